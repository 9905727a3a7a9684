//! Idempotent-producer state of one partition: for each producer id, its epoch, the last sequence written and the
//! last few batches, so that a retried batch is acknowledged with its original offsets instead of being written
//! twice. The state is rebuilt from batch headers when the broker starts.

use std::collections::{HashMap, VecDeque};

use ferry_batch::BatchHeader;

/// How many recent batches per producer are remembered for duplicate detection (as Kafka's five in flight).
pub const RECENT_BATCHES: usize = 5;

/// A batch already written, remembered for duplicate detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    base_sequence: i32,
    last_sequence: i32,
    base_offset: u64,
    last_offset: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    epoch: i16,
    recent: VecDeque<Written>,
}

/// The verdict on an incoming batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Write it.
    Append,
    /// It was written before, at these offsets.
    Duplicate {
        /// Offset of its first record.
        base_offset: u64,
        /// Offset of its last record.
        last_offset: u64,
    },
    /// Refuse it, with the reason.
    Refuse(String),
}

/// Producer state of one partition.
#[derive(Debug, Default)]
pub struct ProducerStates {
    producers: HashMap<i64, Entry>,
}

fn last_sequence(h: &BatchHeader) -> i32 {
    h.base_sequence.wrapping_add(h.record_count.saturating_sub(1) as i32)
}

impl ProducerStates {
    /// Decides what to do with a batch about to be appended.
    pub fn check(&self, h: &BatchHeader) -> Check {
        if !h.is_idempotent() {
            return Check::Append;
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            // Unknown producer (new, or its state aged out): accept whatever sequence it starts with.
            return Check::Append;
        };
        if h.producer_epoch < entry.epoch {
            return Check::Refuse(format!(
                "producer epoch {} is fenced by epoch {}; a newer instance of this producer exists",
                h.producer_epoch, entry.epoch
            ));
        }
        if h.producer_epoch > entry.epoch {
            return Check::Append;
        }
        let last = last_sequence(h);
        if let Some(w) = entry.recent.iter().find(|w| w.base_sequence == h.base_sequence && w.last_sequence == last) {
            return Check::Duplicate { base_offset: w.base_offset, last_offset: w.last_offset };
        }
        let expected = entry.recent.back().map_or(0, |w| w.last_sequence.wrapping_add(1));
        if h.base_sequence == expected {
            Check::Append
        } else {
            Check::Refuse(format!(
                "out-of-order sequence: expected {expected}, got {}; resend the batches in order",
                h.base_sequence
            ))
        }
    }

    /// Records a batch written at `base_offset..=last_offset`.
    pub fn record(&mut self, h: &BatchHeader, base_offset: u64, last_offset: u64) {
        if !h.is_idempotent() {
            return;
        }
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| Entry { epoch: h.producer_epoch, recent: VecDeque::new() });
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.recent.clear();
        }
        entry.recent.push_back(Written {
            base_sequence: h.base_sequence,
            last_sequence: last_sequence(h),
            base_offset,
            last_offset,
        });
        while entry.recent.len() > RECENT_BATCHES {
            entry.recent.pop_front();
        }
    }

    /// Number of producers tracked.
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Whether no producer is tracked.
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Forgets everything (after a truncation the remembered offsets may no longer exist).
    pub fn clear(&mut self) {
        self.producers.clear();
    }

    /// Checks the batches of one request in order, as if each accepted one had been written, without changing
    /// anything: the first refusal, with the refused batch's producer id, or `Ok` when every batch would be
    /// appended or recognised as a duplicate. Lets a request of several batches be refused before any is written.
    pub fn check_all<'a>(&self, headers: impl IntoIterator<Item = &'a BatchHeader>) -> Result<(), (i64, String)> {
        let mut scratch = ProducerStates::default();
        for h in headers {
            if h.is_idempotent()
                && !scratch.producers.contains_key(&h.producer_id)
                && let Some(entry) = self.producers.get(&h.producer_id)
            {
                scratch.producers.insert(h.producer_id, entry.clone());
            }
            match scratch.check(h) {
                Check::Refuse(reason) => return Err((h.producer_id, reason)),
                // Offsets do not matter for later verdicts, only sequences and epochs.
                Check::Append => scratch.record(h, 0, 0),
                Check::Duplicate { .. } => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{BatchBuilder, Compression, ProducerInfo, verify};

    fn header(pid: i64, epoch: i16, seq: i32, count: u32) -> BatchHeader {
        let mut b = BatchBuilder::new(
            Compression::None,
            ProducerInfo { producer_id: pid, producer_epoch: epoch, base_sequence: seq },
        );
        for i in 0..count {
            b.push(i, 1, None, Some(b"v"), &[]);
        }
        verify(&b.build(0, 0)).unwrap()
    }

    #[test]
    fn retried_batch_gets_its_original_offsets() {
        let mut s = ProducerStates::default();
        let a = header(7, 0, 0, 3);
        assert_eq!(s.check(&a), Check::Append);
        s.record(&a, 100, 102);
        let b = header(7, 0, 3, 2);
        assert_eq!(s.check(&b), Check::Append);
        s.record(&b, 103, 104);
        assert_eq!(s.check(&a), Check::Duplicate { base_offset: 100, last_offset: 102 });
        assert_eq!(s.check(&b), Check::Duplicate { base_offset: 103, last_offset: 104 });
    }

    #[test]
    fn gaps_and_fenced_epochs_are_refused() {
        let mut s = ProducerStates::default();
        let a = header(7, 1, 0, 1);
        s.record(&a, 0, 0);
        assert!(matches!(s.check(&header(7, 1, 5, 1)), Check::Refuse(r) if r.contains("expected 1")));
        assert!(matches!(s.check(&header(7, 0, 1, 1)), Check::Refuse(r) if r.contains("fenced")));
        assert_eq!(s.check(&header(7, 2, 0, 1)), Check::Append);
        assert_eq!(s.check(&header(8, 0, 42, 1)), Check::Append);
    }

    #[test]
    fn a_request_is_checked_as_a_whole_without_changing_the_state() {
        let mut s = ProducerStates::default();
        s.record(&header(7, 0, 0, 2), 0, 1);
        // In order, continuing the sequence, with a duplicate and a new producer: fine.
        let ok = [header(7, 0, 2, 3), header(7, 0, 5, 1), header(7, 0, 0, 2), header(9, 0, 40, 1)];
        assert_eq!(s.check_all(&ok), Ok(()));
        // A batch after a good one that skips a sequence is refused, naming its producer.
        let bad = [header(8, 0, 0, 2), header(8, 0, 5, 1)];
        assert!(matches!(s.check_all(&bad), Err((8, r)) if r.contains("expected 2, got 5")));
        // Nothing was recorded by the checks.
        assert_eq!(s.len(), 1);
        assert_eq!(s.check(&header(7, 0, 2, 1)), Check::Append);
    }

    #[test]
    fn non_idempotent_batches_pass() {
        let s = ProducerStates::default();
        assert_eq!(s.check(&header(-1, -1, -1, 2)), Check::Append);
    }
}
