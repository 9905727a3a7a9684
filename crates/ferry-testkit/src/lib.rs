//! Ferry's test harness: starts the real `ferry-broker` and `ferry-mirror` binaries (and a real etcd, the master of
//! the cluster tests: [`EtcdProcess`]) on free loopback ports with temporary directories and captured logs, provides a fault-injecting TCP proxy (cut, blackhole, delay line,
//! throttle, reset of HTTP/2 responses), deadline-based wait helpers, and replayable seeds for random test inputs
//! ([`seeded_rng`], `FERRY_TEST_SEED`).
//!
//! A typical end-to-end test:
//!
//! ```no_run
//! use std::time::Duration;
//! use ferry_testkit::{BrokerProcess, MirrorProcess, Proxy, deadline, init_tracing, wait_until};
//!
//! # async fn example() -> anyhow::Result<()> {
//! init_tracing();
//! let source = BrokerProcess::builder().cluster_id("dc-a").start().await?;
//! let target = BrokerProcess::builder().cluster_id("dc-b").start().await?;
//! let link = Proxy::start(source.addr()).await?;
//! let mut mirror = MirrorProcess::builder(format!(
//!     "[mirror]\nname = \"a_to_b\"\n[source]\ncluster = \"dc-a\"\n\
//!      [[source.routes]]\nname = \"primary\"\nbrokers = [\"{}\"]\n\
//!      [target]\ncluster = \"dc-b\"\nbrokers = [\"{}\"]\n[monitor]\nlisten = \"127.0.0.1:0\"\n",
//!     link.addr(),
//!     target.addr()
//! ))
//! .env("FERRY_MONITOR_TOKEN", "secret")
//! .start()
//! .await?;
//! link.cut();
//! // ... produce to the source, then:
//! let within = deadline(&[Duration::from_secs(3), Duration::from_secs(10)]);
//! wait_until("the mirror to be running", within, async || mirror.is_running()).await?;
//! # Ok(()) }
//! ```
//!
//! The binaries must be built first (`cargo build --workspace --bins`); see [`binary_path`] for where they are
//! looked for. Every process is killed when its handle is dropped, also when a test panics.

#![deny(missing_docs)]

mod bins;
mod broker;
mod cluster;
mod console;
mod error;
mod etcd;
mod mirror;
mod process;
mod proxy;
mod seed;
mod server;
mod util;
mod wait;

pub use bins::{BROKER_BIN, CONSOLE_BIN, FERRYCTL_BIN, MIRROR_BIN, bin_dir, binary_path, workspace_root};
pub use broker::{BrokerBuilder, BrokerProcess, METRICS_LISTEN_VAR};
pub use cluster::{ClusterSpec, FaultyCluster};
pub use console::ConsoleProcess;
pub use error::{Error, Result};
pub use etcd::{ETCD_BIN_VAR, EtcdProcess, etcd_binary};
/// The etcd v3 client the cluster tests inspect the master with.
pub use etcd_client;
pub use mirror::{MirrorBuilder, MirrorProcess};
pub use process::{ChildProcess, ChildSpec, LOG_TAIL_LINES};
pub use proxy::{Proxy, ProxyMode, ProxyStats};
/// A POSIX signal for [`ChildProcess::send_signal`], [`BrokerProcess::send_signal`] and
/// [`MirrorProcess::send_signal`], e.g. `Signal::HUP`, `Signal::TERM`, `Signal::INT`, `Signal::KILL`.
pub use rustix::process::Signal;
pub use seed::{SEED_VAR, seeded_rng, test_seed};
pub use util::{init_tracing, reserve_port, reserve_ports};
pub use wait::{Check, Found, MIN_DEADLINE, POLL_INTERVAL, deadline, hold_fault, wait_for, wait_until};

#[cfg(test)]
mod tests {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_can_be_shared_across_tasks() {
        assert_send_sync::<crate::Proxy>();
        assert_send_sync::<crate::BrokerProcess>();
        assert_send_sync::<crate::MirrorProcess>();
        assert_send_sync::<crate::ChildProcess>();
        assert_send_sync::<crate::Error>();
    }
}
