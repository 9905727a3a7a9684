//! raft3 partitions on three real brokers under a real etcd, faults from signals. The checks are Jepsen-style:
//! every acknowledged record is present exactly once, at the offset its acknowledgement named; the log holds
//! nothing else between them (no offset names two records: a read checks that offsets strictly increase and the
//! records are compared by digest); and after healing every replica's segment files are byte-identical.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, EtcdProcess, deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, STOP_GRACE, assert_same_records, read_partition};

/// The members' lease TTL: the shortest allowed, so that failovers are quick.
pub const LEASE_TTL: Duration = Duration::from_secs(2);
/// `cluster.replica_lag_max` of the members.
pub const REPLICA_LAG: Duration = Duration::from_secs(2);
pub const TOPIC: &str = "orders";
pub const TS0: i64 = 1_700_000_000_000;

pub fn member_config(etcd: &EtcdProcess, id: u32, storage: &str) -> String {
    format!(
        "[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"2s\"\nreplica_lag_max = \"2s\"\nack_timeout = \
         \"8s\"\n\n[storage]\nflush = \"sync\"\n{storage}",
        etcd.url()
    )
}

/// An etcd and three members, broker id `i + 1` at index `i`.
pub struct Cluster {
    pub etcd: EtcdProcess,
    pub brokers: Vec<BrokerProcess>,
}

impl Cluster {
    pub async fn start() -> anyhow::Result<Cluster> {
        Cluster::start_with("").await
    }

    /// Three members whose `[storage]` sections also hold `storage` (TOML lines).
    pub async fn start_with(storage: &str) -> anyhow::Result<Cluster> {
        ferry_testkit::init_tracing();
        let etcd = EtcdProcess::start().await?;
        let mut brokers = Vec::new();
        for id in 1..=3 {
            let config = member_config(&etcd, id, storage);
            brokers.push(BrokerProcess::builder().cluster_id("dc-a").config(config).start().await?);
        }
        Ok(Cluster { etcd, brokers })
    }

    pub fn addrs(&self) -> Vec<String> {
        self.brokers.iter().map(|b| b.addr().to_string()).collect()
    }

    /// A client that knows every member (it follows NOT_LEADER hints among them).
    pub fn client(&self) -> BrokerClient {
        BrokerClient::new(ClientConfig::new(self.addrs())).expect("loopback addresses")
    }

    /// A client of broker `id` alone.
    pub fn client_of(&self, id: u32) -> BrokerClient {
        BrokerClient::new(ClientConfig::new([self.brokers[id as usize - 1].addr().to_string()])).expect("loopback")
    }

    pub fn broker(&mut self, id: u32) -> &mut BrokerProcess {
        &mut self.brokers[id as usize - 1]
    }

    /// The partition's placement as broker `asked` reads it from etcd.
    pub async fn placement(&self, asked: u32) -> anyhow::Result<pb::PartitionPlacement> {
        let meta = self.client_of(asked).metadata_for(vec![TOPIC.to_owned()]).await?;
        meta.partitions.into_iter().next().ok_or_else(|| anyhow::anyhow!("no placement of {TOPIC} yet"))
    }

    /// Waits until broker `asked` sees a leader other than `not` (0: any) with an ISR of `isr` members.
    pub async fn wait_leader(
        &self,
        asked: u32,
        not: u32,
        isr: usize,
        within: Duration,
    ) -> anyhow::Result<pb::PartitionPlacement> {
        let what = format!("a leader other than {not} with {isr} in sync, as broker {asked} sees it");
        wait_until(&what, within, async || {
            self.placement(asked).await.map(|p| p.leader_id != 0 && p.leader_id != not && p.isr.len() == isr)
        })
        .await?;
        self.placement(asked).await
    }

    /// [`Cluster::start`] with the raft3 topic [`TOPIC`] of one partition, created through broker 1; returns its
    /// first placement, once it has a leader and three in sync.
    pub async fn with_topic() -> anyhow::Result<(Cluster, pb::PartitionPlacement)> {
        let cluster = Cluster::start().await?;
        Admin::new(cluster.client_of(1)).create_replicated_topic(TOPIC, 1, "raft3").await?;
        let first = cluster.wait_leader(1, 0, 3, deadline(&[LEASE_TTL])).await?;
        Ok((cluster, first))
    }

