//! The periodic commit (design §4, conf/mirror.toml `sync.commit_interval`): while the mirror keeps running, the
//! cache offsets reach the source group `ferry-mirror.{mirror.name}` within three commit intervals, again after
//! more records, and the monitor's `commit_offset` says the same. No shutdown is involved: the commit on SIGTERM is
//! tested in `sigterm`.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_testkit::{deadline, wait_until};

use crate::common::*;

const TOPIC: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_offsets_are_committed_every_commit_interval_while_running() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 3).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.commit_interval = Duration::from_secs(2);
    let mut mirror = conf.start().await?;
    let pid = mirror.pid();
    let group = format!("ferry-mirror.{}", conf.name);
    let p = producer(&a).await?;
    for (from, to) in [(0, 600), (600, 1_500)] {
        produce_range(&p, TOPIC, "commits", from, to, 64).await?;
        wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
        // Caught up: every cache offset equals the target's log end, which the next commit carries over.
        let expected: BTreeMap<u32, u64> =
            b.leos(TOPIC).await?.into_iter().enumerate().map(|(p, o)| (p as u32, o)).collect();
        assert!(expected.values().all(|o| *o > 0), "every partition holds records: {expected:?}");
        let what = format!("{group} on dc-a and the monitor's commit_offset to hold the cache offsets {expected:?}");
        wait_until(&what, deadline(&[conf.commit_interval]), async || -> anyhow::Result<bool> {
            let committed: BTreeMap<u32, u64> = a
                .admin
                .fetch_committed_offsets(&group, &[])
                .await?
                .into_iter()
                .filter(|c| c.topic == TOPIC)
                .map(|c| (c.partition, c.offset))
                .collect();
            // The monitor learns of the commit once the source acknowledged it.
            let rows = monitor_get(&mirror, "/api/v1/partitions").await?;
            let shown: BTreeMap<u32, u64> = rows["partitions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["topic"] == TOPIC)
                .map(|r| (r["partition"].as_u64().unwrap_or(u64::MAX) as u32, r["commit_offset"].as_u64().unwrap_or(0)))
                .collect();
            Ok(committed == expected && shown == expected)
        })
        .await?;
        assert!(mirror.is_running() && mirror.pid() == pid, "committed by the running mirror, not at a stop");
    }
    p.close().await;
    Ok(())
}
