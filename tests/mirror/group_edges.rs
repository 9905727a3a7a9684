//! The edges of consumer-group offset sync (design §4 "Group offset sync": each copy is `min(committed, target
//! LEO)`, moves forward only, happens only while the group has no active members on the target, and stops for
//! promoted topics), end to end, and under `rename = "prefix"`.
//!
//! A sync round reads each group's committed offsets once. To know that a round saw a source commit, a test commits
//! a marker offset after it and waits for the marker on the target, twice: the round that copies the second marker
//! started after the round that copied the first one ended, so after the commit under test. (With one marker, the
//! round that copied it could have read the other offsets before the commit under test.)

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::admin::CommittedOffset;
use ferry_client::{Consumer, ConsumerConfig, OffsetReset};
use ferry_testkit::{deadline, wait_until};

use crate::common::*;

type Offsets = BTreeMap<(String, u32), u64>;

fn offsets(items: &[(&str, u32, u64)]) -> Offsets {
    items.iter().map(|(t, p, o)| ((t.to_string(), *p), *o)).collect()
}

/// Commits `offsets` for `group` on `dc`.
async fn commit(dc: &Dc, group: &str, offsets: &Offsets) -> anyhow::Result<()> {
    let list = offsets
        .iter()
        .map(|((t, p), o)| CommittedOffset { topic: t.clone(), partition: *p, offset: *o, metadata: String::new() })
        .collect();
    Ok(dc.admin.commit_offsets(group, list).await?)
}

/// `group`'s committed offsets on `dc`.
async fn group_offsets(dc: &Dc, group: &str) -> anyhow::Result<Offsets> {
    let d = dc.admin.describe_group(group).await?;
    Ok(d.offsets.iter().map(|o| ((o.topic.clone(), o.partition), o.offset)).collect())
}

/// Waits until `group` holds exactly `want` on `dc`.
async fn wait_group(dc: &Dc, group: &str, want: &Offsets, limit: Duration) -> anyhow::Result<()> {
    let what = format!("{group} on {} to hold {want:?}", dc.name);
    wait_until(&what, limit, async || -> anyhow::Result<bool> { Ok(group_offsets(dc, group).await? == *want) }).await
}

/// The wait of one sync round and the copy it makes.
fn sync_deadline(conf: &MirrorConf) -> Duration {
    deadline(&[conf.group_sync_interval, DISCOVERY])
}

/// A marker partition: its topic on each side, and the offset the markers count up from (below the target's log
/// end minus 2).
struct Marker<'a> {
    source: &'a str,
    target: &'a str,
    partition: u32,
    base: u64,
}

