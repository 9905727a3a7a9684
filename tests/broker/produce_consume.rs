//! Keyed produce over four partitions and a group consumer that reads everything back.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::proto::partition_for_key;
use ferry_client::{Consumer, ConsumerConfig, OffsetReset, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, by_partition, connect, read_topic, start_broker};

const RECORDS: usize = 20_000;
const KEYS: usize = 500;
const PARTITIONS: u32 = 4;
const TS0: i64 = 1_700_000_000_000;

/// The i-th record: key `key-{i % KEYS}`, a sequence header and a repeated `tag` header (order matters).
fn record(topic: &str, i: usize) -> ProducerRecord {
    ProducerRecord::new(topic, format!("value-{i:05}-{}", "x".repeat(i % 37)))
        .with_key(format!("key-{:03}", i % KEYS))
        .with_header("seq", i.to_string())
        .with_header("tag", "a")
        .with_header("tag", if i % 2 == 0 { "even" } else { "odd" })
        .with_timestamp(TS0 + i as i64)
}

fn seq_of(r: &Rec) -> usize {
    let (_, v) = r.headers.iter().find(|(k, _)| k == "seq").expect("seq header");
    std::str::from_utf8(v.as_deref().expect("seq value")).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_are_consumed_exactly_once_in_partition_order() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", PARTITIONS, TopicConfig::default(), None).await?;

    // Produce, keeping what each acknowledgement says.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut deliveries = Vec::with_capacity(RECORDS);
    for i in 0..RECORDS {
        deliveries.push(producer.send(record("orders", i)).await?);
    }
    let acks = futures::future::try_join_all(deliveries).await?;
    producer.close().await;
    let expected: Vec<Rec> = acks.iter().enumerate().map(|(i, ack)| Rec::acked(ack, record("orders", i))).collect();

    // The same key always lands on the partition of the documented partitioner.
    for r in &expected {
        assert_eq!(r.partition, partition_for_key(r.key.as_deref().unwrap(), PARTITIONS), "{r:?}");
    }
    // Per partition, offsets follow send order, and no offset is given twice.
    for (p, recs) in by_partition(&expected) {
        let seqs: Vec<usize> = recs.iter().map(seq_of).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "partition {p}: offsets do not follow send order");
        assert!(recs.windows(2).all(|w| w[0].offset < w[1].offset), "partition {p}: an offset was given twice");
    }
    // Every partition got records (500 keys over 4 partitions), and the log holds exactly what was acknowledged.
    assert_eq!(by_partition(&expected).len(), PARTITIONS as usize);
    assert_same_records("log vs acknowledgements", &expected, &read_topic(&client, "orders").await);

    // A group consumer reads the same set, each partition in offset order.
    let config = ConsumerConfig {
        auto_offset_reset: OffsetReset::Earliest,
        auto_commit: false,
        heartbeat_interval: Duration::from_millis(500),
        session_timeout: Duration::from_secs(5),
        max_wait: Duration::from_millis(200),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(client.clone(), config.clone())?;
    consumer.subscribe("readers", vec!["orders".into()]).await?;
    let mut consumed: Vec<Rec> = Vec::new();
    wait_until("the group consumer to read every record", deadline(&[IO_BUDGET]), async || {
        let batch = consumer.poll(config.max_wait).await?;
        consumed.extend(batch.iter().map(Rec::from_consumed));
        anyhow::Ok(consumed.len() >= RECORDS)
    })
    .await?;
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for r in &consumed {
        if let Some(prev) = last.insert(r.partition, r.offset) {
            assert!(r.offset > prev, "partition {}: offset {} delivered after {prev}", r.partition, r.offset);
        }
    }
    assert_eq!(consumer.assignment().len(), PARTITIONS as usize);
    assert_same_records("group consumer vs acknowledgements", &expected, &consumed);

    // Commit, and the group's committed offsets are the log ends.
    consumer.commit().await?;
    let committed: Vec<(u32, u64)> =
        admin.fetch_committed_offsets("readers", &[]).await?.iter().map(|c| (c.partition, c.offset)).collect();
    let ends: Vec<(u32, u64)> =
        by_partition(&expected).iter().map(|(p, v)| (*p, v.last().unwrap().offset + 1)).collect();
    assert_eq!(committed, ends);
    consumer.close().await?;
    Ok(())
}

/// `len` bytes that do not compress (xorshift), different for every `seed`.
fn noise(seed: usize, len: usize) -> Vec<u8> {
    let mut x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_with_default_budgets_reads_a_backlog_larger_than_one_message() -> anyhow::Result<()> {
    // 4 partitions x ~1.5 MiB of 1 KiB incompressible records: one fetch at the consumer's default budgets (16 MiB
    // in total, 1 MiB per partition) asks for more than one gRPC message may carry (2 x 1 MiB + 1 MiB).
    const PER_PARTITION: usize = 1500;
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("backlog", PARTITIONS, TopicConfig::default(), None).await?;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut deliveries = Vec::new();
    for i in 0..PER_PARTITION * PARTITIONS as usize {
        let r = ProducerRecord::new("backlog", noise(i, 1024))
            .with_partition(i as u32 % PARTITIONS)
            .with_timestamp(TS0 + i as i64);
        deliveries.push(producer.send(r).await?);
    }
    futures::future::try_join_all(deliveries).await?;
    producer.close().await;
    let expected = read_topic(&client, "backlog").await;
    assert_eq!(expected.len(), PER_PARTITION * PARTITIONS as usize);

    let config = ConsumerConfig { auto_offset_reset: OffsetReset::Earliest, ..ConsumerConfig::default() };
    let mut consumer = Consumer::new(client.clone(), config)?;
    consumer.subscribe("bulk", vec!["backlog".into()]).await?;
    let mut consumed: Vec<Rec> = Vec::new();
    wait_until("the consumer to read the whole backlog", deadline(&[IO_BUDGET]), async || {
        let batch = consumer.poll(Duration::from_millis(200)).await?;
        consumed.extend(batch.iter().map(Rec::from_consumed));
        anyhow::Ok(consumed.len() >= expected.len())
    })
    .await?;
    assert_same_records("large backlog", &expected, &consumed);
    consumer.close().await?;
    Ok(())
}
