//! A topic-partition, as one value per side: [`SourceTp`] names a partition of the source cluster, [`TargetTp`]
//! the partition of the target cluster it is mirrored into. They are distinct types so that a source name is never
//! used where a target name belongs (the rename policy makes them differ).

use std::fmt;
use std::sync::Arc;

/// The hasher of the maps keyed by partition that are read for every partition on every round (the partitions'
/// statuses, the lanes' links): a fast, randomly seeded one. With thousands of partitions, hashing their names with
/// the standard library's DoS-hardened hasher was a tenth of what an idle mirror did.
pub type TpHasher = foldhash::fast::RandomState;

/// A concurrent map keyed by source partition, with [`TpHasher`].
pub type TpMap<V> = dashmap::DashMap<SourceTp, V, TpHasher>;

/// A partition of the source cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceTp {
    /// Source topic name.
    pub topic: Arc<str>,
    /// Partition index.
    pub partition: u32,
}

/// A partition of the target cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TargetTp {
    /// Target topic name.
    pub topic: Arc<str>,
    /// Partition index.
    pub partition: u32,
}

impl SourceTp {
    /// A source partition.
    pub fn new(topic: impl Into<Arc<str>>, partition: u32) -> SourceTp {
        SourceTp { topic: topic.into(), partition }
    }

    /// The topic name.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

impl TargetTp {
    /// A target partition.
    pub fn new(topic: impl Into<Arc<str>>, partition: u32) -> TargetTp {
        TargetTp { topic: topic.into(), partition }
    }

    /// The topic name.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

impl fmt::Display for SourceTp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

impl fmt::Display for TargetTp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}
