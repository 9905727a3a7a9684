//! Clients that know one member of a raft3 cluster reach every partition's leader: a producer and a consumer
//! given only broker 1's address write and read a topic whose three partitions are led by three different brokers,
//! and go on through the death of one of those leaders. Every acknowledged record is read exactly once, with its
//! key, value, headers, timestamp and offset.

use std::collections::BTreeMap;

use ferry_client::proto::PartitionPlacement;
use ferry_client::{Admin, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, StartAt};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records};
use crate::raft3::{Cluster, LEASE_TTL, TS0};

const TOPIC: &str = "spread";
const PARTITIONS: u32 = 3;

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("event-{i}"))
        .with_partition(i as u32 % PARTITIONS)
        .with_key(format!("key-{}", i % 7))
        .with_header("i", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

/// Every partition's placement as broker `asked` reads it, once each has a leader (other than `not`) and `isr`
/// in sync.
async fn placements(cluster: &Cluster, asked: u32, not: u32, isr: usize) -> anyhow::Result<Vec<PartitionPlacement>> {
    let client = cluster.client_of(asked);
    let read = async || -> anyhow::Result<Vec<PartitionPlacement>> {
        let mut parts = client.metadata_for(vec![TOPIC.to_owned()]).await?.partitions;
        parts.sort_by_key(|p| p.partition);
        Ok(parts)
    };
    let ready = |parts: &[PartitionPlacement]| {
        parts.len() == PARTITIONS as usize
            && parts.iter().all(|p| p.leader_id != 0 && p.leader_id != not && p.isr.len() >= isr)
    };
    wait_until("every partition led and in sync", deadline(&[LEASE_TTL, LEASE_TTL, LEASE_TTL]), async || {
        read().await.map(|p| ready(&p))
    })
    .await?;
    read().await
}

async fn produce(producer: &Producer, range: std::ops::Range<usize>) -> anyhow::Result<Vec<Rec>> {
    let mut pending = Vec::new();
    for i in range {
        pending.push((i, producer.send(record(i)).await?));
    }
    let mut acked = Vec::new();
    for (i, delivery) in pending {
        acked.push(Rec::acked(&delivery.await?, record(i)));
    }
    Ok(acked)
}

/// Polls until `consumer` handed out `count` records in all, and returns them.
async fn consume(consumer: &mut Consumer, got: &mut Vec<Rec>, count: usize) -> anyhow::Result<()> {
    wait_until(&format!("{count} records consumed"), deadline(&[IO_BUDGET, LEASE_TTL]), async || {
        for r in consumer.poll(std::time::Duration::from_millis(200)).await? {
            got.push(Rec::from_consumed(&r));
        }
        anyhow::Ok(got.len() >= count)
    })
    .await
}

fn by_partition(records: &[Rec]) -> BTreeMap<u32, Vec<Rec>> {
    crate::common::by_partition(records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_one_member_reach_each_partitions_leader_and_follow_a_failover() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    Admin::new(cluster.client_of(1)).create_replicated_topic(TOPIC, PARTITIONS, "raft3").await?;
    let first = placements(&cluster, 1, 0, 3).await?;
    let mut leaders: Vec<u32> = first.iter().map(|p| p.leader_id).collect();
    leaders.sort_unstable();
    assert_eq!(leaders, vec![1, 2, 3], "placement gives each member one partition to lead: {first:?}");

    // Both clients list broker 1 alone: partitions led by 2 and 3 are reached through the leaders it names.
    let client = cluster.client_of(1);
    let config =
        ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL, LEASE_TTL]), ..Default::default() };
    let producer = Producer::new(client.clone(), config).await?;
    let mut acked = produce(&producer, 0..300).await?;
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default())?;
    consumer.assign((0..PARTITIONS).map(|p| (TOPIC.to_owned(), p, StartAt::Earliest)).collect())?;
    let mut got = Vec::new();
    consume(&mut consumer, &mut got, 300).await?;
    for (p, recs) in by_partition(&acked) {
        assert_same_records(&format!("partition {p}"), &recs, &by_partition(&got).remove(&p).unwrap_or_default());
    }

    // The leader of a partition broker 1 does not lead dies under load (broker 1 names it as leader until the
    // election): both clients follow the new leader.
    let victim = first.iter().find(|p| p.leader_id != 1).expect("a partition led elsewhere").leader_id;
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce(&producer, 300..450).await })
    };
    cluster.broker(victim).kill9().await?;
    placements(&cluster, 1, victim, 2).await?;
    acked.extend(load.await??);
    producer.close().await;
    consume(&mut consumer, &mut got, 450).await?;
    let (acked, got) = (by_partition(&acked), by_partition(&got));
    assert_eq!(acked.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
    for (p, recs) in &acked {
        assert_same_records(&format!("partition {p} through the failover"), recs, &got[p]);
    }
    Ok(())
}
