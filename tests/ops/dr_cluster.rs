//! Fenced failover from a raft3 cluster (issue 29): a three-member source cluster under etcd, its raft3 topic
//! mirrored to a lone target broker under live load. `ferryctl failover` fences the topic in the cluster's catalog,
//! waits until every partition's leader reports the fence and every record acknowledged, and until the target holds
//! as much: the two logs are then equal record for record, the cluster refuses writes (also after a member's kill
//! -9 and restart), and the target takes them.

use anyhow::Context;
use ferry_client::{Admin, BrokerClient, ClientConfig, OffsetSpec, Producer, ProducerConfig};
use ferry_testkit::{ClusterSpec, FaultyCluster, MirrorProcess, deadline, wait_until};

use crate::common::*;
use crate::support::{TOKEN, ferryctl};

const TOPIC: &str = "orders";

fn cluster_client(cluster: &FaultyCluster) -> anyhow::Result<BrokerClient> {
    let mut config = ClientConfig::new(cluster.addrs());
    config.request_timeout = cluster.spec().lease_ttl;
    Ok(BrokerClient::new(config)?)
}

async fn ends(admin: &Admin) -> anyhow::Result<Vec<u64>> {
    let asks: Vec<(String, u32, OffsetSpec)> = (0..2).map(|p| (TOPIC.to_owned(), p, OffsetSpec::Latest)).collect();
    Ok(admin.list_offsets(&asks).await?.iter().map(|o| o.log_end_offset).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_failover_from_a_raft3_cluster_under_load_loses_nothing() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let mut cluster = FaultyCluster::start(ClusterSpec::default()).await?;
    let ttl = cluster.spec().lease_ttl;
    let client = cluster_client(&cluster)?;
    let admin = Admin::new(client.clone());
    admin.create_replicated_topic(TOPIC, 2, "raft3").await?;
    // Every member has taken the catalog's record (one it has not yet answers that the topic does not exist).
    for addr in cluster.addrs() {
        let member = BrokerClient::new(ClientConfig::new([addr]))?;
        wait_until("every partition led and in sync at each member", deadline(&[ttl, IO_BUDGET]), async || {
            let meta = member.metadata_for(vec![TOPIC.to_owned()]).await?;
            anyhow::Ok(
                meta.partitions.len() == 2 && meta.partitions.iter().all(|p| p.leader_id != 0 && p.isr.len() == 3),
            )
        })
        .await?;
    }
    let b = Dc::start("dc-b").await?;
    let slow = ProducerConfig { delivery_timeout: deadline(&[ttl, ttl, IO_BUDGET]), ..ProducerConfig::default() };
    let p = Producer::new(client.clone(), slow.clone()).await?;
    produce_range(&p, TOPIC, "before", 0, 200, 64).await?;
    p.close().await;

    let conf = MirrorConf::between("dc-a", cluster.addrs().join("\", \""), "dc-b", b.addr());
    // The lone target keeps single topics.
    let text = conf.toml().replacen("[target]\n", "[target]\nreplication = \"single\"\n", 1);
    let mirror = MirrorProcess::builder(text).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_until("the target caught up", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(b.leos(TOPIC).await.ok() == Some(ends(&admin).await?))
    })
    .await?;
    let load = {
        let client = client.clone();
        tokio::spawn(async move {
            let p = Producer::new(client, slow).await?;
            let mut next = 0u64;
            loop {
                match produce_range(&p, TOPIC, "live", next, next + 50, 64).await {
                    Ok(()) => next += 50,
                    Err(e) => return anyhow::Ok((next, format!("{e:#}"))),
                }
            }
        })
    };
    let before = ends(&admin).await?;
    wait_until("the load is running", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(ends(&admin).await?.iter().zip(&before).all(|(now, then)| now > then))
    })
    .await?;

    let url = mirror.monitor_url();
    let out = ferryctl(&["--token", TOKEN, "failover", "--mirror", &url, "--topics", TOPIC, "--confirm"]).await?;
    assert_eq!(out.code, 0, "{out:?}");
    let (acked, refusal) = load.await??;
    assert!(acked > 0 && refusal.contains("fenced at epoch"), "{acked}: {refusal}");

    // The two logs are equal, record for record and batch for batch.
    for p in 0..2 {
        let source = read_partition(&client, TOPIC, p, None).await?;
        let target = read_partition(&b.client, TOPIC, p, None).await?;
        source.assert_contiguous("the source");
        assert_same_partition(&format!("{TOPIC}/{p}"), &source, &target);
        assert!(source.records.len() >= 100, "{TOPIC}/{p}: {} records", source.records.len());
    }
    let job: serde_json::Value =
        serde_json::from_slice(&b.admin.get_job("failover.dc-a_to_dc-b").await?.context("the job")?.body)?;
    let epoch = job["epoch"].as_u64().context("epoch")?;

    // The cluster refuses writes, also at a member that was killed and restarted.
    let refused = |e: anyhow::Error| format!("{e:#}").contains(&format!("is fenced at epoch {epoch}"));
    let p = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let err = produce_range(&p, TOPIC, "after", 0, 1, 16).await.expect_err("fenced");
    assert!(refused(err));
    let meta = client.metadata_for(vec![TOPIC.to_owned()]).await?;
    let leader = meta.partitions.iter().find(|pl| pl.partition == 0).context("a placement")?.leader_id;
    cluster.broker(leader).kill9().await?;
    cluster.broker(leader).restart().await?;
    let err = produce_range(&p, TOPIC, "zombie", 0, 1, 16).await.expect_err("still fenced");
    assert!(refused(err));
    p.close().await;
    // The target takes writes.
    let q = producer(&b).await?;
    produce_to_partition(&q, TOPIC, 1, "new-primary", 0, 3).await?;
    q.close().await;
    Ok(())
}
