//! What the drivers read from etcd, as plain data: the catalog at one revision.

use std::collections::{BTreeMap, BTreeSet};

use crate::node::replica::PartitionState;
use crate::node::topic::TopicMeta;

/// A partition state with the etcd revision it was read at, for a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The state.
    pub state: PartitionState,
    /// Its key's mod revision.
    pub revision: i64,
}

/// Everything the catalog holds, read at one revision.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Live brokers: id → advertised address.
    pub brokers: BTreeMap<u32, String>,
    /// Replicated topics by name.
    pub topics: BTreeMap<String, TopicMeta>,
    /// Each topic key's mod revision, for a compare-and-swap.
    pub topic_revisions: BTreeMap<String, i64>,
    /// Ids of deleted topics (their tombstones).
    pub deleted: BTreeSet<String>,
    /// Brokers being drained.
    pub draining: BTreeSet<u32>,
    /// Each live broker's named listeners: name -> advertised address.
    pub listeners: BTreeMap<u32, BTreeMap<String, String>>,
    /// Partition states by (topic, partition).
    pub partitions: BTreeMap<(String, u32), Versioned>,
    /// The controller's broker id, 0 when none.
    pub controller: u32,
}

impl Snapshot {
    /// Broker `id`'s address on `listener` (its named listener of that name, else its registered address); the
    /// registered one for `None`.
    pub fn address(&self, id: u32, listener: Option<&str>) -> Option<String> {
        let named = listener.and_then(|l| self.listeners.get(&id).and_then(|m| m.get(l)));
        named.or_else(|| self.brokers.get(&id)).cloned()
    }

    /// How many replicas each live broker that is not being drained holds (the brokers that may take more).
    pub fn replica_counts(&self) -> BTreeMap<u32, usize> {
        let mut counts: BTreeMap<u32, usize> =
            self.brokers.keys().filter(|id| !self.draining.contains(id)).map(|&id| (id, 0)).collect();
        for v in self.partitions.values() {
            for id in &v.state.replicas {
                if let Some(c) = counts.get_mut(id) {
                    *c += 1;
                }
            }
        }
        counts
    }
}
