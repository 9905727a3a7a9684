//! Bad input: each case gets its own gRPC status (or per-partition code) with a message that says what to do,
//! and nothing is written.

use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_client::{Code, OffsetSpec};

use crate::common::{assert_status, connect, leos, plain_batch, start_broker};

const TS0: i64 = 1_700_000_000_000;

fn produce(topic: &str, partition: Option<u32>, batches: bytes::Bytes) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: topic.into(), partition, key: None, batches }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_write_nothing() -> anyhow::Result<()> {
    let broker = start_broker("[broker]\nmax_batch_bytes = \"64KiB\"\n").await?;
    let (client, admin) = connect(&broker);
    assert_eq!(admin.metadata().await?.max_batch_bytes, 64 * 1024);
    admin.create_topic("valid", 4, TopicConfig::default(), None).await?;
    let mirror = MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: "0b6f3c1e-5d7a-4e0c-8a43-6f1d2c9e7b55".into(),
        source_topic: "valid".into(),
        source_cluster: "dc-a".into(),
    };
    admin.create_topic("dc-a.valid", 1, TopicConfig::default(), Some(mirror)).await?;
    for p in 0..4 {
        client
            .produce(produce("valid", Some(p), plain_batch(&["one", "two", "three"][..=p as usize % 3], TS0)))
            .await?;
    }
    let before = leos(&admin, "valid").await;
    assert_eq!(before, vec![1, 2, 3, 1]);
    let topics_before = admin.list_topics().await?.len();
    let unchanged = async || {
        assert_eq!(leos(&admin, "valid").await, before, "a refused request changed a log end offset");
        assert_eq!(leos(&admin, "dc-a.valid").await, vec![0]);
        assert_eq!(admin.list_topics().await.expect("list").len(), topics_before, "a refused request made a topic");
    };

    // Unknown topic and unknown partition: NOT_FOUND, naming the fix.
    assert_status(
        client.produce(produce("missing", None, plain_batch(&["x"], TS0))).await,
        Code::NotFound,
        &["\"missing\" does not exist", "ferryctl topic create missing"],
    );
    assert_status(admin.describe_topic("missing").await, Code::NotFound, &["missing"]);
    assert_status(
        client.produce(produce("valid", Some(7), plain_batch(&["x"], TS0))).await,
        Code::NotFound,
        &["partition 7 does not exist", "has 4 partitions"],
    );
    assert_status(admin.epoch_end("valid", 9, 0).await, Code::NotFound, &["partition 9"]);
    unchanged().await;

    // Invalid topic names: INVALID_ARGUMENT with the rule broken.
    let long = "x".repeat(201);
    for (name, rule) in [
        ("", "cannot be empty"),
        ("has space", "A-Z a-z 0-9 . _ -"),
        ("a/b", "A-Z a-z 0-9 . _ -"),
        ("..", "cannot be . or .."),
        ("__ferry_offsets", "reserved"),
        (long.as_str(), "at most 200 characters"),
    ] {
        assert_status(admin.create_topic(name, 1, TopicConfig::default(), None).await, Code::InvalidArgument, &[rule]);
    }
    // The reserved prefix holds the broker's internal partitions (committed offsets live in __ferry_offsets): no
    // client writes, alters or deletes them, and they are not listed.
    admin
        .commit_offsets(
            "reserved-check",
            vec![ferry_client::admin::CommittedOffset {
                topic: "valid".into(),
                partition: 0,
                offset: 1,
                metadata: String::new(),
            }],
        )
        .await?;
    let reserved = ["reserved for the broker's internal partitions"];
    assert_status(
        client.produce(produce("__ferry_offsets", Some(0), plain_batch(&["x"], TS0))).await,
        Code::InvalidArgument,
        &reserved,
    );
    assert_status(admin.delete_topic("__ferry_offsets").await, Code::InvalidArgument, &reserved);
    assert_status(admin.alter_partitions("__ferry_offsets", 2).await, Code::InvalidArgument, &reserved);
    assert_status(
        admin.alter_topic_config("__ferry_offsets", TopicConfig::default()).await,
        Code::InvalidArgument,
        &reserved,
    );
    assert_status(admin.promote("__ferry_offsets").await, Code::InvalidArgument, &reserved);
    assert_status(admin.truncate_partition("__ferry_offsets", 0, 0).await, Code::InvalidArgument, &reserved);
    assert_status(
        admin.append_with_offsets("__ferry_offsets", 0, "id", 0, plain_batch(&["x"], TS0)).await,
        Code::InvalidArgument,
        &reserved,
    );
    let names: Vec<String> = admin.list_topics().await?.into_iter().map(|t| t.name).collect();
    assert_eq!(names, vec!["dc-a.valid".to_owned(), "valid".to_owned()]);
    assert_eq!(admin.fetch_committed_offsets("reserved-check", &[]).await?.len(), 1);
    // Other bad create fields: zero partitions, an unknown flush mode.
    assert_status(
        admin.create_topic("zero", 0, TopicConfig::default(), None).await,
        Code::InvalidArgument,
        &["partitions must be between 1 and 100000"],
    );
    let bad_flush = TopicConfig { flush: Some("sometimes".into()), ..TopicConfig::default() };
    assert_status(
        admin.create_topic("oddflush", 1, bad_flush, None).await,
        Code::InvalidArgument,
        &["\"sync\" or \"async\""],
    );
    unchanged().await;

    // A batch over max_batch_bytes: RESOURCE_EXHAUSTED.
    let big = "v".repeat(70 * 1024);
    assert_status(
        client.produce(produce("valid", Some(0), plain_batch(&[big.as_str()], TS0))).await,
        Code::ResourceExhausted,
        &["exceeds max_batch_bytes (65536)", "send smaller batches"],
    );
    // A batch whose CRC does not match: DATA_LOSS. A truncated one: INVALID_ARGUMENT.
    let mut corrupt = plain_batch(&["payload"], TS0).to_vec();
    *corrupt.last_mut().unwrap() ^= 0x5a;
    assert_status(
        client.produce(produce("valid", Some(0), corrupt.into())).await,
        Code::DataLoss,
        &["CRC mismatch", "resend"],
    );
    let whole = plain_batch(&["payload"], TS0);
    assert_status(
        client.produce(produce("valid", Some(0), whole.slice(..whole.len() - 3))).await,
        Code::InvalidArgument,
        &["truncated"],
    );
    // A good batch followed by a bad one writes neither.
    let mut mixed = plain_batch(&["good"], TS0).to_vec();
    let mut bad = plain_batch(&["bad"], TS0).to_vec();
    *bad.last_mut().unwrap() ^= 1;
    mixed.extend_from_slice(&bad);
    assert_status(client.produce(produce("valid", Some(1), mixed.into())).await, Code::DataLoss, &["CRC"]);
    assert_status(
        client.produce(produce("valid", Some(1), bytes::Bytes::new())).await,
        Code::InvalidArgument,
        &["no batch"],
    );
    unchanged().await;

    // Offsets out of range: fetch answers a per-partition OFFSET_OUT_OF_RANGE with the log's range; the other
    // partitions of the same fetch are served.
    let fetch = client
        .fetch(pb::FetchRequest {
            partitions: vec![
                pb::PartitionFetch {
                    topic: "valid".into(),
                    partition: 1,
                    offset: 50,
                    max_bytes: 0,
                    leader_epoch: None,
                },
                pb::PartitionFetch { topic: "valid".into(), partition: 2, offset: 0, max_bytes: 0, leader_epoch: None },
                pb::PartitionFetch {
                    topic: "missing".into(),
                    partition: 0,
                    offset: 0,
                    max_bytes: 0,
                    leader_epoch: None,
                },
            ],
            max_wait_ms: 0,
            max_bytes: 0,
        })
        .await?;
    let out = &fetch.partitions[0];
    assert_eq!(ErrorCode::try_from(out.error), Ok(ErrorCode::OffsetOutOfRange), "{out:?}");
    assert!(out.message.contains("offset 50 is out of range") && out.message.contains("[0, 2)"), "{}", out.message);
    assert_eq!((out.log_start_offset, out.log_end_offset), (0, 2));
    assert_eq!(fetch.partitions[1].error, ErrorCode::None as i32);
    assert!(!fetch.partitions[1].batches.is_empty());
    assert_eq!(ErrorCode::try_from(fetch.partitions[2].error), Ok(ErrorCode::UnknownTopicOrPartition));
    // ListOffsets: an unknown partition is a per-partition error; a timestamp after every record has no offset.
    let lo = admin.list_offsets(&[("valid".into(), 8, OffsetSpec::Latest)]).await.unwrap_err();
    assert_eq!(lo.partition_code(), Some(ErrorCode::UnknownTopicOrPartition), "{lo}");
    // Many at once, aligned with the asks: the unknown partition's error sits in its own place, between answers.
    let asks = [("valid", 1, OffsetSpec::Latest), ("valid", 8, OffsetSpec::Latest), ("valid", 1, OffsetSpec::Earliest)];
    let aligned = admin.list_offsets_aligned(&asks).await?;
    let got: Vec<_> = aligned
        .iter()
        .map(|a| a.as_ref().map(|r| r.as_ref().map(|r| (r.partition, r.offset)).map_err(|e| e.partition_code())))
        .collect();
    assert_eq!(
        got,
        [Some(Ok((1, Some(2)))), Some(Err(Some(ErrorCode::UnknownTopicOrPartition))), Some(Ok((1, Some(0))))]
    );
    let late = admin.list_offset("valid", 1, OffsetSpec::Timestamp(TS0 + 1_000_000)).await?;
    assert_eq!((late.offset, late.log_end_offset), (None, 2));
    assert_eq!(admin.list_offset("valid", 1, OffsetSpec::Timestamp(TS0 + 1)).await?.offset, Some(1));
    unchanged().await;

    // Shrinking partitions: FAILED_PRECONDITION, and the count stays.
    assert_status(
        admin.alter_partitions("valid", 2).await,
        Code::FailedPrecondition,
        &["can only grow", "has 4, asked for 2"],
    );
    assert_eq!(admin.describe_topic("valid").await?.topic.partitions, 4);
    // Creating a topic that exists: ALREADY_EXISTS, and the topic keeps its id.
    let id = admin.describe_topic("valid").await?.topic.topic_id;
    let msg = assert_status(
        admin.create_topic("valid", 8, TopicConfig::default(), None).await,
        Code::AlreadyExists,
        &["\"valid\" already exists", "delete it first or choose another name"],
    );
    assert!(msg.contains(&id), "{msg}");
    assert_eq!(admin.describe_topic("valid").await?.topic.topic_id, id);
    // Producing to a mirror topic, and truncating a topic that is not one: FAILED_PRECONDITION.
    assert_status(
        client.produce(produce("dc-a.valid", Some(0), plain_batch(&["x"], TS0))).await,
        Code::FailedPrecondition,
        &["mirrors dc-a", "promote it before writing"],
    );
    assert_status(admin.truncate_partition("valid", 0, 0).await, Code::FailedPrecondition, &["not a mirror topic"]);
    // An idempotent batch out of sequence: FAILED_PRECONDITION.
    let id = client.init_producer(pb::InitProducerRequest {}).await?;
    let seq_batch = |seq: i32| {
        let mut b = BatchBuilder::new(
            Compression::None,
            ProducerInfo { producer_id: id.producer_id, producer_epoch: 0, base_sequence: seq },
        );
        b.push(0, TS0, None, Some(b"s"), &[]);
        b.build(0, 0)
    };
    let first = client.produce(produce("valid", Some(3), seq_batch(0))).await?;
    assert_eq!(first.base_offset, 1);
    assert_status(
        client.produce(produce("valid", Some(3), seq_batch(5))).await,
        Code::FailedPrecondition,
        &["out-of-order sequence: expected 1, got 5"],
    );
    // A request of two batches whose second is out of sequence writes neither.
    let two = [seq_batch(1), seq_batch(3)].concat();
    assert_status(
        client.produce(produce("valid", Some(3), two.into())).await,
        Code::FailedPrecondition,
        &["out-of-order sequence: expected 2, got 3"],
    );
    assert_eq!(leos(&admin, "valid").await, vec![1, 2, 3, 2]);
    // The sequence continues where the last written batch left it.
    assert_eq!(client.produce(produce("valid", Some(3), seq_batch(1))).await?.base_offset, 2);
    Ok(())
}
