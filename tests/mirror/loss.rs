//! Issue 18, loss before mirroring: source retention deletes records the mirror has not copied, while the topic is
//! paused. The mirror reports it at once, still paused: one `data_lost_before_mirroring` naming the exact range
//! `[gap_start, gap_end)`, where `gap_end` is the source's new log start and `gap_start` one past what the mirror
//! holds (copied before the pause, or fetched ahead while paused), and
//! `ferry_mirror_records_lost_before_mirroring_total` counts exactly those offsets. After the resume the target
//! records exactly that range as a gap, holds what it copied and fetched ahead below it, and exactly the source's
//! records from the new log start on; no second event names any of it again.

use ferry_client::admin::TopicConfig;
use ferry_testkit::{deadline, wait_until};

use crate::common::*;
use crate::watch::*;

const TOPIC: &str = "orders";
/// The source's segments (its `max_batch_bytes` too, so they are effective).
const SEGMENT: u64 = 64 * 1024;
/// The retention set once every record is produced, so it deletes in one pass.
const RETENTION: u64 = 128 * 1024;
const COPIED: u64 = 100;
const LAGGING: u64 = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_of_unmirrored_records_while_paused_is_reported_at_once_with_the_exact_range() -> anyhow::Result<()> {
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let config = TopicConfig { segment_bytes: Some(SEGMENT), ..Default::default() };
    a.admin.create_topic(TOPIC, 1, config, None).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "copied", 0, COPIED, 300).await?;
    // A small fetch-ahead window, so the paused mirror holds only a little of what follows.
    let mut conf = MirrorConf::new(&a, &b);
    conf.sync_extra = vec!["queue_bytes = \"128KiB\"".into()];
    let mirror = start_mirror(&conf, "", "").await?;
    let m = &mirror.process;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let copied = read_partition(&b.client, TOPIC, 0, None).await?;

    // Paused; the records that follow outgrow the fetch-ahead window; then retention deletes most of them.
    set_topic(m, TOPIC, "pause", "paused").await?;
    for chunk in 0..LAGGING / 50 {
        produce_range(&p, TOPIC, "lagging", chunk * 50, (chunk + 1) * 50, 300).await?;
    }
    p.close().await;
    a.admin.alter_topic_config(TOPIC, TopicConfig { retention_bytes: Some(RETENTION), ..Default::default() }).await?;
    let retention_check = std::time::Duration::from_millis(200);
    wait_until("source retention to delete old segments", deadline(&[retention_check, IO_BUDGET]), async || {
        anyhow::Ok(a.offsets(TOPIC).await?[0].0 > COPIED)
    })
    .await?;
    let (source_start, source_end) = a.offsets(TOPIC).await?[0];
    assert_eq!(source_end, COPIED + LAGGING);

    // Reported while still paused: the stream's position or the probe shows the new log start.
    let lost = wait_event(m, "data_lost_before_mirroring", TOPIC, 0, false, deadline(&[CHECK, CHECK])).await?;
    let (gap_start, gap_end) =
        (lost["details"]["gap_start"].as_u64().unwrap(), lost["details"]["gap_end"].as_u64().unwrap());
    assert_eq!(gap_end, source_start, "the gap ends at the source's new log start: {lost}");
    assert!((COPIED..source_start).contains(&gap_start), "it starts past what was copied: {lost}");
    assert_eq!(lost["details"]["records"], gap_end - gap_start, "{lost}");
    assert_eq!(lost["severity"], "critical");
    let doc = partition_doc(m, TOPIC, 0).await?;
    assert_eq!((doc["state"].as_str(), doc["cache_offset"].as_u64()), (Some("paused"), Some(COPIED)), "{doc}");
    let counter = "ferry_mirror_records_lost_before_mirroring_total{topic=\"orders\",partition=\"0\"}";
    assert_eq!(metric(m, counter).await?, Some((gap_end - gap_start) as f64));

    // Resumed: the target records exactly that range.
    set_topic(m, TOPIC, "resume", "mirroring").await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let d = b.admin.describe_topic(TOPIC).await?;
    let gaps: Vec<(u64, u64)> = d.partitions[0].gaps.iter().map(|g| (g.start, g.end)).collect();
    assert_eq!(gaps, vec![(gap_start, gap_end)], "the target records the range the event named");
    let target = read_partition(&b.client, TOPIC, 0, None).await?;
    let below: Vec<Rec> = target.records.iter().filter(|r| r.offset < COPIED).cloned().collect();
    assert_eq!(records_digest(&below), records_digest(&copied.records), "records copied before the pause");
    let ahead: Vec<Rec> = target.records.iter().filter(|r| (COPIED..gap_start).contains(&r.offset)).cloned().collect();
    let produced: Vec<Rec> =
        (0..gap_start - COPIED).map(|i| as_stored(COPIED + i, record(TOPIC, "lagging", i, 300))).collect();
    assert_eq!(records_digest(&ahead), records_digest(&produced), "records fetched ahead before retention");
    assert!(target.records.iter().all(|r| !(gap_start..gap_end).contains(&r.offset)), "nothing inside the gap");
    let source = read_partition(&a.client, TOPIC, 0, None).await?;
    let after = target.starting_at(source_start);
    after.assert_contiguous("target after the gap");
    assert_same_partition("records from the source's new log start", &source, &after);
    let events = monitor_events(m, Some("data_lost_before_mirroring")).await?;
    assert_eq!(events.len(), 1, "one event names the whole gap: {events:?}");
    assert_eq!(metric(m, counter).await?, Some((gap_end - gap_start) as f64));
    Ok(())
}

