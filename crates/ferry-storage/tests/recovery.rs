//! Crash and corruption on real files: each damaged log reopens to exactly its last good batch, bumps the epoch
//! and keeps serving; damage inside a sealed segment is a `CorruptSegment` error naming the file and position.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use ferry_batch::{self as batch, Record};
use ferry_storage::{Log, LogConfig, StorageError};

const BATCHES: u64 = 6;
const PER_BATCH: u64 = 3;

fn one_segment_config() -> LogConfig {
    LogConfig { segment_bytes: 1 << 20, index_interval_bytes: 1, ..small_config() }
}

/// Writes six 3-record batches into one segment and drops the log without closing it (an unclean shutdown).
/// Returns the records and each batch's position in the segment file.
fn crashed_log(dir: &Path) -> (Vec<Record>, Vec<u64>) {
    let log = Log::open(dir, one_segment_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..BATCHES {
        let info = log.append(&producer_batch(PER_BATCH, 100 * i as i64, &format!("b{i}"))).unwrap();
        expected.extend(rebased(&records(0, PER_BATCH, 100 * i as i64, &format!("b{i}")), info.base_offset));
    }
    log.flush().unwrap();
    drop(log);
    let positions = batch_positions(&log_path(dir, 0)).into_iter().map(|(p, _)| p).collect::<Vec<_>>();
    assert_eq!(positions.len() as u64, BATCHES);
    (expected, positions)
}

fn flip(path: &Path, at: u64) {
    let file = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0x5a;
    file.write_all_at(&byte, at).unwrap();
}

/// Reopens and checks: exactly `good` batches survive, the epoch went to 1, every offset reads from the right
/// batch, and an append followed by a read works.
fn assert_recovered(dir: &Path, expected: &[Record], good: u64) {
    let log = Log::open(dir, one_segment_config()).unwrap();
    let keep = (good * PER_BATCH) as usize;
    assert_eq!(log.log_end_offset(), good * PER_BATCH);
    assert_eq!(read_all(&log), expected[..keep].to_vec());
    assert_eq!(log.epoch(), 1);
    for offset in 0..log.log_end_offset() {
        let recs = batch::decode_records(&log.read(offset, 1).unwrap().batches).unwrap();
        assert_eq!(recs[0].offset, offset - offset % PER_BATCH);
    }
    let info = log.append(&producer_batch(2, 9, "after")).unwrap();
    assert_eq!((info.base_offset, info.epoch), (good * PER_BATCH, 1));
    let mut now = expected[..keep].to_vec();
    now.extend(rebased(&records(0, 2, 9, "after"), good * PER_BATCH));
    assert_eq!(read_all(&log), now);
    assert_eq!(log.epoch_history().last(), Some(&(1, good * PER_BATCH)));
    log.close().unwrap();
    // The repaired log reopens cleanly as it is.
    let log = Log::open(dir, one_segment_config()).unwrap();
    assert_eq!((read_all(&log), log.epoch()), (now, 1));
    let index_len = std::fs::metadata(index_path(dir, 0)).unwrap().len();
    assert!(index_len > 0 && index_len % 8 == 0);
}

#[test]
fn a_tail_cut_mid_batch_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    let file = OpenOptions::new().write(true).open(log_path(dir.path(), 0)).unwrap();
    file.set_len(pos[5] + 30).unwrap();
    assert_recovered(dir.path(), &expected, 5);
    // Cut inside the header, too.
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    OpenOptions::new().write(true).open(log_path(dir.path(), 0)).unwrap().set_len(pos[4] + 10).unwrap();
    assert_recovered(dir.path(), &expected, 4);
}

#[test]
fn a_flipped_header_byte_cuts_from_that_batch() {
    // CRC-covered header field (first timestamp), the magic byte, and the length field.
    for offset_in_header in [30u64, 16, 10] {
        let dir = tempfile::tempdir().unwrap();
        let (expected, pos) = crashed_log(dir.path());
        flip(&log_path(dir.path(), 0), pos[3] + offset_in_header);
        assert_recovered(dir.path(), &expected, 3);
    }
}

