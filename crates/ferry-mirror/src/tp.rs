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

/// Finds which partition of a probe's request each answer is about. A Ferry broker answers in the order it was
/// asked, some left out (a leader that answered with an error), so the next asked partition is tried first; any
/// other answer (a target that answers by topic) is found by name, through an index built the first time one is
/// needed.
pub struct Placer<'a, K> {
    asked: &'a [K],
    next: usize,
    by_name: Option<std::collections::HashMap<&'a K, usize, TpHasher>>,
}

impl<'a, K: Eq + std::hash::Hash> Placer<'a, K> {
    /// A placer over the partitions asked, in the order asked.
    pub fn new(asked: &'a [K]) -> Placer<'a, K> {
        Placer { asked, next: 0, by_name: None }
    }

    /// The index in the request of the partition `answer` names, if it was asked.
    pub fn place(&mut self, answer: &K) -> Option<usize> {
        let at = match self.asked.get(self.next) {
            Some(asked) if asked == answer => Some(self.next),
            _ => {
                let asked = self.asked;
                self.by_name
                    .get_or_insert_with(|| asked.iter().enumerate().map(|(i, t)| (t, i)).collect())
                    .get(answer)
                    .copied()
            }
        };
        if let Some(i) = at {
            self.next = i + 1;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_order_with_gaps_or_out_of_order_each_find_their_partition() {
        let asked: Vec<SourceTp> = (0..5).map(|p| SourceTp::new("t", p)).collect();
        let mut placer = Placer::new(&asked);
        let answers = [0, 2, 3, 1, 4, 4];
        let placed: Vec<Option<usize>> = answers.iter().map(|p| placer.place(&SourceTp::new("t", *p))).collect();
        assert_eq!(placed, [Some(0), Some(2), Some(3), Some(1), Some(4), Some(4)]);
        assert_eq!(placer.place(&SourceTp::new("u", 0)), None, "a partition not asked");
        assert_eq!(Placer::new(&asked).place(&SourceTp::new("t", 9)), None);
    }
}
