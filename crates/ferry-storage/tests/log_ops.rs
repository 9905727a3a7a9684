//! Behaviour of each log operation through the public API: append, read, roll, timestamp lookup, truncation,
//! retention, epochs, flushing, header scans, close and delete, bad input.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_batch::{self as batch, Compression, ProducerInfo};
use ferry_storage::{EpochEnd, FlushPolicy, Log, LogConfig, ManualClock, StorageError};

#[test]
fn append_assigns_offsets_and_reads_return_exact_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset(), log.epoch()), (0, 0, 0));

    let first = log.append(&producer_batch(3, 1000, "a")).unwrap();
    assert_eq!((first.base_offset, first.last_offset, first.epoch, first.log_end_offset), (0, 2, 0, 3));
    let second = log.append(&producer_batch(2, 2000, "b")).unwrap();
    assert_eq!((second.base_offset, second.last_offset, second.log_end_offset), (3, 4, 5));

    let mut expected = rebased(&records(0, 3, 1000, "a"), 0);
    expected.extend(rebased(&records(0, 2, 2000, "b"), 3));
    assert_eq!(read_all(&log), expected);

    // A read from inside a batch starts with that whole batch.
    let r = log.read(1, 1 << 20).unwrap();
    let batches = batch::split_verified(&r.batches).unwrap();
    assert_eq!(batches.iter().map(|(h, _)| h.base_offset).collect::<Vec<_>>(), vec![0, 3]);
    assert_eq!((r.next_offset, r.log_start_offset, r.log_end_offset, r.epoch), (5, 0, 5, 0));

    // A tiny max_bytes still returns one whole batch.
    let r = log.read(3, 1).unwrap();
    let batches = batch::split_verified(&r.batches).unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batch::decode_records(&batches[0].1).unwrap(), expected[3..].to_vec());
    assert_eq!(r.next_offset, 5);

    // At the log end: nothing, and the offset comes back.
    let r = log.read(5, 1 << 20).unwrap();
    assert!(r.batches.is_empty());
    assert_eq!(r.next_offset, 5);
}

#[test]
fn bad_input_gets_typed_errors_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { max_batch_bytes: 512, ..LogConfig::default() };
    let log = Log::open(dir.path(), config).unwrap();
    log.append(&producer_batch(2, 1, "ok")).unwrap();
    log.flush().unwrap();
    let sizes = file_sizes(dir.path());

    match log.read(3, 100) {
        Err(StorageError::OffsetOutOfRange { dir: d, offset: 3, log_start: 0, log_end: 2 }) => {
            assert_eq!(d, dir.path())
        }
        other => panic!("expected OffsetOutOfRange, got {other:?}"),
    }
    let msg = log.read(99, 1).unwrap_err().to_string();
    assert!(msg.contains("99") && msg.contains(&dir.path().display().to_string()), "{msg}");

    let big = batch_of(&[rec(0, 1, None, Some(&"x".repeat(1000)), &[])], 0);
    match log.append(&big) {
        Err(StorageError::BatchTooLarge { dir: d, offset: 2, size, max: 512 }) => {
            assert_eq!((d.as_path(), size), (dir.path(), big.len() as u64))
        }
        other => panic!("expected BatchTooLarge, got {other:?}"),
    }

    let mut bad_crc = producer_batch(1, 1, "c").to_vec();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    match log.append(&bad_crc) {
        Err(StorageError::InvalidBatch { dir: d, offset: 2, source: batch::BatchError::CrcMismatch { .. } }) => {
            assert_eq!(d, dir.path())
        }
        other => panic!("expected InvalidBatch(CrcMismatch), got {other:?}"),
    }
    // Truncated and over-long buffers are refused too.
    let good = producer_batch(1, 1, "d");
    assert!(matches!(log.append(&good[..good.len() - 1]), Err(StorageError::InvalidBatch { offset: 2, .. })));
    let mut two = good.to_vec();
    two.extend_from_slice(&good);
    assert!(matches!(log.append(&two), Err(StorageError::InvalidBatch { offset: 2, .. })));
    assert!(matches!(log.append(&[]), Err(StorageError::InvalidBatch { offset: 2, .. })));

    assert_eq!(log.log_end_offset(), 2);
    log.flush().unwrap();
    assert_eq!(file_sizes(dir.path()), sizes);
    assert_eq!(read_all(&log), rebased(&records(0, 2, 1, "ok"), 0));
}