#[test]
fn a_flipped_body_byte_cuts_from_that_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    flip(&log_path(dir.path(), 0), pos[2] + 70);
    assert_recovered(dir.path(), &expected, 2);
}

#[test]
fn with_keep_corrupt_a_flipped_body_byte_keeps_the_batches_after_it_and_reads_of_it_fail() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    flip(&log_path(dir.path(), 0), pos[2] + 70);
    let config = LogConfig { keep_corrupt_batches_followed_by_valid_ones: true, ..one_segment_config() };
    let log = Log::open(dir.path(), config.clone()).unwrap();
    // Nothing cut: the log end is where it was, and every batch but the flipped one reads back exactly.
    assert_eq!(log.log_end_offset(), BATCHES * PER_BATCH);
    for b in 0..BATCHES {
        let read = log.read(b * PER_BATCH, 1);
        if b == 2 {
            assert!(
                matches!(read, Err(StorageError::CorruptSegment { position, offset: Some(6), .. }) if position == pos[2]),
                "{read:?}"
            );
        } else {
            let got = batch::decode_records(&read.unwrap().batches).unwrap();
            let at = (b * PER_BATCH) as usize;
            assert_eq!(got, expected[at..at + PER_BATCH as usize].to_vec());
        }
    }
    // A flip in the last batch has nothing valid after it: a torn tail, cut as without the setting.
    drop(log);
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    flip(&log_path(dir.path(), 0), pos[BATCHES as usize - 1] + 70);
    let log = Log::open(dir.path(), config).unwrap();
    assert_eq!(log.log_end_offset(), (BATCHES - 1) * PER_BATCH);
    assert_eq!(read_all(&log), expected[..((BATCHES - 1) * PER_BATCH) as usize].to_vec());
}

#[test]
fn a_zero_filled_tail_is_dropped() {
    // As after a power loss: the file's length reached the disk, the last batches' bytes did not.
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    let path = log_path(dir.path(), 0);
    let len = std::fs::metadata(&path).unwrap().len();
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&vec![0u8; (len - pos[4]) as usize + 4096], pos[4]).unwrap();
    assert_recovered(dir.path(), &expected, 4);
}

#[test]
fn a_damaged_index_is_rebuilt() {
    // A flipped byte in an entry's position, one in an entry's offset, a torn last entry.
    for (at, cut) in [(Some(8 * 2 + 6), None), (Some(8 * 3 + 3), None), (None, Some(8 * 3 + 5))] {
        let dir = tempfile::tempdir().unwrap();
        let (expected, _) = crashed_log(dir.path());
        let index = index_path(dir.path(), 0);
        assert_eq!(std::fs::metadata(&index).unwrap().len(), 8 * (BATCHES - 1), "one entry per batch after the first");
        if let Some(at) = at {
            flip(&index, at);
        }
        if let Some(cut) = cut {
            OpenOptions::new().write(true).open(&index).unwrap().set_len(cut).unwrap();
        }
        assert_recovered(dir.path(), &expected, BATCHES);
        assert_eq!(std::fs::metadata(&index).unwrap().len() % 8, 0);
    }
}

#[test]
fn a_missing_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, _) = crashed_log(dir.path());
    std::fs::remove_file(index_path(dir.path(), 0)).unwrap();
    assert_recovered(dir.path(), &expected, BATCHES);
    assert!(index_path(dir.path(), 0).exists());
}

#[test]
fn a_clean_log_with_a_broken_active_tail_is_recovered_and_bumped() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, pos) = crashed_log(dir.path());
    // Make it clean first, then damage the chain of headers.
    Log::open(dir.path(), one_segment_config()).unwrap().close().unwrap();
    flip(&log_path(dir.path(), 0), pos[5] + 10);
    let log = Log::open(dir.path(), one_segment_config()).unwrap();
    assert_eq!(log.epoch(), 2, "one bump for the unclean open before, one for the cut");
    assert_eq!(read_all(&log), expected[..15].to_vec());
}

