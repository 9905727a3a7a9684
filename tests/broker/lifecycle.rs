//! A topic over its life: retention moving the log start (and what readers below it get), growing the partition
//! count under a consumer group, and delete + re-create giving a new topic.

use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_client::{Consumer, ConsumerConfig, OffsetReset, OffsetSpec, StartAt};
use ferry_testkit::{deadline, wait_for, wait_until};

use crate::common::{
    IO_BUDGET, Rec, assert_same_records, assert_status, connect, offsets, plain_batch, read_partition, start_broker,
};

const TS0: i64 = 1_700_000_000_000;
const RETENTION_CHECK: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_moves_the_log_start_and_readers_below_it_are_told() -> anyhow::Result<()> {
    let config = "[broker]\nmax_batch_bytes = \"16KiB\"\n[storage]\nsegment_bytes = \"64KiB\"\n\
                  retention_check_interval = \"200ms\"\n";
    let broker = start_broker(config).await?;
    let (client, admin) = connect(&broker);
    let retained = TopicConfig { retention_bytes: Some(128 * 1024), ..TopicConfig::default() };
    admin.create_topic("logs", 1, retained, None).await?;
    // ~400 KiB in 100 batches of 8 records: several 64 KiB segments.
    for b in 0..100 {
        let values: Vec<String> = (0..8).map(|i| format!("batch-{b:03}-record-{i}-{}", "l".repeat(480))).collect();
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        let request = pb::ProduceRequest {
            topic: "logs".into(),
            partition: Some(0),
            key: None,
            batches: plain_batch(&refs, TS0 + b),
        };
        client.produce(request).await?;
    }
    let start = wait_for("retention to delete the oldest segments", deadline(&[RETENTION_CHECK]), async || {
        let (start, _) = offsets(&admin, "logs").await[0];
        (start > 0).then_some(start)
    })
    .await?;
    let info = admin.describe_topic("logs").await?.partitions[0].clone();
    assert_eq!(info.log_end_offset, 800);
    assert!(info.size_bytes <= 128 * 1024 + 64 * 1024, "{info:?}");
    assert_eq!(start % 8, 0, "retention deletes whole segments of whole batches");

    // What is left is exactly the tail that was written.
    let left = read_partition(&client, "logs", 0).await;
    assert_eq!(left.first().map(|r| r.offset), Some(start));
    assert_eq!(left.len() as u64, 800 - start);
    for r in &left {
        let (b, i) = (r.offset / 8, r.offset % 8);
        assert!(r.value_str().starts_with(&format!("batch-{b:03}-record-{i}-")), "{r:?}");
    }
    // Earliest is the new log start; a fetch below it is OFFSET_OUT_OF_RANGE with the range.
    assert_eq!(admin.list_offset("logs", 0, OffsetSpec::Earliest).await?.offset, Some(start));
    let fetch = client
        .fetch(pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: "logs".into(),
                partition: 0,
                offset: 0,
                max_bytes: 0,
                leader_epoch: None,
            }],
            max_wait_ms: 0,
            max_bytes: 0,
        })
        .await?;
    let d = &fetch.partitions[0];
    assert_eq!(ErrorCode::try_from(d.error), Ok(ErrorCode::OffsetOutOfRange), "{d:?}");
    assert_eq!((d.log_start_offset, d.log_end_offset), (start, 800));
    // A consumer positioned below the log start resets to the earliest offset and reads exactly what is left.
    let config = ConsumerConfig { auto_offset_reset: OffsetReset::Earliest, ..ConsumerConfig::default() };
    let mut consumer = Consumer::new(client.clone(), config)?;
    consumer.assign(vec![("logs".into(), 0, StartAt::Offset(0))])?;
    let mut got: Vec<Rec> = Vec::new();
    wait_until("the consumer to read what retention left", deadline(&[IO_BUDGET]), async || {
        got.extend(consumer.poll(Duration::from_millis(200)).await?.iter().map(Rec::from_consumed));
        anyhow::Ok(got.len() >= left.len())
    })
    .await?;
    assert_same_records("records after retention", &left, &got);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_topic_is_rebalanced_and_a_recreated_topic_is_a_new_topic() -> anyhow::Result<()> {
    const HEARTBEAT: Duration = Duration::from_millis(300);
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    let first = admin.create_topic("grow", 2, TopicConfig::default(), None).await?;
    let config = ConsumerConfig {
        auto_offset_reset: OffsetReset::Earliest,
        heartbeat_interval: HEARTBEAT,
        session_timeout: Duration::from_secs(3),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(client.clone(), config)?;
    consumer.subscribe("growers", vec!["grow".into()]).await?;
    let mut got: Vec<Rec> = Vec::new();
    wait_until("the member to own both partitions", deadline(&[HEARTBEAT]), async || {
        got.extend(consumer.poll(Duration::from_millis(100)).await?.iter().map(Rec::from_consumed));
        anyhow::Ok(consumer.assignment().len() == 2)
    })
    .await?;

    // Growing to 4 partitions: the member is given the new ones on its next heartbeat and reads their data.
    admin.alter_partitions("grow", 4).await?;
    for p in 0..4 {
        let request = pb::ProduceRequest {
            topic: "grow".into(),
            partition: Some(p),
            key: None,
            batches: plain_batch(&[&format!("in-{p}")], TS0),
        };
        client.produce(request).await?;
    }
    wait_until("the member to read all four partitions", deadline(&[HEARTBEAT, IO_BUDGET]), async || {
        got.extend(consumer.poll(Duration::from_millis(100)).await?.iter().map(Rec::from_consumed));
        anyhow::Ok(consumer.assignment().len() == 4 && got.len() >= 4)
    })
    .await?;
    let mut values: Vec<(u32, String)> = got.iter().map(|r| (r.partition, r.value_str().to_owned())).collect();
    values.sort();
    assert_eq!(values, (0..4).map(|p| (p, format!("in-{p}"))).collect::<Vec<_>>());
    consumer.close().await?;
    let committed: Vec<(u32, u64)> =
        admin.fetch_committed_offsets("growers", &[]).await?.iter().map(|c| (c.partition, c.offset)).collect();
    assert_eq!(committed, vec![(0, 1), (1, 1), (2, 1), (3, 1)]);

    // Deleted and created again: a new topic id, empty partitions, the old data gone for good, and no committed
    // offset of the old topic left to make a group skip the new topic's first records.
    admin.delete_topic("grow").await?;
    assert_status(admin.describe_topic("grow").await, ferry_client::Code::NotFound, &["does not exist"]);
    let second = admin.create_topic("grow", 2, TopicConfig::default(), None).await?;
    assert_ne!(second.topic_id, first.topic_id);
    assert_eq!(offsets(&admin, "grow").await, vec![(0, 0), (0, 0)]);
    assert_eq!(admin.fetch_committed_offsets("growers", &[]).await?, vec![]);
    // Offsets are committed only for partitions that exist.
    let stray =
        ferry_client::admin::CommittedOffset { topic: "grow".into(), partition: 5, offset: 1, metadata: String::new() };
    assert_status(admin.commit_offsets("growers", vec![stray]).await, ferry_client::Code::NotFound, &["partition 5"]);
    let unknown =
        ferry_client::admin::CommittedOffset { topic: "nope".into(), partition: 0, offset: 1, metadata: String::new() };
    assert_status(admin.commit_offsets("growers", vec![unknown]).await, ferry_client::Code::NotFound, &["\"nope\""]);
    Ok(())
}
