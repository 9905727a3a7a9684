//! Storage throughput against the raw file system, in the same run.
//!
//! - append: 1 KiB records in 64 KiB batches into a fresh log in a temp dir, under the async flush policy with the
//!   fsync left to the caller's interval (so, like the raw writer, the timed loop writes to the page cache), with
//!   segments small enough that several roll (and are fsynced as they are sealed) per run;
//!   raw: the same bytes in 64 KiB `write_all` calls to one file.
//! - append+fsync: the same with an fsync every 16 MiB on both sides (ferry's `flush_bytes`).
//! - read: sequential `Log::read` calls with 1 MiB `max_bytes` over the whole log (CRC-checked, fresh buffers);
//!   raw: sequential 1 MiB `read` calls over a file of the same bytes.
//!
//! Criterion reports each side; then an interleaved pass (raw and ferry back to back in each round, so that load
//! from other processes hits both alike) prints each ratio as the median of the per-round ratios,
//! `append ratio (ferry/raw): 0.93`, with the ratio of the best rounds and of the medians beside it.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use ferry_batch::{self as batch, Compression, ProducerInfo, Record};
use ferry_storage::{FlushPolicy, Log, LogConfig};

const RECORD_BYTES: usize = 1024;
const BATCH_TARGET: usize = 64 * 1024;
const TOTAL_BYTES: usize = 96 * 1024 * 1024;
const SEGMENT_BYTES: u64 = 32 * 1024 * 1024;
const READ_MAX: u64 = 1024 * 1024;
const FSYNC_EVERY: u64 = 16 * 1024 * 1024;
const ROUNDS: usize = 11;

/// One ~64 KiB batch of 1 KiB records with pseudo-random values (incompressible, like real payloads).
fn make_batch() -> Bytes {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut records = Vec::new();
    let mut size = batch::HEADER_LEN;
    while size + RECORD_BYTES + 16 <= BATCH_TARGET {
        let value: Vec<u8> = (0..RECORD_BYTES)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        records.push(Record {
            offset: records.len() as u64,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::from(value)),
            headers: Vec::new(),
        });
        size += RECORD_BYTES + 16;
    }
    batch::encode_records(&records, 0, Compression::None, ProducerInfo::NONE)
}

fn config(flush_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT_BYTES,
        flush: FlushPolicy::Async { interval: Duration::from_secs(3600), bytes: flush_bytes },
        ..LogConfig::default()
    }
}

fn batches_per_run(batch: &Bytes) -> usize {
    TOTAL_BYTES / batch.len()
}

/// Appends a run's worth of batches into a fresh log; returns the time taken (files removed afterwards).
fn ferry_append(batch: &Bytes, flush_bytes: u64) -> Duration {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = Log::open(dir.path(), config(flush_bytes)).expect("open");
    let n = batches_per_run(batch);
    let start = Instant::now();
    for _ in 0..n {
        log.append(batch).expect("append");
    }
    let elapsed = start.elapsed();
    drop(log);
    elapsed
}

/// Writes the same bytes with plain 64 KiB writes; `fsync_every` mirrors ferry's flush_bytes.
fn raw_write(batch: &Bytes, fsync_every: u64) -> Duration {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut file = File::create(dir.path().join("raw")).expect("create");
    let n = batches_per_run(batch);
    let mut unflushed = 0u64;
    let start = Instant::now();
    for _ in 0..n {
        file.write_all(batch).expect("write");
        unflushed += batch.len() as u64;
        if unflushed >= fsync_every {
            file.sync_data().expect("fsync");
            unflushed = 0;
        }
    }
    start.elapsed()
}

/// Reads the whole log sequentially; returns the time and the bytes read.
fn ferry_read(log: &Log) -> (Duration, u64) {
    let start = Instant::now();
    let mut offset = log.log_start_offset();
    let mut bytes = 0u64;
    loop {
        let r = log.read(offset, READ_MAX).expect("read");
        if r.batches.is_empty() {
            break;
        }
        bytes += r.batches.len() as u64;
        offset = r.next_offset;
    }
    (start.elapsed(), bytes)
}