#[test]
fn segments_roll_on_size_and_on_age() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let config = LogConfig { segment_bytes: 1000, segment_ms: 60_000, ..small_config() };
    let log = Log::open_with_clock(dir.path(), config, clock.clone()).unwrap();
    let b = producer_batch(4, 1, "roll");
    let len = b.len() as u64;
    let per_segment = 1000 / len;
    for _ in 0..per_segment {
        log.append(&b).unwrap();
    }
    assert_eq!(log.segment_base_offsets(), vec![0]);
    log.append(&b).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![0, 4 * per_segment]);
    assert!(log.stats().size_bytes == len * (per_segment + 1));

    // Age: the active segment's first append was at 1_000_000; one ms short of the limit nothing rolls.
    clock.advance(59_999);
    log.append(&b).unwrap();
    assert_eq!(log.segment_base_offsets().len(), 2);
    clock.advance(1);
    let info = log.append(&b).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![0, 4 * per_segment, info.base_offset]);
    assert_eq!(
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "index"))
            .count(),
        3
    );
    assert_eq!(read_all(&log).len() as u64, log.log_end_offset());
}

#[test]
fn reads_use_the_index_across_many_batches_and_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..60u64 {
        let n = 1 + i % 4;
        let info = log.append(&producer_batch(n, i as i64 * 10, &format!("r{i}"))).unwrap();
        expected.extend(rebased(&records(0, n, i as i64 * 10, &format!("r{i}")), info.base_offset));
    }
    assert!(log.segment_base_offsets().len() > 3);
    // Every offset reads back from the batch that holds it.
    for offset in 0..log.log_end_offset() {
        let r = log.read(offset, 1).unwrap();
        let recs = batch::decode_records(&r.batches).unwrap();
        assert!(recs.first().unwrap().offset <= offset && recs.last().unwrap().offset >= offset);
        assert_eq!(
            recs,
            expected.iter().filter(|e| recs.iter().any(|r| r.offset == e.offset)).cloned().collect::<Vec<_>>()
        );
    }
    assert_eq!(read_all(&log), expected);
    // The index files hold whole entries and at least one entry per full segment.
    log.close().unwrap();
    for base in Log::open(dir.path(), small_config()).unwrap().segment_base_offsets() {
        let len = std::fs::metadata(index_path(dir.path(), base)).unwrap().len();
        assert_eq!(len % 8, 0);
    }
}

#[test]
fn offset_for_timestamp_finds_the_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    // Batches whose timestamps go up by 100 per batch, records within a batch out of order.
    for i in 0..30i64 {
        let recs = vec![
            rec(0, i * 100 + 50, None, Some("a"), &[]),
            rec(1, i * 100 + 10, None, Some("b"), &[]),
            rec(2, i * 100 + 70, None, Some("c"), &[]),
        ];
        log.append(&batch_of(&recs, 0)).unwrap();
    }
    assert!(log.segment_base_offsets().len() > 2);
    assert_eq!(log.offset_for_timestamp(i64::MIN).unwrap(), Some(0));
    assert_eq!(log.offset_for_timestamp(0).unwrap(), Some(0));
    assert_eq!(log.offset_for_timestamp(50).unwrap(), Some(0));
    assert_eq!(log.offset_for_timestamp(51).unwrap(), Some(2));
    assert_eq!(log.offset_for_timestamp(70).unwrap(), Some(2));
    assert_eq!(log.offset_for_timestamp(71).unwrap(), Some(3));
    assert_eq!(log.offset_for_timestamp(2555).unwrap(), Some(25 * 3 + 2));
    assert_eq!(log.offset_for_timestamp(2970).unwrap(), Some(29 * 3 + 2));
    assert_eq!(log.offset_for_timestamp(2971).unwrap(), None);
}

