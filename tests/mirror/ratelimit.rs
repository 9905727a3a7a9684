//! Scenario 11: `sync.max_bytes_per_sec = "2MiB"` bounds the mirrored byte rate. The bytes on the target are
//! sampled while a 24 MiB backlog is mirrored, and between any two samples no more arrived than the limit allows:
//! the rate times the time between them, plus the limiter's burst (a quarter second of traffic) and the appends
//! that may have been released before the first sample but landed after it (one request per partition, at most
//! `sync.max_request_bytes`). Mirroring completes with the target identical to the source.
//!
//! Only the limit is asserted (an upper bound on bytes, so a lower bound on time); how close the mirror comes to
//! it is printed here and measured by `benches/mirror.rs`.

use std::time::Duration;

use ferry_client::{Producer, ProducerConfig};
use ferry_testkit::{deadline, wait_until};
use tokio::time::Instant;

use crate::common::*;

const TOPIC: &str = "orders";
const PARTITIONS: u64 = 4;
/// `sync.max_bytes_per_sec`.
const RATE: u64 = 2 << 20;
/// The limiter's burst: a quarter second of traffic (crates/ferry-mirror/src/ratelimit.rs).
const BURST: u64 = RATE / 4;
/// `sync.max_request_bytes`; the source batches (64 KiB) are smaller, so no request is larger.
const MAX_REQUEST: u64 = 256 << 10;

/// One reading of the target: the bytes it held, read between `before` and `after`.
struct Sample {
    before: Instant,
    after: Instant,
    bytes: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_rate_limit_holds_between_any_two_samples() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, PARTITIONS as u32).await?;
    let p = Producer::new(a.client.clone(), ProducerConfig { batch_bytes: 64 << 10, ..Default::default() }).await?;
    produce_range(&p, TOPIC, "limited", 0, 24 * 1024, 1024).await?;
    p.close().await;
    let source_bytes: u64 = a.admin.describe_topic(TOPIC).await?.partitions.iter().map(|p| p.size_bytes).sum();

    let mut conf = MirrorConf::new(&a, &b);
    conf.sync_extra = vec![format!("max_bytes_per_sec = \"{RATE}\""), format!("max_request_bytes = \"{MAX_REQUEST}\"")];
    let _mirror = conf.start().await?;

    let mut samples: Vec<Sample> = Vec::new();
    let copy_time = Duration::from_secs(source_bytes / RATE);
    wait_until("the rate-limited mirror to copy the backlog", deadline(&[copy_time, IO_BUDGET]), async || {
        let before = Instant::now();
        let bytes: u64 = match b.admin.describe_topic(TOPIC).await {
            Ok(d) => d.partitions.iter().map(|p| p.size_bytes).sum(),
            Err(_) => 0,
        };
        samples.push(Sample { before, after: Instant::now(), bytes });
        bytes >= source_bytes
    })
    .await?;

    // Between samples i and j the target took in at most what the limiter released from i's read to j's, plus what
    // was already released and in flight at i.
    let in_flight = PARTITIONS * MAX_REQUEST;
    let mut worst: Option<(f64, usize, usize)> = None;
    for (i, s) in samples.iter().enumerate() {
        for (j, t) in samples.iter().enumerate().skip(i + 1) {
            let allowed = RATE as f64 * (t.after - s.before).as_secs_f64() + (BURST + in_flight) as f64;
            let excess = t.bytes.saturating_sub(s.bytes) as f64 - allowed;
            if worst.is_none_or(|(w, _, _)| excess > w) {
                worst = Some((excess, i, j));
            }
        }
    }
    let (excess, i, j) = worst.expect("at least two samples: the target starts empty");
    let (first, last) = (&samples[0], &samples[samples.len() - 1]);
    let took = (last.after - first.before).as_secs_f64();
    println!(
        "{} MiB in {took:.1} s: {:.2} MiB/s against a limit of {} MiB/s ({} samples)",
        source_bytes >> 20,
        source_bytes as f64 / took / 1048576.0,
        RATE >> 20,
        samples.len()
    );
    assert!(
        excess <= 0.0,
        "{} bytes arrived between samples {i} and {j} ({:?} apart), {excess:.0} more than the limit allows",
        samples[j].bytes - samples[i].bytes,
        samples[j].after - samples[i].before
    );

    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    Ok(())
}