/// Case 13 of the cluster analysis: retention active all along (the topic has 128 KiB of it from the start) deletes
/// unmirrored records while the partition is paused, pass after pass; on resume the loss is reported (once, for
/// exactly the range the target then records as a gap), and nothing of it is ever copied as if it existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_running_all_along_while_paused_is_reported_by_resume_at_the_latest() -> anyhow::Result<()> {
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let config = TopicConfig { segment_bytes: Some(SEGMENT), retention_bytes: Some(RETENTION), ..Default::default() };
    a.admin.create_topic(TOPIC, 1, config, None).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "copied", 0, COPIED, 300).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.sync_extra = vec!["queue_bytes = \"128KiB\"".into()];
    let mirror = start_mirror(&conf, "", "").await?;
    let m = &mirror.process;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    // About 1 MB while paused: retention deletes as it goes.
    set_topic(m, TOPIC, "pause", "paused").await?;
    for chunk in 0..LAGGING / 50 {
        produce_range(&p, TOPIC, "lagging", chunk * 50, (chunk + 1) * 50, 500).await?;
    }
    p.close().await;
    let retention_check = std::time::Duration::from_millis(200);
    wait_until("source retention to pass what the mirror holds", deadline(&[retention_check, IO_BUDGET]), async || {
        anyhow::Ok(a.offsets(TOPIC).await?[0].0 > COPIED + 500)
    })
    .await?;
    set_topic(m, TOPIC, "resume", "mirroring").await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let events = monitor_events(m, Some("data_lost_before_mirroring")).await?;
    assert!(!events.is_empty(), "records deleted before they were mirrored, and no event");
    // Every range reported is exactly a gap the target records, and the target holds nothing inside one.
    let mut reported: Vec<(u64, u64)> = events
        .iter()
        .map(|e| (e["details"]["gap_start"].as_u64().unwrap(), e["details"]["gap_end"].as_u64().unwrap()))
        .collect();
    reported.sort_unstable();
    let d = b.admin.describe_topic(TOPIC).await?;
    let gaps: Vec<(u64, u64)> = d.partitions[0].gaps.iter().map(|g| (g.start, g.end)).collect();
    assert_eq!(gaps, reported, "the target records exactly the ranges reported");
    let target = read_partition(&b.client, TOPIC, 0, None).await?;
    for (start, end) in &gaps {
        assert!(target.records.iter().all(|r| !(*start..*end).contains(&r.offset)), "a record inside a gap");
    }
    let source = read_partition(&a.client, TOPIC, 0, None).await?;
    let (source_start, _) = a.offsets(TOPIC).await?[0];
    assert_same_partition("records from the source's log start", &source, &target.starting_at(source_start));
    Ok(())
}

/// Case 13, after a restart: the mirror is killed, source retention deletes records it never copied meanwhile, and
/// the restarted mirror reports exactly that range (once) and records it as the target's gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_while_the_mirror_is_down_is_reported_when_it_comes_back() -> anyhow::Result<()> {
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let config = TopicConfig { segment_bytes: Some(SEGMENT), retention_bytes: Some(RETENTION), ..Default::default() };
    a.admin.create_topic(TOPIC, 1, config, None).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "copied", 0, COPIED, 300).await?;
    let mut mirror = start_mirror(&MirrorConf::new(&a, &b), "", "").await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    mirror.process.kill9().await?;
    for chunk in 0..LAGGING / 50 {
        produce_range(&p, TOPIC, "lagging", chunk * 50, (chunk + 1) * 50, 500).await?;
    }
    p.close().await;
    let retention_check = std::time::Duration::from_millis(200);
    wait_until("source retention to pass what the target holds", deadline(&[retention_check, IO_BUDGET]), async || {
        anyhow::Ok(a.offsets(TOPIC).await?[0].0 > COPIED)
    })
    .await?;
    let (source_start, _) = a.offsets(TOPIC).await?[0];
    mirror.process.restart().await?;
    let m = &mirror.process;
    let lost =
        wait_event(m, "data_lost_before_mirroring", TOPIC, 0, false, deadline(&[CHECK, CHECK, IO_BUDGET])).await?;
    let range = (lost["details"]["gap_start"].as_u64().unwrap(), lost["details"]["gap_end"].as_u64().unwrap());
    assert_eq!(range, (COPIED, source_start), "{lost}");
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let d = b.admin.describe_topic(TOPIC).await?;
    let gaps: Vec<(u64, u64)> = d.partitions[0].gaps.iter().map(|g| (g.start, g.end)).collect();
    assert_eq!(gaps, vec![range]);
    assert_eq!(monitor_events(m, Some("data_lost_before_mirroring")).await?.len(), 1);
    Ok(())
}
