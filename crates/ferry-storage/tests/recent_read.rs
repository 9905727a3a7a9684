//! The kept read: a second shared read asking the same question is answered from memory, once; any other read,
//! and every plain read, goes to the file and checks every CRC there.

mod common;

use common::*;
use ferry_storage::{Log, LogConfig, StorageError};

/// Flips the last byte of the batch at `offset` in segment 0 (inside its CRC-covered records).
fn damage(dir: &std::path::Path, offset: u64) {
    let file = log_path(dir, 0);
    let (pos, header) = batch_positions(&file).into_iter().find(|(_, h)| h.base_offset == offset).unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let last = pos as usize + header.total_len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
}

#[test]
fn the_same_read_twice_is_answered_from_memory_once_and_the_file_is_checked_again_after() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    log.append(&producer_batch(3, 1000, "a")).unwrap();
    log.append(&producer_batch(2, 2000, "b")).unwrap();
    let first = log.read_shared(0, 1 << 20).unwrap();
    assert_eq!((first.next_offset, first.log_end_offset), (5, 5));

    // The bytes on disk change behind the log's back (as a disk could): the identical second read is the kept one,
    // the same bytes the first read checked; the third goes to the file and its CRC check catches the damage.
    damage(dir.path(), 3);
    let second = log.read_shared(0, 1 << 20).unwrap();
    assert_eq!((&second.batches, second.next_offset), (&first.batches, 5));
    let third = log.read_shared(0, 1 << 20).unwrap_err();
    assert!(matches!(third, StorageError::CorruptSegment { offset: Some(3), .. }), "{third:?}");
}

#[test]
fn a_read_after_an_append_a_truncation_or_with_another_budget_goes_to_the_file() {
    for (what, change) in [("another budget", 0u8), ("an append since", 1), ("a truncation since", 2)] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogConfig::default()).unwrap();
        log.append(&producer_batch(3, 1000, "a")).unwrap();
        log.append(&producer_batch(2, 2000, "b")).unwrap();
        let budget = 1 << 20;
        log.read_shared(0, budget).unwrap();
        let again = match change {
            0 => budget - 1,
            1 => {
                log.append(&producer_batch(1, 3000, "c")).unwrap();
                budget
            }
            _ => {
                log.truncate_to(4).unwrap();
                budget
            }
        };
        damage(dir.path(), 0);
        let err = log.read_shared(0, again).unwrap_err();
        assert!(matches!(err, StorageError::CorruptSegment { offset: Some(0), .. }), "{what}: {err:?}");
    }
}

#[test]
fn a_plain_read_always_reads_and_checks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    log.append(&producer_batch(3, 1000, "a")).unwrap();
    log.read_shared(0, 1 << 20).unwrap();
    log.read(0, 1 << 20).unwrap();
    damage(dir.path(), 0);
    let err = log.read(0, 1 << 20).unwrap_err();
    assert!(matches!(err, StorageError::CorruptSegment { offset: Some(0), .. }), "{err:?}");
}