/// A log of several segments, closed cleanly. Returns the records and the segment bases.
fn sealed_log(dir: &Path) -> (Vec<Record>, Vec<u64>) {
    let log = Log::open(dir, small_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..30u64 {
        let info = log.append(&producer_batch(3, i as i64, "s")).unwrap();
        expected.extend(rebased(&records(0, 3, i as i64, "s"), info.base_offset));
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    log.close().unwrap();
    (expected, bases)
}

#[test]
fn a_flipped_body_byte_in_a_sealed_segment_fails_the_read_naming_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, bases) = sealed_log(dir.path());
    let file = log_path(dir.path(), bases[1]);
    let batches = batch_positions(&file);
    let (pos, header) = batches[2];
    flip(&file, pos + 70);
    let log = Log::open(dir.path(), small_config()).unwrap();
    match log.read(header.base_offset, 1) {
        Err(StorageError::CorruptSegment { file: f, position, offset, .. }) => {
            assert_eq!((f, position, offset), (file.clone(), pos, Some(header.base_offset)));
        }
        other => panic!("expected CorruptSegment, got {other:?}"),
    }
    // A read starting earlier stops before the bad batch, and the next one reports it.
    let earlier = log.read(batches[1].1.base_offset, 1).unwrap();
    assert_eq!(earlier.next_offset, header.base_offset);
    let err = log.read(earlier.next_offset, 1 << 20).unwrap_err().to_string();
    assert!(err.contains(&file.display().to_string()) && err.contains(&pos.to_string()), "{err}");
    // Everything else still reads, and the log still takes appends.
    assert_eq!(read_all_from(&log, header.next_offset()), expected[header.next_offset() as usize..].to_vec());
    log.append(&producer_batch(1, 1, "more")).unwrap();
}

fn read_all_from(log: &Log, mut offset: u64) -> Vec<Record> {
    let mut out = Vec::new();
    while offset < log.log_end_offset() {
        let r = log.read(offset, 1 << 20).unwrap();
        for (_, b) in batch::split_verified(&r.batches).unwrap() {
            out.extend(batch::decode_records(&b).unwrap());
        }
        offset = r.next_offset;
    }
    out
}

#[test]
fn a_broken_header_chain_in_a_sealed_segment_fails_the_open_naming_file_and_position() {
    for (unclean, offset_in_header) in [(false, 10u64), (true, 16), (true, 3)] {
        let dir = tempfile::tempdir().unwrap();
        let (_, bases) = sealed_log(dir.path());
        if unclean {
            Log::open(dir.path(), small_config()).unwrap(); // dropped: no marker
        }
        let file = log_path(dir.path(), bases[0]);
        let (pos, header) = batch_positions(&file)[1];
        flip(&file, pos + offset_in_header);
        match Log::open(dir.path(), small_config()) {
            Err(StorageError::CorruptSegment { file: f, position, offset, .. }) => {
                assert_eq!((f, position, offset), (file.clone(), pos, Some(header.base_offset)));
            }
            other => panic!("expected CorruptSegment, got {other:?}"),
        }
    }
}

