//! Draining a broker of a four-broker cluster under producer and consumer load: `ferryctl cluster drain` moves the
//! broker's leaderships, then its replicas, to the others, reports its progress and exits once nothing is left
//! there; the drained broker drops its copies; every acknowledged record is in the log exactly once, and the
//! consumer read each exactly once.

use std::time::Duration;

use ferry_client::proto::PartitionPlacement;
use ferry_client::{
    Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, StartAt,
};
use ferry_testkit::{BrokerProcess, EtcdProcess, deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, by_partition, read_partition};
use crate::raft3::{LEASE_TTL, TS0, member_config};

const TOPIC: &str = "moving";
const PARTITIONS: u32 = 2;
const RECORDS: usize = 400;

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("item-{i}"))
        .with_partition(i as u32 % PARTITIONS)
        .with_key(format!("k{}", i % 9))
        .with_header("i", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

async fn placements(client: &BrokerClient) -> anyhow::Result<Vec<PartitionPlacement>> {
    let mut parts = client.metadata_for(vec![TOPIC.to_owned()]).await?.partitions;
    parts.sort_by_key(|p| p.partition);
    Ok(parts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_broker_under_load_moves_everything_off_it_and_loses_nothing() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let etcd = EtcdProcess::start().await?;
    let mut brokers = Vec::new();
    for id in 1..=4 {
        let config = member_config(&etcd, id, "");
        brokers.push(BrokerProcess::builder().cluster_id("dc-a").config(config).start().await?);
    }
    let addrs: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
    let client = BrokerClient::new(ClientConfig::new(addrs.clone()))?;
    Admin::new(client.clone()).create_replicated_topic(TOPIC, PARTITIONS, "raft3").await?;
    wait_until("both partitions led with three in sync", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        let parts = placements(&client).await?;
        anyhow::Ok(parts.len() == 2 && parts.iter().all(|p| p.leader_id != 0 && p.isr.len() == 3))
    })
    .await?;
    // Drain the leader of partition 0: its leadership and its replicas move.
    let drained = placements(&client).await?[0].leader_id;

    let producer_client = client.clone();
    let load = tokio::spawn(async move {
        let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL]), ..Default::default() };
        let producer = Producer::new(producer_client, config).await?;
        let mut acked = Vec::new();
        for chunk in (0..RECORDS).collect::<Vec<_>>().chunks(20) {
            let mut pending = Vec::new();
            for &i in chunk {
                pending.push((i, producer.send(record(i)).await?));
            }
            for (i, d) in pending {
                acked.push(Rec::acked(&d.await?, record(i)));
            }
        }
        producer.close().await;
        anyhow::Ok(acked)
    });
    let mut consumer =
        Consumer::new(client.clone(), ConsumerConfig { max_wait: Duration::from_millis(100), ..Default::default() })?;
    consumer.assign((0..PARTITIONS).map(|p| (TOPIC.to_owned(), p, StartAt::Earliest)).collect())?;
    let mut got = Vec::new();
    wait_until("the consumer to read the first records", deadline(&[IO_BUDGET]), async || {
        got.extend(consumer.poll(Duration::from_millis(100)).await?.iter().map(Rec::from_consumed));
        anyhow::Ok(!got.is_empty())
    })
    .await?;

    let program = ferry_testkit::binary_path(ferry_testkit::FERRYCTL_BIN)?;
    let drain = tokio::process::Command::new(program)
        .args(["--broker", &addrs.join(","), "cluster", "drain", &drained.to_string(), "--wait", "60s"])
        .output();
    let (out, _) = tokio::join!(drain, async {
        // The consumer keeps reading while the drain runs.
        let until = tokio::time::Instant::now() + deadline(&[LEASE_TTL]);
        while tokio::time::Instant::now() < until {
            if let Ok(batch) = consumer.poll(Duration::from_millis(100)).await {
                got.extend(batch.iter().map(Rec::from_consumed));
            }
        }
    });
    let out = out?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ferryctl failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("draining broker {drained}")), "{stdout}");
    assert!(stdout.contains(&format!("broker {drained} is drained")), "{stdout}");
    let acked = load.await??;
    assert_eq!(acked.len(), RECORDS);

    // Nothing is left on the drained broker; every partition has three replicas, all in sync.
    let parts = placements(&client).await?;
    for p in &parts {
        assert!(!p.replicas.contains(&drained) && p.leader_id != drained, "{p:?}");
        assert_eq!((p.replicas.len(), p.isr.len(), p.target_replicas.len()), (3, 3, 0), "{p:?}");
    }
    wait_until("the drained broker to drop its copies", deadline(&[LEASE_TTL]), async || {
        !brokers[drained as usize - 1].data_dir().join(TOPIC).exists()
    })
    .await?;

    // Every acknowledged record is in its leader's log exactly once, and the consumer read each exactly once.
    wait_until("the consumer to read every record", deadline(&[IO_BUDGET]), async || {
        got.extend(consumer.poll(Duration::from_millis(100)).await?.iter().map(Rec::from_consumed));
        anyhow::Ok(got.len() >= RECORDS)
    })
    .await?;
    let (want, have) = (by_partition(&acked), by_partition(&got));
    for p in &parts {
        let leader = BrokerClient::new(ClientConfig::new([addrs[p.leader_id as usize - 1].clone()]))?;
        let log = read_partition(&leader, TOPIC, p.partition).await;
        assert_same_records(&format!("partition {} in its leader's log", p.partition), &want[&p.partition], &log);
        assert_same_records(
            &format!("partition {} as consumed", p.partition),
            &want[&p.partition],
            &have[&p.partition],
        );
    }
    Ok(())
}
