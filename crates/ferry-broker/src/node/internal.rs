//! The broker's internal state topics: where a feature with state (queue progress, delayed records, transactions)
//! keeps it, as records in a reserved topic `__ferry_{feature}` that no client may write or list.
//!
//! On a single broker such a topic is a local topic with the reserved name, created at startup. On a cluster the
//! controller creates it in the catalog as a raft3 topic, like the committed offsets topic, so the state is
//! replicated like any acknowledged write and survives the loss of a member; the leader of each of its partitions
//! owns the state of the keys that hash to it (see `crate::state`).
//!
//! Each entry of [`INTERNAL_TOPICS`] is created on every broker and cluster; a feature adds its own.

use crate::node::topic::{RESERVED_PREFIX, Replication, TopicMeta, TopicSettings};

/// One internal state topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InternalTopic {
    /// The topic's name, with the reserved prefix.
    pub name: &'static str,
    /// How many partitions it has: the keys of its state spread over them, each owned by its leader.
    pub partitions: u32,
    /// Its segment size: small, so compaction and retention free space early.
    pub segment_bytes: u64,
    /// How long its records are kept, ms; 0 keeps them until the feature deletes them.
    pub retention_ms: u64,
}

/// Transactional messages (`crate::txn`): prepared half messages, decisions and check counts, keyed by producer
/// group and transaction id; each partition's leader owns the transactions of the groups hashed to it.
pub const TRANSACTIONS: InternalTopic =
    InternalTopic { name: "__ferry_transactions", partitions: 8, segment_bytes: 8 << 20, retention_ms: 0 };

/// Every internal state topic.
pub const INTERNAL_TOPICS: &[InternalTopic] = &[JOBS, TRANSACTIONS, DELAY_TOPIC, QUEUES];

/// The message models' group state (`crate::share`): queue and serial progress, broadcast positions, dead-letter
/// intents and redrive jobs, keyed by group. Kept 7 days (the history of a record's transitions is bounded by it);
/// each group's whole state is written again every hour, so a replay never needs an older record.
pub const QUEUES: InternalTopic =
    InternalTopic { name: "__ferry_queues", partitions: 8, segment_bytes: 8 << 20, retention_ms: 7 * 86_400_000 };

/// The delay store of delayed delivery and the broker's timer (`crate::delay`): its partitions spread the timer's
/// streams, each owned by its leader; records stay until they fire (no time retention), and the owner deletes the
/// sealed segments below what is still pending (`crate::delay`'s compaction), so segments are small.
pub const DELAY_TOPIC: InternalTopic =
    InternalTopic { name: "__ferry_delay", partitions: 4, segment_bytes: 4 << 20, retention_ms: 0 };

/// Job records (`crate::jobs`): a failover's durable state.
pub const JOBS: InternalTopic =
    InternalTopic { name: "__ferry_jobs", partitions: 1, segment_bytes: 4 << 20, retention_ms: 0 };

impl InternalTopic {
    /// The partition that owns `key`'s state.
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        ferry_proto::partition_for_key(key, self.partitions)
    }

    /// Its metadata as a topic of `replication` (single on a single broker, raft3 on a cluster): flushed on every
    /// write, as the committed offsets are.
    pub fn meta(&self, replication: Replication, topic_id: String, created_ms: i64) -> TopicMeta {
        TopicMeta {
            name: self.name.to_owned(),
            topic_id,
            partitions: self.partitions,
            replication,
            created_ms,
            settings: TopicSettings {
                flush: Some("sync".into()),
                segment_bytes: Some(self.segment_bytes),
                retention_ms: (self.retention_ms > 0).then_some(self.retention_ms),
                ..TopicSettings::default()
            },
            mirror: None,
            promoted_ms: None,
            risk_phase: false,
            fence: None,
            promote_epoch: None,
        }
    }
}

/// The internal state topic named `name`, if it is one.
pub fn find(name: &str) -> Option<&'static InternalTopic> {
    if !name.starts_with(RESERVED_PREFIX) {
        return None;
    }
    INTERNAL_TOPICS.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_internal_topic_is_reserved_and_named_once() {
        let mut names: Vec<&str> = INTERNAL_TOPICS.iter().map(|t| t.name).collect();
        for t in INTERNAL_TOPICS {
            assert!(t.name.starts_with(RESERVED_PREFIX), "{} lacks the reserved prefix", t.name);
            assert!(t.partitions > 0, "{} has no partitions", t.name);
            assert_eq!(find(t.name), Some(t));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), INTERNAL_TOPICS.len(), "an internal topic is listed twice");
        assert_eq!(find("orders"), None);
        assert_eq!(find("__ferry_offsets"), None);
    }

    #[test]
    fn a_key_always_maps_to_the_same_partition_within_the_topic() {
        let t = InternalTopic { name: "__ferry_test", partitions: 8, segment_bytes: 1 << 20, retention_ms: 0 };
        for key in ["a", "group-1", "orders/3", ""] {
            let p = t.partition_of(key.as_bytes());
            assert!(p < 8);
            assert_eq!(p, t.partition_of(key.as_bytes()));
        }
        let meta = t.meta(Replication::Raft3, "id".into(), 5);
        assert_eq!(
            (meta.partitions, meta.settings.flush.as_deref(), meta.settings.retention_ms),
            (8, Some("sync"), None)
        );
    }
}
