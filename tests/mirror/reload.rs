//! SIGHUP through the real process (conf/mirror.toml: it reloads the `[topics]` and `[groups]` rules): one reload
//! drops a topic from `include` and adds a group to `[groups] include`.
//!
//! - The dropped topic raises `remove_topic`, leaves `/api/v1/topics` and `/api/v1/partitions`, and records
//!   produced to it after the reload are not copied: its target topic stays exactly as it was.
//! - The group the new rules match, which the old ones did not, starts syncing: its committed offsets appear on the
//!   target. Before the reload a sync round demonstrably ran (a matched marker group was copied) and left it out.
//! - The process is the same throughout (no restart), and the topic still included keeps mirroring exactly.

use std::collections::BTreeMap;

use ferry_client::admin::CommittedOffset;
use ferry_testkit::{Signal, deadline, wait_until};

use crate::common::*;

const KEEP: &str = "keep";
const DROP: &str = "drop";

/// The committed offsets of `group` on `dc` for `topic`, by partition.
async fn group_offsets(dc: &Dc, group: &str, topic: &str) -> anyhow::Result<BTreeMap<u32, u64>> {
    let d = dc.admin.describe_group(group).await?;
    Ok(d.offsets.iter().filter(|o| o.topic == topic).map(|o| (o.partition, o.offset)).collect())
}

/// Commits `offsets` (by partition) of `topic` for `group` on `dc`.
async fn commit(dc: &Dc, group: &str, topic: &str, offsets: &BTreeMap<u32, u64>) -> anyhow::Result<()> {
    let list = offsets
        .iter()
        .map(|(p, o)| CommittedOffset { topic: topic.into(), partition: *p, offset: *o, metadata: String::new() })
        .collect();
    Ok(dc.admin.commit_offsets(group, list).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_drops_a_topic_from_include_and_starts_syncing_a_newly_included_group() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in [KEEP, DROP] {
        a.create_topic(t, 2).await?;
        produce(&a, t, "before", 400, 64).await?;
    }
    // "app" and "marker" both committed on dc-a; only "marker" is matched before the reload.
    let app: BTreeMap<u32, u64> = [(0, 150), (1, 120)].into();
    let marker: BTreeMap<u32, u64> = [(0, 10), (1, 20)].into();
    commit(&a, "app", KEEP, &app).await?;
    commit(&a, "marker", KEEP, &marker).await?;

    let mut conf = MirrorConf::new(&a, &b);
    conf.include = vec![format!("^{KEEP}$"), format!("^{DROP}$")];
    conf.groups_include = vec!["^marker$".into()];
    let mut mirror = conf.start().await?;
    let pid = mirror.pid();
    for t in [KEEP, DROP] {
        wait_caught_up(&a, t, &b, t, io_deadline()).await?;
        assert_identical(&a, t, &b, t).await?;
    }
    for leo in b.leos(KEEP).await? {
        assert!(leo > 150, "the committed offsets are below the log ends, so they are copied as they are");
    }
    let sync = deadline(&[conf.group_sync_interval, DISCOVERY]);
    wait_until("marker's offsets on dc-b", sync, async || -> anyhow::Result<bool> {
        Ok(group_offsets(&b, "marker", KEEP).await? == marker)
    })
    .await?;
    // That round listed every group of dc-a, "app" included, and did not copy it.
    assert!(group_offsets(&b, "app", KEEP).await?.is_empty(), "\"app\" is not matched before the reload");
    let dropped_before = read_topic(&b, DROP).await?;

    conf.include = vec![format!("^{KEEP}$")];
    conf.groups_include = vec!["^marker$".into(), "^app$".into()];
    mirror.rewrite_config(&conf.toml())?;
    mirror.send_signal(Signal::HUP)?;

    let events = wait_for_remove(&mirror, DROP, deadline(&[DISCOVERY])).await?;
    assert_eq!(events.len(), 1, "one remove_topic for {DROP}: {events:?}");
    wait_until("app's offsets on dc-b", sync, async || -> anyhow::Result<bool> {
        Ok(group_offsets(&b, "app", KEEP).await? == app)
    })
    .await?;

    // The monitor no longer lists the dropped topic or its partitions.
    let topics = monitor_get(&mirror, "/api/v1/topics").await?;
    let names: Vec<&str> =
        topics["topics"].as_array().into_iter().flatten().filter_map(|t| t["topic"].as_str()).collect();
    assert_eq!(names, [KEEP], "{topics}");
    // Its partition tasks stop once the SyncManager sees the new topic set.
    let kept = [(KEEP.to_owned(), 0), (KEEP.to_owned(), 1)];
    wait_owned(&mirror, "only keep's partitions listed", deadline(&[DISCOVERY]), |rows| rows.keys().eq(kept.iter()))
        .await?;

    // Records produced after the reload: the kept topic gets them, the dropped one does not.
    let p = producer(&a).await?;
    produce_range(&p, DROP, "after", 0, 300, 64).await?;
    produce_range(&p, KEEP, "after", 0, 300, 64).await?;
    p.close().await;
    wait_caught_up(&a, KEEP, &b, KEEP, io_deadline()).await?;
    assert_identical(&a, KEEP, &b, KEEP).await?;
    let dropped_after = read_topic(&b, DROP).await?;
    assert_eq!(dropped_after.len(), dropped_before.len());
    for (p, (before, after)) in dropped_before.iter().zip(&dropped_after).enumerate() {
        assert_same_partition(&format!("{DROP}/{p} on dc-b after the reload"), before, after);
    }
    assert!(a.leos(DROP).await?.iter().sum::<u64>() == 700, "the source did take the later records");
    assert!(mirror.is_running() && mirror.pid() == pid, "the reload needs no restart");
    Ok(())
}

/// Waits for `remove_topic` of `topic` on the monitor and returns those events.
async fn wait_for_remove(
    mirror: &ferry_testkit::MirrorProcess,
    topic: &str,
    limit: std::time::Duration,
) -> anyhow::Result<Vec<serde_json::Value>> {
    ferry_testkit::wait_for(&format!("remove_topic for {topic}"), limit, async || -> anyhow::Result<Option<_>> {
        let events: Vec<_> =
            monitor_events(mirror, Some("remove_topic")).await?.into_iter().filter(|e| e["topic"] == topic).collect();
        Ok((!events.is_empty()).then_some(events))
    })
    .await
}