#[test]
fn truncate_to_cuts_at_batch_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..40u64 {
        let info = log.append(&producer_batch(3, i as i64, "t")).unwrap();
        expected.extend(rebased(&records(0, 3, i as i64, "t"), info.base_offset));
    }
    let segments = log.segment_base_offsets();
    assert!(segments.len() > 3);

    // Beyond the end: nothing changes.
    assert_eq!(log.truncate_to(500).unwrap(), 120);
    // Inside a batch: cut at its start.
    assert_eq!(log.truncate_to(100).unwrap(), 99);
    assert_eq!(read_all(&log), expected[..99].to_vec());
    // At a boundary that is also a segment base: that segment empties and becomes the active one.
    let base = segments[2];
    assert_eq!(log.truncate_to(base).unwrap(), base);
    assert_eq!(log.segment_base_offsets(), segments[..3].to_vec());
    assert_eq!(read_all(&log), expected[..base as usize].to_vec());
    // Appends continue at the new end.
    let info = log.append(&producer_batch(2, 7, "after")).unwrap();
    assert_eq!(info.base_offset, base);
    let mut now = expected[..base as usize].to_vec();
    now.extend(rebased(&records(0, 2, 7, "after"), base));
    assert_eq!(read_all(&log), now);
    // A clean reopen sees the same.
    log.close().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(read_all(&log), now);
    assert_eq!(log.epoch(), 0);
    // Below the log start: the log empties and restarts at the offset.
    log.set_config(LogConfig { retention_bytes: Some(0), ..small_config() });
    assert!(log.apply_retention(0).unwrap() > 0);
    let start = log.log_start_offset();
    assert!(start > 0);
    assert_eq!(log.truncate_to(start - 1).unwrap(), start - 1);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (start - 1, start - 1));
    assert_eq!(log.segment_base_offsets(), vec![start - 1]);
    assert!(read_all(&log).is_empty());
    let info = log.append(&producer_batch(1, 1, "fresh")).unwrap();
    assert_eq!(info.base_offset, start - 1);
}

#[test]
fn truncation_drops_later_epoch_history() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    log.append(&producer_batch(5, 1, "e0")).unwrap();
    drop(log); // unclean
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.epoch(), 1);
    log.append(&producer_batch(5, 1, "e1")).unwrap();
    assert_eq!(log.epoch_history(), vec![(0, 0), (1, 5)]);
    assert_eq!(log.truncate_to(7).unwrap(), 5);
    assert_eq!(log.epoch_history(), vec![(0, 0)]);
    // The current epoch stays: the next append is epoch 1 again, starting at 5.
    let info = log.append(&producer_batch(1, 1, "again")).unwrap();
    assert_eq!((info.base_offset, info.epoch), (5, 1));
    assert_eq!(log.epoch_history(), vec![(0, 0), (1, 5)]);
}

#[test]
fn retention_by_bytes_and_by_age_deletes_whole_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..40u64 {
        let ts = 1_000 * i as i64;
        let info = log.append(&producer_batch(3, ts, "r")).unwrap();
        expected.extend(rebased(&records(0, 3, ts, "r"), info.base_offset));
    }
    let segments = log.segment_base_offsets();
    let n = segments.len();
    assert!(n >= 5);
    let end = log.log_end_offset();

    // Nothing configured: nothing deleted.
    assert_eq!(log.apply_retention(i64::MAX).unwrap(), 0);

    // By age: segments whose newest record is older than now - retention_ms.
    let cutoff_ts = expected.iter().find(|r| r.offset == segments[2]).unwrap().timestamp;
    log.set_config(LogConfig { retention_ms: Some(10), ..small_config() });
    assert_eq!(log.apply_retention(cutoff_ts + 10).unwrap(), 2);
    assert_eq!(log.log_start_offset(), segments[2]);
    assert_eq!(read_all(&log), expected[segments[2] as usize..].to_vec());
    assert!(
        matches!(log.read(0, 1), Err(StorageError::OffsetOutOfRange { log_start, .. }) if log_start == segments[2])
    );
    assert!(!log_path(dir.path(), segments[0]).exists() && !index_path(dir.path(), segments[0]).exists());

    // By bytes: keep the total at or under the limit as far as whole sealed segments allow.
    let total = log.stats().size_bytes;
    let first_size = std::fs::metadata(log_path(dir.path(), segments[2])).unwrap().len();
    log.set_config(LogConfig { retention_bytes: Some(total - first_size), ..small_config() });
    assert_eq!(log.apply_retention(0).unwrap(), 1);
    assert_eq!(log.log_start_offset(), segments[3]);

    // Everything: only the active segment stays, and the log end does not move.
    log.set_config(LogConfig { retention_bytes: Some(0), ..small_config() });
    assert_eq!(log.apply_retention(0).unwrap(), n - 4);
    assert_eq!(log.segment_base_offsets(), vec![segments[n - 1]]);
    assert_eq!(log.log_end_offset(), end);
    assert_eq!(log.apply_retention(i64::MAX).unwrap(), 0);
    assert_eq!(read_all(&log), expected[segments[n - 1] as usize..].to_vec());
}

