//! Scenario 4: source retention deleted the oldest segments before the mirror first ran. The target partition
//! starts where the source now starts (its log start equals the source's) and holds exactly the records from there.
//!
//! Also: retention deletes records while the mirror lags (its topic paused): the target carries the hole over as a
//! recorded gap, keeps what it had, raises `data_lost_before_mirroring` for exactly that range, and holds exactly the
//! source's records from its new start.

use ferry_client::admin::TopicConfig;
use ferry_testkit::{MirrorProcess, deadline, wait_until};

use crate::common::*;

const TOPIC: &str = "orders";
const SEGMENT: u64 = 64 * 1024;
const RETENTION: u64 = 128 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_starts_at_the_source_log_start_after_retention() -> anyhow::Result<()> {
    // The source takes batches of at most one segment, so its 64 KiB segments are effective (a segment is never
    // smaller than the broker's largest batch). The target keeps its 1 MiB limit, so it adjusts the segment size it
    // is given, and the mirror must not copy the config again on every discovery round.
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let config = TopicConfig { segment_bytes: Some(SEGMENT), retention_bytes: Some(RETENTION), ..Default::default() };
    a.admin.create_topic(TOPIC, 2, config, None).await?;
    // Small flushes make small batches, so the segments roll often and retention has whole segments to delete.
    let p = producer(&a).await?;
    for chunk in 0..40u64 {
        produce_range(&p, TOPIC, "old", chunk * 50, (chunk + 1) * 50, 300).await?;
    }
    p.close().await;
    // Wait until retention deleted the old segments and is done (the rest fits the limit).
    let retention_check = std::time::Duration::from_millis(200);
    ferry_testkit::wait_until(
        "source retention to delete old segments and settle",
        ferry_testkit::deadline(&[retention_check, IO_BUDGET]),
        async || -> anyhow::Result<bool> {
            let d = a.admin.describe_topic(TOPIC).await?;
            Ok(d.partitions.iter().all(|p| p.log_start_offset > 0 && (p.size_bytes <= RETENTION || p.segments == 1)))
        },
    )
    .await?;
    let source_starts: Vec<u64> = a.offsets(TOPIC).await?.iter().map(|(start, _)| *start).collect();

    let mirror = MirrorConf::new(&a, &b).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let target = b.offsets(TOPIC).await?;
    for (p, ((start, _), source_start)) in target.iter().zip(&source_starts).enumerate() {
        assert_eq!(start, source_start, "{TOPIC}/{p}: the target's log start is the source's");
    }
    // Retention did not move since: the comparison below covers exactly [log start, log end).
    assert_eq!(a.offsets(TOPIC).await?.iter().map(|(s, _)| *s).collect::<Vec<_>>(), source_starts);
    assert_identical(&a, TOPIC, &b, TOPIC).await?;

    // Two more discovery rounds: the target's adjusted segment size is not "copied" again and again.
    let round = ferry_testkit::deadline(&[DISCOVERY, DISCOVERY]);
    discovery_round(&a, &b, "marker-1", "marker-1", round).await?;
    discovery_round(&a, &b, "marker-2", "marker-2", round).await?;
    let copies = mirror.logs().matches("copied the source topic's config change").count();
    assert_eq!(copies, 0, "the config given at creation is not copied again:\n{}", mirror.logs());
    Ok(())
}

/// Waits until retention deleted old segments of every partition of `topic` on `dc` and is done (what is left fits
/// the limit).
async fn wait_retention_settled(dc: &Dc, topic: &str, past: u64) -> anyhow::Result<()> {
    let retention_check = std::time::Duration::from_millis(200);
    wait_until(
        "source retention to delete old segments and settle",
        deadline(&[retention_check, IO_BUDGET]),
        async || -> anyhow::Result<bool> {
            let d = dc.admin.describe_topic(topic).await?;
            Ok(d.partitions.iter().all(|p| p.log_start_offset > past && (p.size_bytes <= RETENTION || p.segments == 1)))
        },
    )
    .await
}

