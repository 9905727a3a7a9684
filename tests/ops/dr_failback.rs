//! Lossless failback after a split brain (issue 29). The mirror's link to dc-a is cut and the operator fails over
//! with `--source-unreachable`; a partitioned application goes on writing to dc-a (the old primary) while others
//! write to dc-b (the new one). After the network heals, `ferryctl failback --from dc-b --to dc-a`:
//!
//! - every record dc-a took after the split is in `orders.recovered` on dc-b, record for record, with its origin
//!   cluster, topic, partition, offset and epoch in lineage headers;
//! - dc-a's `orders` is cut back to the split and marked as a mirror of dc-b; the group offset past the split is
//!   moved back to it;
//! - the reverse mirror started with the written config resumes at the split: dc-a then equals dc-b, offset for
//!   offset;
//! - a second failback changes nothing.

use anyhow::Context;
use ferry_client::OffsetSpec;
use ferry_client::proto::CommittedOffset;
use ferry_testkit::{MirrorProcess, Proxy};

use crate::common::*;
use crate::support::{TOKEN, ferryctl};

const TOPIC: &str = "orders";
const RECOVERED: &str = "orders.recovered";

async fn failback(a: &Dc, b: &Dc, config: &std::path::Path) -> anyhow::Result<crate::support::CtlOutput> {
    let config = config.display().to_string();
    ferryctl(&[
        "failback",
        "--from",
        &b.addr(),
        "--to",
        &a.addr(),
        "--topics",
        TOPIC,
        "--write-config",
        &config,
        "--monitor-listen",
        "127.0.0.1:0",
        "--from-cluster",
        "dc-b",
        "--to-cluster",
        "dc-a",
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failback_after_a_split_brain_keeps_every_record_and_the_reverse_mirror_resumes_at_the_split()
-> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    produce(&a, TOPIC, "before", 300, 64).await?;
    let proxy = Proxy::start(a.broker.addr()).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.source_brokers = proxy.addr().to_string();
    let mirror = MirrorProcess::builder(conf.toml()).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let split = a.leos(TOPIC).await?;

    // The split: the link is cut, the operator fails over without the source.
    proxy.cut();
    let url = mirror.monitor_url();
    let out = ferryctl(&[
        "--token",
        TOKEN,
        "failover",
        "--mirror",
        &url,
        "--topics",
        TOPIC,
        "--source-unreachable",
        "--confirm",
        "--poll",
        "100ms",
    ])
    .await?;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("source unreachable, 0 records not on the target"), "{}", out.stdout);
    // Both sides take writes: a partitioned application on dc-a, the others on dc-b.
    let pa = producer(&a).await?;
    produce_range(&pa, TOPIC, "old-side", 0, 120, 64).await?;
    pa.close().await;
    let pb = producer(&b).await?;
    produce_range(&pb, TOPIC, "new-side", 0, 80, 64).await?;
    pb.close().await;
    let old = read_topic(&a, TOPIC).await?;
    // A group on dc-a read past the split on partition 0.
    let past = CommittedOffset { topic: TOPIC.into(), partition: 0, offset: old[0].log_end, metadata: String::new() };
    a.admin.commit_offsets("app", vec![past]).await?;
    proxy.restore();

    let dir = tempfile::tempdir()?;
    let config = dir.path().join("reverse.toml");
    let out = failback(&a, &b, &config).await?;
    assert_eq!(out.code, 0, "{out:?}");
    let kept: u64 = old.iter().zip(&split).map(|(p, s)| p.log_end - s).sum();
    assert!(out.stdout.contains(&format!("event failback_kept_records records={kept} partitions=2")), "{}", out.stdout);

    // Every record dc-a took after the split is in orders.recovered, in order, with its lineage.
    let recovered = read_topic(&b, RECOVERED).await?;
    for (p, (data, s)) in old.iter().zip(&split).enumerate() {
        let after: Vec<&Rec> = data.records.iter().filter(|r| r.offset >= *s).collect();
        let got = &recovered[p].records;
        assert_eq!(got.len(), after.len(), "{RECOVERED}/{p}: one copy of each record past the split");
        for (i, (r, orig)) in got.iter().zip(&after).enumerate() {
            assert_eq!(r.offset, i as u64);
            assert_eq!((&r.key, &r.value, r.timestamp), (&orig.key, &orig.value, orig.timestamp), "{p}/{i}");
            let (original, lineage) = r.headers.split_at(orig.headers.len());
            assert_eq!(original, orig.headers.as_slice(), "the record's own headers come first");
            let epoch = data.batches.iter().find(|b| b.0 <= orig.offset && orig.offset <= b.1).context("batch")?.2;
            let want: Vec<(String, Option<bytes::Bytes>)> = [
                ("ferry-origin-cluster", "dc-a".to_owned()),
                ("ferry-origin-topic", TOPIC.to_owned()),
                ("ferry-origin-partition", p.to_string()),
                ("ferry-origin-offset", orig.offset.to_string()),
                ("ferry-origin-epoch", epoch.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Some(bytes::Bytes::from(v))))
            .collect();
            assert_eq!(lineage, want.as_slice());
        }
    }
    // dc-a was cut back to the split, marked as dc-b's mirror, and its group moved back to the split.
    assert_eq!(a.leos(TOPIC).await?, split);
    let d = a.admin.describe_topic(TOPIC).await?;
    let mark = d.topic.mirror.context("dc-a's orders is a mirror topic")?;
    assert_eq!((mark.source_cluster_id.as_str(), mark.source_cluster.as_str()), ("dc-b", "dc-b"));
    assert!(d.topic.fence.is_none(), "the fence is lifted for the reverse mirror");
    let committed = a.admin.fetch_committed_offsets("app", &[(TOPIC.to_owned(), 0)]).await?;
    assert_eq!(committed[0].offset, split[0]);

    // The reverse mirror resumes at the split: no re-copy, and dc-a equals dc-b offset for offset.
    let text = std::fs::read_to_string(&config)?;
    let reverse = MirrorProcess::builder(text).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_caught_up(&b, TOPIC, &a, TOPIC, io_deadline()).await?;
    let new = assert_identical(&b, TOPIC, &a, TOPIC).await?;
    for (p, s) in split.iter().enumerate() {
        assert_eq!(new[p].log_end, s + new[p].records.iter().filter(|r| r.offset >= *s).count() as u64);
    }
    let rows = monitor_partitions(&reverse).await?;
    assert_eq!(rows.len(), 2, "{rows:?}");

    // A second failback changes nothing.
    let before = (read_topic(&b, RECOVERED).await?, read_topic(&a, TOPIC).await?);
    let again = failback(&a, &b, &config).await?;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.stdout.matches("already failed back").count(), 2, "{}", again.stdout);
    let after = (read_topic(&b, RECOVERED).await?, read_topic(&a, TOPIC).await?);
    for (x, y) in before.0.iter().zip(&after.0).chain(before.1.iter().zip(&after.1)) {
        assert_same_partition("unchanged by the second failback", x, y);
    }
    assert!(a.admin.list_offset(TOPIC, 0, OffsetSpec::Latest).await?.fence_epoch.is_none());
    Ok(())
}
