//! Every case of append with caller-supplied offsets (design §3): present, diverged (with the exact first
//! differing offset), at the end, a valid gap, an invalid gap, a straddle, an epoch regression, a zero-batch jump,
//! ordering, and that a refused call writes nothing.

mod common;

use bytes::{Bytes, BytesMut};
use common::*;
use ferry_batch::{self as batch, Compression, ProducerInfo};
use ferry_storage::{EpochEnd, Log, LogConfig, OffsetAppendOutcome, StorageError};

fn concat(batches: &[&Bytes]) -> Bytes {
    let mut out = BytesMut::new();
    for b in batches {
        out.extend_from_slice(b);
    }
    out.freeze()
}

fn appended(written: u32, present: u32, log_end_offset: u64) -> OffsetAppendOutcome {
    OffsetAppendOutcome::Appended { written, present, log_end_offset }
}

/// A log holding source batches [0..4], [5..7], [8..9] at epochs 0, 0, 2.
fn source_like(dir: &std::path::Path) -> (Log, Vec<Bytes>) {
    let log = Log::open(dir, small_config()).unwrap();
    let batches = vec![
        batch_of(&records(0, 5, 100, "s"), 0),
        batch_of(&records(5, 3, 200, "s"), 0),
        batch_of(&records(8, 2, 300, "s"), 2),
    ];
    assert_eq!(log.append_with_offsets(&concat(&batches.iter().collect::<Vec<_>>()), 0).unwrap(), appended(3, 0, 10));
    (log, batches)
}

#[test]
fn batches_at_the_end_are_written_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = source_like(dir.path());
    let stored = read_all_batches(&log, 1 << 20);
    assert_eq!(stored.len(), 3);
    for ((_, got), want) in stored.iter().zip(&batches) {
        assert_eq!(got, want, "stored byte for byte, source epoch included");
    }
    assert_eq!(log.epoch_history(), vec![(0, 0), (2, 8)]);
    assert_eq!(log.epoch(), 2);
    assert_eq!(log.epoch_end(1), Some(EpochEnd { epoch: 0, end_offset: 8 }));

    // Producer fields are kept too (no sequence checks on this path).
    let p = ProducerInfo { producer_id: 9, producer_epoch: 1, base_sequence: 40 };
    let b = batch::encode_records(&records(10, 2, 400, "p"), 2, Compression::None, p);
    assert_eq!(log.append_with_offsets(&b, 0).unwrap(), appended(1, 0, 12));
    let (h, _) = read_all_batches(&log, 1 << 20).pop().unwrap();
    assert_eq!((h.base_offset, h.epoch, h.producer_id, h.producer_epoch, h.base_sequence), (10, 2, 9, 1, 40));
    // A local append after mirrored ones is stamped with the latest epoch.
    assert_eq!(log.append(&producer_batch(1, 1, "local")).unwrap().epoch, 2);
}

#[test]
fn a_batch_already_stored_is_present_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = source_like(dir.path());
    log.flush().unwrap();
    let sizes = file_sizes(dir.path());
    assert_eq!(log.append_with_offsets(&batches[1], 0).unwrap(), appended(0, 1, 10));
    let all = concat(&batches.iter().collect::<Vec<_>>());
    assert_eq!(log.append_with_offsets(&all, 0).unwrap(), appended(0, 3, 10));
    assert_eq!(file_sizes(dir.path()), sizes);

    // Present then new, in one call.
    let next = batch_of(&records(10, 4, 500, "s"), 2);
    assert_eq!(log.append_with_offsets(&concat(&[&batches[2], &next]), 0).unwrap(), appended(1, 1, 14));
}

