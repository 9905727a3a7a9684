//! The per-partition record buffer: records wait here until their batch is full or has lingered long enough.
//!
//! Pure bookkeeping, no I/O, so batching decisions are unit-tested. Invariants: records leave in the order they
//! arrived; a drained batch holds at least one record and, beyond the first, never more than `max_bytes` of
//! (estimated) record bytes plus the batch header; the byte count always equals the sum of the queued sizes.

use std::collections::VecDeque;
use tokio::time::Instant;

use ferry_batch::HEADER_LEN;

/// Records of one partition waiting to be batched. `T` is the pending record (with its delivery channel).
#[derive(Debug)]
pub(crate) struct PartitionBuffer<T> {
    queue: VecDeque<(T, usize, Instant)>,
    bytes: usize,
    enqueued: u64,
}

impl<T> Default for PartitionBuffer<T> {
    fn default() -> Self {
        PartitionBuffer { queue: VecDeque::new(), bytes: 0, enqueued: 0 }
    }
}

impl<T> PartitionBuffer<T> {
    /// Appends a record of (estimated) `size` bytes. Returns true when the buffer went from empty to non-empty,
    /// which is when the sender must be woken.
    pub(crate) fn push(&mut self, item: T, size: usize, now: Instant) -> bool {
        let was_empty = self.queue.is_empty();
        self.queue.push_back((item, size, now));
        self.bytes += size;
        self.enqueued += 1;
        was_empty
    }

    /// Records ever pushed (a monotonic counter; `flush` waits until this many are complete).
    pub(crate) fn enqueued(&self) -> u64 {
        self.enqueued
    }

    /// When the oldest waiting record arrived.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.queue.front().map(|(_, _, at)| *at)
    }

    /// Whether a full batch of `max_bytes` is waiting (so lingering longer gains nothing).
    pub(crate) fn is_full(&self, max_bytes: usize) -> bool {
        HEADER_LEN + self.bytes >= max_bytes
    }

    /// Takes the next batch: records in arrival order while they fit `max_bytes` (header included), and always
    /// at least one. Returns the records and the time the oldest of them arrived.
    pub(crate) fn drain(&mut self, max_bytes: usize) -> Option<(Vec<T>, Instant)> {
        let oldest = self.oldest()?;
        let mut total = HEADER_LEN;
        let mut out = Vec::new();
        while let Some((_, size, _)) = self.queue.front() {
            if !out.is_empty() && total + size > max_bytes {
                break;
            }
            let (item, size, _) = self.queue.pop_front().expect("front exists");
            total += size;
            self.bytes -= size;
            out.push(item);
        }
        Some((out, oldest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn drains_in_order_up_to_the_batch_limit() {
        let t0 = Instant::now();
        let mut buf = PartitionBuffer::default();
        assert!(buf.push(1, 100, t0));
        assert!(!buf.push(2, 100, t0 + Duration::from_millis(1)));
        assert!(!buf.push(3, 100, t0 + Duration::from_millis(2)));
        assert!(!buf.is_full(HEADER_LEN + 300 + 1));
        assert!(buf.is_full(HEADER_LEN + 300));
        let (batch, oldest) = buf.drain(HEADER_LEN + 250).unwrap();
        assert_eq!(batch, vec![1, 2]);
        assert_eq!(oldest, t0);
        assert_eq!(buf.oldest(), Some(t0 + Duration::from_millis(2)));
        let (batch, _) = buf.drain(HEADER_LEN + 250).unwrap();
        assert_eq!(batch, vec![3]);
        assert!(buf.oldest().is_none());
        assert!(buf.drain(1000).is_none());
        assert_eq!(buf.enqueued(), 3);
        // Empty again: the next push reports the wake-up edge.
        assert!(buf.push(4, 1, t0));
    }

    #[test]
    fn a_record_larger_than_the_limit_still_leaves_alone() {
        let t0 = Instant::now();
        let mut buf = PartitionBuffer::default();
        buf.push("big", 5000, t0);
        buf.push("small", 10, t0);
        assert_eq!(buf.drain(1000).unwrap().0, vec!["big"]);
        assert_eq!(buf.drain(1000).unwrap().0, vec!["small"]);
    }

    #[test]
    fn byte_count_tracks_the_queue() {
        let t0 = Instant::now();
        let mut buf = PartitionBuffer::default();
        for i in 0..100 {
            buf.push(i, 10 + i, t0);
        }
        let mut seen = Vec::new();
        while let Some((batch, _)) = buf.drain(HEADER_LEN + 500) {
            assert!(!batch.is_empty());
            let bytes: usize = batch.iter().map(|i| 10 + i).sum();
            assert!(batch.len() == 1 || HEADER_LEN + bytes <= HEADER_LEN + 500);
            seen.extend(batch);
        }
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert_eq!(buf.bytes, 0);
    }
}
