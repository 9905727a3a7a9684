//! A consumer group on a three-broker cluster: its coordinator is the leader of the offsets partition its name
//! hashes to. Three members split a raft3 topic's three partitions and commit; the coordinator's broker is killed;
//! the members rejoin at the new coordinator within a session timeout, the committed offsets are intact, and they
//! read on from them: every record exactly once, nothing skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::proto::{self as pb, PartitionPlacement};
use ferry_client::{
    Admin, BrokerClient, Consumer, ConsumerConfig, OffsetReset, Producer, ProducerConfig, ProducerRecord,
};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, by_partition};
use crate::raft3::{Cluster, LEASE_TTL, TS0};

const TOPIC: &str = "work";
const GROUP: &str = "workers";
const OFFSETS: &str = "__ferry_cluster_offsets";
const PARTITIONS: u32 = 3;
const PER_ROUND: usize = 60;
const SESSION: Duration = Duration::from_secs(2);
const HEARTBEAT: Duration = Duration::from_millis(300);
const MAX_WAIT: Duration = Duration::from_millis(100);

fn member_config() -> ConsumerConfig {
    ConsumerConfig {
        auto_offset_reset: OffsetReset::Earliest,
        auto_commit: false,
        heartbeat_interval: HEARTBEAT,
        session_timeout: SESSION,
        max_wait: MAX_WAIT,
        ..ConsumerConfig::default()
    }
}

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("job-{i}"))
        .with_partition(i as u32 % PARTITIONS)
        .with_key(format!("k{i}"))
        .with_header("i", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

async fn produce(client: &BrokerClient, range: std::ops::Range<usize>) -> anyhow::Result<Vec<Rec>> {
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL]), ..Default::default() };
    let producer = Producer::new(client.clone(), config).await?;
    let mut pending = Vec::new();
    for i in range {
        pending.push((i, producer.send(record(i)).await?));
    }
    let mut acked = Vec::new();
    for (i, d) in pending {
        acked.push(Rec::acked(&d.await?, record(i)));
    }
    producer.close().await;
    Ok(acked)
}

/// The group's offsets partition, once it has a leader other than `not` with two in sync at least.
async fn coordinator(cluster: &Cluster, asked: u32, not: u32) -> anyhow::Result<PartitionPlacement> {
    let k = pb::partition_for_key(GROUP.as_bytes(), 8);
    let client = cluster.client_of(asked);
    let read = async || -> anyhow::Result<Option<PartitionPlacement>> {
        let parts = client.metadata_for(vec![OFFSETS.to_owned()]).await?.partitions;
        Ok(parts.into_iter().find(|p| p.partition == k && p.leader_id != 0 && p.leader_id != not && p.isr.len() >= 2))
    };
    wait_until("the group's offsets partition led", deadline(&[LEASE_TTL, LEASE_TTL, LEASE_TTL]), async || {
        read().await.map(|p| p.is_some())
    })
    .await?;
    read().await?.ok_or_else(|| anyhow::anyhow!("no coordinator"))
}

/// Polls every member until they hold one partition each (the group has settled), collecting what they read.
async fn settle(members: &mut [Consumer], got: &mut Vec<Rec>, within: Duration) -> anyhow::Result<()> {
    wait_until("each member to own one partition", within, async || {
        for m in members.iter_mut() {
            got.extend(m.poll(MAX_WAIT).await?.iter().map(Rec::from_consumed));
        }
        anyhow::Ok(members.iter().all(|m| m.assignment().len() == 1))
    })
    .await
}

/// Polls every member until the group has read `count` records in all, committing each member's progress.
async fn consume(members: &mut [Consumer], got: &mut Vec<Rec>, count: usize) -> anyhow::Result<()> {
    wait_until(&format!("the group to read {count} records"), deadline(&[IO_BUDGET, SESSION]), async || {
        for m in members.iter_mut() {
            got.extend(m.poll(MAX_WAIT).await?.iter().map(Rec::from_consumed));
            m.commit().await?;
        }
        anyhow::Ok(got.len() >= count)
    })
    .await
}

