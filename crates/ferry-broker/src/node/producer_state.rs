//! Idempotent-producer state of one partition: for each producer id, its epoch, the last sequence written and the
//! last few batches, so that a retried batch is acknowledged with its original offsets instead of being written
//! twice. The state is rebuilt from batch headers when the broker starts.
//!
//! **Expiry** follows batch timestamps only, never the broker's clock, so that every replica of the log reaches
//! the same verdicts: a producer id whose last batch's `max_timestamp` is more than
//! [`Settings::expiration_ms`] behind the newest `max_timestamp` the partition has seen (from any producer) is
//! expired, and a batch from it at the same (or an older) epoch is refused instead of appended: a late retry of a
//! batch written before the expiry cannot be told from a new one any more. At most [`Settings::max_producers`]
//! ids are tracked; past that, the id whose last batch is oldest (then the lowest id) is forgotten.

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
    /// `max_timestamp` of the producer's last batch.
    last_timestamp: i64,
}

/// How long producer ids are remembered, and how many (`storage.producer_id_expiration` and
/// `storage.max_producer_ids` of the broker config, whose defaults these are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Milliseconds of batch timestamps after which an idle producer id expires.
    pub expiration_ms: i64,
    /// Producer ids tracked per partition at most.
    pub max_producers: usize,
    /// How far ahead of the broker's clock a produced batch's newest timestamp may be, ms (`storage.
    /// max_timestamp_ahead`): time retention and producer expiry follow batch timestamps.
    pub max_timestamp_ahead_ms: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { expiration_ms: 7 * 24 * 3600 * 1000, max_producers: 10_000, max_timestamp_ahead_ms: 3_600_000 }
    }
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
    /// Refuse it: which rule, and the reason in words.
    Refuse(SequenceRefusal, String),
}

pub use crate::error::SequenceRefusal;

/// Producer state of one partition.
#[derive(Debug)]
pub struct ProducerStates {
    producers: HashMap<i64, Entry>,
    /// The newest `max_timestamp` of any batch recorded.
    newest: i64,
    settings: Settings,
}

impl Default for ProducerStates {
    fn default() -> Self {
        ProducerStates::new(Settings::default())
    }
}

fn last_sequence(h: &BatchHeader) -> i32 {
    h.base_sequence.wrapping_add(h.record_count.saturating_sub(1) as i32)
}

impl ProducerStates {
    /// An empty state with these settings.
    pub fn new(settings: Settings) -> ProducerStates {
        ProducerStates { producers: HashMap::new(), newest: i64::MIN, settings }
    }

    /// The settings this state runs under.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Decides what to do with a batch about to be appended.
    pub fn check(&self, h: &BatchHeader) -> Check {
        if !h.is_idempotent() {
            return Check::Append;
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            // Unknown producer (new, or its state aged out of the segments read at start-up or was forgotten past
            // the bound on tracked ids): accept whatever sequence it starts with.
            return Check::Append;
        };
        if h.producer_epoch < entry.epoch {
            return Check::Refuse(
                SequenceRefusal::Fenced,
                format!(
                    "producer epoch {} is fenced by epoch {}; a newer instance of this producer exists",
                    h.producer_epoch, entry.epoch
                ),
            );
        }
        if h.producer_epoch > entry.epoch {
            return Check::Append;
        }
        let idle = self.newest.saturating_sub(entry.last_timestamp);
        if idle > self.settings.expiration_ms {
            return Check::Refuse(
                SequenceRefusal::Expired,
                format!(
                    "producer id {} expired: its last batch (max_timestamp {}) is {idle} ms older than the partition's \
                 newest batch, beyond storage.producer_id_expiration ({} ms); a late retry is not appended, produce \
                 with a new producer id",
                    h.producer_id, entry.last_timestamp, self.settings.expiration_ms
                ),
            );
        }
        let last = last_sequence(h);
        if let Some(w) = entry.recent.iter().find(|w| w.base_sequence == h.base_sequence && w.last_sequence == last) {
            return Check::Duplicate { base_offset: w.base_offset, last_offset: w.last_offset };
        }
        let expected = entry.recent.back().map_or(0, |w| w.last_sequence.wrapping_add(1));
        if h.base_sequence == expected {
            Check::Append
        } else {
            Check::Refuse(
                SequenceRefusal::OutOfOrder,
                format!(
                    "out-of-order sequence: expected {expected}, got {}; resend the batches in order",
                    h.base_sequence
                ),
            )
        }
    }