/// Commits two marker offsets in turn for `group` on the source and waits for each on the target, where the group
/// holds `target_rest` besides the marker (see the module docs): afterwards a sync round has read every group after
/// everything committed before the call.
async fn two_markers(
    (a, b): (&Dc, &Dc),
    conf: &MirrorConf,
    group: &str,
    m: Marker<'_>,
    target_rest: &Offsets,
) -> anyhow::Result<()> {
    for step in [1, 2] {
        commit(a, group, &offsets(&[(m.source, m.partition, m.base + step)])).await?;
        let mut want = target_rest.clone();
        want.insert((m.target.to_owned(), m.partition), m.base + step);
        wait_group(b, group, &want, sync_deadline(conf)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_prefix_rename_offsets_follow_later_commits_and_never_move_back() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic("orders", 2).await?;
    produce(&a, "orders", "groups", 1_000, 64).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.rename = "prefix".into();
    conf.groups_include = vec!["^app$".into()];
    let _mirror = conf.start().await?;
    wait_caught_up(&a, "orders", &b, "dc-a.orders", io_deadline()).await?;
    assert!(b.leos("dc-a.orders").await?.iter().all(|leo| *leo > 460), "every offset below is within the log");

    // First copy, under the target's name.
    commit(&a, "app", &offsets(&[("orders", 0, 300), ("orders", 1, 200)])).await?;
    wait_group(&b, "app", &offsets(&[("dc-a.orders", 0, 300), ("dc-a.orders", 1, 200)]), sync_deadline(&conf)).await?;
    // Later commits are copied again.
    commit(&a, "app", &offsets(&[("orders", 0, 400), ("orders", 1, 350)])).await?;
    wait_group(&b, "app", &offsets(&[("dc-a.orders", 0, 400), ("dc-a.orders", 1, 350)]), sync_deadline(&conf)).await?;

    // The source moves partition 0 back (a consumer rewound on dc-a): the target keeps 400.
    commit(&a, "app", &offsets(&[("orders", 0, 100)])).await?;
    assert_eq!(group_offsets(&a, "app").await?, offsets(&[("orders", 0, 100), ("orders", 1, 350)]));
    let rest = offsets(&[("dc-a.orders", 0, 400)]);
    two_markers(
        (&a, &b),
        &conf,
        "app",
        Marker { source: "orders", target: "dc-a.orders", partition: 1, base: 450 },
        &rest,
    )
    .await?;
    assert_eq!(
        group_offsets(&b, "app").await?,
        offsets(&[("dc-a.orders", 0, 400), ("dc-a.orders", 1, 452)]),
        "a source commit moving back is not copied; nothing appears under the source's topic name"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_while_the_group_runs_on_the_target_and_never_for_promoted_topics() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in ["orders", "payments"] {
        a.create_topic(t, 2).await?;
        produce(&a, t, "groups", 600, 64).await?;
    }
    let mut conf = MirrorConf::new(&a, &b);
    conf.groups_include = vec!["^app$".into(), "^busy$".into()];
    let _mirror = conf.start().await?;
    for t in ["orders", "payments"] {
        wait_caught_up(&a, t, &b, t, io_deadline()).await?;
        assert!(b.leos(t).await?.iter().all(|leo| *leo > 210), "every offset below is within the log");
    }

    // "busy" runs on dc-b: a member with live heartbeats, subscribed to orders.
    let mut member = Consumer::new(
        b.client.clone(),
        ConsumerConfig {
            group: Some("busy".into()),
            auto_offset_reset: OffsetReset::Earliest,
            auto_commit: false,
            heartbeat_interval: Duration::from_millis(300),
            session_timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )?;
    member.subscribe("busy", vec!["orders".into()]).await?;
    assert_eq!(b.admin.describe_group("busy").await?.members.len(), 1);
    let busy = offsets(&[("orders", 0, 100), ("orders", 1, 100)]);
    commit(&a, "busy", &busy).await?;
    let app = offsets(&[("orders", 0, 50), ("orders", 1, 50), ("payments", 0, 50), ("payments", 1, 50)]);
    commit(&a, "app", &app).await?;
    wait_group(&b, "app", &app, sync_deadline(&conf)).await?;
    let mut rest = app.clone();
    rest.remove(&("orders".to_owned(), 1));
    two_markers((&a, &b), &conf, "app", Marker { source: "orders", target: "orders", partition: 1, base: 60 }, &rest)
        .await?;
    assert!(group_offsets(&b, "busy").await?.is_empty(), "a group with members on the target is left alone");

    // payments is promoted on dc-b: app's later commits reach orders only.
    b.admin.promote("payments").await?;
    commit(&a, "app", &offsets(&[("orders", 0, 200), ("payments", 0, 200), ("payments", 1, 200)])).await?;
    let rest = offsets(&[("orders", 0, 200), ("payments", 0, 50), ("payments", 1, 50)]);
    two_markers((&a, &b), &conf, "app", Marker { source: "orders", target: "orders", partition: 1, base: 200 }, &rest)
        .await?;
    assert_eq!(
        group_offsets(&b, "app").await?,
        offsets(&[("orders", 0, 200), ("orders", 1, 202), ("payments", 0, 50), ("payments", 1, 50)]),
        "nothing is copied for a promoted topic"
    );

    // The member leaves: busy's offsets follow now.
    member.close().await?;
    wait_group(&b, "busy", &busy, sync_deadline(&conf)).await?;
    Ok(())
}