#[test]
fn rolling_and_deleting_segments_before_an_offset_keep_the_segment_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let mut expected = Vec::new();
    for i in 0..40u64 {
        let info = log.append(&producer_batch(3, i as i64, "d")).unwrap();
        expected.extend(rebased(&records(0, 3, i as i64, "d"), info.base_offset));
    }
    let segments = log.segment_base_offsets();
    let n = segments.len();
    assert!(n >= 5);
    // Below the second segment's base: only whole segments ending at or before the offset go.
    assert_eq!(log.delete_segments_before(segments[1] - 1).unwrap(), 0);
    assert_eq!(log.delete_segments_before(segments[1]).unwrap(), 1);
    assert_eq!(log.log_start_offset(), segments[1]);
    // An offset inside the third segment keeps it.
    assert_eq!(log.delete_segments_before(segments[2] + 1).unwrap(), 1);
    assert_eq!(log.segment_base_offsets(), segments[2..].to_vec());
    assert_eq!(read_all(&log), expected[segments[2] as usize..].to_vec());
    // Past the log end: every sealed segment goes, the active one stays and the log end does not move.
    let end = log.log_end_offset();
    assert_eq!(log.delete_segments_before(u64::MAX).unwrap(), n - 3);
    assert_eq!(log.segment_base_offsets(), vec![segments[n - 1]]);
    assert_eq!(log.log_end_offset(), end);
    // A roll seals the active segment at the log end; an empty active segment does not roll.
    assert!(log.roll().unwrap());
    assert_eq!(log.segment_base_offsets(), vec![segments[n - 1], end]);
    assert!(!log.roll().unwrap());
    log.close().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![segments[n - 1], end]);
    assert_eq!(log.log_start_offset(), segments[n - 1]);
    assert_eq!(read_all(&log), expected[segments[n - 1] as usize..].to_vec());
}

#[test]
fn epochs_bump_on_unclean_open_and_answer_epoch_end() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.epoch_end(0), None);
    log.append(&producer_batch(4, 1, "a")).unwrap();
    assert_eq!(log.epoch_history(), vec![(0, 0)]);
    assert_eq!(log.epoch_end(0), Some(EpochEnd { epoch: 0, end_offset: 4 }));
    log.close().unwrap();
    assert!(matches!(log.append(&producer_batch(1, 1, "x")), Err(StorageError::Closed { .. })));
    assert!(matches!(log.read(0, 1), Err(StorageError::Closed { .. })));

    // Clean: same epoch.
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.epoch(), 0);
    log.append(&producer_batch(2, 1, "b")).unwrap();
    drop(log);

    // Unclean: bumped, and the history entry comes with the first batch of the new epoch.
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.epoch(), 1);
    assert_eq!(log.epoch_history(), vec![(0, 0)]);
    assert_eq!(log.epoch_end(0), Some(EpochEnd { epoch: 0, end_offset: 6 }));
    let info = log.append(&producer_batch(3, 1, "c")).unwrap();
    assert_eq!((info.base_offset, info.epoch), (6, 1));
    assert_eq!(log.epoch_history(), vec![(0, 0), (1, 6)]);
    assert_eq!(log.epoch_end(0), Some(EpochEnd { epoch: 0, end_offset: 6 }));
    assert_eq!(log.epoch_end(1), Some(EpochEnd { epoch: 1, end_offset: 9 }));
    assert_eq!(log.epoch_end(7), Some(EpochEnd { epoch: 1, end_offset: 9 }));
    drop(log);

    // Unclean again without appends: epoch 2, and epoch 1 still ends at the log end.
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.epoch(), 2);
    assert_eq!(log.epoch_end(1), Some(EpochEnd { epoch: 1, end_offset: 9 }));
    assert_eq!(log.epoch_end(2), Some(EpochEnd { epoch: 1, end_offset: 9 }));
    let headers: Vec<(u64, u32)> =
        read_all_batches(&log, 1 << 20).iter().map(|(h, _)| (h.base_offset, h.epoch)).collect();
    assert_eq!(headers, vec![(0, 0), (4, 0), (6, 1)]);
}