async fn set_state(mirror: &MirrorProcess, action: &str, state: &str) -> anyhow::Result<()> {
    monitor_post(mirror, &format!("/api/v1/topics/{TOPIC}/{action}"), TOKEN).await?;
    wait_until(&format!("{TOPIC}/0 to be {state}"), deadline(&[IO_BUDGET]), async || -> anyhow::Result<bool> {
        Ok(monitor_partitions(mirror).await?.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == state))
    })
    .await
}

const TOKEN: &str = "retention-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_while_the_mirror_lags_leaves_a_recorded_gap() -> anyhow::Result<()> {
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let config = TopicConfig { segment_bytes: Some(SEGMENT), retention_bytes: Some(RETENTION), ..Default::default() };
    a.admin.create_topic(TOPIC, 1, config, None).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "mirrored", 0, 100, 300).await?;
    // A small fetch-ahead window, so the paused mirror holds only a little of what follows.
    let mut conf = MirrorConf::new(&a, &b);
    conf.sync_extra = vec!["queue_bytes = \"128KiB\"".into()];
    let mirror = MirrorProcess::builder(conf.toml()).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let copied = read_topic(&b, TOPIC).await?;

    // While the topic is paused, retention deletes records the mirror has not copied.
    set_state(&mirror, "pause", "paused").await?;
    for chunk in 0..40u64 {
        produce_range(&p, TOPIC, "lagging", chunk * 50, (chunk + 1) * 50, 300).await?;
    }
    p.close().await;
    wait_retention_settled(&a, TOPIC, 100).await?;
    let (source_start, _) = a.offsets(TOPIC).await?[0];
    assert!(source_start > 100, "retention removed records the mirror never copied");
    set_state(&mirror, "resume", "mirroring").await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    // The target holds what it copied before the pause, then what the paused mirror had fetched ahead, then the
    // recorded gap, then exactly the source from its new log start.
    let target = read_partition(&b.client, TOPIC, 0, None).await?;
    let source = read_partition(&a.client, TOPIC, 0, None).await?;
    let gap_start = target.records.iter().take_while(|r| r.offset < source_start).last().map_or(0, |r| r.offset + 1);
    assert!((100..source_start).contains(&gap_start), "the gap starts after the copied records: {gap_start}");
    let d = b.admin.describe_topic(TOPIC).await?;
    let gaps: Vec<(u64, u64)> = d.partitions[0].gaps.iter().map(|g| (g.start, g.end)).collect();
    assert_eq!(gaps, vec![(gap_start, source_start)], "the target records the hole retention left");
    let before: Vec<Rec> = target.records.iter().filter(|r| r.offset < 100).cloned().collect();
    assert_eq!(records_digest(&before), records_digest(&copied[0].records), "records copied before the pause");
    let fetched_ahead: Vec<Rec> =
        target.records.iter().filter(|r| (100..gap_start).contains(&r.offset)).cloned().collect();
    let produced: Vec<Rec> =
        (0..gap_start - 100).map(|i| as_stored(100 + i, record(TOPIC, "lagging", i, 300))).collect();
    assert_eq!(records_digest(&fetched_ahead), records_digest(&produced), "records fetched before retention");
    let after = target.starting_at(source_start);
    after.assert_contiguous("target after the gap");
    assert_same_partition("records from the source's new log start", &source, &after);
    // Retention ran while records were produced: the mirror reports each deletion it saw as it saw it (the probe
    // or a stream position), so one event or several whose ranges follow each other name the exact gap.
    let events = monitor_events(&mirror, Some("data_lost_before_mirroring")).await?;
    let mut ranges: Vec<(u64, u64)> = events
        .iter()
        .map(|e| (e["details"]["gap_start"].as_u64().unwrap_or(0), e["details"]["gap_end"].as_u64().unwrap_or(0)))
        .collect();
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0), "the ranges follow each other: {ranges:?}");
    let union = ranges.first().map(|r| r.0).zip(ranges.last().map(|r| r.1));
    assert_eq!(union, Some((gap_start, source_start)), "data_lost_before_mirroring names the exact gap: {ranges:?}");
    Ok(())
}