fn raw_read(path: &Path) -> (Duration, u64) {
    let start = Instant::now();
    let mut file = File::open(path).expect("open");
    let mut buf = vec![0u8; READ_MAX as usize];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    (start.elapsed(), bytes)
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let batch = make_batch();
    let run_bytes = (batches_per_run(&batch) * batch.len()) as u64;

    // The read side's data: one log and one raw file of the same bytes, written once, read many times.
    let read_dir = tempfile::tempdir().expect("temp dir");
    let log = Log::open(read_dir.path().join("log"), config(u64::MAX)).expect("open");
    let mut raw = File::create(read_dir.path().join("raw")).expect("create");
    for _ in 0..batches_per_run(&batch) {
        log.append(&batch).expect("append");
        raw.write_all(&batch).expect("write");
    }
    log.flush().expect("flush");
    raw.sync_all().expect("fsync");
    let raw_path = read_dir.path().join("raw");

    let mut c = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(4)).configure_from_args();
    {
        let mut g = c.benchmark_group("storage");
        g.throughput(Throughput::Bytes(run_bytes));
        g.bench_function("append/ferry", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| ferry_append(&batch, u64::MAX)).sum())
        });
        g.bench_function("append/raw", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| raw_write(&batch, u64::MAX)).sum())
        });
        g.bench_function("append_fsync/ferry", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| ferry_append(&batch, FSYNC_EVERY)).sum())
        });
        g.bench_function("append_fsync/raw", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| raw_write(&batch, FSYNC_EVERY)).sum())
        });
        g.bench_function("read/ferry", |b| b.iter_custom(|iters| (0..iters).map(|_| ferry_read(&log).0).sum()));
        g.bench_function("read/raw", |b| b.iter_custom(|iters| (0..iters).map(|_| raw_read(&raw_path).0).sum()));
        g.finish();
    }
    c.final_summary();

    // Interleaved pass for the ratios.
    let (mut fa, mut ra, mut ff, mut rf, mut fr, mut rr) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        ra.push(raw_write(&batch, u64::MAX));
        fa.push(ferry_append(&batch, u64::MAX));
        rf.push(raw_write(&batch, FSYNC_EVERY));
        ff.push(ferry_append(&batch, FSYNC_EVERY));
        let (d, n) = raw_read(&raw_path);
        assert_eq!(n, run_bytes);
        rr.push(d);
        let (d, n) = ferry_read(&log);
        assert_eq!(n, run_bytes);
        fr.push(d);
    }
    let best = |v: &[Duration]| v.iter().copied().min().unwrap_or_default();
    let ratio = |raw: Duration, ferry: Duration| raw.as_secs_f64() / ferry.as_secs_f64();
    println!();
    println!(
        "storage bench: {} MiB per run, {}-byte batches of {} B records, {} MiB segments, {ROUNDS} interleaved rounds",
        run_bytes >> 20,
        batch.len(),
        RECORD_BYTES,
        SEGMENT_BYTES >> 20
    );
    for (name, ferry, raw) in [("append", &fa, &ra), ("append+fsync", &ff, &rf), ("read", &fr, &rr)] {
        println!(
            "{name} best: ferry {:6.0} MiB/s, raw {:6.0} MiB/s; median: ferry {:6.0} MiB/s, raw {:6.0} MiB/s",
            mib_per_s(run_bytes, best(ferry)),
            mib_per_s(run_bytes, best(raw)),
            mib_per_s(run_bytes, median(ferry.clone())),
            mib_per_s(run_bytes, median(raw.clone()))
        );
    }
    for (name, ferry, raw) in [("append", &fa, &ra), ("append+fsync", &ff, &rf), ("read", &fr, &rr)] {
        // Each round measures raw and ferry back to back, so their ratio sees the same load; the median of the
        // per-round ratios is the headline.
        let paired = median_f64(raw.iter().zip(ferry.iter()).map(|(r, f)| ratio(*r, *f)).collect());
        println!(
            "{name} ratio (ferry/raw): {paired:.2}   (best rounds: {:.2}, medians: {:.2})",
            ratio(best(raw), best(ferry)),
            ratio(median(raw.clone()), median(ferry.clone()))
        );
    }
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