#[test]
fn unexpected_files_are_reported_or_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, bases) = sealed_log(dir.path());
    std::fs::write(dir.path().join("notes.txt"), "operator notes").unwrap();
    std::fs::write(dir.path().join("epoch.checkpoint.tmp"), "half").unwrap();
    std::fs::write(index_path(dir.path(), 99_999), [0u8; 8]).unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(read_all(&log), expected);
    assert_eq!(log.segment_base_offsets(), bases);
    log.close().unwrap();
    assert!(dir.path().join("notes.txt").exists());
    assert!(!dir.path().join("epoch.checkpoint.tmp").exists());
    assert!(!index_path(dir.path(), 99_999).exists());

    std::fs::write(dir.path().join("12.log"), "").unwrap();
    assert!(
        matches!(Log::open(dir.path(), small_config()), Err(StorageError::BadFile { path, .. }) if path.ends_with("12.log"))
    );
    std::fs::remove_file(dir.path().join("12.log")).unwrap();
    std::fs::write(dir.path().join("epoch.checkpoint"), "garbage").unwrap();
    assert!(
        matches!(Log::open(dir.path(), small_config()), Err(StorageError::BadFile { path, .. }) if path.ends_with("epoch.checkpoint"))
    );
}

#[test]
fn an_unclean_open_with_several_segments_cuts_only_the_active_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, bases) = sealed_log(dir.path());
    Log::open(dir.path(), small_config()).unwrap(); // unclean from here
    let active = log_path(dir.path(), *bases.last().unwrap());
    let batches = batch_positions(&active);
    let (pos, header) = *batches.last().unwrap();
    OpenOptions::new().write(true).open(&active).unwrap().set_len(pos + 5).unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.log_end_offset(), header.base_offset);
    assert_eq!(read_all(&log), expected[..header.base_offset as usize].to_vec());
    assert_eq!(log.segment_base_offsets(), bases);
    assert_eq!(log.epoch(), 1);
}

/// Several segments written under the async policy with no flush at all, then dropped (a crash).
fn unflushed_segments(dir: &Path, flush_before_crash: bool) -> (Vec<Record>, Vec<u64>) {
    let log = Log::open(dir, small_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..30u64 {
        let info = log.append(&producer_batch(3, i as i64, "u")).unwrap();
        expected.extend(rebased(&records(0, 3, i as i64, "u"), info.base_offset));
    }
    if flush_before_crash {
        log.flush().unwrap();
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 4);
    drop(log);
    (expected, bases)
}

#[test]
fn a_sealed_segment_that_was_never_flushed_is_recovered_like_a_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, bases) = unflushed_segments(dir.path(), false);
    // The crash lost the end of the second segment (sealed, not yet fsynced under the async policy).
    let file = log_path(dir.path(), bases[1]);
    let (pos, header) = *batch_positions(&file).last().unwrap();
    OpenOptions::new().write(true).open(&file).unwrap().set_len(pos + 20).unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.log_end_offset(), header.base_offset);
    assert_eq!(read_all(&log), expected[..header.base_offset as usize].to_vec());
    // The segments after the hole are gone, files included; the cut segment is the active one now.
    assert_eq!(log.segment_base_offsets(), bases[..2].to_vec());
    for base in &bases[2..] {
        assert!(!log_path(dir.path(), *base).exists() && !index_path(dir.path(), *base).exists());
    }
    assert_eq!(log.epoch(), 1);
    let info = log.append(&producer_batch(1, 1, "after")).unwrap();
    assert_eq!((info.base_offset, info.epoch), (header.base_offset, 1));
}

#[test]
fn after_a_flush_a_broken_sealed_segment_is_corruption_not_a_lost_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (_, bases) = unflushed_segments(dir.path(), true);
    let recovery_point = std::fs::read_to_string(dir.path().join("recovery-point.checkpoint")).unwrap();
    assert_eq!(recovery_point, format!("ferry-recovery-point v1\n{}\n", bases.last().unwrap()));
    let file = log_path(dir.path(), bases[1]);
    let (pos, header) = *batch_positions(&file).last().unwrap();
    OpenOptions::new().write(true).open(&file).unwrap().set_len(pos + 20).unwrap();
    match Log::open(dir.path(), small_config()) {
        Err(StorageError::CorruptSegment { file: f, position, offset, .. }) => {
            assert_eq!((f, position, offset), (file, pos, Some(header.base_offset)));
        }
        other => panic!("expected CorruptSegment, got {other:?}"),
    }
}
