//! Helpers shared by the storage behaviour tests: building batches, reading a whole log back, configs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use ferry_batch::{self as batch, BatchHeader, BatchIter, Compression, Header, ProducerInfo, Record};
use ferry_storage::{FlushPolicy, Log, LogConfig};

/// A record with string key/value and headers.
pub fn rec(offset: u64, ts: i64, key: Option<&str>, value: Option<&str>, headers: &[(&str, Option<&str>)]) -> Record {
    Record {
        offset,
        timestamp: ts,
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
        headers: headers
            .iter()
            .map(|(k, v)| Header { key: (*k).to_owned(), value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())) })
            .collect(),
    }
}

/// `n` records at offsets `base..base+n`, values `"{tag}-{i}"`, timestamps `ts + i`.
pub fn records(base: u64, n: u64, ts: i64, tag: &str) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let key = format!("k{}", (base + i) % 3);
            let value = format!("{tag}-{}", base + i);
            rec(base + i, ts + i as i64, Some(&key), Some(&value), &[("h", Some(tag)), ("h", None)])
        })
        .collect()
}

/// One batch holding `records` (absolute offsets), stamped with `epoch`.
pub fn batch_of(records: &[Record], epoch: u32) -> Bytes {
    batch::encode_records(records, epoch, Compression::None, ProducerInfo::NONE)
}

/// A producer-style batch (base 0, epoch 0) of `n` records; the log assigns its offsets.
pub fn producer_batch(n: u64, ts: i64, tag: &str) -> Bytes {
    batch_of(&records(0, n, ts, tag), 0)
}

/// The records of `batch_bytes` as the log would store them at `base`.
pub fn rebased(records: &[Record], base: u64) -> Vec<Record> {
    let first = records.first().map_or(0, |r| r.offset);
    records.iter().map(|r| Record { offset: r.offset - first + base, ..r.clone() }).collect()
}

/// Every batch from the log start to the log end, read with `max_bytes` reads.
pub fn read_all_batches(log: &Log, max_bytes: u64) -> Vec<(BatchHeader, Bytes)> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let result = log.read(offset, max_bytes).expect("read");
        if result.batches.is_empty() {
            // At the log end, or inside a gap with nothing above it yet.
            assert!(offset <= result.log_end_offset);
            assert_eq!(result.next_offset, offset);
            break;
        }
        for (header, bytes) in batch::split_verified(&result.batches).expect("whole verified batches") {
            out.push((header, bytes));
        }
        assert!(result.next_offset > offset);
        offset = result.next_offset;
    }
    out
}

/// Every record in the log.
pub fn read_all(log: &Log) -> Vec<Record> {
    read_all_batches(log, 1 << 20).iter().flat_map(|(_, b)| batch::decode_records(b).expect("decode")).collect()
}

/// A config with small segments and a dense index, async flush by bytes only.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        segment_ms: 7 * 24 * 3600 * 1000,
        index_interval_bytes: 300,
        max_batch_bytes: 64 * 1024,
        flush: FlushPolicy::Async { interval: std::time::Duration::from_secs(3600), bytes: u64::MAX },
        retention_bytes: None,
        retention_ms: None,
        retention_caps_timestamps_at_append_time: false,
        keep_corrupt_batches_followed_by_valid_ones: false,
        max_open_segments: 8,
    }
}

/// Sizes of every file in `dir`, sorted by name.
pub fn file_sizes(dir: &Path) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().to_string_lossy().into_owned(), e.metadata().expect("metadata").len())
        })
        .collect();
    out.sort();
    out
}

/// Path of the segment file with this base.
pub fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

/// Path of the index file with this base.
pub fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.index"))
}

/// Positions of each batch in a segment file.
pub fn batch_positions(file: &Path) -> Vec<(u64, BatchHeader)> {
    let bytes = std::fs::read(file).expect("read segment");
    let mut out = Vec::new();
    let mut iter = BatchIter::new(&bytes);
    loop {
        let pos = iter.position() as u64;
        match iter.next() {
            Some(Ok((h, _))) => out.push((pos, h)),
            _ => break,
        }
    }
    out
}