    /// After healing: stops every member gracefully, then asserts their replicas are byte-identical.
    pub async fn stop_and_compare(&mut self) -> anyhow::Result<()> {
        self.stop_all().await?;
        assert_replicas_identical(self)
    }

    /// Stops every member gracefully.
    pub async fn stop_all(&mut self) -> anyhow::Result<()> {
        for b in &mut self.brokers {
            if b.is_running() {
                assert_eq!(b.terminate(STOP_GRACE).await?.code(), Some(0), "{}", b.logs());
            }
        }
        Ok(())
    }
}

pub fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("order-{i}"))
        .with_partition(0)
        .with_key(format!("customer-{}", i % 11))
        .with_header("i", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

/// Sends records `range` one after the other, each awaited (so acknowledged offsets must increase), and returns
/// what was acknowledged.
pub async fn produce_all(producer: &Producer, range: std::ops::Range<usize>) -> anyhow::Result<Vec<Rec>> {
    let mut acked = Vec::new();
    for i in range {
        let ack = producer.send(record(i)).await?.await?;
        acked.push(Rec::acked(&ack, record(i)));
    }
    Ok(acked)
}

/// The segment files of the partition in a member's data dir: name → bytes.
fn segments(data_dir: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let dir = data_dir.join(TOPIC).join("0");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".log") {
            out.insert(name.clone(), std::fs::read(dir.join(&name))?);
        }
    }
    Ok(out)
}

/// After healing: every replica holds the same segment files, byte for byte, and they are not empty.
pub fn assert_replicas_identical(cluster: &Cluster) -> anyhow::Result<()> {
    let first = segments(cluster.brokers[0].data_dir())?;
    assert!(first.values().any(|b| !b.is_empty()), "broker 1 holds no data");
    for b in &cluster.brokers[1..] {
        let theirs = segments(b.data_dir())?;
        assert_eq!(theirs.keys().collect::<Vec<_>>(), first.keys().collect::<Vec<_>>(), "segment names differ");
        for (name, bytes) in &first {
            assert!(theirs[name] == *bytes, "segment {name} differs between broker 1 and {}", b.data_dir().display());
        }
    }
    Ok(())
}

/// The Prometheus text of a broker's metrics endpoint (its port is the one its log names last).
pub async fn scrape(broker: &BrokerProcess) -> anyhow::Result<String> {
    let addr = broker.metrics_addr().context("no metrics address in the log")?;
    Ok(reqwest::get(format!("http://{addr}/metrics")).await?.error_for_status()?.text().await?)
}