#[test]
fn async_flush_interval_is_driven_by_flush_if_due() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let config = LogConfig {
        flush: FlushPolicy::Async { interval: Duration::from_millis(500), bytes: u64::MAX },
        ..small_config()
    };
    let log = Log::open_with_clock(dir.path(), config, clock.clone()).unwrap();
    assert!(!log.flush_if_due().unwrap(), "nothing to flush");
    log.append(&producer_batch(1, 1, "f")).unwrap();
    clock.advance(499);
    assert!(!log.flush_if_due().unwrap());
    clock.advance(1);
    assert!(log.flush_if_due().unwrap());
    assert!(!log.flush_if_due().unwrap(), "flushed already");

    // Sync never has anything due; appends are durable on return.
    log.set_config(LogConfig { flush: FlushPolicy::Sync, ..small_config() });
    log.append(&producer_batch(1, 1, "s")).unwrap();
    clock.advance(10_000);
    assert!(!log.flush_if_due().unwrap());
    // Async by bytes: the append that crosses the threshold flushes.
    log.set_config(LogConfig {
        flush: FlushPolicy::Async { interval: Duration::from_secs(3600), bytes: 1 },
        ..small_config()
    });
    log.append(&producer_batch(1, 1, "b")).unwrap();
    assert!(!log.flush_if_due().unwrap(), "the byte threshold flushed already");
    assert_eq!(read_all(&log).len(), 3);
}

#[test]
fn header_scan_visits_every_batch_from_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let producer = ProducerInfo { producer_id: 77, producer_epoch: 2, base_sequence: 0 };
    for i in 0..30u64 {
        let p = ProducerInfo { base_sequence: (i * 2) as i32, ..producer };
        log.append(&batch::encode_records(&records(0, 2, 1, "p"), 0, Compression::None, p)).unwrap();
    }
    let mut seen = Vec::new();
    log.for_each_batch_header(31, &mut |h| seen.push((h.base_offset, h.producer_id, h.base_sequence))).unwrap();
    let want: Vec<_> = (15..30u64).map(|i| (i * 2, 77, (i * 2) as i32)).collect();
    assert_eq!(seen, want);
    let mut count = 0;
    log.for_each_batch_header(0, &mut |_| count += 1).unwrap();
    assert_eq!(count, 30);
}

#[test]
fn zstd_batches_are_stored_and_served_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    let recs = records(0, 50, 5, "zstd zstd zstd zstd");
    let b = batch::encode_records(&recs, 0, Compression::Zstd, ProducerInfo::NONE);
    log.append(&b).unwrap();
    let r = log.read(0, 1 << 20).unwrap();
    assert_eq!(&r.batches[21..], &b[21..], "bytes after the stamped fields are stored as given");
    assert_eq!(read_all(&log), recs);
}

#[test]
fn stats_close_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topic").join("0");
    let log = Log::open(&path, small_config()).unwrap();
    for _ in 0..20 {
        log.append(&producer_batch(2, 1, "s")).unwrap();
    }
    let stats = log.stats();
    assert_eq!((stats.log_start_offset, stats.log_end_offset, stats.epoch), (0, 40, 0));
    assert_eq!(stats.segments as usize, log.segment_base_offsets().len());
    let on_disk: u64 =
        log.segment_base_offsets().iter().map(|b| std::fs::metadata(log_path(&path, *b)).unwrap().len()).sum();
    assert_eq!(stats.size_bytes, on_disk);
    assert!(stats.gaps.is_empty());
    log.close().unwrap();
    log.close().unwrap();
    assert!(path.join("clean-shutdown").exists());
    assert_eq!(log.log_end_offset(), 40);
    assert!(matches!(log.flush(), Err(StorageError::Closed { .. })));
    assert!(matches!(log.truncate_to(3), Err(StorageError::Closed { .. })));
    let log = Log::open(&path, small_config()).unwrap();
    assert!(!path.join("clean-shutdown").exists(), "the marker is removed on open");
    log.delete().unwrap();
    assert!(!path.exists());
    assert!(matches!(log.append(&producer_batch(1, 1, "x")), Err(StorageError::Closed { .. })));
}

