//! What one broker holds: its topic registry and data dir, each topic and partition with its log, idempotent
//! producer state and, on a cluster member, the replicated partition's state and leader-epoch history.

pub mod dr;
pub mod end_clock;
pub mod internal;
pub mod leader_epochs;
pub mod partition;
pub mod producer_state;
pub mod registry;
pub mod replica;
pub mod topic;
