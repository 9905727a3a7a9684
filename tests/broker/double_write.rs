//! double_write partitions on three real brokers under a real etcd: without the risk phase a lost replica stops
//! writes until its replacement, picked by the controller, is in sync, and a lost leader's in-sync follower takes
//! over; with the risk phase writes go on with the leader alone, which the metric and the events show, until the
//! replacement clears the risk; and an election with no in-sync replica alive is refused unless forced, when it
//! starts a new partition epoch. Every acknowledged record is checked by digest at its offset.

use std::time::Duration;

use ferry_client::proto::{self as pb, PartitionPlacement};
use ferry_client::{Admin, BrokerClient, Code, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, assert_status, read_partition};
use crate::raft3::{Cluster, LEASE_TTL, REPLICA_LAG, TS0};

/// Long enough for a lease to run out, a lagging replica to leave the ISR and a replacement to be chosen.
/// How long a SIGSTOP may take to show.
const STOP_WAIT: Duration = Duration::from_secs(5);

fn settle() -> Duration {
    deadline(&[LEASE_TTL, REPLICA_LAG, LEASE_TTL])
}

fn record(topic: &str, i: usize) -> ProducerRecord {
    ProducerRecord::new(topic, format!("{topic}-{i}"))
        .with_partition(0)
        .with_key(format!("k{}", i % 5))
        .with_timestamp(TS0 + i as i64)
}

async fn produce(producer: &Producer, topic: &str, range: std::ops::Range<usize>) -> anyhow::Result<Vec<Rec>> {
    let mut acked = Vec::new();
    for i in range {
        let ack = producer.send(record(topic, i)).await?.await?;
        acked.push(Rec::acked(&ack, record(topic, i)));
    }
    Ok(acked)
}

/// Partition 0 of `topic` as broker `asked` reads it from etcd, once `ready` holds.
async fn placement_when(
    cluster: &Cluster,
    asked: u32,
    topic: &str,
    what: &str,
    ready: impl Fn(&PartitionPlacement) -> bool,
) -> anyhow::Result<PartitionPlacement> {
    let client = cluster.client_of(asked);
    let read = async || -> anyhow::Result<Option<PartitionPlacement>> {
        let parts = client.metadata_for(vec![topic.to_owned()]).await?.partitions;
        Ok(parts.into_iter().find(|p| p.partition == 0))
    };
    wait_until(what, settle(), async || read().await.map(|p| p.is_some_and(|p| ready(&p)))).await?;
    read().await?.ok_or_else(|| anyhow::anyhow!("{topic} has no placement"))
}

/// One plain produce straight to `broker`: its refusal, or `None` when it was written.
async fn refused_at(client: &BrokerClient, topic: &str) -> Option<ferry_client::ClientError> {
    let batch = crate::common::plain_batch(&["refused"], TS0);
    let request = pb::ProduceRequest { topic: topic.into(), partition: Some(0), key: None, batches: batch };
    client.produce(request).await.err()
}