#[test]
fn a_different_batch_below_the_end_diverges_at_the_first_differing_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = source_like(dir.path());

    // One value changed at offset 6 (inside the stored batch [5..7]).
    let mut recs = records(5, 3, 200, "s");
    recs[1].value = Some(Bytes::from_static(b"other"));
    let changed = batch_of(&recs, 0);
    assert_eq!(
        log.append_with_offsets(&changed, 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 6, written: 0, present: 0, log_end_offset: 10 }
    );
    // Headers are compared too (order and repeats matter).
    let mut recs = records(0, 5, 100, "s");
    recs[3].headers.reverse();
    assert!(matches!(
        log.append_with_offsets(&batch_of(&recs, 0), 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 3, .. }
    ));
    // Timestamps too.
    let mut recs = records(0, 5, 100, "s");
    recs[4].timestamp += 1;
    assert!(matches!(
        log.append_with_offsets(&batch_of(&recs, 0), 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 4, .. }
    ));

    // Same records, different epoch: diverged at the batch's base.
    let other_epoch = batch_of(&records(5, 3, 200, "s"), 1);
    assert_eq!(
        log.append_with_offsets(&other_epoch, 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 5, written: 0, present: 0, log_end_offset: 10 }
    );

    // Different boundaries over equal records ([0..2] against stored [0..4]): diverged at the base.
    let prefix = batch_of(&records(0, 3, 100, "s"), 0);
    assert!(matches!(log.append_with_offsets(&prefix, 0).unwrap(), OffsetAppendOutcome::Diverged { at: 0, .. }));

    // A record missing on the offered side: [5, 7] offered with offset 6 absent.
    let mut recs = records(5, 3, 200, "s");
    recs.remove(1);
    assert!(matches!(
        log.append_with_offsets(&batch_of(&recs, 0), 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 6, .. }
    ));

    // Spanning two stored batches ([0..7] against [0..4] + [5..7]), differing at 7.
    let mut recs = records(0, 5, 100, "s");
    let mut tail = records(5, 3, 200, "s");
    tail[2].key = None;
    recs.extend(tail);
    assert!(matches!(
        log.append_with_offsets(&batch_of(&recs, 0), 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 7, .. }
    ));

    // Present batches before the divergence count; processing stops at it.
    let after = batch_of(&records(10, 1, 1, "s"), 2);
    assert_eq!(
        log.append_with_offsets(&concat(&[&batches[0], &changed, &after]), 0).unwrap(),
        OffsetAppendOutcome::Diverged { at: 6, written: 0, present: 1, log_end_offset: 10 }
    );
    assert_eq!(log.log_end_offset(), 10);
    assert_eq!(read_all_batches(&log, 1 << 20).len(), 3);
}

#[test]
fn a_gap_left_by_source_retention_is_jumped_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source_like(dir.path());
    // A batch above the log end that does not start at the source's log start would skip records the source may
    // still hold ([50, 60) here): refused, nothing written.
    let b = batch_of(&records(60, 3, 600, "g"), 2);
    assert!(matches!(log.append_with_offsets(&b, 50), Err(StorageError::OffsetAppendRefused { offset: 60, .. })));
    assert_eq!(log.log_end_offset(), 10);
    // Source log start 60, first batch at 60: written at 60, the gap recorded.
    assert_eq!(log.append_with_offsets(&b, 60).unwrap(), appended(1, 0, 63));
    assert_eq!(log.stats().gaps, vec![(10, 60)]);
    assert_eq!(*log.segment_base_offsets().last().unwrap(), 60);
    // Reading inside the gap returns the first batch above it.
    let r = log.read(30, 1 << 20).unwrap();
    assert_eq!(batch::split_verified(&r.batches).unwrap()[0].0.base_offset, 60);
    let mut want = records(0, 5, 100, "s");
    want.extend(records(5, 3, 200, "s"));
    want.extend(records(8, 2, 300, "s"));
    want.extend(records(60, 3, 600, "g"));
    assert_eq!(read_all(&log), want);
    // The gap survives a reopen (clean and unclean).
    drop(log);
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.stats().gaps, vec![(10, 60)]);
    assert_eq!(read_all(&log), want);
    // Truncating into the gap cuts back to the data below it and forgets the gap.
    assert_eq!(log.truncate_to(30).unwrap(), 10);
    assert!(log.stats().gaps.is_empty());
    assert_eq!(read_all(&log), want[..10].to_vec());
}

#[test]
fn an_empty_log_moves_its_start_instead_of_recording_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let b = batch_of(&records(1000, 2, 1, "e"), 5);
    assert_eq!(log.append_with_offsets(&b, 1000).unwrap(), appended(1, 0, 1002));
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (1000, 1002));
    assert_eq!(log.segment_base_offsets(), vec![1000]);
    assert!(log.stats().gaps.is_empty());
    assert_eq!(log.epoch_history(), vec![(5, 1000)]);
    assert_eq!(read_all(&log), records(1000, 2, 1, "e"));
}

#[test]
fn a_zero_batch_call_moves_the_log_end_to_the_source_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    // Empty log: the start moves.
    assert_eq!(log.append_with_offsets(&[], 500).unwrap(), appended(0, 0, 500));
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 500));
    assert!(log.stats().gaps.is_empty());
    // At or past the source log start: nothing happens.
    assert_eq!(log.append_with_offsets(&[], 500).unwrap(), appended(0, 0, 500));
    assert_eq!(log.append_with_offsets(&[], 10).unwrap(), appended(0, 0, 500));
    // With data: a gap is recorded and the next batch lands at the new end.
    log.append_with_offsets(&batch_of(&records(500, 2, 1, "z"), 0), 500).unwrap();
    assert_eq!(log.append_with_offsets(&[], 900).unwrap(), appended(0, 0, 900));
    assert_eq!(log.stats().gaps, vec![(502, 900)]);
    // A second jump from an empty active segment widens the same gap.
    assert_eq!(log.append_with_offsets(&[], 950).unwrap(), appended(0, 0, 950));
    assert_eq!(log.stats().gaps, vec![(502, 950)]);
    assert_eq!(log.segment_base_offsets(), vec![500, 950]);
    assert_eq!(log.append_with_offsets(&batch_of(&records(950, 1, 1, "z"), 0), 900).unwrap(), appended(1, 0, 951));
    // Reopened uncleanly, the layout and the record agree.
    drop(log);
    let log = Log::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.stats().gaps, vec![(502, 950)]);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 951));
}

