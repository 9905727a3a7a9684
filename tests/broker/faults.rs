//! Shared by the fault tests (`jepsen*.rs`, `nemesis.rs`): a [`FaultyCluster`] (every member's link to etcd and to
//! each peer through a proxy of its own), a topic on it, where its partitions' leaders are, and records produced
//! and read back by exact content.

use std::time::Duration;

use anyhow::Context;
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{ClusterSpec, FaultyCluster, deadline, wait_for};

use crate::common::{IO_BUDGET, Rec};

pub const TS0: i64 = 1_700_000_000_000;

/// A client of every member (it follows leader hints among them).
pub fn client(cluster: &FaultyCluster) -> BrokerClient {
    let mut config = ClientConfig::new(cluster.addrs());
    config.request_timeout = cluster.spec().lease_ttl;
    BrokerClient::new(config).expect("loopback addresses")
}

/// A client of member `id` alone.
pub fn client_of(cluster: &FaultyCluster, id: u32) -> BrokerClient {
    let mut config = ClientConfig::new([cluster.addrs()[id as usize - 1].clone()]);
    config.request_timeout = cluster.spec().lease_ttl;
    BrokerClient::new(config).expect("loopback address")
}

/// A producer that retries until its delivery timeout (long enough for any failover of these tests).
pub async fn producer(cluster: &FaultyCluster) -> anyhow::Result<Producer> {
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..ProducerConfig::default() };
    Ok(Producer::new(client(cluster), config).await?)
}

/// Starts `spec` and creates `topic` with `partitions` partitions of `replication` through member 1; waits until
/// every partition has a leader and all its replicas in sync.
pub async fn cluster_with_topic(
    spec: ClusterSpec,
    topic: &str,
    partitions: u32,
    replication: &str,
) -> anyhow::Result<FaultyCluster> {
    ferry_testkit::init_tracing();
    let cluster = FaultyCluster::start(spec).await?;
    Admin::new(client_of(&cluster, 1)).create_replicated_topic(topic, partitions, replication).await?;
    let replicas = if replication == "double_write" { 2 } else { 3 };
    // Every member has read the catalog's record and sees every partition led and in sync.
    for id in 1..=cluster.spec().members {
        for p in 0..partitions {
            wait_placement(&cluster, id, topic, p, deadline(&[cluster.spec().lease_ttl]), |pl| {
                pl.leader_id != 0 && pl.isr.len() == replicas
            })
            .await?;
        }
    }
    Ok(cluster)
}

/// `topic`/`p`'s placement as member `asked` reads it from etcd.
pub async fn placement(
    cluster: &FaultyCluster,
    asked: u32,
    topic: &str,
    p: u32,
) -> anyhow::Result<pb::PartitionPlacement> {
    let meta = client_of(cluster, asked).metadata_for(vec![topic.to_owned()]).await?;
    meta.partitions
        .into_iter()
        .find(|pl| pl.partition == p)
        .with_context(|| format!("no placement of {topic}/{p} at broker {asked}"))
}

/// Waits until member `asked` sees a placement of `topic`/`p` that `ok` accepts, and returns it.
pub async fn wait_placement(
    cluster: &FaultyCluster,
    asked: u32,
    topic: &str,
    p: u32,
    within: Duration,
    ok: impl Fn(&pb::PartitionPlacement) -> bool,
) -> anyhow::Result<pb::PartitionPlacement> {
    wait_for(&format!("a placement of {topic}/{p} as broker {asked} sees it"), within, async || {
        anyhow::Ok(placement(cluster, asked, topic, p).await.ok().filter(|pl| ok(pl)))
    })
    .await
}

/// Record `i` of `topic`/`partition`.
pub fn record(topic: &str, partition: u32, i: usize) -> ProducerRecord {
    ProducerRecord::new(topic, format!("{topic}-{partition}-{i}"))
        .with_partition(partition)
        .with_key(format!("key-{}", i % 7))
        .with_header("i", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

/// Sends records `range` of `topic`/`partition` one after the other, each awaited; returns what was acknowledged.
pub async fn produce(
    producer: &Producer,
    topic: &str,
    partition: u32,
    range: std::ops::Range<usize>,
) -> anyhow::Result<Vec<Rec>> {
    let mut acked = Vec::new();
    for i in range {
        let ack = producer.send(record(topic, partition, i)).await?.await?;
        acked.push(Rec::acked(&ack, record(topic, partition, i)));
    }
    Ok(acked)
}

/// The segment files of `topic`/`partition` in a member's data dir: name -> bytes.
fn segments(
    data_dir: &std::path::Path,
    topic: &str,
    partition: u32,
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<u8>>> {
    let dir = data_dir.join(topic).join(partition.to_string());
    let mut out = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".log") {
            out.insert(name.clone(), std::fs::read(dir.join(&name))?);
        }
    }
    Ok(out)
}

/// After healing: stops every member gracefully, then asserts that the replicas of `topic`/`partition` hold the
/// same segment files, byte for byte, and that they are not empty.
pub async fn stop_and_compare(cluster: &mut FaultyCluster, topic: &str, partition: u32) -> anyhow::Result<()> {
    let holders: Vec<u32> = placement(cluster, 1, topic, partition).await?.replicas;
    stop_all(cluster).await?;
    compare(cluster, topic, partition, &holders)
}

/// [`stop_and_compare`] for partitions `0..partitions`.
pub async fn stop_and_compare_all(cluster: &mut FaultyCluster, topic: &str, partitions: u32) -> anyhow::Result<()> {
    let mut holders = Vec::new();
    for p in 0..partitions {
        holders.push(placement(cluster, 1, topic, p).await?.replicas);
    }
    stop_all(cluster).await?;
    for (p, h) in holders.iter().enumerate() {
        compare(cluster, topic, p as u32, h)?;
    }
    Ok(())
}

async fn stop_all(cluster: &mut FaultyCluster) -> anyhow::Result<()> {
    for b in &mut cluster.brokers {
        if b.is_running() {
            assert_eq!(b.terminate(crate::common::STOP_GRACE).await?.code(), Some(0), "{}", b.logs());
        }
    }
    Ok(())
}

fn compare(cluster: &FaultyCluster, topic: &str, partition: u32, holders: &[u32]) -> anyhow::Result<()> {
    let first = segments(cluster.brokers[holders[0] as usize - 1].data_dir(), topic, partition)?;
    assert!(first.values().any(|b| !b.is_empty()), "broker {} holds no data", holders[0]);
    for id in &holders[1..] {
        let theirs = segments(cluster.brokers[*id as usize - 1].data_dir(), topic, partition)?;
        assert_eq!(theirs.keys().collect::<Vec<_>>(), first.keys().collect::<Vec<_>>(), "segment names differ");
        for (name, bytes) in &first {
            assert!(theirs[name] == *bytes, "segment {name} differs between broker {} and {id}", holders[0]);
        }
    }
    Ok(())
}
