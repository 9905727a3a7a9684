//! `Log::append_all`: several batches appended all or nothing. Offsets are assigned as consecutive single appends
//! would assign them; a bad batch anywhere, or a write that fails part-way on a full disk, leaves the log exactly as
//! it was; and what was acknowledged survives a power loss under sync flush.

mod common;

use std::sync::Arc;

use common::*;
use ferry_storage::fs::{PowerLoss, SimFs};
use ferry_storage::{FlushPolicy, Log, LogConfig, ManualClock, StorageError};

fn open(fs: &SimFs, config: LogConfig) -> Log {
    Log::open_on(Arc::new(fs.clone()), "/data/t-0", config, Arc::new(ManualClock::new(1_000))).unwrap()
}

fn sync() -> LogConfig {
    LogConfig { flush: FlushPolicy::Sync, ..LogConfig::default() }
}

#[test]
fn append_all_assigns_consecutive_offsets_and_publishes_every_batch() {
    let fs = SimFs::new();
    let log = open(&fs, sync());
    log.append(&producer_batch(2, 100, "a")).unwrap();
    let (b, c, d) = (producer_batch(3, 200, "b"), producer_batch(1, 300, "c"), producer_batch(2, 400, "d"));
    let infos = log.append_all(&[&b, &c, &d]).unwrap();
    let spans: Vec<(u64, u64, u64)> = infos.iter().map(|i| (i.base_offset, i.last_offset, i.log_end_offset)).collect();
    assert_eq!(spans, vec![(2, 4, 8), (5, 5, 8), (6, 7, 8)]);
    assert_eq!(log.log_end_offset(), 8);
    let mut expected = rebased(&records(0, 2, 100, "a"), 0);
    expected.extend(rebased(&records(0, 3, 200, "b"), 2));
    expected.extend(rebased(&records(0, 1, 300, "c"), 5));
    expected.extend(rebased(&records(0, 2, 400, "d"), 6));
    assert_eq!(read_all(&log), expected);
    // Nothing to append is not an error and changes nothing.
    assert!(log.append_all(&[]).unwrap().is_empty());
    assert_eq!(log.log_end_offset(), 8);
}

#[test]
fn a_bad_batch_anywhere_in_the_call_writes_none_of_them() {
    let fs = SimFs::new();
    let log = open(&fs, LogConfig { max_batch_bytes: 4096, ..sync() });
    log.append(&producer_batch(2, 100, "a")).unwrap();
    let used = fs.used_bytes();
    let good = producer_batch(2, 200, "b");
    let mut corrupt = producer_batch(2, 300, "c").to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let err = log.append_all(&[&good, &corrupt]).unwrap_err();
    assert!(matches!(err, StorageError::InvalidBatch { offset: 4, .. }), "{err:?}");
    let huge = producer_batch(1, 300, &"x".repeat(8192));
    let err = log.append_all(&[&good, &huge]).unwrap_err();
    assert!(matches!(err, StorageError::BatchTooLarge { offset: 4, max: 4096, .. }), "{err:?}");
    assert_eq!((log.log_end_offset(), fs.used_bytes()), (2, used), "a refused call wrote something");
    assert_eq!(read_all(&log), rebased(&records(0, 2, 100, "a"), 0));
}

#[test]
fn a_write_that_fails_part_way_on_a_full_disk_is_taken_back_whole() {
    let fs = SimFs::new();
    let log = open(&fs, sync());
    log.append(&producer_batch(2, 100, "a")).unwrap();
    let (b, c) = (producer_batch(3, 200, "b"), producer_batch(3, 300, "c"));
    // Room for the first batch of the call and a little of the second.
    fs.set_space_limit(Some(fs.used_bytes() + b.len() as u64 + 10));
    let used = fs.used_bytes();
    let err = log.append_all(&[&b, &c]).unwrap_err();
    assert!(matches!(err, StorageError::Io { .. }), "{err:?}");
    assert_eq!((log.log_end_offset(), fs.used_bytes()), (2, used), "part of a failed call stayed in the log");
    assert_eq!(read_all(&log), rebased(&records(0, 2, 100, "a"), 0));

    // Space is back: the same call lands where it would have, and a power loss keeps all of it (sync flush).
    fs.set_space_limit(None);
    let infos = log.append_all(&[&b, &c]).unwrap();
    assert_eq!(infos.iter().map(|i| i.base_offset).collect::<Vec<_>>(), vec![2, 5]);
    let mut expected = rebased(&records(0, 2, 100, "a"), 0);
    expected.extend(rebased(&records(0, 3, 200, "b"), 2));
    expected.extend(rebased(&records(0, 3, 300, "c"), 5));
    assert_eq!(read_all(&log), expected);
    drop(log);
    let after = fs.power_loss(PowerLoss::TornTail, 7);
    let reopened = open(&after, sync());
    assert_eq!(read_all(&reopened), expected);
    assert_eq!(reopened.log_end_offset(), 8);
}

