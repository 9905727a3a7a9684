//! The mirror's pipeline defects a review found, each in the scenario that showed it.
//!
//! - **A target that loses its async tail.** kill -9 the target under load, cut a few KB off the tail of each
//!   partition's newest segment (what a power loss under async flush does), restart it. Partitions that get more
//!   source data and partitions whose source stays quiet are all copied again from the target's real log end: the
//!   target probe sees the log end below the cache offset (`sync_error` naming both), and the target ends equal to
//!   the source. Before the fix, a quiet partition showed `mirroring`, lag 0, target offset = cache, while the target
//!   lacked records.
//! - **A source that lost its whole first epoch.** The source partition's only batch (epoch 0) is lost in a power
//!   loss; the source restarts in epoch 1 and new records pass the old log end before the mirror looks. The source
//!   answers `EpochEnd(0)` with "no such epoch": that is a divergence (it was taken for none), under halt and under
//!   truncate.
//! - **A gap above the target's log end.** The target loses its tail while the mirror's cache offset is ahead, and
//!   source retention moves the source's log start between the two: the target refuses the batch at the cache offset
//!   (it does not start at the source's log start), the mirror copies again from the target's log end, and only
//!   what the source really no longer holds becomes a gap (`data_lost_before_mirroring` names it exactly).

use std::path::PathBuf;

use ferry_client::admin::TopicConfig;
use ferry_testkit::{MirrorProcess, deadline, wait_until};

use crate::common::*;
use crate::soak::oracle::cut_tail;

const TOPIC: &str = "orders";

