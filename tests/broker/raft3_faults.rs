//! raft3 under harder faults: a leader frozen past its lease (SIGSTOP) that wakes up, two failovers in a row with
//! deposed leaders' tails truncated by epoch (KIP-101), every broker killed at once under `flush = "sync"`, and
//! etcd frozen under load. The checks are those of `raft3.rs`, plus a consumer polling through the faults from
//! whichever broker leads, whose reads must never go back, skip or differ from the final log.

use std::time::Duration;

use ferry_batch as batch;
use ferry_client::proto as pb;
use ferry_client::{BrokerClient, ClientConfig, Producer, ProducerConfig};
use ferry_testkit::etcd_client::GetOptions;
use ferry_testkit::{Signal, deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, headers, plain_batch, read_partition};
use crate::raft3::{Cluster, LEASE_TTL, REPLICA_LAG, TOPIC, TS0, assert_log_is, produce_all};

fn producer_config() -> ProducerConfig {
    ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..ProducerConfig::default() }
}

/// Polls partition 0 from offset 0 as a consumer would, from whichever of `addrs` answers with data (a follower's
/// NOT_LEADER, a dead broker and an idle one are skipped), until it has read up to `until`. Returns every record
/// in the order read; fails if an offset ever goes back or repeats.
async fn poll_until(addrs: Vec<String>, until: u64) -> anyhow::Result<Vec<Rec>> {
    let clients: Vec<BrokerClient> = addrs
        .iter()
        .map(|a| {
            let mut c = ClientConfig::new([a.clone()]);
            c.request_timeout = LEASE_TTL;
            BrokerClient::new(c).expect("loopback")
        })
        .collect();
    let mut out: Vec<Rec> = Vec::new();
    let mut offset = 0;
    let mut turn = 0;
    while offset < until {
        turn += 1;
        let client = &clients[turn % clients.len()];
        let request = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: TOPIC.into(),
                partition: 0,
                offset,
                max_bytes: 1 << 20,
                leader_epoch: None,
            }],
            max_wait_ms: 100,
            max_bytes: 1 << 20,
        };
        let Ok(response) = client.fetch(request).await else { continue };
        let Some(data) = response.partitions.into_iter().next() else { continue };
        if data.error != pb::ErrorCode::None as i32 {
            continue;
        }
        for (_, bytes) in batch::split_verified(&data.batches)? {
            for r in batch::decode_records(&bytes)? {
                if r.offset < offset {
                    continue;
                }
                anyhow::ensure!(out.last().is_none_or(|l| l.offset < r.offset), "a poll went back to {}", r.offset);
                out.push(Rec {
                    partition: 0,
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    headers: headers(&r.headers),
                    timestamp: r.timestamp,
                });
            }
        }
        offset = offset.max(data.next_offset);
    }
    Ok(out)
}

