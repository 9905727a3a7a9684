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
