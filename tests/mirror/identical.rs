//! Scenario 1: three topics of four partitions, 100,000 keyed records with headers and timestamps in all, half
//! produced before the mirror starts and half while it runs: the target is identical, partition by partition.

use crate::common::*;

const TOPICS: [&str; 3] = ["orders.eu", "orders.us", "payments"];
const TOTAL: u64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_copies_three_topics_identically() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in TOPICS {
        a.create_topic(t, 4).await?;
    }
    let per_topic = TOTAL / TOPICS.len() as u64;
    let counts: Vec<u64> =
        TOPICS.iter().enumerate().map(|(i, _)| if i == 0 { TOTAL - per_topic * 2 } else { per_topic }).collect();
    let p = producer(&a).await?;
    // Half before the mirror's first start, half while it runs.
    for (t, n) in TOPICS.iter().zip(&counts) {
        produce_range(&p, t, t, 0, n / 2, 64).await?;
    }
    let mut mirror = MirrorConf::new(&a, &b).start().await?;
    for (t, n) in TOPICS.iter().zip(&counts) {
        produce_range(&p, t, t, n / 2, *n, 64).await?;
    }
    p.close().await;

    let mut total = 0;
    for t in TOPICS {
        wait_caught_up(&a, t, &b, t, io_deadline()).await?;
        let src = assert_identical(&a, t, &b, t).await?;
        assert!(src.iter().all(|p| !p.records.is_empty()), "{t}: the keyed load reaches every partition");
        total += src.iter().map(|p| p.records.len() as u64).sum::<u64>();
        // The mirror topic is marked as such, with the source's identity.
        let info = b.admin.describe_topic(t).await?.topic;
        let mark = info.mirror.expect("the target topic is a mirror topic");
        assert_eq!(mark.source_cluster_id, "dc-a");
        assert_eq!(mark.source_topic, t);
        assert_eq!(mark.source_topic_id, a.admin.describe_topic(t).await?.topic.topic_id);
    }
    assert_eq!(total, TOTAL, "every produced record is on the source, and so on the target");
    assert!(mirror.is_running(), "the mirror keeps running");
    Ok(())
}
