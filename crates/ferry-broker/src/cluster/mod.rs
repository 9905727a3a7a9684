//! A cluster member's side of the cluster: its membership and lease under etcd, the catalog in etcd, the
//! controller, the replication manager that drives this member's replicas, the follower's fetcher, the links to
//! the other members and the leader's side of replication. Every decision they take is made in [`core`], without
//! I/O; the modules here read etcd and the peers, feed the core, and carry out what it answers.

pub mod catalog;
pub mod controller;
pub mod core;
pub mod follower;
pub mod lease;
pub mod manager;
pub mod membership;
pub mod peers;
pub mod serving;
pub mod startup;
