//! Scenario 9: two mirror processes with the same `mirror.name` split the partitions through the scale-out group
//! on the target; when one is killed with SIGKILL the other takes all of them over within the session timeout, and
//! the target ends identical to the source with no duplicate and no gap.

use std::collections::{BTreeMap, BTreeSet};

use ferry_testkit::deadline;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPICS: [&str; 2] = ["orders", "payments"];

fn all_partitions() -> BTreeSet<(String, u32)> {
    TOPICS.iter().flat_map(|t| (0..4).map(move |p| (t.to_string(), p))).collect()
}

fn mirroring(rows: &BTreeMap<(String, u32), PartitionRow>) -> BTreeSet<(String, u32)> {
    rows.iter().filter(|(_, r)| r.state == "mirroring").map(|(k, _)| k.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_splits_and_takes_over() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in TOPICS {
        a.create_topic(t, 4).await?;
    }
    let stop = CancellationToken::new();
    let loads: Vec<_> = TOPICS.iter().map(|t| background_producer(&a, t, t, stop.clone())).collect();
    let conf = MirrorConf::new(&a, &b);
    let (m1, m2) = tokio::join!(conf.start(), conf.start());
    let (mut m1, m2) = (m1?, m2?);

    // Both join; the group splits the eight partitions between them, each owning some and none owned twice.
    let split = deadline(&[DISCOVERY, SESSION, SESSION]);
    let all = all_partitions();
    let (one, two) = ferry_testkit::wait_for(
        "the two mirrors to split the partitions",
        split,
        async || -> anyhow::Result<Option<_>> {
            let one = mirroring(&monitor_partitions(&m1).await?);
            let two = mirroring(&monitor_partitions(&m2).await?);
            let union: BTreeSet<_> = one.union(&two).cloned().collect();
            Ok((!one.is_empty() && !two.is_empty() && one.is_disjoint(&two) && union == all).then_some((one, two)))
        },
    )
    .await?;
    tracing::info!(?one, ?two, "split");
    assert_eq!(one.len() + two.len(), 8);

    // SIGKILL one: the other owns everything within the session timeout (plus its heartbeat and a resume).
    m1.kill9().await?;
    let takeover = deadline(&[SESSION, SESSION / 5, DISCOVERY]);
    wait_owned(&m2, "the survivor to own every partition", takeover, |rows| mirroring(rows) == all).await?;

    stop.cancel();
    let mut produced = 0;
    for l in loads {
        produced += l.await??;
    }
    let mut total = 0;
    for t in TOPICS {
        wait_caught_up(&a, t, &b, t, io_deadline()).await?;
        total += assert_identical(&a, t, &b, t).await?.iter().map(|p| p.records.len() as u64).sum::<u64>();
    }
    assert_eq!(total, produced);
    Ok(())
}