fn produce_request(value: &str) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: TOPIC.into(), partition: Some(0), key: None, batches: plain_batch(&[value], TS0) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_lease_acknowledges_nothing_once_it_wakes() -> anyhow::Result<()> {
    let (mut cluster, first) = Cluster::with_topic().await?;
    let producer = Producer::new(cluster.client(), producer_config()).await?;
    let mut acked = produce_all(&producer, 0..100).await?;

    // Freeze the leader past its lease; the others elect a new leader and go on.
    let old = first.leader_id;
    let stale = cluster.client_of(old);
    cluster.broker(old).suspend(deadline(&[LEASE_TTL])).await?;
    let survivor = first.replicas.iter().copied().find(|r| *r != old).expect("three replicas");
    let next = cluster.wait_leader(survivor, old, 2, deadline(&[LEASE_TTL, LEASE_TTL])).await?;
    acked.extend(produce_all(&producer, 100..200).await?);

    // A write sent to the frozen leader is read when it wakes: it is never acknowledged.
    let write = tokio::spawn(async move { stale.produce(produce_request("stale")).await });
    cluster.broker(old).resume()?;
    let answer = write.await?;
    let err = answer.expect_err("the deposed leader acknowledged a write");
    assert!(matches!(err.reason(), Some("not_leader" | "not_acknowledged")), "{err}");

    acked.extend(produce_all(&producer, 200..250).await?);
    producer.close().await;
    wait_until("the woken leader back in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        cluster.placement(survivor).await.map(|p| p.isr.len() == 3)
    })
    .await?;
    assert_eq!(cluster.placement(survivor).await?.leader_id, next.leader_id);
    assert_log_is(&cluster, next.leader_id, &acked, "the log after the frozen leader woke").await;
    cluster.stop_and_compare().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_failovers_in_a_row_truncate_by_epoch_and_no_offset_names_two_records() -> anyhow::Result<()> {
    let (mut cluster, first) = Cluster::with_topic().await?;
    let producer = Producer::new(cluster.client(), producer_config()).await?;
    let poller = tokio::spawn(poll_until(cluster.addrs(), 300));
    let mut acked = produce_all(&producer, 0..100).await?;

    // Failover 1: the leader dies under load; its unacknowledged tail, if any, stays on its disk.
    let a = first.leader_id;
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce_all(&producer, 100..200).await })
    };
    cluster.broker(a).kill9().await?;
    let b_state = cluster
        .wait_leader(
            first.replicas.iter().copied().find(|r| *r != a).expect("replicas"),
            a,
            2,
            deadline(&[LEASE_TTL, LEASE_TTL]),
        )
        .await?;
    acked.extend(load.await??);

    // Failover 2: the second leader dies too; the last broker leads alone, so writes wait for a second replica.
    let b = b_state.leader_id;
    let c = first.replicas.iter().copied().find(|r| *r != a && *r != b).expect("replicas");
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce_all(&producer, 200..300).await })
    };
    cluster.broker(b).kill9().await?;
    cluster.wait_leader(c, b, 1, deadline(&[LEASE_TTL, LEASE_TTL, REPLICA_LAG])).await?;
    // The first dead leader comes back: it truncates to the last epoch it shares with c and rejoins; writes resume.
    cluster.broker(a).restart().await?;
    acked.extend(load.await??);
    cluster.broker(b).restart().await?;
    producer.close().await;
    wait_until("all three in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        cluster.placement(c).await.map(|p| p.isr.len() == 3 && p.leader_id == c)
    })
    .await?;
    let leader = cluster.placement(c).await?;
    assert_eq!(leader.leader_epoch, first.leader_epoch + 2, "{leader:?}");

    let offsets: Vec<u64> = acked.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..300).collect::<Vec<u64>>(), "one producer's acknowledged offsets");
    assert_log_is(&cluster, c, &acked, "the log after two failovers").await;
    let polled = poller.await??;
    assert_same_records("what the consumer polled through the failovers", &acked, &polled);
    cluster.stop_and_compare().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_broker_killed_at_once_keeps_every_acknowledged_record_under_sync_flush() -> anyhow::Result<()> {
    let (mut cluster, _) = Cluster::with_topic().await?;
    let producer = Producer::new(cluster.client(), producer_config()).await?;
    let mut acked = produce_all(&producer, 0..100).await?;
    // The load goes on through the outage: the producer retries until the cluster is back.
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce_all(&producer, 100..200).await })
    };
    for id in 1..=3 {
        cluster.broker(id).kill9().await?;
    }
    for id in 1..=3 {
        cluster.broker(id).restart().await?;
    }
    acked.extend(load.await??);
    producer.close().await;
    let leader = cluster.wait_leader(1, 0, 3, deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET])).await?;
    let offsets: Vec<u64> = acked.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..200).collect::<Vec<u64>>(), "one producer's acknowledged offsets");
    assert_log_is(&cluster, leader.leader_id, &acked, "the log after every broker was killed").await;
    cluster.stop_and_compare().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_frozen_produce_and_consume_go_on_and_coordination_resumes_after() -> anyhow::Result<()> {
    let (mut cluster, first) = Cluster::with_topic().await?;
    let producer = Producer::new(cluster.client(), producer_config()).await?;
    let mut acked = produce_all(&producer, 0..100).await?;

    // Freeze etcd well past every lease: the leader goes on acknowledging with its ISR, consumers go on reading.
    cluster.etcd.send_signal(Signal::STOP)?;
    let frozen = std::time::Instant::now();
    let mut during = 100;
    while frozen.elapsed() < Duration::from_secs(20) {
        acked.extend(produce_all(&producer, during..during + 10).await?);
        during += 10;
    }
    let read = read_partition(&cluster.client_of(first.leader_id), TOPIC, 0).await;
    assert_same_records("what a consumer reads while etcd is frozen", &acked, &read);
    cluster.etcd.send_signal(Signal::CONT)?;

    // Coordination resumes: a leader killed now is replaced, and nothing is lost.
    let old = first.leader_id;
    let survivor = first.replicas.iter().copied().find(|r| *r != old).expect("replicas");
    let mut etcd = cluster.etcd.client().await?;
    wait_until("etcd answering with every member registered", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        let got = etcd.get("/ferry/brokers/", Some(GetOptions::new().with_prefix())).await?;
        anyhow::Ok(got.kvs().len() == 3)
    })
    .await?;
    cluster.broker(old).kill9().await?;
    let next = cluster.wait_leader(survivor, old, 2, deadline(&[LEASE_TTL, LEASE_TTL, LEASE_TTL])).await?;
    acked.extend(produce_all(&producer, during..during + 50).await?);
    producer.close().await;
    assert_log_is(&cluster, next.leader_id, &acked, "the log after etcd came back and the leader failed").await;
    cluster.broker(old).restart().await?;
    wait_until("all three in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        cluster.placement(survivor).await.map(|p| p.isr.len() == 3)
    })
    .await?;
    cluster.stop_and_compare().await?;
    Ok(())
}