    /// Whether `h` may have overtaken earlier batches of its producer that are still on their way (a pipelining
    /// producer's requests can reach the partition out of order): its base sequence is past the next one expected,
    /// or its producer is not known here (new, forgotten, or at a newer epoch) and it does not start at sequence 0.
    /// Such a batch waits a little for the earlier ones before it is judged.
    fn may_have_overtaken(&self, h: &BatchHeader) -> bool {
        if !h.is_idempotent() {
            return false;
        }
        match self.producers.get(&h.producer_id) {
            None => h.base_sequence != 0,
            Some(entry) if h.producer_epoch > entry.epoch => h.base_sequence != 0,
            Some(entry) => {
                h.producer_epoch == entry.epoch
                    && entry.recent.back().is_some_and(|w| h.base_sequence > w.last_sequence.wrapping_add(1))
            }
        }
    }

    /// Whether a request of these batches may have overtaken earlier batches of a producer (see
    /// `may_have_overtaken`); only each producer's first batch in the request counts, as the later ones follow it.
    pub fn request_may_have_overtaken<'a>(&self, headers: impl IntoIterator<Item = &'a BatchHeader>) -> bool {
        let mut seen = Vec::new();
        headers.into_iter().any(|h| {
            let first = !seen.contains(&h.producer_id);
            if first {
                seen.push(h.producer_id);
            }
            first && self.may_have_overtaken(h)
        })
    }

    /// Records a batch written at `base_offset..=last_offset`.
    pub fn record(&mut self, h: &BatchHeader, base_offset: u64, last_offset: u64) {
        self.newest = self.newest.max(h.max_timestamp);
        if !h.is_idempotent() {
            return;
        }
        if !self.producers.contains_key(&h.producer_id) && self.producers.len() >= self.settings.max_producers {
            self.forget_oldest();
        }
        let entry = self.producers.entry(h.producer_id).or_insert_with(|| Entry {
            epoch: h.producer_epoch,
            recent: VecDeque::new(),
            last_timestamp: h.max_timestamp,
        });
        // The newest of its batches, as a batch's max_timestamp need not grow.
        entry.last_timestamp = entry.last_timestamp.max(h.max_timestamp);
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

    /// Forgets the producer id whose last batch is oldest (the lowest id among equals), so that the same log
    /// leaves every replica tracking the same ids.
    fn forget_oldest(&mut self) {
        if let Some(&id) = self.producers.iter().min_by_key(|(id, e)| (e.last_timestamp, **id)).map(|(id, _)| id) {
            self.producers.remove(&id);
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

    /// The verdict on each batch of one request, in order, as if each accepted one had been written at the offsets
    /// it will get, the first at `log_end`: a `Duplicate` of a batch earlier in the same request gets that batch's
    /// offsets. The first refusal ends the plan (with the refused batch's producer id). Changes nothing.
    pub fn plan<'a>(
        &self,
        headers: impl IntoIterator<Item = &'a BatchHeader>,
        log_end: u64,
    ) -> Result<Vec<Check>, (i64, SequenceRefusal, String)> {
        let headers: Vec<&BatchHeader> = headers.into_iter().collect();
        if let [h] = headers[..] {
            // One batch (the usual request): its verdict against the state as it is, without a scratch copy.
            return match self.check(h) {
                Check::Refuse(kind, reason) => Err((h.producer_id, kind, reason)),
                verdict => Ok(vec![verdict]),
            };
        }
        let mut scratch = ProducerStates::new(self.settings);
        scratch.newest = self.newest;
        let mut next = log_end;
        let mut verdicts = Vec::new();
        for h in headers {
            if h.is_idempotent()
                && !scratch.producers.contains_key(&h.producer_id)
                && let Some(entry) = self.producers.get(&h.producer_id)
            {
                scratch.producers.insert(h.producer_id, entry.clone());
            }
            let verdict = scratch.check(h);
            match &verdict {
                Check::Refuse(kind, reason) => return Err((h.producer_id, *kind, reason.clone())),
                Check::Append => {
                    let last = next.saturating_add(u64::from(h.last_offset_delta));
                    scratch.record(h, next, last);
                    next = last.saturating_add(1);
                }
                Check::Duplicate { .. } => {}
            }
            verdicts.push(verdict);
        }
        Ok(verdicts)
    }
}

#[cfg(test)]
impl ProducerStates {
    /// Checks the batches of one request in order, as if each accepted one had been written, without changing
    /// anything: the first refusal, with the refused batch's producer id, or `Ok` when every batch would be
    /// appended or recognised as a duplicate. Lets a request of several batches be refused before any is written.
    pub fn check_all<'a>(
        &self,
        headers: impl IntoIterator<Item = &'a BatchHeader>,
    ) -> Result<(), (i64, SequenceRefusal, String)> {
        self.plan(headers, 0).map(|_| ())
    }
}

