//! Time retention capped at append time (`retention_caps_timestamps_at_append_time`, set for mirror topics): a
//! segment's age counts from the earlier of its newest record timestamp and its last append, so a far-future
//! timestamp cannot pin a segment forever. Without the cap, the newest record timestamp alone decides.

mod common;

use std::sync::Arc;

use common::*;
use ferry_storage::{Log, LogConfig, ManualClock};

/// The wall clock of the log (appends read it): ms since the epoch.
const NOW: i64 = 1_000_000;
const RETENTION_MS: u64 = 100;

fn config(capped: bool) -> LogConfig {
    LogConfig {
        retention_ms: Some(RETENTION_MS),
        retention_caps_timestamps_at_append_time: capped,
        ..LogConfig::default()
    }
}

/// A log holding one sealed segment of a batch stamped far in the future (appended at `NOW`), and an active
/// segment after it; returns the log and the offset the active segment starts at.
fn with_a_future_segment(dir: &std::path::Path, capped: bool) -> (Log, u64) {
    let clock = Arc::new(ManualClock::new(NOW));
    let log = Log::open_with_clock(dir, config(capped), clock.clone()).unwrap();
    log.append(&producer_batch(3, i64::MAX - 10, "future")).unwrap();
    assert!(log.roll().unwrap());
    clock.set(NOW + 50);
    let active = log.append(&producer_batch(1, NOW + 50, "now")).unwrap().base_offset;
    (log, active)
}

#[test]
fn a_far_future_timestamp_ages_from_its_append_when_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (log, active) = with_a_future_segment(dir.path(), true);
    // Appended at NOW: not yet older than the retention at NOW + RETENTION_MS.
    assert_eq!(log.apply_retention(NOW + RETENTION_MS as i64).unwrap(), 0);
    assert_eq!(log.log_start_offset(), 0);
    // One ms later it is.
    assert_eq!(log.apply_retention(NOW + RETENTION_MS as i64 + 1).unwrap(), 1);
    assert_eq!(log.log_start_offset(), active);
    assert_eq!(read_all(&log), rebased(&records(0, 1, NOW + 50, "now"), active));
}

#[test]
fn a_reopened_segment_ages_no_later_than_its_reopening_when_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (log, active) = with_a_future_segment(dir.path(), true);
    drop(log);
    // Reopened at NOW + 60: the segment's append time is at most then (its file's modification time, capped by
    // the log's clock).
    let log = Log::open_with_clock(dir.path(), config(true), Arc::new(ManualClock::new(NOW + 60))).unwrap();
    assert_eq!(log.apply_retention(NOW + 60 + RETENTION_MS as i64).unwrap(), 0);
    assert_eq!(log.apply_retention(NOW + 61 + RETENTION_MS as i64).unwrap(), 1);
    assert_eq!(log.log_start_offset(), active);
}

#[test]
fn without_the_cap_the_newest_record_timestamp_alone_decides() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = with_a_future_segment(dir.path(), false);
    // Long after the append, the far-future timestamp still keeps the segment.
    assert_eq!(log.apply_retention(NOW + 1_000_000_000).unwrap(), 0);
    assert_eq!(log.log_start_offset(), 0);
    // The cap never keeps data longer than the timestamps would: an old record timestamp still ages the segment.
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let log = Log::open_with_clock(dir.path(), config(true), clock.clone()).unwrap();
    log.append(&producer_batch(2, NOW - 10_000, "old")).unwrap();
    assert!(log.roll().unwrap());
    log.append(&producer_batch(1, NOW, "now")).unwrap();
    assert_eq!(log.apply_retention(NOW).unwrap(), 1, "a segment of old records goes at once, capped or not");
}
