//! End-to-end tests of the broker: the real `ferry-broker` binary (and `ferryctl`) on loopback with temp dirs,
//! driven through the Rust client. Build the binaries first: `cargo build --workspace --bins`.
//!
//! One test binary with a module per area keeps link time down; every test starts its own broker, so they run in
//! parallel.

mod auth;
mod cluster;
mod cluster_groups;
mod common;
mod config_env;
mod delay;
mod delay_compact;
mod delay_ctl;
mod delay_faults;
mod delay_raft3;
mod delay_topics;
mod double_write;
mod drain;
mod faults;
mod fence;
mod ferryctl;
mod groups;
mod hostile;
mod idempotence;
mod jepsen;
mod lifecycle;
mod limits;
mod list_digest;
mod mirror_append;
mod nemesis;
mod power_losses;
mod produce_consume;
mod raft3;
mod raft3_catalog;
mod raft3_faults;
mod raft3_links;
mod raft3_repair;
mod raft3_routing;
mod raft3_secured;
mod restart;
mod rpc_bounds;
mod scopes;
mod share;
mod share_cluster;
mod share_ops;
mod startup;
mod state_limits;
mod subscribe;
mod tls;
mod txn;
mod txn_checks;
mod txn_cluster;
mod txn_faults;
mod txn_ops;
mod validation;