/// Where `partition` of `topic` lives in a broker's data dir.
fn partition_dir(dc: &Dc, topic: &str, partition: u32) -> PathBuf {
    dc.broker.data_dir().join(topic).join(partition.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_loses_its_tail_is_copied_again_also_on_quiet_partitions() -> anyhow::Result<()> {
    let (a, mut b) = two_dcs().await?;
    a.create_topic(TOPIC, 4).await?;
    let p = producer(&a).await?;
    for partition in 0..4 {
        produce_to_partition(&p, TOPIC, partition, "before", 0, 400).await?;
    }
    let mirror = MirrorConf::new(&a, &b).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let copied = b.leos(TOPIC).await?;
    assert_eq!(copied, vec![400; 4]);

    // The power loss: the target dies, each partition's newest segment loses a tail it had acknowledged.
    b.broker.kill9().await?;
    let mut lost_to = Vec::new();
    for partition in 0..4 {
        let leo = cut_tail(&partition_dir(&b, TOPIC, partition), 3_000)?.expect("a segment");
        assert!(leo < 400, "the cut took records of partition {partition}");
        lost_to.push(leo);
    }
    b.broker.restart().await?;
    assert_eq!(b.leos(TOPIC).await?, lost_to, "recovery found exactly what the cut left");

    // Partitions 0 and 1 get more records; 2 and 3 stay quiet.
    for partition in 0..2 {
        produce_to_partition(&p, TOPIC, partition, "after", 400, 500).await?;
    }
    p.close().await;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(b.leos(TOPIC).await?, vec![500, 500, 400, 400]);

    // The quiet partitions were resynced because the target probe saw the target below the cache offset, and said
    // so with the exact offsets.
    let events = monitor_events(&mirror, Some("sync_error")).await?;
    for partition in 2..4u32 {
        let lost: Vec<_> = events
            .iter()
            .filter(|e| e["partition"] == partition && e["details"].get("target_offset").is_some())
            .collect();
        assert_eq!(lost.len(), 1, "one sync_error for {TOPIC}/{partition}: {events:?}");
        assert_eq!(lost[0]["details"]["target_offset"], lost_to[partition as usize], "{}", lost[0]);
        assert_eq!(lost[0]["details"]["cache_offset"], 400, "{}", lost[0]);
    }
    let rows = monitor_partitions(&mirror).await?;
    for partition in 0..4u32 {
        let row = &rows[&(TOPIC.to_owned(), partition)];
        let end = if partition < 2 { 500 } else { 400 };
        assert_eq!((row.state.as_str(), row.cache_offset, row.target_offset, row.lag), ("mirroring", end, end, 0));
    }
    assert_no_divergence_nor_halt(&mirror, "a target that lost its tail").await?;
    Ok(())
}

/// The source partition's only batch is lost whole in a power loss; new records in epoch 1 pass the old log end
/// before the mirror comes back.
async fn whole_first_epoch_lost(policy: &str) -> anyhow::Result<()> {
    let (mut a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    let p = producer(&a).await?;
    // One send of 300 records: one batch, epoch 0.
    send_all(&p, (0..300).map(|i| record(TOPIC, "epoch-0", i, 100).with_partition(0))).await?;
    p.close().await;
    let before = read_partition(&a.client, TOPIC, 0, None).await?;
    assert_eq!(before.batches.len(), 1, "the whole epoch is one batch");
    let mut conf = MirrorConf::new(&a, &b);
    conf.on_divergence = policy.into();
    let mut mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let target_before = read_topic(&b, TOPIC).await?;
    mirror.kill9().await?;

    // The power loss takes the whole batch: the source restarts empty, in epoch 1.
    a.broker.kill9().await?;
    assert_eq!(cut_tail(&partition_dir(&a, TOPIC, 0), u64::MAX)?, Some(0));
    a.broker.restart().await?;
    let d = a.admin.describe_topic(TOPIC).await?;
    assert_eq!((d.partitions[0].log_end_offset, d.partitions[0].epoch), (0, 1));
    let p = producer(&a).await?;
    for chunk in 0..8u64 {
        produce_range(&p, TOPIC, "epoch-1", chunk * 50, (chunk + 1) * 50, 100).await?;
    }
    p.close().await;
    assert_eq!(a.leos(TOPIC).await?, vec![400], "the new records passed the old log end (300)");
    mirror.restart().await?;

    let reason = "the source no longer knows epoch 0, in which the target's last batch was written (its history \
                  starts at offset 0): the source lost that epoch's records";
    if policy == "halt" {
        wait_until("the partition to halt", deadline(&[IO_BUDGET]), async || -> anyhow::Result<bool> {
            Ok(monitor_partitions(&mirror).await?.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == "halted"))
        })
        .await?;
        let after = read_topic(&b, TOPIC).await?;
        assert_same_partition("the halted target stays as it was", &target_before[0], &after[0]);
    } else {
        wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
        assert_identical(&a, TOPIC, &b, TOPIC).await?;
        let target = read_topic(&b, TOPIC).await?;
        assert!(target[0].batches.iter().all(|b| b.2 == 1), "only the new epoch's batches are left");
    }
    let events = monitor_events(&mirror, Some("partition_diverged")).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0]["details"],
        serde_json::json!({"offset": 0, "cache_offset": 300, "reason": reason, "policy": policy}),
        "{}",
        events[0]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_lost_its_whole_first_epoch_diverges_under_halt() -> anyhow::Result<()> {
    whole_first_epoch_lost("halt").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_lost_its_whole_first_epoch_is_truncated_under_truncate() -> anyhow::Result<()> {
    whole_first_epoch_lost("truncate").await
}

const SEGMENT: u64 = 64 * 1024;
const RETENTION: u64 = 128 * 1024;
/// `retention_check_interval` of [`BROKER_CONFIG`].
const RETENTION_CHECK: std::time::Duration = std::time::Duration::from_millis(200);
const MONITOR_TOKEN: &str = "target-loss-token";

async fn set_paused(mirror: &MirrorProcess, paused: bool) -> anyhow::Result<()> {
    let (action, state) = if paused { ("pause", "paused") } else { ("resume", "mirroring") };
    monitor_post(mirror, &format!("/api/v1/topics/{TOPIC}/{action}"), MONITOR_TOKEN).await?;
    wait_until(&format!("{TOPIC}/0 to be {state}"), deadline(&[IO_BUDGET]), async || -> anyhow::Result<bool> {
        Ok(monitor_partitions(mirror).await?.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == state))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_behind_the_source_log_start_never_skips_records_the_source_still_holds() -> anyhow::Result<()> {
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let topic_config =
        TopicConfig { segment_bytes: Some(SEGMENT), retention_bytes: Some(RETENTION), ..Default::default() };
    a.admin.create_topic(TOPIC, 1, topic_config, None).await?;
    let p = producer(&a).await?;
    for chunk in 0..20u64 {
        produce_range(&p, TOPIC, "first", chunk * 50, (chunk + 1) * 50, 300).await?;
    }
    // Retention deleted the oldest segments and is done before the mirror looks.
    wait_until(
        "source retention to settle",
        deadline(&[RETENTION_CHECK, IO_BUDGET]),
        async || -> anyhow::Result<bool> {
            let d = a.admin.describe_topic(TOPIC).await?;
            Ok(d.partitions[0].log_start_offset > 0 && d.partitions[0].size_bytes <= RETENTION)
        },
    )
    .await?;
    let mirror = MirrorProcess::builder(MirrorConf::new(&a, &b).toml())
        .env("FERRY_MONITOR_TOKEN", MONITOR_TOKEN)
        .start()
        .await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    set_paused(&mirror, true).await?;
    let (source_start, cache) = a.offsets(TOPIC).await?[0];

    // The target loses a tail the mirror had acknowledged: its log end falls one batch (50 records) above the
    // source's log start.
    let lost_to = b.admin.truncate_partition(TOPIC, 0, source_start + 70).await?;
    assert_eq!(lost_to, source_start + 50, "truncated to the batch boundary");
    assert!(lost_to < cache, "{lost_to} < {cache}");
    // Source retention moves the source's log start past the target's log end, one chunk at a time, so it stops
    // before the cache offset.
    let mut chunk = 20u64;
    while a.offsets(TOPIC).await?[0].0 <= lost_to {
        produce_range(&p, TOPIC, "more", chunk * 50, (chunk + 1) * 50, 300).await?;
        chunk += 1;
        wait_until(
            "source retention to settle",
            deadline(&[RETENTION_CHECK, IO_BUDGET]),
            async || -> anyhow::Result<bool> {
                Ok(a.admin.describe_topic(TOPIC).await?.partitions[0].size_bytes <= RETENTION)
            },
        )
        .await?;
    }
    p.close().await;
    let (new_start, _) = a.offsets(TOPIC).await?[0];
    assert!(lost_to < new_start && new_start <= cache, "{lost_to} < {new_start} <= {cache}: the case under test");

    set_paused(&mirror, false).await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    // The target holds exactly the source from its log start on, and the one gap is what the source no longer has.
    let source = read_partition(&a.client, TOPIC, 0, None).await?;
    let target = read_partition(&b.client, TOPIC, 0, None).await?;
    assert_same_partition("records from the source's log start", &source, &target.starting_at(new_start));
    let d = b.admin.describe_topic(TOPIC).await?;
    let gaps: Vec<(u64, u64)> = d.partitions[0].gaps.iter().map(|g| (g.start, g.end)).collect();
    assert_eq!(gaps, vec![(lost_to, new_start)], "only what the source no longer holds is a gap");
    let lost = monitor_events(&mirror, Some("data_lost_before_mirroring")).await?;
    let ranges: Vec<(u64, u64)> = lost
        .iter()
        .map(|e| (e["details"]["gap_start"].as_u64().unwrap_or(0), e["details"]["gap_end"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(ranges, vec![(lost_to, new_start)], "{lost:?}");
    Ok(())
}
