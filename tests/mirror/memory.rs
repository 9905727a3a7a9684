//! Scenario 10: bounded memory. A large backlog of incompressible records waits on the source; the mirror's link
//! to the target goes through the fault proxy throttled to 1 MiB/s, so almost all of it stays behind. With
//! `sync.max_memory = "64MiB"` and `sync.queue_bytes = "8MiB"` the mirror's resident set stays under
//! `max_memory + 64 MiB` while it works through the throttled link and then, the throttle lifted, through the rest
//! of the backlog; and the target ends identical to the source, record for record.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::ProducerRecord;
use ferry_testkit::{Proxy, deadline, wait_until};
use rand::RngCore as _;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPIC: &str = "backlog";
const PARTITIONS: u32 = 8;
/// Size of the backlog: eight times `max_memory`.
const BACKLOG: u64 = 512 << 20;
const VALUE: usize = 64 * 1024;
const MAX_MEMORY: u64 = 64 << 20;
/// The throttle on the target link while the backlog is large.
const THROTTLE: u64 = 1 << 20;
/// What must cross the throttled link before it is lifted: a partition queue's worth (8 s at 1 MiB/s). The fetches
/// from the source are not throttled, so by then every queue, `max_memory` in all, has long been full.
const THROTTLED_PROGRESS: u64 = 8 << 20;
/// How often the resident set is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_with_a_large_backlog() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, PARTITIONS).await?;
    let started = Instant::now();
    // Random values: compression on the link (sync.compression = "zstd") must not shrink the backlog.
    let (seed, mut rng) = ferry_testkit::seeded_rng("record values")?;
    let p = producer(&a).await?;
    let count = BACKLOG / VALUE as u64;
    let records = (0..count).map(|i| {
        let mut value = vec![0u8; VALUE];
        rng.fill_bytes(&mut value);
        ProducerRecord::new(TOPIC, Bytes::from(value))
            .with_partition((i % u64::from(PARTITIONS)) as u32)
            .with_key(format!("k{i}"))
            .with_header("seq", i.to_string())
            .with_timestamp(BASE_TS + i as i64)
    });
    send_all(&p, records).await?;
    p.close().await;
    tracing::info!(elapsed = ?started.elapsed(), bytes = BACKLOG, "backlog produced");

    let proxy = Proxy::start(b.broker.addr()).await?;
    proxy.set_throttle(Some(THROTTLE));
    let mut conf = MirrorConf::new(&a, &b);
    conf.target_brokers = proxy.addr().to_string();
    conf.sync_extra = vec!["max_memory = \"64MiB\"".into(), "queue_bytes = \"8MiB\"".into()];
    let mirror = conf.start().await?;

    // Sample the resident set from the mirror's start to its catching up.
    let pid = mirror.pid();
    let peak = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(AtomicU32::new(0));
    let stop = CancellationToken::new();
    let sampler = {
        let (peak, samples, stop) = (Arc::clone(&peak), Arc::clone(&samples), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return anyhow::Ok(()),
                    _ = tick.tick() => {
                        peak.fetch_max(rss_bytes(pid)?, Ordering::Relaxed);
                        samples.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    // Throttled: the mirror works against the slow link, with the backlog all but untouched.
    let throttled = deadline(&[Duration::from_secs(THROTTLED_PROGRESS / THROTTLE), IO_BUDGET]);
    wait_until("the throttled link to carry 8 MiB of appends", throttled, async || {
        proxy.stats().bytes_to_upstream >= THROTTLED_PROGRESS
    })
    .await?;
    let copied: u64 = b.leos(TOPIC).await?.iter().sum();
    assert!(copied * (VALUE as u64) < BACKLOG / 4, "the throttle held the backlog back: {copied} records copied");
    // Unthrottled: the rest of the backlog, as fast as the mirror goes.
    proxy.set_throttle(None);
    wait_caught_up(&a, TOPIC, &b, TOPIC, deadline(&[IO_BUDGET, IO_BUDGET])).await?;
    stop.cancel();
    sampler.await??;

    let (peak, samples) = (peak.load(Ordering::Relaxed), samples.load(Ordering::Relaxed));
    let limit = MAX_MEMORY + (64 << 20);
    tracing::info!(peak_mib = peak >> 20, samples, elapsed = ?started.elapsed(), "mirror resident set");
    assert!(samples > 0, "the resident set was sampled");
    assert!(
        peak < limit,
        "the mirror's RSS peaked at {} MiB, over max_memory + 64 MiB ({} MiB)",
        peak >> 20,
        limit >> 20
    );

    // Every record arrived, exactly once, as produced: partition by partition (a partition at a time keeps the
    // test's own memory small), the same offsets, records and batches.
    let mut total = 0;
    for partition in 0..PARTITIONS {
        let src = read_partition(&a.client, TOPIC, partition, None).await?;
        let dst = read_partition(&b.client, TOPIC, partition, None).await?;
        let what = format!("{TOPIC}/{partition} (seed {seed})");
        src.assert_contiguous(&format!("source {what}"));
        dst.assert_contiguous(&format!("target {what}"));
        assert_same_partition(&what, &src, &dst);
        total += dst.records.len() as u64;
    }
    assert_eq!(total, count, "every produced record is on the target");
    assert!(proxy.stats().bytes_to_upstream >= BACKLOG, "the appends went through the proxy: {:?}", proxy.stats());
    Ok(())
}