#[test]
fn refused_calls_name_the_offsets_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = source_like(dir.path());
    log.flush().unwrap();
    let sizes = file_sizes(dir.path());
    let refused = |result: Result<OffsetAppendOutcome, StorageError>, offset: u64, needles: &[&str]| match result {
        Err(StorageError::OffsetAppendRefused { dir: d, offset: o, reason }) => {
            assert_eq!((d.as_path(), o), (dir.path(), offset), "{reason}");
            for n in needles {
                assert!(reason.contains(n), "reason {reason:?} should mention {n:?}");
            }
        }
        other => panic!("expected a refusal at {offset}, got {other:?}"),
    };

    // Above the end without a source-retention gap.
    refused(log.append_with_offsets(&batch_of(&records(20, 1, 1, "x"), 2), 0), 20, &["20", "10"]);
    refused(log.append_with_offsets(&batch_of(&records(20, 1, 1, "x"), 2), 10), 20, &["20", "10"]);
    refused(log.append_with_offsets(&batch_of(&records(20, 1, 1, "x"), 2), 25), 20, &["20", "10", "25"]);
    // Straddling the end.
    refused(log.append_with_offsets(&batch_of(&records(8, 4, 1, "x"), 2), 0), 8, &["straddles", "10"]);
    // Epoch regression (history's latest is 2).
    refused(log.append_with_offsets(&batch_of(&records(10, 1, 1, "x"), 1), 0), 10, &["epoch regressed", "1", "2"]);
    // Offsets not increasing across the call.
    let a = batch_of(&records(10, 3, 1, "x"), 2);
    let b = batch_of(&records(12, 1, 1, "x"), 2);
    refused(log.append_with_offsets(&concat(&[&a, &b]), 0), 12, &["12"]);
    // A good batch followed by a refused one: the whole call writes nothing.
    let far = batch_of(&records(40, 1, 1, "x"), 2);
    refused(log.append_with_offsets(&concat(&[&a, &far]), 0), 40, &["40", "13"]);
    // A bad CRC in the second batch: typed error naming its offset.
    let mut bad = b.to_vec();
    let at = bad.len() - 2;
    bad[at] ^= 1;
    let bad_second = concat(&[&a, &Bytes::from(bad)]);
    assert!(matches!(
        log.append_with_offsets(&bad_second, 0),
        Err(StorageError::InvalidBatch { offset: 12, source: batch::BatchError::CrcMismatch { .. }, .. })
    ));
    // A cut-off batch.
    assert!(matches!(
        log.append_with_offsets(&a[..a.len() - 5], 0),
        Err(StorageError::InvalidBatch { offset: 10, .. })
    ));
    // Oversized.
    log.set_config(LogConfig { max_batch_bytes: 100, ..small_config() });
    assert!(matches!(log.append_with_offsets(&a, 0), Err(StorageError::BatchTooLarge { offset: 10, .. })));
    log.set_config(small_config());

    assert_eq!(log.log_end_offset(), 10);
    log.flush().unwrap();
    assert_eq!(file_sizes(dir.path()), sizes);
    assert_eq!(read_all_batches(&log, 1 << 20).iter().map(|(_, b)| b.clone()).collect::<Vec<_>>(), batches);
}

#[test]
fn batches_below_the_log_start_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small_config()).unwrap();
    let mut offered = Vec::new();
    for i in 0..30u64 {
        let b = batch_of(&records(i * 3, 3, 1, "r"), 0);
        log.append_with_offsets(&b, 0).unwrap();
        offered.push(b);
    }
    log.set_config(LogConfig { retention_bytes: Some(0), ..small_config() });
    assert!(log.apply_retention(0).unwrap() > 0);
    let start = log.log_start_offset();
    assert!(matches!(
        log.append_with_offsets(&offered[0], 0),
        Err(StorageError::OffsetAppendRefused { offset: 0, .. })
    ));
    let first_kept = offered.iter().find(|b| batch::verify(b).unwrap().base_offset == start).unwrap();
    assert_eq!(log.append_with_offsets(first_kept, 0).unwrap(), appended(0, 1, 90));
}
