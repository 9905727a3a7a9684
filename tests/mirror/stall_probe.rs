//! Issue 18, a stall watchdog that cannot be fooled: one target partition refuses appends (a directory sits where
//! its next segment file must go, so the append that must roll the segment fails with a storage error, which the
//! mirror retries) while the source advances past it once.
//!
//! `partition_stalled` fires for that partition within `stall_after` plus one check interval of the mirror seeing
//! the source advance (its own measure, `stalled_for_ms`), and within one more check interval of the record's
//! acknowledgement on the wall clock (the independent probe would have told it by then), although that
//! partition's lag stays the same, check after check. The independent probe's log end is in the event and in the
//! partition view. The other partitions keep mirroring to the source's exact log ends meanwhile; once the obstacle
//! is gone the stalled partition catches up, the stall clears, and the target holds exactly the source.

use std::time::Duration;

use bytes::Bytes;
use ferry_client::ProducerRecord;
use ferry_client::admin::TopicConfig;
use ferry_testkit::{deadline, wait_until};

use crate::common::*;
use crate::watch::*;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 3;
/// The partition whose target refuses appends.
const STUCK: u32 = 1;
/// `segment_bytes` of the topic (copied to the target topic): the brokers' `max_batch_bytes`, the smallest
/// segment a broker keeps.
const SEGMENT: u64 = 1 << 20;
/// Records in each partition before the obstacle.
const FIRST: u64 = 20;
/// The rules' `stall_after`.
const STALL_AFTER: Duration = Duration::from_secs(2);

async fn produce_to(p: &ferry_client::Producer, partitions: &[u32], from: u64, to: u64) -> anyhow::Result<()> {
    let records = partitions.iter().flat_map(|&q| (from..to).map(move |i| record(TOPIC, "r", i, 64).with_partition(q)));
    send_all(p, records).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_target_refuses_appends_stalls_while_its_lag_stays_the_same() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    let config = TopicConfig { segment_bytes: Some(SEGMENT), ..Default::default() };
    a.admin.create_topic(TOPIC, PARTITIONS, config, None).await?;
    let p = producer(&a).await?;
    let all: Vec<u32> = (0..PARTITIONS).collect();
    let flowing: Vec<u32> = all.iter().copied().filter(|&q| q != STUCK).collect();
    produce_to(&p, &all, 0, FIRST).await?;
    let rules = format!("[thresholds]\nstall_after = \"{}\"\n", dur(STALL_AFTER));
    let mirror = start_mirror(&MirrorConf::new(&a, &b), &rules, "").await?;
    let m = &mirror.process;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;

    // The obstacle, then one record that fills a batch of its own: its append must roll the segment and fails.
    let obstacle = segment_file(&b, TOPIC, STUCK, FIRST);
    std::fs::create_dir(&obstacle)?;
    let big = ProducerRecord::new(TOPIC, Bytes::from(vec![b'x'; SEGMENT as usize - 2048]))
        .with_partition(STUCK)
        .with_key("big")
        .with_timestamp(now_ms());
    send_all(&p, [big]).await?;
    let acked_ms = now_ms();
    produce_to(&p, &flowing, FIRST, 2 * FIRST).await?;

    let limit = deadline(&[STALL_AFTER, CHECK, CHECK]);
    let stalled = wait_event(m, "partition_stalled", TOPIC, STUCK, false, limit).await?;
    let d = &stalled["details"];
    let stalled_for = d["stalled_for_ms"].as_u64().unwrap_or(0);
    let within = (STALL_AFTER.as_millis() as u64)..(STALL_AFTER + CHECK).as_millis() as u64;
    assert!(within.contains(&stalled_for), "stalled_for_ms {stalled_for} not in {within:?}: {stalled}");
    let waited = stalled["timestamp_ms"].as_i64().unwrap_or(i64::MAX) - acked_ms;
    assert!(waited <= (STALL_AFTER + CHECK + CHECK).as_millis() as i64, "fired {waited} ms after the ack: {stalled}");
    assert_eq!(
        (&d["cache_offset"], &d["lag"], &d["probed_source_offset"], &d["stall_after"]),
        (&FIRST.into(), &1.into(), &(FIRST + 1).into(), &"2s".into()),
        "{stalled}"
    );
    let first = partition_doc(m, TOPIC, STUCK).await?;
    let want = |doc: &serde_json::Value| {
        (doc["state"].clone(), doc["cache_offset"].clone(), doc["lag"].clone(), doc["probed_source_offset"].clone())
    };
    let stuck = ("stalled".into(), FIRST.into(), 1.into(), (FIRST + 1).into());
    assert_eq!(want(&first), stuck, "{first}");

    // More records on the flowing partitions; once the probe has seen them (a later check), the stuck partition's
    // lag is still the same and it is still stalled, while the others reach the source's exact log ends.
    produce_to(&p, &flowing, 2 * FIRST, 3 * FIRST).await?;
    wait_until("the flowing partitions to catch up", io_deadline(), async || -> anyhow::Result<bool> {
        let leos = b.leos(TOPIC).await?;
        Ok(flowing.iter().all(|&q| leos[q as usize] == 3 * FIRST))
    })
    .await?;
    wait_until("a probe round after the first reading", deadline(&[CHECK, CHECK]), async || -> anyhow::Result<bool> {
        let mut probed = Vec::new();
        for &q in &flowing {
            probed.push(partition_doc(m, TOPIC, q).await?["probed_source_offset"].clone());
        }
        Ok(probed.iter().all(|o| *o == 3 * FIRST))
    })
    .await?;
    let later = partition_doc(m, TOPIC, STUCK).await?;
    assert_eq!(want(&later), stuck, "{later}");
    for &q in &flowing {
        let src = read_partition(&a.client, TOPIC, q, None).await?;
        let dst = read_partition(&b.client, TOPIC, q, None).await?;
        assert_same_partition(&format!("{TOPIC}/{q}"), &src, &dst);
    }
    let raised = monitor_events(m, Some("partition_stalled")).await?;
    let raised: Vec<_> = raised.iter().filter(|e| e["cleared"] == false).collect();
    assert_eq!(raised.len(), 1, "only the stuck partition stalled, once: {raised:?}");

    // The obstacle gone, the partition catches up and the stall clears.
    std::fs::remove_dir(&obstacle)?;
    p.close().await;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    wait_event(m, "partition_stalled", TOPIC, STUCK, true, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    Ok(())
}
