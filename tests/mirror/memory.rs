//! Scenario 10: bounded memory. A large backlog waits on the source; the mirror's link to the target goes
//! through the fault proxy throttled to 1 MiB/s, so almost all of it stays behind. With `sync.max_memory = "64MiB"`
//! and `sync.queue_bytes = "8MiB"` the mirror's resident set stays under `max_memory + 64 MiB` while it mirrors,
//! and what reached the target is an identical prefix of the source.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::ProducerRecord;
use ferry_testkit::Proxy;

use crate::common::*;

const TOPIC: &str = "backlog";
const PARTITIONS: u32 = 8;
/// Size of the backlog.
const BACKLOG: u64 = 1 << 30;
const VALUE: usize = 64 * 1024;
const MAX_MEMORY: u64 = 64 << 20;
const SAMPLING: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_with_a_large_backlog() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, PARTITIONS).await?;
    let started = Instant::now();
    let p = producer(&a).await?;
    let value = Bytes::from(vec![b'x'; VALUE]);
    let count = BACKLOG / VALUE as u64;
    let records = (0..count).map(|i| {
        ProducerRecord::new(TOPIC, value.clone())
            .with_partition((i % u64::from(PARTITIONS)) as u32)
            .with_key(format!("k{i}"))
            .with_header("seq", i.to_string())
            .with_timestamp(BASE_TS + i as i64)
    });
    send_all(&p, records).await?;
    p.close().await;
    tracing::info!(elapsed = ?started.elapsed(), bytes = BACKLOG, "backlog produced");

    let proxy = Proxy::start(b.broker.addr()).await?;
    proxy.set_throttle(Some(1 << 20));
    let mut conf = MirrorConf::new(&a, &b);
    conf.target_brokers = proxy.addr().to_string();
    conf.sync_extra = vec!["max_memory = \"64MiB\"".into(), "queue_bytes = \"8MiB\"".into()];
    let mirror = conf.start().await?;
    let pid = mirror.pid();

    // Sample the resident set while the mirror works through the backlog.
    let mut peak = 0u64;
    let mut samples = 0u32;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let sampling_started = Instant::now();
    while sampling_started.elapsed() < SAMPLING {
        tick.tick().await;
        let rss = rss_bytes(pid)?;
        peak = peak.max(rss);
        samples += 1;
    }
    let limit = MAX_MEMORY + (64 << 20);
    tracing::info!(peak_mib = peak >> 20, samples, "mirror resident set");
    assert!(
        peak < limit,
        "the mirror's RSS peaked at {} MiB, over max_memory + 64 MiB ({} MiB)",
        peak >> 20,
        limit >> 20
    );

    // It was mirroring all along: some data reached the target, and it is an identical prefix of the source.
    let leos = b.leos(TOPIC).await?;
    assert!(leos.iter().sum::<u64>() > 0, "the throttled mirror made progress");
    for (partition, leo) in leos.iter().enumerate() {
        let partition = partition as u32;
        let src = read_partition(&a.client, TOPIC, partition, Some(*leo)).await?;
        let dst = read_partition(&b.client, TOPIC, partition, Some(*leo)).await?;
        dst.assert_contiguous(&format!("target {TOPIC}/{partition}"));
        assert_same_partition(&format!("{TOPIC}/{partition} below {leo}"), &src, &dst);
    }
    assert!(proxy.stats().bytes_to_upstream > 0, "the appends went through the throttled proxy");
    Ok(())
}
