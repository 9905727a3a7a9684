//! The last read of a log, kept for the next reader that asks the same question.
//!
//! A replicated partition's leader answers each follower's fetch with a read from the same offset with the same
//! budget, moments apart (`Log::read_shared`). The second such read would `pread` and CRC-check the same bytes
//! again. Plain reads (consumers, verification) never use a kept read: they always read and check the file. A [`RecentRead`] holds the last result and hands it to the next read only when a fresh read
//! would return exactly the same batches:
//! - the same offset and byte budget;
//! - the same generation (no truncation, retention or compaction removed or rewrote bytes since);
//! - the same log end, or the cached read stopped short of the log end then (budget-bound: a fresh read stops at the
//!   same batch), and the offset still at or above the log start.
//!
//! The bytes were read from the segment file and CRC-checked by that first read; handing them on from memory does
//! not skip a check where corruption could enter. A hit takes the entry (a third reader reads the file again), so a
//! cached result is used at most twice.
//!
//! Memory is bounded process-wide: entries together hold at most [`RECENT_READ_BUDGET`] bytes; beyond it nothing
//! more is kept until entries are taken or replaced. An entry is released when taken, replaced or its log dropped.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::types::ReadResult;

/// Bytes all logs' kept reads may hold at once.
const RECENT_READ_BUDGET: usize = 64 << 20;
/// The largest read kept (a bigger one is rarely asked for twice at the same offset).
const MAX_KEPT: usize = 4 << 20;

static HELD: AtomicUsize = AtomicUsize::new(0);

/// What a read was asked and what it answered.
struct Kept {
    offset: u64,
    max_bytes: u64,
    generation: u64,
    batches: Bytes,
    next_offset: u64,
    log_end_offset: u64,
}

impl Drop for Kept {
    fn drop(&mut self) {
        HELD.fetch_sub(self.batches.len(), Ordering::Relaxed);
    }
}

/// The log's view now, to check a kept read against.
pub(crate) struct Now {
    pub generation: u64,
    pub log_start_offset: u64,
    pub log_end_offset: u64,
    pub epoch: u32,
}

/// One log's last kept read.
#[derive(Default)]
pub(crate) struct RecentRead(Mutex<Option<Kept>>);

impl RecentRead {
    /// The kept answer to `(offset, max_bytes)` if a fresh read now would return the same batches; taken.
    pub fn take(&self, offset: u64, max_bytes: u64, now: &Now) -> Option<ReadResult> {
        let mut slot = self.0.lock();
        let kept = slot.as_ref()?;
        let same_question = kept.offset == offset && kept.max_bytes == max_bytes && kept.generation == now.generation;
        let same_answer = kept.log_end_offset == now.log_end_offset || kept.next_offset < kept.log_end_offset;
        if !(same_question && same_answer && offset >= now.log_start_offset) {
            return None;
        }
        let kept = slot.take()?;
        Some(ReadResult {
            batches: kept.batches.clone(),
            next_offset: kept.next_offset,
            log_start_offset: now.log_start_offset,
            log_end_offset: now.log_end_offset,
            epoch: now.epoch,
        })
    }

    /// Keeps `result`, the answer to `(offset, max_bytes)` read wholly within `generation`, if it fits the budget.
    pub fn keep(&self, offset: u64, max_bytes: u64, generation: u64, result: &ReadResult) {
        let len = result.batches.len();
        if len == 0 || len > MAX_KEPT {
            return;
        }
        let mut slot = self.0.lock();
        // The entry this one replaces is released first, so a log never holds two.
        *slot = None;
        if HELD.fetch_add(len, Ordering::Relaxed) + len > RECENT_READ_BUDGET {
            HELD.fetch_sub(len, Ordering::Relaxed);
            return;
        }
        *slot = Some(Kept {
            offset,
            max_bytes,
            generation,
            batches: result.batches.clone(),
            next_offset: result.next_offset,
            log_end_offset: result.log_end_offset,
        });
    }
}

/// Bytes all kept reads hold now.
#[cfg(test)]
fn recent_read_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(bytes: &'static [u8], next: u64, end: u64) -> ReadResult {
        ReadResult {
            batches: Bytes::from_static(bytes),
            next_offset: next,
            log_start_offset: 0,
            log_end_offset: end,
            epoch: 0,
        }
    }

    fn now(generation: u64, start: u64, end: u64) -> Now {
        Now { generation, log_start_offset: start, log_end_offset: end, epoch: 3 }
    }

    #[test]
    fn a_kept_read_answers_only_the_same_question_about_the_same_log_once() {
        let cases: [(&str, u64, u64, Now, bool); 7] = [
            ("same question, same log", 10, 100, now(1, 0, 20), true),
            ("another offset", 11, 100, now(1, 0, 20), false),
            ("another budget", 10, 99, now(1, 0, 20), false),
            ("bytes removed or rewritten since", 10, 100, now(2, 0, 20), false),
            ("more was appended since (the read reached the end)", 10, 100, now(1, 0, 21), false),
            ("the log start passed the offset", 10, 100, now(1, 11, 20), false),
            ("same question, same log, again", 10, 100, now(1, 0, 20), true),
        ];
        for (what, offset, max, view, hit) in cases {
            let recent = RecentRead::default();
            recent.keep(10, 100, 1, &result(b"batch", 20, 20));
            let got = recent.take(offset, max, &view);
            assert_eq!(got.is_some(), hit, "{what}");
            if let Some(got) = got {
                assert_eq!((&got.batches[..], got.next_offset, got.epoch), (&b"batch"[..], 20, 3), "{what}");
                assert!(recent.take(offset, max, &view).is_none(), "{what}: a kept read is used once");
            }
        }
        // A budget-bound read (it stopped short of the end then) still answers after more was appended.
        let recent = RecentRead::default();
        recent.keep(10, 100, 1, &result(b"batch", 15, 20));
        assert_eq!(recent.take(10, 100, &now(1, 0, 30)).map(|r| (r.next_offset, r.log_end_offset)), Some((15, 30)));
    }

    #[test]
    fn kept_reads_count_against_the_budget_and_release_their_bytes() {
        // Each test runs in a process of its own under the suite's runner, so the process-wide count is this test's.
        let before = recent_read_bytes();
        let recent = RecentRead::default();
        recent.keep(0, 10, 0, &result(b"0123456789", 1, 1));
        assert_eq!(recent_read_bytes(), before + 10);
        recent.keep(0, 10, 0, &result(b"01234", 1, 1));
        assert_eq!(recent_read_bytes(), before + 5, "a replaced read is released");
        assert!(recent.take(0, 10, &now(0, 0, 1)).is_some());
        assert_eq!(recent_read_bytes(), before, "a taken read is released");
        recent.keep(0, 10, 0, &result(b"01234", 1, 1));
        drop(recent);
        assert_eq!(recent_read_bytes(), before, "a dropped log's read is released");
    }
}