#[cfg(test)]
impl Check {
    fn reason(&self) -> String {
        match self {
            Check::Refuse(_, r) => r.clone(),
            other => panic!("not a refusal: {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{BatchBuilder, Compression, ProducerInfo, verify};

    fn header(pid: i64, epoch: i16, seq: i32, count: u32) -> BatchHeader {
        header_at(pid, epoch, seq, count, 1)
    }

    /// A batch whose records all carry timestamp `ts` (so its max_timestamp is `ts`).
    fn header_at(pid: i64, epoch: i16, seq: i32, count: u32, ts: i64) -> BatchHeader {
        let mut b = BatchBuilder::new(
            Compression::None,
            ProducerInfo { producer_id: pid, producer_epoch: epoch, base_sequence: seq },
        );
        for i in 0..count {
            b.push(i, ts, None, Some(b"v"), &[]);
        }
        let h = verify(&b.build(0, 0)).unwrap();
        assert_eq!(h.max_timestamp, ts);
        h
    }

    fn expired(pid: i64, last: i64, idle: i64) -> Check {
        Check::Refuse(
            SequenceRefusal::Expired,
            format!(
                "producer id {pid} expired: its last batch (max_timestamp {last}) is {idle} ms older than the partition's \
             newest batch, beyond storage.producer_id_expiration (1000 ms); a late retry is not appended, produce \
             with a new producer id"
            ),
        )
    }

    #[test]
    fn an_idle_producer_id_expires_by_batch_timestamps_and_its_late_retry_is_refused() {
        let mut s = ProducerStates::new(Settings { expiration_ms: 1000, max_producers: 100, ..Settings::default() });
        let a = header_at(7, 0, 0, 2, 10_000);
        s.record(&a, 0, 1);
        // Another producer moves the partition's newest timestamp to exactly the expiration: not expired yet.
        s.record(&header_at(8, 0, 0, 1, 11_000), 2, 2);
        assert_eq!(s.check(&a), Check::Duplicate { base_offset: 0, last_offset: 1 });
        assert_eq!(s.check(&header_at(7, 0, 2, 1, 11_000)), Check::Append);
        // A plain batch one millisecond newer: producer 7 has been idle 1001 ms of batch time.
        s.record(&header_at(-1, -1, -1, 1, 11_001), 3, 3);
        assert_eq!(s.check(&a), expired(7, 10_000, 1001));
        assert_eq!(s.check(&header_at(7, 0, 2, 1, 11_001)), expired(7, 10_000, 1001));
        assert_eq!(
            s.check_all(&[header(9, 0, 0, 1), a]),
            Err((7, SequenceRefusal::Expired, expired(7, 10_000, 1001).reason()))
        );
        // Producer 8 (idle 1 ms) is still known; a new epoch of producer 7 starts afresh.
        assert_eq!(s.check(&header_at(8, 0, 0, 1, 11_000)), Check::Duplicate { base_offset: 2, last_offset: 2 });
        let fresh = header_at(7, 1, 0, 1, 11_001);
        assert_eq!(s.check(&fresh), Check::Append);
        s.record(&fresh, 4, 4);
        assert_eq!(s.check(&fresh), Check::Duplicate { base_offset: 4, last_offset: 4 });
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn past_the_bound_the_producer_id_with_the_oldest_batch_is_forgotten() {
        let mut s = ProducerStates::new(Settings { expiration_ms: 1000, max_producers: 2, ..Settings::default() });
        s.record(&header_at(7, 0, 0, 1, 500), 0, 0);
        s.record(&header_at(8, 0, 0, 1, 300), 1, 1);
        s.record(&header_at(9, 0, 0, 1, 400), 2, 2);
        assert_eq!(s.len(), 2);
        // 8 is forgotten: its retry is an unknown producer's batch; 7 and 9 are still recognised.
        assert_eq!(s.check(&header_at(8, 0, 0, 1, 300)), Check::Append);
        assert_eq!(s.check(&header_at(7, 0, 0, 1, 500)), Check::Duplicate { base_offset: 0, last_offset: 0 });
        assert_eq!(s.check(&header_at(9, 0, 0, 1, 400)), Check::Duplicate { base_offset: 2, last_offset: 2 });
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
    fn a_batch_past_the_next_expected_sequence_or_a_late_start_of_an_unknown_producer_may_have_overtaken() {
        let mut s = ProducerStates::default();
        assert!(!s.may_have_overtaken(&header(7, 1, 0, 2)), "an unknown producer's first batch");
        assert!(s.may_have_overtaken(&header(7, 1, 5, 1)), "an unknown producer starting past sequence 0");
        s.record(&header(7, 1, 0, 2), 0, 1);
        assert!(!s.may_have_overtaken(&header(7, 1, 2, 1)), "the next expected batch");
        assert!(s.may_have_overtaken(&header(7, 1, 3, 1)), "one batch overtook the one at sequence 2");
        assert!(!s.may_have_overtaken(&header(7, 1, 0, 2)), "a resend of a written batch");
        assert!(!s.may_have_overtaken(&header(7, 2, 0, 1)), "a newer epoch starting afresh");
        assert!(s.may_have_overtaken(&header(7, 2, 9, 1)), "a newer epoch starting past sequence 0");
        assert!(!s.may_have_overtaken(&header(7, 0, 9, 1)), "an older epoch is fenced, not waited for");
        assert!(!s.may_have_overtaken(&header(8, 1, 0, 1)), "another producer's first batch");
        let plain = header(-1, -1, -1, 1);
        assert!(!s.may_have_overtaken(&plain), "a batch without a producer id");
        // In one request, a producer's later batches follow its first.
        let (a, b) = (header(9, 1, 0, 2), header(9, 1, 2, 1));
        assert!(!s.request_may_have_overtaken([&a, &b]));
        assert!(s.request_may_have_overtaken([&b, &a]), "its first batch in the request decides");
        assert!(s.request_may_have_overtaken([&a, &header(7, 1, 3, 1)]), "another producer's first batch overtook");
    }

    #[test]
    fn gaps_and_fenced_epochs_are_refused() {
        let mut s = ProducerStates::default();
        let a = header(7, 1, 0, 1);
        s.record(&a, 0, 0);
        assert!(
            matches!(s.check(&header(7, 1, 5, 1)), Check::Refuse(SequenceRefusal::OutOfOrder, r) if r.contains("expected 1"))
        );
        assert!(
            matches!(s.check(&header(7, 0, 1, 1)), Check::Refuse(SequenceRefusal::Fenced, r) if r.contains("fenced"))
        );
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
        assert!(
            matches!(s.check_all(&bad), Err((8, SequenceRefusal::OutOfOrder, r)) if r.contains("expected 2, got 5"))
        );
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
