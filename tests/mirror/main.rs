//! End-to-end tests of the MirrorMaker (issue 4): two real `ferry-broker` processes as two datacenters and the
//! real `ferry-mirror` between them, on loopback with temp dirs, driven and checked through the Rust client.
//! Build the binaries first: `cargo build -p ferry-broker -p ferry-mirror -p ferryctl --bins`.
//!
//! Every scenario asserts on exact data: per partition, the target holds the same records (offset, timestamp,
//! key, value, headers) and the same batches (offsets, epoch, CRC) as the source, with no duplicate and no gap
//! unless the gap is what the test is about. One test binary with a module per scenario keeps link time down;
//! every test starts its own brokers and mirrors; nextest runs them one at a time (.config/nextest.toml).

mod common;

mod active_active;
mod cluster_faults;
mod clusters;
mod commits;
mod config;
mod discovery;
mod divergence;
mod dlq;
mod env;
mod full_target;
mod group_edges;
mod groups;
mod identical;
mod kill9;
mod loss;
mod memory;
mod promote;
mod ratelimit;
mod reload;
mod restarts;
mod retention;
mod rpo;
mod scaleout;
mod scoped;
mod secure;
mod sigterm;
mod soak;
mod source_changes;
mod split;
mod stall_probe;
mod target_diverged;
mod target_down;
mod target_loss;
mod txn;
mod verification;
mod watch;
mod zombie;