async fn committed(client: &BrokerClient) -> anyhow::Result<BTreeMap<u32, u64>> {
    let offsets = Admin::new(client.clone()).fetch_committed_offsets(GROUP, &[]).await?;
    Ok(offsets.into_iter().filter(|o| o.topic == TOPIC).map(|o| (o.partition, o.offset)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_survives_its_coordinators_death_with_its_committed_offsets() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    Admin::new(cluster.client_of(1)).create_replicated_topic(TOPIC, PARTITIONS, "raft3").await?;
    let first = coordinator(&cluster, 1, 0).await?;
    let victim = first.leader_id;
    let mut members = Vec::new();
    for _ in 0..3 {
        let mut m = Consumer::new(cluster.client(), member_config())?;
        m.subscribe(GROUP, vec![TOPIC.into()]).await?;
        members.push(m);
    }
    let mut got = Vec::new();
    settle(&mut members, &mut got, deadline(&[SESSION, SESSION, HEARTBEAT])).await?;
    let described = Admin::new(cluster.client()).describe_group(GROUP).await?;
    assert_eq!(described.members.len(), 3, "{described:?}");

    let mut produced = produce(&cluster.client(), 0..PER_ROUND * PARTITIONS as usize).await?;
    consume(&mut members, &mut got, produced.len()).await?;
    let expected: BTreeMap<u32, u64> = (0..PARTITIONS).map(|p| (p, PER_ROUND as u64)).collect();
    assert_eq!(committed(&cluster.client()).await?, expected);

    // The coordinator's broker dies. Another replica of the offsets partition takes over: the offsets are intact,
    // and the members rejoin there.
    cluster.broker(victim).kill9().await?;
    let survivor = (1..=3).find(|b| *b != victim).unwrap();
    let next = coordinator(&cluster, survivor, victim).await?;
    assert!(next.leader_epoch > first.leader_epoch, "{next:?}");
    let survivors: Vec<String> =
        (1..=3).filter(|b| *b != victim).map(|b| cluster.brokers[b as usize - 1].addr().to_string()).collect();
    let client = BrokerClient::new(ferry_client::ClientConfig::new(survivors))?;
    wait_until("the committed offsets at the new coordinator", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        anyhow::Ok(committed(&client).await.is_ok_and(|c| c == expected))
    })
    .await?;
    // Each member learns at its next heartbeat that the new coordinator does not know it, and joins again.
    let admin = Admin::new(client.clone());
    wait_until(
        "the three members rejoined at the new coordinator",
        deadline(&[SESSION, SESSION, HEARTBEAT, LEASE_TTL]),
        async || {
            for m in members.iter_mut() {
                got.extend(m.poll(MAX_WAIT).await?.iter().map(Rec::from_consumed));
            }
            let described = admin.describe_group(GROUP).await?;
            anyhow::Ok(described.members.len() == 3 && members.iter().all(|m| m.assignment().len() == 1))
        },
    )
    .await?;

    // They read on from the committed offsets: nothing skipped, nothing read twice.
    produced.extend(produce(&client, PER_ROUND * PARTITIONS as usize..2 * PER_ROUND * PARTITIONS as usize).await?);
    consume(&mut members, &mut got, produced.len()).await?;
    let (want, have) = (by_partition(&produced), by_partition(&got));
    for p in 0..PARTITIONS {
        assert_same_records(&format!("partition {p}"), &want[&p], have.get(&p).map_or(&[][..], Vec::as_slice));
    }
    let done: BTreeMap<u32, u64> = (0..PARTITIONS).map(|p| (p, 2 * PER_ROUND as u64)).collect();
    assert_eq!(committed(&client).await?, done);
    for m in &mut members {
        m.close().await?;
    }
    Ok(())
}
