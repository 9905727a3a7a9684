//! Which partition a record goes to: the explicit partition, else the key's partition by
//! `ferry_proto::partition_for_key` (the same rule the broker applies), else a sticky round robin that stays on
//! one partition until a batch for it is formed and then moves to the next.
//!
//! The partition count comes from DescribeTopic and is cached per topic; the producer refreshes it when it is
//! older than `metadata_max_age` or when an answer suggests it changed (unknown partition).

use std::time::Duration;

use tokio::time::Instant;

/// Cached metadata of one topic, with its sticky partition.
#[derive(Debug, Clone)]
pub(crate) struct TopicMeta {
    pub(crate) partitions: u32,
    pub(crate) fetched: Instant,
    sticky: u32,
}

/// Why no partition could be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The partition to use.
    Partition(u32),
    /// The explicit partition is not below the cached count: refresh, then fail if it still is not.
    OutOfRange,
}

impl TopicMeta {
    /// Fresh metadata; the sticky partition starts at `start % partitions` (random, so producers spread).
    pub(crate) fn new(partitions: u32, now: Instant, start: u32) -> Self {
        let partitions = partitions.max(1);
        TopicMeta { partitions, fetched: now, sticky: start % partitions }
    }

    /// Whether the cache is older than `max_age`.
    pub(crate) fn is_stale(&self, now: Instant, max_age: Duration) -> bool {
        now.saturating_duration_since(self.fetched) >= max_age
    }

    /// Takes a newer partition count, keeping the sticky partition when it still exists.
    pub(crate) fn update(&mut self, partitions: u32, now: Instant) {
        self.partitions = partitions.max(1);
        self.fetched = now;
        self.sticky %= self.partitions;
    }

    /// The partition for a record.
    pub(crate) fn choose(&self, explicit: Option<u32>, key: Option<&[u8]>) -> Choice {
        match (explicit, key) {
            (Some(p), _) if p < self.partitions => Choice::Partition(p),
            (Some(_), _) => Choice::OutOfRange,
            (None, Some(key)) => Choice::Partition(ferry_proto::partition_for_key(key, self.partitions)),
            (None, None) => Choice::Partition(self.sticky),
        }
    }

    /// A batch for `partition` was formed: if keyless records were sticking to it, move on to the next one.
    pub(crate) fn on_new_batch(&mut self, partition: u32) {
        if self.sticky == partition {
            self.sticky = (partition + 1) % self.partitions;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_partition_wins_and_is_range_checked() {
        let meta = TopicMeta::new(4, Instant::now(), 0);
        assert_eq!(meta.choose(Some(3), Some(b"k")), Choice::Partition(3));
        assert_eq!(meta.choose(Some(4), None), Choice::OutOfRange);
    }

    #[test]
    fn keys_use_the_shared_partitioner() {
        let meta = TopicMeta::new(7, Instant::now(), 0);
        for key in ["a", "orders-1", "", "ключ"] {
            let expected = ferry_proto::partition_for_key(key.as_bytes(), 7);
            assert_eq!(meta.choose(None, Some(key.as_bytes())), Choice::Partition(expected));
        }
        // Same key, same partition, whatever the sticky state.
        let mut m = meta.clone();
        m.on_new_batch(0);
        assert_eq!(m.choose(None, Some(b"a")), meta.choose(None, Some(b"a")));
    }

    #[test]
    fn keyless_records_stick_until_a_batch_forms_then_rotate() {
        let mut meta = TopicMeta::new(3, Instant::now(), 1);
        assert_eq!(meta.choose(None, None), Choice::Partition(1));
        assert_eq!(meta.choose(None, None), Choice::Partition(1));
        meta.on_new_batch(0); // a batch of another partition does not move it
        assert_eq!(meta.choose(None, None), Choice::Partition(1));
        let mut seen = Vec::new();
        for _ in 0..6 {
            let Choice::Partition(p) = meta.choose(None, None) else { panic!() };
            seen.push(p);
            meta.on_new_batch(p);
        }
        assert_eq!(seen, vec![1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn growing_the_topic_keeps_the_cache_consistent() {
        let now = Instant::now();
        let mut meta = TopicMeta::new(2, now, 5);
        assert_eq!(meta.choose(None, None), Choice::Partition(1));
        assert!(!meta.is_stale(now, Duration::from_secs(60)));
        assert!(meta.is_stale(now + Duration::from_secs(60), Duration::from_secs(60)));
        meta.update(8, now);
        assert_eq!(meta.choose(Some(7), None), Choice::Partition(7));
        meta.update(0, now); // nonsense from a broker never divides by zero
        assert_eq!(meta.choose(None, None), Choice::Partition(0));
    }
}
