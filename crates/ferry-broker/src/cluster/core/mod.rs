//! The cluster's rules, decided without I/O, clock reads or tokio: each takes what the drivers observed (the
//! catalog, the members' reports, the followers' fetches, the time) and answers what to do. The drivers (the
//! manager, the controller, the follower and the serving side) read etcd, the peers and the clock, and carry the
//! answers out. Every rule has table tests beside it.
//!
//! | rule | module | entry |
//! |------|--------|-------|
//! | electing a leader (controller and operator) | [`election`] | `elect`, `manual` |
//! | the controller's beat | [`controller`] | `step` |
//! | who may be elected after a restart | [`eligibility`] | `on_restart` |
//! | the in-sync set | [`isr`] | `change`, `counted`, `on_fetch` |
//! | the high watermark, the readable end, acknowledgements | [`hw`] | `high_watermark`, `readable_end`, `ack` |
//! | self-fencing by lease, the failsafe | [`fencing`] | `authority`, `answer`, `grant` |
//! | placement of new replicas | [`placement`] | `place`, `replacement` |
//! | moving replicas | [`moves`] | `target_for`, `step` |
//!
//! The cases of the cluster's fault analysis (docs/cluster.md, "Faults and promises") are rows of these tables.

pub mod controller;
pub mod election;
pub mod eligibility;
pub mod fencing;
pub mod hw;
pub mod isr;
pub mod moves;
pub mod placement;
pub mod view;
