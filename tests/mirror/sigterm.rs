//! Scenario 3: SIGTERM while records keep arriving. The mirror drains its in-flight appends, commits and exits
//! with 0; the offsets committed to the source group `ferry-mirror.{mirror.name}` then equal the target's log ends
//! exactly, and what the target holds is an identical prefix of the source.
//!
//! Then the target loses the topic while the mirror is stopped: restarted, the mirror finds an empty target
//! partition although its source group shows progress, raises `sync_error` and copies everything again.

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPIC: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_exactly_the_target_log_ends() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 4).await?;
    produce(&a, TOPIC, "before", 2_000, 100).await?;
    let conf = MirrorConf::new(&a, &b);
    let mut mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    // Stop while a producer is still writing, so there is work in flight.
    let stop = CancellationToken::new();
    let load = background_producer(&a, TOPIC, "during", stop.clone());
    let before: u64 = a.leos(TOPIC).await?.iter().sum();
    ferry_testkit::wait_until("the source to grow under the load", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(a.leos(TOPIC).await?.iter().sum::<u64>() >= before + 1_000)
    })
    .await?;
    let status = mirror.terminate(ferry_testkit::deadline(&[SHUTDOWN_TIMEOUT])).await?;
    assert_eq!(status.code(), Some(0), "SIGTERM is a graceful stop");
    stop.cancel();
    load.await??;

    let group = format!("ferry-mirror.{}", conf.name);
    let committed: BTreeMap<u32, u64> = a
        .admin
        .fetch_committed_offsets(&group, &[])
        .await?
        .into_iter()
        .filter(|c| c.topic == TOPIC)
        .map(|c| (c.partition, c.offset))
        .collect();
    let target_leos = b.leos(TOPIC).await?;
    let expected: BTreeMap<u32, u64> = target_leos.iter().enumerate().map(|(p, leo)| (p as u32, *leo)).collect();
    assert_eq!(committed, expected, "the source group {group} holds exactly the target's log ends");

    // The target holds an identical prefix of the source.
    for (p, leo) in target_leos.iter().enumerate() {
        let p = p as u32;
        let src = read_partition(&a.client, TOPIC, p, Some(*leo)).await?;
        let dst = read_partition(&b.client, TOPIC, p, None).await?;
        dst.assert_contiguous(&format!("target {TOPIC}/{p}"));
        assert_same_partition(&format!("{TOPIC}/{p} below {leo}"), &src, &dst);
    }

    // The target loses the topic; the restarted mirror notices (the source group shows progress) and copies again.
    b.admin.delete_topic(TOPIC).await?;
    mirror.restart().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, ferry_testkit::deadline(&[DISCOVERY, SESSION, IO_BUDGET])).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    let events = monitor_events(&mirror, Some("sync_error")).await?;
    let lost: Vec<_> =
        events.iter().filter(|e| e["message"].as_str().is_some_and(|m| m.contains("lost data"))).collect();
    assert_eq!(lost.len(), 4, "one sync_error per partition: {events:?}");
    Ok(())
}