/// The output of `ferryctl --broker (every member) cluster status --format FORMAT`.
async fn cluster_status(cluster: &Cluster, format: &str) -> anyhow::Result<String> {
    let program = ferry_testkit::binary_path(ferry_testkit::FERRYCTL_BIN)?;
    let brokers = cluster.addrs().join(",");
    let out = tokio::process::Command::new(program)
        .args(["--broker", &brokers, "cluster", "status", "--format", format])
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "ferryctl failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

/// Every acknowledged record is in the leader's log once, at its acknowledged offset, and nothing else is.
pub async fn assert_log_is(cluster: &Cluster, leader: u32, acked: &[Rec], what: &str) {
    let got = read_partition(&cluster.client_of(leader), TOPIC, 0).await;
    assert_same_records(what, acked, &got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_loses_no_acknowledged_record_and_its_producer_is_redirected() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    let admin = Admin::new(cluster.client_of(2));
    let created = admin.create_replicated_topic(TOPIC, 1, "raft3").await?;
    assert_eq!((created.partitions, created.replication.as_str()), (1, "raft3"));
    let first = cluster.wait_leader(3, 0, 3, deadline(&[LEASE_TTL])).await?;
    assert_eq!(first.leader_epoch, 1);
    let mut replicas = first.replicas.clone();
    replicas.sort_unstable();
    assert_eq!(replicas, [1, 2, 3]);

    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..ProducerConfig::default() };
    let client = cluster.client();
    let producer = Producer::new(client.clone(), config).await?;
    let mut acked = produce_all(&producer, 0..150).await?;
    assert_eq!(client.current_address(), Some(cluster.broker(first.leader_id).addr().to_string()));

    // Kill -9 the leader mid-load: the load goes on, and the producer finds the new leader.
    let old = first.leader_id;
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce_all(&producer, 150..400).await })
    };
    let killed_at = Instant::now();
    cluster.broker(old).kill9().await?;
    let survivor = if old == 1 { 2 } else { 1 };
    let next = cluster.wait_leader(survivor, old, 2, deadline(&[LEASE_TTL, LEASE_TTL])).await?;
    assert!(next.leader_epoch > first.leader_epoch, "{next:?}");
    assert!(!next.isr.contains(&old), "{next:?}");
    acked.extend(load.await??);
    producer.close().await;
    tracing::info!(failover = ?killed_at.elapsed(), "failover done");
    // The producer followed the NOT_LEADER hints to the new leader.
    assert_eq!(client.current_address(), Some(cluster.broker(next.leader_id).addr().to_string()));

    let offsets: Vec<u64> = acked.iter().map(|r| r.offset).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "acknowledged offsets go back: {offsets:?}");
    assert_log_is(&cluster, next.leader_id, &acked, "the new leader's log").await;

    // The old leader comes back as a follower, catches up and rejoins the in-sync set.
    cluster.broker(old).restart().await?;
    wait_until("the old leader back in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        cluster.placement(survivor).await.map(|p| p.isr.len() == 3)
    })
    .await?;
    let healed = cluster.placement(survivor).await?;
    assert_eq!(healed.leader_id, next.leader_id, "{healed:?}");
    assert_log_is(&cluster, next.leader_id, &acked, "the log after the old leader rejoined").await;

    // `ferryctl cluster status` shows the same, with each follower caught up to the leader's log end.
    let status = cluster_status(&cluster, "json").await?;
    let json: serde_json::Value = serde_json::from_str(&status)?;
    let brokers: Vec<u64> =
        json["brokers"].as_array().unwrap().iter().map(|b| b["broker_id"].as_u64().unwrap()).collect();
    assert_eq!(brokers, [1, 2, 3], "{status}");
    assert_eq!(json["etcd_reachable"], true, "{status}");
    assert!((1..=3).contains(&json["controller_id"].as_u64().unwrap()), "{status}");
    let p = &json["partitions"][0];
    assert_eq!((p["topic"].as_str(), p["partition"].as_u64()), (Some(TOPIC), Some(0)), "{status}");
    assert_eq!(p["leader"].as_u64(), Some(u64::from(next.leader_id)), "{status}");
    assert_eq!(p["leader_epoch"].as_u64(), Some(u64::from(next.leader_epoch)), "{status}");
    assert_eq!(p["isr"].as_array().unwrap().len(), 3, "{status}");
    assert_eq!(
        (&p["replication"], &p["under_replicated"], &p["at_risk"], &p["target_replicas"], &json["draining"]),
        (&"raft3".into(), &false.into(), &false.into(), &serde_json::json!([]), &serde_json::json!([])),
        "{status}"
    );
    assert_eq!((p["high_watermark"].as_u64(), p["log_end_offset"].as_u64()), (Some(400), Some(400)), "{status}");
    let followers = p["followers"].as_array().unwrap();
    assert_eq!(followers.len(), 2, "{status}");
    assert!(followers.iter().all(|f| f["log_end_offset"] == 400 && f["lag_records"] == 0), "{status}");
    let text = cluster_status(&cluster, "text").await?;

    // The leader's Prometheus metrics say the same; its leader changes (of this topic, and of the internal offsets
    // partitions it took) are counted as its log tells them.
    let leader_broker = &cluster.brokers[next.leader_id as usize - 1];
    let metrics = scrape(leader_broker).await?;
    let changes = leader_broker.logs().lines().filter(|l| l.contains("event=\"leader_change\"")).count();
    let ours = leader_broker
        .logs()
        .lines()
        .filter(|l| l.contains("event=\"leader_change\"") && l.contains(&format!("topic=\"{TOPIC}\"")))
        .count();
    assert_eq!(ours, 1, "it took {TOPIC} once");
    let labels = format!("{{topic=\"{TOPIC}\",partition=\"0\"}}");
    for line in [
        format!("ferry_broker_partition_high_watermark{labels} 400"),
        format!("ferry_broker_partition_log_end_offset{labels} 400"),
        format!("ferry_broker_partition_leader_epoch{labels} {}", next.leader_epoch),
        format!("ferry_broker_partition_isr_size{labels} 3"),
        format!("ferry_broker_partition_leader{labels} 1"),
        "ferry_broker_under_replicated_partitions 0".to_owned(),
        "ferry_broker_etcd_reachable 1".to_owned(),
        format!("ferry_broker_events_total{{event=\"leader_change\"}} {changes}"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "no line {line:?} in the metrics:\n{metrics}");
    }
    for follower in next.replicas.iter().filter(|r| **r != next.leader_id) {
        for unit in ["records", "bytes"] {
            let line = format!(
                "ferry_broker_replication_lag_{unit}{{topic=\"{TOPIC}\",partition=\"0\",follower=\"{follower}\"}} 0"
            );
            assert!(metrics.lines().any(|l| l == line), "no line {line:?} in the metrics:\n{metrics}");
        }
    }
    assert!(text.contains("TOPIC   PARTITION  LEADER  EPOCH  REPLICAS  ISR    HW   LEO  MAX LAG  STATE"), "{text}");
    assert!(text.contains("Partitions:  0 under-replicated, 0 at risk"), "{text}");
    assert!(text.lines().any(|l| l.starts_with(TOPIC) && l.trim_end().ends_with("  ok")), "{text}");
    cluster.stop_and_compare().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_brokers_killed_writes_are_refused_and_resume_when_one_is_back() -> anyhow::Result<()> {
    let (mut cluster, first) = Cluster::with_topic().await?;
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..ProducerConfig::default() };
    let producer = Producer::new(cluster.client(), config).await?;
    let mut acked = produce_all(&producer, 0..100).await?;
    producer.close().await;

    // Kill two: the leader and one follower. The third is elected and takes the dead follower out of its ISR.
    let followers: Vec<u32> = first.replicas.iter().copied().filter(|r| *r != first.leader_id).collect();
    let (dead_follower, last) = (followers[0], followers[1]);
    cluster.broker(first.leader_id).kill9().await?;
    cluster.broker(dead_follower).kill9().await?;
    wait_until("the last broker leading alone", deadline(&[LEASE_TTL, LEASE_TTL, REPLICA_LAG]), async || {
        cluster.placement(last).await.map(|p| p.leader_id == last && p.isr == [last])
    })
    .await?;

    // A write is refused with a retriable error naming the in-sync set, and nothing is written.
    let client = cluster.client_of(last);
    let batch = crate::common::plain_batch(&["refused"], TS0);
    let produce = pb::ProduceRequest { topic: TOPIC.into(), partition: Some(0), key: None, batches: batch };
    let err = client.produce(produce.clone()).await.unwrap_err();
    assert_eq!(err.reason(), Some("not_enough_replicas"), "{err}");
    assert!(err.to_string().contains("[") && err.to_string().contains("fewer than the 2"), "{err}");
    assert_log_is(&cluster, last, &acked, "the log while writes are refused").await;

    // One broker back: it catches up, rejoins, and writes resume with nothing lost.
    cluster.broker(dead_follower).restart().await?;
    wait_until("two replicas in sync again", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        cluster.placement(last).await.map(|p| p.isr.len() == 2)
    })
    .await?;
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..ProducerConfig::default() };
    let producer = Producer::new(cluster.client(), config).await?;
    acked.extend(produce_all(&producer, 100..200).await?);
    producer.close().await;
    assert_log_is(&cluster, last, &acked, "the log after writes resumed").await;

    cluster.broker(first.leader_id).restart().await?;
    wait_until("all three in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        cluster.placement(last).await.map(|p| p.isr.len() == 3)
    })
    .await?;
    cluster.stop_and_compare().await?;
    Ok(())
}
