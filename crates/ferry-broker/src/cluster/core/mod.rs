//! The cluster's rules, decided without I/O, clock reads or tokio: each function takes what the drivers observed
//! and answers what to do. The drivers (the manager, the controller, the follower and the serving side) only read
//! etcd, the peers and the clock, and carry the answers out.

pub mod moves;