/// The value of an unlabelled gauge or of a counter line in a broker's metrics.
async fn metric(broker: &BrokerProcess, line_start: &str) -> anyhow::Result<String> {
    let metrics = crate::raft3::scrape(broker).await?;
    let line = metrics.lines().find(|l| l.starts_with(line_start)).unwrap_or_default().to_owned();
    Ok(line.rsplit(' ').next().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_risk_phase_a_lost_replica_stops_writes_until_its_replacement_is_in_sync() -> anyhow::Result<()> {
    let topic = "dw";
    let mut cluster = Cluster::start().await?;
    Admin::new(cluster.client_of(1)).create_replicated_topic(topic, 1, "double_write").await?;
    let first =
        placement_when(&cluster, 1, topic, "two replicas in sync", |p| p.leader_id != 0 && p.isr.len() == 2).await?;
    assert_eq!(first.replicas.len(), 2, "{first:?}");
    let leader = first.leader_id;
    let follower = first.replicas.iter().copied().find(|r| *r != leader).unwrap();
    let spare = (1..=3).find(|b| !first.replicas.contains(b)).unwrap();
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL]), ..Default::default() };
    let producer = Producer::new(cluster.client(), config).await?;
    let mut acked = produce(&producer, topic, 0..50).await?;

    // The follower dies while the spare is frozen (no broker can replace it): the leader alone refuses writes.
    cluster.broker(spare).suspend(STOP_WAIT).await?;
    cluster.broker(follower).kill9().await?;
    placement_when(&cluster, leader, topic, "the leader alone in sync", |p| p.isr == [leader]).await?;
    let refused = refused_at(&cluster.client_of(leader), topic).await.expect("a write with one replica in sync");
    assert_eq!(refused.reason(), Some("not_enough_replicas"), "{refused}");
    assert!(refused.to_string().contains("fewer than the 2"), "{refused}");

    // The spare is back: the controller makes it the replacement; once in sync, writes resume.
    cluster.broker(spare).resume()?;
    let replaced = placement_when(&cluster, leader, topic, "the spare in sync in the lost follower's place", |p| {
        p.replicas.len() == 2 && p.replicas.contains(&spare) && p.isr.len() == 2 && p.target_replicas.is_empty()
    })
    .await?;
    assert_eq!(replaced.leader_id, leader, "{replaced:?}");
    acked.extend(produce(&producer, topic, 50..80).await?);

    // Now the leader dies: its in-sync follower (the spare) is promoted, nothing acknowledged is lost, and the
    // first follower, back, replaces the dead leader.
    cluster.broker(follower).restart().await?;
    cluster.broker(leader).kill9().await?;
    let promoted = placement_when(&cluster, spare, topic, "the spare leading with the returned broker in sync", |p| {
        p.leader_id == spare && p.isr.len() == 2 && p.replicas.contains(&follower)
    })
    .await?;
    assert!(promoted.leader_epoch > replaced.leader_epoch, "{promoted:?}");
    acked.extend(produce(&producer, topic, 80..100).await?);
    producer.close().await;
    assert_same_records(
        "the promoted follower's log",
        &acked,
        &read_partition(&cluster.client_of(spare), topic, 0).await,
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_risk_phase_writes_go_on_alone_and_a_forced_election_starts_a_new_partition_epoch() -> anyhow::Result<()>
{
    let topic = "risky";
    let mut cluster = Cluster::start().await?;
    let admin = Admin::new(cluster.client_of(1));
    let created = admin.create_topic_kept(topic, 1, None, None, "double_write", true).await?;
    assert!(created.risk_phase && created.replication == "double_write", "{created:?}");
    let first =
        placement_when(&cluster, 1, topic, "two replicas in sync", |p| p.leader_id != 0 && p.isr.len() == 2).await?;
    let leader = first.leader_id;
    let follower = first.replicas.iter().copied().find(|r| *r != leader).unwrap();
    let spare = (1..=3).find(|b| !first.replicas.contains(b)).unwrap();
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL]), ..Default::default() };
    let producer = Producer::new(cluster.client(), config).await?;
    let mut acked = produce(&producer, topic, 0..40).await?;
    assert_eq!(metric(&cluster.brokers[leader as usize - 1], "ferry_broker_partitions_at_risk").await?, "0");

    // The follower dies with no replacement possible: writes go on with the leader alone, at risk.
    cluster.broker(spare).suspend(STOP_WAIT).await?;
    cluster.broker(follower).kill9().await?;
    placement_when(&cluster, leader, topic, "the leader alone in sync", |p| p.isr == [leader]).await?;
    let leader_broker = &cluster.brokers[leader as usize - 1];
    assert_eq!(metric(leader_broker, "ferry_broker_partitions_at_risk").await?, "1");
    assert_eq!(metric(leader_broker, "ferry_broker_events_total{event=\"risk_phase_entered\"}").await?, "1");
    assert!(leader_broker.logs().contains("risk_phase_entered"), "the risk is an event in the log");
    acked.extend(produce(&producer, topic, 40..60).await?);

    // The spare is back and replaces the follower: the risk clears.
    cluster.broker(spare).resume()?;
    placement_when(&cluster, leader, topic, "the spare in sync", |p| p.isr.len() == 2 && p.replicas.contains(&spare))
        .await?;
    let leader_broker = &cluster.brokers[leader as usize - 1];
    wait_until("the risk to clear in the metrics", deadline(&[LEASE_TTL]), async || {
        metric(leader_broker, "ferry_broker_partitions_at_risk").await.map(|v| v == "0")
    })
    .await?;
    assert_eq!(metric(leader_broker, "ferry_broker_events_total{event=\"risk_phase_left\"}").await?, "1");
    acked.extend(produce(&producer, topic, 60..70).await?);
    producer.close().await;
    assert_same_records("after the risk phase", &acked, &read_partition(&cluster.client_of(leader), topic, 0).await);

    // Forced election. The spare (now the follower) is frozen, the leader writes alone, then dies: no in-sync
    // replica is live. The frozen spare comes back out of sync: a plain election is refused, a forced one makes
    // it the leader at a new partition epoch, and the records only the dead leader had are gone.
    let epochs_before = read_epoch(&cluster, leader, topic).await?;
    cluster.broker(spare).suspend(STOP_WAIT).await?;
    placement_when(&cluster, leader, topic, "the leader alone again", |p| p.isr == [leader]).await?;
    let producer = Producer::new(cluster.client_of(leader), ProducerConfig::default()).await?;
    let lost = produce(&producer, topic, 70..75).await?;
    producer.close().await;
    assert_eq!(lost.len(), 5);
    cluster.broker(leader).kill9().await?;
    cluster.broker(spare).resume()?;
    let offline =
        placement_when(&cluster, spare, topic, "the partition offline", |p| p.leader_id == 0 || p.leader_id == leader)
            .await?;
    let survivor = Admin::new(cluster.client_of(spare));
    wait_until("the spare back, and the leader gone, in the spare's view", settle(), async || {
        let brokers: Vec<u32> = survivor.client().metadata().await?.brokers.iter().map(|b| b.broker_id).collect();
        anyhow::Ok(brokers.contains(&spare) && !brokers.contains(&leader))
    })
    .await?;
    let refused = survivor.elect_leader(topic, 0, false).await;
    let message = assert_status(refused, Code::FailedPrecondition, &["no in-sync replica is live", "--unclean"]);
    assert!(message.contains(&format!("{topic}/0")), "{message}");
    let forced = survivor.elect_leader(topic, 0, true).await?;
    assert_eq!((forced.leader_id, forced.unclean), (spare, true));
    assert!(forced.leader_epoch > offline.leader_epoch);
    placement_when(&cluster, spare, topic, "the spare leading", |p| p.leader_id == spare).await?;
    let producer = Producer::new(cluster.client_of(spare), ProducerConfig::default()).await?;
    wait_until("the forced leader to take writes", deadline(&[LEASE_TTL, REPLICA_LAG]), async || {
        anyhow::Ok(producer.send(record(topic, 1000)).await?.await.is_ok())
    })
    .await?;
    producer.close().await;
    let epochs_after = read_epoch(&cluster, spare, topic).await?;
    assert_eq!(epochs_after, epochs_before + 1, "the forced election started a new partition epoch");
    let log = read_partition(&cluster.client_of(spare), topic, 0).await;
    assert_same_records("the forced leader's log", &acked, &log[..acked.len()]);
    assert!(log.iter().all(|r| !lost.iter().any(|l| l.value == r.value)), "records only the dead leader had are gone");
    Ok(())
}

/// The partition epoch of `topic`/0 as broker `id` describes it.
async fn read_epoch(cluster: &Cluster, id: u32, topic: &str) -> anyhow::Result<u32> {
    let d = Admin::new(cluster.client_of(id)).describe_topic(topic).await?;
    Ok(d.partitions.first().map_or(0, |p| p.epoch))
}