#[test]
fn concurrent_readers_see_only_whole_batches_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 8 * 1024, index_interval_bytes: 512, ..small_config() };
    let log = Arc::new(Log::open(dir.path(), config).unwrap());
    const BATCHES: u64 = 400;
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let log = log.clone();
        let finished = finished.clone();
        std::thread::spawn(move || {
            for i in 0..BATCHES {
                let n = 1 + i % 5;
                // Every record's value names its offset, so readers can check any prefix.
                let base = log.log_end_offset();
                let recs: Vec<_> =
                    (0..n).map(|j| rec(j, i as i64, None, Some(&format!("v{}", base + j)), &[])).collect();
                log.append(&batch_of(&recs, 0)).unwrap();
            }
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let log = log.clone();
            let finished = finished.clone();
            std::thread::spawn(move || {
                let mut rounds = 0u64;
                loop {
                    // Checked before the pass, so the last pass starts after the last append.
                    let done = finished.load(std::sync::atomic::Ordering::SeqCst);
                    let mut offset = 0;
                    let mut seen = 0u64;
                    loop {
                        let r = log.read(offset, 3000).unwrap();
                        if r.batches.is_empty() {
                            break;
                        }
                        // Whole, verified batches only (split_verified fails on a partial batch).
                        for (_, b) in batch::split_verified(&r.batches).unwrap() {
                            for record in batch::decode_records(&b).unwrap() {
                                assert_eq!(record.offset, seen, "offsets are a gapless prefix");
                                assert_eq!(record.value.as_deref(), Some(format!("v{seen}").as_bytes()));
                                seen += 1;
                            }
                        }
                        assert!(r.next_offset <= r.log_end_offset);
                        offset = r.next_offset;
                    }
                    rounds += 1;
                    if done {
                        assert_eq!(seen, log.log_end_offset(), "the last pass sees everything");
                        return rounds;
                    }
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let total: u64 = (0..BATCHES).map(|i| 1 + i % 5).sum();
    assert_eq!(log.log_end_offset(), total);
    assert_eq!(read_all(&log).len() as u64, total);
}

#[test]
fn log_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Log>();
}

#[test]
fn sync_policy_keeps_sealed_segments_durable_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { flush: FlushPolicy::Sync, ..small_config() };
    let log = Log::open(dir.path(), config.clone()).unwrap();
    let mut expected = Vec::new();
    for i in 0..20u64 {
        let info = log.append(&producer_batch(3, i as i64, "sync")).unwrap();
        expected.extend(rebased(&records(0, 3, i as i64, "sync"), info.base_offset));
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() > 2);
    // Every roll under the sync policy moved the recovery point to the new active segment.
    let point = std::fs::read_to_string(dir.path().join("recovery-point.checkpoint")).unwrap();
    assert_eq!(point, format!("ferry-recovery-point v1\n{}\n", bases.last().unwrap()));
    drop(log); // unclean
    let log = Log::open(dir.path(), config).unwrap();
    assert_eq!((read_all(&log), log.epoch(), log.segment_base_offsets()), (expected, 1, bases));
}

#[test]
fn bytes_from_counts_the_log_from_a_batch_to_the_end_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    // Every batch indexed: the count is exact at batch boundaries.
    let config = LogConfig { segment_bytes: 1000, index_interval_bytes: 1, ..small_config() };
    let log = Log::open(dir.path(), config).unwrap();
    let mut batches = Vec::new();
    for i in 0..30u64 {
        let b = producer_batch(1 + i % 3, i as i64, &format!("b{i}"));
        let info = log.append(&b).unwrap();
        batches.push((info.base_offset, b.len() as u64));
    }
    assert!(log.segment_base_offsets().len() > 2, "the batches span several segments");
    for (k, (base, _)) in batches.iter().enumerate() {
        let behind: u64 = batches[k..].iter().map(|(_, len)| len).sum();
        assert_eq!(log.bytes_from(*base), behind, "from offset {base}");
    }
    assert_eq!(log.bytes_from(log.log_end_offset()), 0);
    assert_eq!(log.bytes_from(log.log_end_offset() + 10), 0);
    assert_eq!(log.bytes_from(0), log.stats().size_bytes);
}

#[test]
fn a_bumped_epoch_stamps_the_next_append_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    log.append(&producer_batch(2, 0, "before")).unwrap();
    assert_eq!((log.epoch(), log.epoch_history()), (0, vec![(0, 0)]));
    assert_eq!(log.bump_epoch().unwrap(), 1);
    // Nothing is written by the bump itself: the history gains the epoch with its first batch.
    assert_eq!((log.epoch(), log.epoch_history()), (1, vec![(0, 0)]));
    let info = log.append(&producer_batch(3, 10, "after")).unwrap();
    assert_eq!(info.base_offset, 2);
    assert_eq!(log.epoch_history(), vec![(0, 0), (1, 2)]);
    let read = log.read(2, 1 << 20).unwrap();
    assert_eq!(batch::split_verified(&read.batches).unwrap()[0].0.epoch, 1);
    assert_eq!(log.epoch_end(0), Some(EpochEnd { epoch: 0, end_offset: 2 }));
    log.close().unwrap();
    let reopened = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!((reopened.epoch(), reopened.epoch_history()), (1, vec![(0, 0), (1, 2)]));
}
