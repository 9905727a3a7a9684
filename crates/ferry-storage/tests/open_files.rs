//! A log holds a bounded number of open files however its segments roll: sealed segments are opened on demand
//! through a cache of `max_open_segments` files, and every record still reads back exactly.

mod common;

use std::path::Path;

use common::{batch_of, read_all, rebased, records, small_config};
use ferry_batch::Record;
use ferry_storage::{FlushPolicy, Log, LogConfig, OffsetAppendOutcome};

const TS: i64 = 1_700_000_000_000;
const LIMIT: usize = 3;
/// The active segment's `.log` and `.index`, open besides the cache.
const ACTIVE_FILES: usize = 2;

/// Open descriptors of this process on files inside `dir` (nextest runs each test in its own process).
fn open_files_in(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log"))
        .count()
}

fn config(flush: FlushPolicy) -> LogConfig {
    LogConfig { max_open_segments: LIMIT, flush, ..small_config() }
}

/// Appends, then reads everything back and reads every batch's first offset on its own (each in a sealed
/// segment), checking the open files after every step.
fn exercise(dir: &Path, log: &Log, expected: &[Record], peak: &mut usize) {
    *peak = (*peak).max(open_files_in(dir));
    assert_eq!(read_all(log), expected);
    *peak = (*peak).max(open_files_in(dir));
    for r in expected.iter().rev() {
        let got = log.read(r.offset, 1).unwrap();
        let first = ferry_batch::decode_records(&got.batches).unwrap();
        assert_eq!(first.iter().find(|x| x.offset == r.offset), Some(r));
        *peak = (*peak).max(open_files_in(dir));
    }
    assert_eq!(log.offset_for_timestamp(TS + 1_000_000).unwrap(), None);
    *peak = (*peak).max(open_files_in(dir));
}

#[test]
fn small_segments_keep_at_most_the_limit_of_sealed_files_open() {
    for flush in [FlushPolicy::Sync, small_config().flush] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let log = Log::open(&dir, config(flush)).unwrap();
        let mut expected = Vec::new();
        let mut peak = 0;
        for i in 0..60u64 {
            // Each batch is more than half a 1 KiB segment: every append rolls.
            let recs = records(0, 4, TS + i as i64 * 10, &format!("{}-{i}", "v".repeat(120)));
            let info = log.append(&batch_of(&recs, 0)).unwrap();
            expected.extend(rebased(&recs, info.base_offset));
            peak = peak.max(open_files_in(&dir));
        }
        assert_eq!(segment_count(&dir), 60);
        exercise(&dir, &log, &expected, &mut peak);
        assert!(peak <= LIMIT + ACTIVE_FILES, "{flush:?}: {peak} files open, the bound is {}", LIMIT + ACTIVE_FILES);
        assert!(peak >= LIMIT, "the cache is used ({peak} open)");
        // Reopened (a clean start), the log again opens sealed segments on demand only.
        log.close().unwrap();
        drop(log);
        assert_eq!(open_files_in(&dir), 0);
        let log = Log::open(&dir, config(flush)).unwrap();
        let mut peak = open_files_in(&dir);
        assert_eq!(peak, ACTIVE_FILES, "a reopened log holds only its active segment open");
        exercise(&dir, &log, &expected, &mut peak);
        assert!(peak <= LIMIT + ACTIVE_FILES, "reopened: {peak} files open");
    }
}

#[test]
fn sparse_mirrored_batches_that_roll_every_append_keep_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    // Large segments: only the offset span (2^32 per batch, the most a batch can claim) forces the rolls.
    let log = Log::open(&dir, LogConfig { segment_bytes: 1 << 30, ..config(small_config().flush) }).unwrap();
    let mut expected = Vec::new();
    let mut peak = 0;
    let span = 1u64 << 32;
    for i in 0..40u64 {
        // One record at the start and one at the end of a sparse span, as a compacted source leaves them.
        let base = i * span;
        let mut recs = records(base, 1, TS + i as i64, "first");
        recs.extend(records(base + span - 1, 1, TS + i as i64, "last"));
        let outcome = log.append_with_offsets(&batch_of(&recs, 0), 0).unwrap();
        assert_eq!(outcome, OffsetAppendOutcome::Appended { written: 1, present: 0, log_end_offset: base + span });
        expected.extend(recs);
        peak = peak.max(open_files_in(&dir));
    }
    assert_eq!(segment_count(&dir), 40);
    exercise(&dir, &log, &expected, &mut peak);
    assert!(peak <= LIMIT + ACTIVE_FILES, "{peak} files open, the bound is {}", LIMIT + ACTIVE_FILES);
    // Truncating back to a sealed segment makes it the active one (its file held open again), and appends
    // continue there.
    let cut = expected[40].offset;
    assert_eq!(log.truncate_to(cut).unwrap(), cut);
    expected.truncate(40);
    assert_eq!(read_all(&log), expected);
    let more = records(cut, 1, TS + 100, "after");
    log.append_with_offsets(&batch_of(&more, 0), 0).unwrap();
    expected.extend(more);
    assert_eq!(read_all(&log), expected);
    assert!(open_files_in(&dir) <= LIMIT + ACTIVE_FILES);
}