#[test]
fn a_call_that_does_not_fit_the_active_segment_rolls_first_and_lands_whole_in_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 1024, ..sync() };
    let log = Log::open(dir.path(), config.clone()).unwrap();
    let batches: Vec<_> = (0..4).map(|i| producer_batch(2, 200 + 10 * i, "call")).collect();
    let total: u64 = batches.iter().map(|b| b.len() as u64).sum();
    // Fill the first segment until the call no longer fits in it (each fill batch is smaller than the call, so
    // none of them rolls).
    let fill = producer_batch(1, 100, "fill");
    let first_segment = log_path(dir.path(), 0);
    let mut filled = 0;
    while std::fs::metadata(&first_segment).unwrap().len() + total <= 1024 {
        log.append(&fill).unwrap();
        filled += 1;
    }
    assert!(filled > 0);
    let refs: Vec<&[u8]> = batches.iter().map(|b| b.as_ref()).collect();
    let infos = log.append_all(&refs).unwrap();
    let bases: Vec<u64> = infos.iter().map(|i| i.base_offset).collect();
    assert_eq!(bases, vec![filled, filled + 2, filled + 4, filled + 6]);
    // The call rolled a new segment at its first offset and lies whole in it.
    let in_new: Vec<u64> = batch_positions(&log_path(dir.path(), filled)).iter().map(|(_, h)| h.base_offset).collect();
    assert_eq!(in_new, bases);
    assert_eq!(batch_positions(&first_segment).len() as u64, filled);
    let mut expected: Vec<_> = (0..filled).flat_map(|o| rebased(&records(0, 1, 100, "fill"), o)).collect();
    for (i, base) in bases.iter().enumerate() {
        expected.extend(rebased(&records(0, 2, 200 + 10 * i as i64, "call"), *base));
    }
    assert_eq!(read_all(&log), expected);
    drop(log);
    assert_eq!(read_all(&Log::open(dir.path(), config).unwrap()), expected);
}

#[test]
fn the_verified_append_makes_every_check_but_the_crc_pass_and_reads_still_catch_a_bad_crc() {
    let fs = SimFs::new();
    let log = open(&fs, LogConfig { max_batch_bytes: 4096, ..sync() });
    let (a, b) = (producer_batch(2, 100, "a"), producer_batch(3, 200, "b"));
    let infos = log.append_all_verified(&[&a, &b]).unwrap();
    let spans: Vec<(u64, u64)> = infos.iter().map(|i| (i.base_offset, i.last_offset)).collect();
    assert_eq!(spans, vec![(0, 1), (2, 4)]);
    let mut expected = rebased(&records(0, 2, 100, "a"), 0);
    expected.extend(rebased(&records(0, 3, 200, "b"), 2));
    assert_eq!(read_all(&log), expected);
    // Every header check still holds: a cut batch, an oversized one.
    let used = fs.used_bytes();
    let cut = &b[..b.len() - 1];
    let err = log.append_all_verified(&[&a, cut]).unwrap_err();
    assert!(matches!(err, StorageError::InvalidBatch { offset: 7, .. }), "{err:?}");
    let huge = producer_batch(1, 300, &"x".repeat(8192));
    let err = log.append_all_verified(&[&huge]).unwrap_err();
    assert!(matches!(err, StorageError::BatchTooLarge { offset: 5, max: 4096, .. }), "{err:?}");
    assert_eq!((log.log_end_offset(), fs.used_bytes()), (5, used), "a refused call wrote something");
    // The CRC pass is the caller's: a batch it did not verify goes in, and the read that serves it refuses it
    // (the pass every read makes, and `ferryctl verify`, are what catch a bad CRC on disk).
    let mut corrupt = producer_batch(1, 400, "c").to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert!(matches!(log.append_all(&[&corrupt]).unwrap_err(), StorageError::InvalidBatch { offset: 5, .. }));
    log.append_all_verified(&[&corrupt]).unwrap();
    let err = log.read(5, 1 << 20).unwrap_err();
    assert!(matches!(err, StorageError::CorruptSegment { offset: Some(5), .. }), "{err:?}");
}

#[test]
fn the_verified_append_leaves_the_byte_threshold_fsync_to_its_caller_and_that_fsync_survives_a_power_loss() {
    let config = || LogConfig {
        flush: FlushPolicy::Async { interval: std::time::Duration::from_secs(3600), bytes: 1 },
        ..LogConfig::default()
    };
    let a = rebased(&records(0, 2, 100, "a"), 0);
    let mut all = a.clone();
    all.extend(rebased(&records(0, 3, 200, "b"), 2));
    all.extend(records(5, 1, 300, "c"));
    // The same appends on two machines; the power fails before the caller's flush on one, after it on the other.
    for flushed in [false, true] {
        let fs = SimFs::new();
        let log = open(&fs, config());
        // A plain append that crosses the threshold fsyncs before it returns: nothing is over it afterwards.
        log.append_all(&[&producer_batch(2, 100, "a")]).unwrap();
        assert!(!log.over_flush_threshold());
        // A verified one does not: its bytes wait for the caller's flush.
        log.append_all_verified(&[&producer_batch(3, 200, "b")]).unwrap();
        log.append_with_offsets_verified(&batch_of(&records(5, 1, 300, "c"), 0), 0).unwrap();
        assert!(log.over_flush_threshold());
        assert_eq!(read_all(&log), all);
        if flushed {
            assert!(log.flush_over_threshold().unwrap());
            assert!(!log.over_flush_threshold());
            assert!(!log.flush_over_threshold().unwrap(), "nothing is over the threshold after the flush");
        }
        let after = open(&fs.power_loss(PowerLoss::DropUnsynced, 1), config());
        assert_eq!(read_all(&after), if flushed { all.clone() } else { a.clone() }, "flushed: {flushed}");
    }
}
