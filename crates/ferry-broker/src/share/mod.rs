//! The message models (docs/messaging.md, "Message models"): broadcast, queue and serial groups, with a lifecycle
//! per record (NEW, ING, SUCCESS, FAIL), retries after a backoff, dead letters and their redrive.
//!
//! - **Where the state lives.** A group's state is records in the internal topic `__ferry_queues`
//!   (`node::internal::QUEUES`), keyed by the group's name; the leader of the group's partition of it owns the
//!   group (`crate::state`): it alone answers the group's calls, and anyone else answers NOT_LEADER naming it. A
//!   new owner replays the partition, so it starts from every acknowledged transition of its predecessor.
//! - **What is persisted.** Each partition's start (the lowest offset not settled), every delivery (its count
//!   raised before the record is handed out, so a record that crashes its consumers cannot circle unnoticed),
//!   every settlement, retry wait and dead letter, and broadcast members' acknowledged positions. Locks and members
//!   are kept in memory only: a new owner starts with no locks, so records that were in flight are NEW again with
//!   their counts kept (as KIP-932 does), and members join again (their clients do it on NOT_LEADER).
//! - **Dead letters** go to `{group}.dlq` (created on first use) under the group's own idempotent producer, whose
//!   sequence is recorded with an intent before the write: a new owner redoes an intent without a result, and the
//!   retried write is a duplicate, so each record is dead-lettered once.
//! - **Decisions** are in `core` (pure); the service's calls (`rpc::service::share`) drive them.

pub mod core;
pub mod gauges;
pub mod state;

use crate::node::internal::QUEUES;
use crate::state::Owners;

pub use self::state::{Group, Groups, Tp};

/// The header a producer sets to give a record its own retries (a decimal count).
pub const RETRIES_HEADER: &str = "ferry-retries";

/// The dead-letter disposition headers.
pub mod headers {
    /// Origin topic.
    pub const TOPIC: &str = "ferry-dlq-topic";
    /// Origin partition.
    pub const PARTITION: &str = "ferry-dlq-partition";
    /// Origin offset.
    pub const OFFSET: &str = "ferry-dlq-offset";
    /// The group.
    pub const GROUP: &str = "ferry-dlq-group";
    /// The consumer that failed it last.
    pub const CONSUMER: &str = "ferry-dlq-consumer";
    /// Deliveries made.
    pub const ATTEMPTS: &str = "ferry-dlq-attempts";
    /// The last error text.
    pub const ERROR: &str = "ferry-dlq-error";
    /// First failure, ms since the epoch.
    pub const FIRST_FAILURE: &str = "ferry-dlq-first-failure-ms";
    /// Last failure, ms since the epoch.
    pub const LAST_FAILURE: &str = "ferry-dlq-last-failure-ms";
    /// On a redriven record: the dead letter it came from ("topic/partition/offset").
    pub const REDRIVEN_FROM: &str = "ferry-redriven-from";
    /// Every disposition header, dropped from a redriven record.
    pub const ALL: &[&str] = &[TOPIC, PARTITION, OFFSET, GROUP, CONSUMER, ATTEMPTS, ERROR, FIRST_FAILURE, LAST_FAILURE];
}

/// The dead-letter topic of `group`.
pub fn dlq_topic(group: &str) -> String {
    format!("{group}.dlq")
}

/// Checks a message-model group's name: its dead-letter topic must be a valid topic name.
pub fn check_group_name(group: &str) -> Result<(), String> {
    let ok = !group.is_empty()
        && group.len() <= 196
        && group.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && !group.starts_with("__ferry");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "group name {group:?}: a queue, serial or broadcast group's name is 1-196 characters of A-Z a-z 0-9 . _ - \
             and does not start with __ferry (its dead letters go to the topic \"{{group}}.dlq\")"
        ))
    }
}

/// The groups of the `__ferry_queues` partitions this broker owns.
pub type Shares = Owners<Groups>;

/// A fresh set of owned group states.
pub fn shares() -> Shares {
    Owners::new(&QUEUES)
}

/// The id of the group's dead-letter producer (positive, stable, apart from client-allocated ids by its high bit).
pub fn producer_id(what: &str, group: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in what.bytes().chain([0]).chain(group.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    ((h >> 2) | (1 << 61)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_are_those_whose_dead_letter_topic_is_valid() {
        for ok in ["orders", "a.b_c-9", &"x".repeat(196)] {
            assert!(check_group_name(ok).is_ok(), "{ok}");
            crate::node::topic::validate_topic_name(&dlq_topic(ok)).unwrap();
        }
        for bad in ["", "a b", "a/b", "__ferry_x", &"x".repeat(197)] {
            assert!(check_group_name(bad).is_err(), "{bad}");
        }
        assert_ne!(producer_id("dlq", "a"), producer_id("dlq", "b"));
        assert!(producer_id("dlq", "a") > 0);
    }
}
