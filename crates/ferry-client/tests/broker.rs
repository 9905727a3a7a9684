//! The client against the real `ferry-broker` binary (started by ferry-testkit on loopback): admin calls and their
//! errors, produce/consume round trips with exact data, idempotent retries through a proxy that loses responses,
//! failover across listed addresses, groups, mirror topics, tokens and large messages.
//!
//! Needs `target/debug/ferry-broker` (`cargo build -p ferry-broker`); the testkit says so when it is missing.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::batch::Header;
use ferry_client::{
    Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, OffsetReset, OffsetSpec, Producer,
    ProducerConfig, ProducerRecord, RecordMetadata, StartAt,
};
use ferry_testkit::{BrokerProcess, Proxy, deadline, init_tracing, wait_until};

fn config(addrs: &[String]) -> ClientConfig {
    let mut config = ClientConfig::new(addrs.iter().cloned());
    config.retry.initial_backoff = Duration::from_millis(20);
    config.retry.max_backoff = Duration::from_millis(200);
    config.request_timeout = Duration::from_secs(10);
    config
}

async fn connect(addr: impl ToString) -> BrokerClient {
    BrokerClient::connect(config(&[addr.to_string()])).await.expect("connect to the test broker")
}

fn record(topic: &str, i: usize) -> ProducerRecord {
    ProducerRecord {
        topic: topic.to_owned(),
        partition: None,
        key: Some(Bytes::from(format!("key-{}", i % 17))),
        value: Some(Bytes::from(format!("value-{i}"))),
        headers: vec![
            Header { key: "i".into(), value: Some(Bytes::from(i.to_string())) },
            Header { key: "i".into(), value: None },
        ],
        timestamp: Some(1_700_000_000_000 + i as i64),
        when: None,
    }
}

/// Sends `records` and waits for every acknowledgement.
async fn produce_all(producer: &Producer, records: Vec<ProducerRecord>) -> Vec<RecordMetadata> {
    let mut futures = Vec::new();
    for r in records {
        futures.push(producer.send(r).await.expect("send"));
    }
    let mut out = Vec::new();
    for f in futures {
        out.push(f.await.expect("delivery"));
    }
    out
}

/// Reads `count` records from every partition of `topic` from the start.
async fn consume_all(client: &BrokerClient, topic: &str, partitions: u32, count: usize) -> Vec<ConsumerRecord> {
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default()).unwrap();
    consumer.assign((0..partitions).map(|p| (topic.to_owned(), p, StartAt::Earliest)).collect()).unwrap();
    let mut out = Vec::new();
    wait_until("all records to be consumed", deadline(&[Duration::from_secs(10)]), async || {
        out.extend(consumer.poll(Duration::from_millis(200)).await?);
        anyhow::Ok(out.len() >= count)
    })
    .await
    .unwrap();
    assert_eq!(out.len(), count, "more records than produced");
    out
}

#[tokio::test]
async fn admin_topic_lifecycle_and_errors() {
    init_tracing();
    let broker = BrokerProcess::builder().cluster_id("dc-test").start().await.unwrap();
    let admin = Admin::new(connect(broker.addr()).await);

    let meta = admin.metadata().await.unwrap();
    assert_eq!(meta.cluster_id, "dc-test");
    assert!(meta.max_batch_bytes > 0);

    let config = TopicConfig { flush: Some("sync".into()), retention_ms: Some(3_600_000), ..Default::default() };
    let created = admin.create_topic("orders", 2, config, None).await.unwrap();
    assert_eq!((created.name.as_str(), created.partitions), ("orders", 2));
    assert!(!created.topic_id.is_empty());
    assert!(admin.create_topic("orders", 2, TopicConfig::default(), None).await.unwrap_err().is_already_exists());

    let described = admin.describe_topic("orders").await.unwrap();
    assert_eq!(described.topic.topic_id, created.topic_id);
    let effective = described.topic.config.unwrap();
    assert_eq!((effective.flush.as_deref(), effective.retention_ms), (Some("sync"), Some(3_600_000)));
    assert_eq!(described.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(), vec![0, 1]);
    assert!(described.partitions.iter().all(|p| p.log_end_offset == 0));

    let grown = admin.alter_partitions("orders", 5).await.unwrap();
    assert_eq!(grown.partitions, 5);
    let shrink = admin.alter_partitions("orders", 3).await.unwrap_err();
    assert!(shrink.is_failed_precondition(), "{shrink:?}");

    let altered = admin.alter_topic_config("orders", TopicConfig { retention_ms: Some(60_000), ..Default::default() });
    assert_eq!(altered.await.unwrap().config.unwrap().retention_ms, Some(60_000));

    let names: Vec<String> = admin.list_topics().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, vec!["orders".to_owned()]);
    let offsets = admin.list_offset("orders", 4, OffsetSpec::Latest).await.unwrap();
    assert_eq!((offsets.offset, offsets.log_end_offset), (Some(0), 0));

    assert!(admin.describe_topic("missing").await.unwrap_err().is_not_found());
    admin.delete_topic("orders").await.unwrap();
    assert!(admin.describe_topic("orders").await.unwrap_err().is_not_found());
    assert!(admin.delete_topic("orders").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn produce_and_consume_keep_partitions_order_and_every_field() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    let admin = Admin::new(client.clone());
    admin.create_topic("events", 3, TopicConfig::default(), None).await.unwrap();

    let producer = Producer::new(client.clone(), ProducerConfig::default()).await.unwrap();
    let n = 3000;
    let acks = produce_all(&producer, (0..n).map(|i| record("events", i)).collect()).await;
    // Keyed records land where the shared partitioner says, with offsets 0.. in send order per partition.
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    for (i, ack) in acks.iter().enumerate() {
        let key = format!("key-{}", i % 17);
        assert_eq!(ack.partition, ferry_client::proto::partition_for_key(key.as_bytes(), 3));
        let expected = next.entry(ack.partition).or_default();
        assert_eq!(ack.offset, *expected, "record {i}");
        *expected += 1;
        assert_eq!(ack.timestamp, 1_700_000_000_000 + i as i64);
    }
    producer.close().await;

    let consumed = consume_all(&client, "events", 3, n).await;
    let by_value: BTreeMap<String, &ConsumerRecord> =
        consumed.iter().map(|r| (String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap(), r)).collect();
    assert_eq!(by_value.len(), n);
    for (i, ack) in acks.iter().enumerate() {
        let r = by_value[&format!("value-{i}")];
        let expected = record("events", i);
        assert_eq!((r.partition, r.offset, r.timestamp), (ack.partition, ack.offset, ack.timestamp));
        assert_eq!(r.key, expected.key);
        assert_eq!(r.headers, expected.headers);
    }
    let described = admin.describe_topic("events").await.unwrap();
    let leos: Vec<u64> = described.partitions.iter().map(|p| p.log_end_offset).collect();
    assert_eq!(leos, (0..3).map(|p| next.get(&p).copied().unwrap_or(0)).collect::<Vec<_>>());
}

#[tokio::test]
async fn keyless_records_spread_and_explicit_partitions_are_checked() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    Admin::new(client.clone()).create_topic("spread", 4, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).await.unwrap();
    // Waiting for each ack closes each batch, so the sticky partition rotates through all four.
    let mut partitions = Vec::new();
    for i in 0..8 {
        let ack = producer.send(ProducerRecord::new("spread", format!("v{i}"))).await.unwrap().await.unwrap();
        partitions.push(ack.partition);
    }
    partitions.sort();
    partitions.dedup();
    assert_eq!(partitions, vec![0, 1, 2, 3]);
    let ack = producer.send(ProducerRecord::new("spread", "x").with_partition(2)).await.unwrap().await.unwrap();
    assert_eq!(ack.partition, 2);
    let err = producer.send(ProducerRecord::new("spread", "x").with_partition(9)).await.unwrap_err();
    assert!(matches!(err, ferry_client::ClientError::UnknownPartition { partition: 9, partitions: 4, .. }), "{err}");
    let err = producer.send(ProducerRecord::new("missing", "x")).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    producer.close().await;
    assert!(matches!(
        producer.send(ProducerRecord::new("spread", "x")).await,
        Err(ferry_client::ClientError::Closed(_))
    ));
}

#[tokio::test]
async fn lost_produce_response_is_retried_and_written_once() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let proxy = Proxy::start(broker.addr()).await.unwrap();
    let client = connect(proxy.addr()).await;
    Admin::new(client.clone()).create_topic("idem", 1, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await.unwrap();
    // First batch: allocates the producer id.
    produce_all(&producer, vec![record("idem", 0)]).await;

    proxy.reset_next_responses(1);
    let acks = produce_all(&producer, (1..50).map(|i| record("idem", i)).collect()).await;
    assert_eq!(proxy.stats().response_resets, 1, "the response was not lost: the test proved nothing");
    assert_eq!(acks.iter().map(|a| a.offset).collect::<Vec<_>>(), (1..50).collect::<Vec<u64>>());
    producer.close().await;

    let direct = connect(broker.addr()).await;
    let leo = Admin::new(direct.clone()).list_offset("idem", 0, OffsetSpec::Latest).await.unwrap().log_end_offset;
    assert_eq!(leo, 50, "a resent batch was written twice");
    let consumed = consume_all(&direct, "idem", 1, 50).await;
    let values: Vec<String> =
        consumed.iter().map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()).collect();
    assert_eq!(values, (0..50).map(|i| format!("value-{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn non_idempotent_produce_is_not_resent_after_a_lost_response() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let proxy = Proxy::start(broker.addr()).await.unwrap();
    let client = connect(proxy.addr()).await;
    Admin::new(client.clone()).create_topic("plain", 1, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client, ProducerConfig { idempotence: false, ..Default::default() }).await.unwrap();
    // The first record caches the topic's metadata, so the armed reset hits the produce call.
    produce_all(&producer, vec![record("plain", 0)]).await;
    proxy.reset_next_responses(1);
    let err = producer.send(record("plain", 1)).await.unwrap().await.unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert_eq!(proxy.stats().response_resets, 1);
    producer.close().await;
    // The broker wrote it once; the client did not write it again.
    let direct = Admin::new(connect(broker.addr()).await);
    assert_eq!(direct.list_offset("plain", 0, OffsetSpec::Latest).await.unwrap().log_end_offset, 2);
}

#[tokio::test]
async fn client_fails_over_to_the_next_listed_broker() {
    init_tracing();
    let broker = BrokerProcess::builder().cluster_id("dc-x").start().await.unwrap();
    let dead = format!("127.0.0.1:{}", ferry_testkit::reserve_port().unwrap());
    let client = BrokerClient::new(config(&[dead.clone(), broker.addr().to_string()])).unwrap();
    assert_eq!(client.metadata().await.unwrap().cluster_id, "dc-x");
    assert_eq!(client.current_address(), Some(broker.addr().to_string()));
    let probed = client.probe(Duration::from_secs(2)).await.unwrap();
    assert_eq!(probed.cluster_id, "dc-x");
}

#[tokio::test]
async fn producer_rides_through_a_broker_restart() {
    init_tracing();
    let mut broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    Admin::new(client.clone()).create_topic("restart", 2, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await.unwrap();
    produce_all(&producer, (0..100).map(|i| record("restart", i)).collect()).await;
    broker.terminate(Duration::from_secs(20)).await.unwrap();
    let mut pending = Vec::new();
    for i in 100..200 {
        pending.push(producer.send(record("restart", i)).await.unwrap());
    }
    broker.restart().await.unwrap();
    for p in pending {
        p.await.unwrap();
    }
    producer.close().await;
    let consumed = consume_all(&client, "restart", 2, 200).await;
    let mut values: Vec<String> =
        consumed.iter().map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()).collect();
    values.sort();
    let mut expected: Vec<String> = (0..200).map(|i| format!("value-{i}")).collect();
    expected.sort();
    assert_eq!(values, expected);
}

#[tokio::test]
async fn consumer_resets_an_out_of_range_position() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    Admin::new(client.clone()).create_topic("oor", 1, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await.unwrap();
    produce_all(&producer, (0..10).map(|i| record("oor", i)).collect()).await;
    let mut consumer =
        Consumer::new(client, ConsumerConfig { auto_offset_reset: OffsetReset::Earliest, ..Default::default() })
            .unwrap();
    consumer.assign(vec![("oor".into(), 0, StartAt::Offset(1000))]).unwrap();
    let mut got = Vec::new();
    wait_until("records after the reset", deadline(&[Duration::from_secs(5)]), async || {
        got.extend(consumer.poll(Duration::from_millis(200)).await?);
        anyhow::Ok(got.len() >= 10)
    })
    .await
    .unwrap();
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), (0..10).collect::<Vec<u64>>());
    assert_eq!(consumer.position("oor", 0), Some(10));
}

#[tokio::test]
async fn group_members_split_partitions_and_commit_positions() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    let admin = Admin::new(client.clone());
    admin.create_topic("grp", 4, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await.unwrap();
    let acks = produce_all(&producer, (0..400).map(|i| record("grp", i)).collect()).await;
    producer.close().await;

    let heartbeat = Duration::from_millis(200);
    let config = ConsumerConfig {
        heartbeat_interval: heartbeat,
        session_timeout: Duration::from_secs(3),
        auto_offset_reset: OffsetReset::Earliest,
        ..Default::default()
    };
    let mut a = Consumer::new(client.clone(), config.clone()).unwrap();
    let mut b = Consumer::new(client.clone(), config).unwrap();
    a.subscribe("g", vec!["grp".into()]).await.unwrap();
    b.subscribe("g", vec!["grp".into()]).await.unwrap();
    let mut records = Vec::new();
    wait_until("both members to hold two partitions", deadline(&[heartbeat, heartbeat]), async || {
        records.extend(a.poll(Duration::from_millis(50)).await?);
        records.extend(b.poll(Duration::from_millis(50)).await?);
        anyhow::Ok(a.assignment().len() == 2 && b.assignment().len() == 2)
    })
    .await
    .unwrap();
    let mut all = a.assignment();
    all.extend(b.assignment());
    all.sort();
    assert_eq!(all, (0..4).map(|p| ("grp".to_owned(), p)).collect::<Vec<_>>());
    wait_until("every record", deadline(&[Duration::from_secs(5)]), async || {
        records.extend(a.poll(Duration::from_millis(100)).await?);
        records.extend(b.poll(Duration::from_millis(100)).await?);
        anyhow::Ok(records.len() >= 400)
    })
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
    // Records taken before the rebalance may be read again by the new owner (at least once), never lost.
    let mut seen: Vec<(u32, u64)> = records.iter().map(|r| (r.partition, r.offset)).collect();
    seen.sort();
    seen.dedup();
    let mut expected: Vec<(u32, u64)> = acks.iter().map(|a| (a.partition, a.offset)).collect();
    expected.sort();
    assert_eq!(seen, expected);

    let mut committed: Vec<(u32, u64)> =
        admin.fetch_committed_offsets("g", &[]).await.unwrap().into_iter().map(|c| (c.partition, c.offset)).collect();
    committed.sort();
    let leos: Vec<(u32, u64)> =
        admin.describe_topic("grp").await.unwrap().partitions.iter().map(|p| (p.partition, p.log_end_offset)).collect();
    assert_eq!(committed, leos);
}

#[tokio::test]
async fn mirror_topic_refuses_produce_until_promoted() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    let admin = Admin::new(client.clone());
    let mirror = MirrorSource {
        source_cluster_id: "src-id".into(),
        source_topic_id: "5f0c6c3e-0000-4000-8000-000000000001".into(),
        source_topic: "m".into(),
        source_cluster: "dc-a".into(),
    };
    let topic = admin.create_topic("m", 1, TopicConfig::default(), Some(mirror.clone())).await.unwrap();
    assert_eq!(topic.mirror, Some(mirror));
    let producer = Producer::new(client, ProducerConfig::default()).await.unwrap();
    let err = producer.send(record("m", 0)).await.unwrap().await.unwrap_err();
    assert!(err.is_failed_precondition(), "{err:?}");
    let promoted = admin.promote("m").await.unwrap();
    assert!(promoted.was_mirror);
    assert_eq!(promoted.topic.mirror, None);
    assert!(!admin.promote("m").await.unwrap().was_mirror);
    let ack = producer.send(record("m", 1)).await.unwrap().await.unwrap();
    assert_eq!((ack.partition, ack.offset), (0, 0));
    producer.close().await;
}

#[tokio::test]
async fn token_is_required_when_the_broker_has_one() {
    init_tracing();
    let broker = BrokerProcess::builder().env("FERRY_BROKER_TOKEN", "s3cret").start().await.unwrap();
    let without = BrokerClient::new(config(&[broker.addr().to_string()])).unwrap();
    assert!(without.metadata().await.unwrap_err().is_unauthenticated());
    let with = BrokerClient::new(config(&[broker.addr().to_string()]).with_token("s3cret")).unwrap();
    with.metadata().await.unwrap();
    let wrong = BrokerClient::new(config(&[broker.addr().to_string()]).with_token("nope")).unwrap();
    assert!(wrong.list_topics(Default::default()).await.unwrap_err().is_unauthenticated());
}

#[tokio::test]
async fn large_batches_pass_the_default_grpc_limit() {
    init_tracing();
    let broker = BrokerProcess::builder().config("[broker]\nmax_batch_bytes = \"8MiB\"\n").start().await.unwrap();
    let client = connect(broker.addr()).await;
    Admin::new(client.clone()).create_topic("big", 1, TopicConfig::default(), None).await.unwrap();
    let producer =
        Producer::new(client.clone(), ProducerConfig { batch_bytes: 8 << 20, ..Default::default() }).await.unwrap();
    assert_eq!(producer.batch_limit(), 8 << 20);
    // Three 3 MiB values: two per batch at most, and a fetch of 9 MiB, both above tonic's 4 MiB default.
    let values: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![b'a' + i; 3 << 20])).collect();
    let records = values.iter().map(|v| ProducerRecord::new("big", v.clone()).with_partition(0)).collect();
    produce_all(&producer, records).await;
    let too_big = producer.send(ProducerRecord::new("big", vec![0u8; 9 << 20])).await.unwrap_err();
    assert!(matches!(too_big, ferry_client::ClientError::RecordTooLarge { .. }), "{too_big}");
    producer.close().await;

    let mut consumer = Consumer::new(
        client,
        ConsumerConfig { partition_max_bytes: 16 << 20, fetch_max_bytes: 16 << 20, ..Default::default() },
    )
    .unwrap();
    consumer.assign(vec![("big".into(), 0, StartAt::Earliest)]).unwrap();
    let mut got: Vec<ConsumerRecord> = Vec::new();
    wait_until("three big records", deadline(&[Duration::from_secs(5)]), async || {
        got.extend(consumer.poll(Duration::from_millis(500)).await?);
        anyhow::Ok(got.len() >= 3)
    })
    .await
    .unwrap();
    let got_values: Vec<Bytes> = got.into_iter().map(|r| r.value.unwrap()).collect();
    assert_eq!(got_values, values);
}

#[tokio::test]
async fn stream_hands_out_records_one_by_one_and_a_dropped_stream_loses_nothing() {
    use futures::StreamExt as _;
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    let admin = Admin::new(client.clone());
    admin.create_topic("s", 1, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await.unwrap();
    produce_all(&producer, (0..20).map(|i| record("s", i)).collect()).await;
    producer.close().await;

    let config = ConsumerConfig { group: Some("manual".into()), ..Default::default() };
    let mut consumer = Consumer::new(client, config).unwrap();
    consumer.assign(vec![("s".into(), 0, StartAt::Earliest)]).unwrap();
    let first: Vec<u64> = consumer.stream().take(5).map(|r| r.unwrap().offset).collect().await;
    assert_eq!(first, vec![0, 1, 2, 3, 4]);
    // The fetch brought all 20; only 5 were handed out, and only those count as consumed.
    assert_eq!(consumer.position("s", 0), Some(5));
    consumer.commit().await.unwrap();
    let committed = admin.fetch_committed_offsets("manual", &[("s".into(), 0)]).await.unwrap();
    assert_eq!(committed.iter().map(|c| (c.partition, c.offset)).collect::<Vec<_>>(), vec![(0, 5)]);
    let rest = consumer.poll(Duration::from_millis(100)).await.unwrap();
    assert_eq!(rest.iter().map(|r| r.offset).collect::<Vec<_>>(), (5..20).collect::<Vec<u64>>());
    consumer.seek("s", 0, 18).unwrap();
    let mut again = Vec::new();
    wait_until("records after the seek", deadline(&[Duration::from_secs(5)]), async || {
        again.extend(consumer.poll(Duration::from_millis(100)).await?);
        anyhow::Ok(again.len() >= 2)
    })
    .await
    .unwrap();
    assert_eq!(again.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![18, 19]);
    consumer.close().await.unwrap();
    assert!(matches!(consumer.poll(Duration::ZERO).await, Err(ferry_client::ClientError::Closed(_))));
}

#[tokio::test]
async fn flush_skips_the_linger_and_a_small_buffer_only_slows_sends_down() {
    use futures::FutureExt as _;
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let client = connect(broker.addr()).await;
    Admin::new(client.clone()).create_topic("f", 2, TopicConfig::default(), None).await.unwrap();

    // A linger far longer than the flush bound below: flush must send at once instead of waiting for it.
    let lingering = ProducerConfig { linger: Duration::from_secs(600), ..Default::default() };
    let producer = Producer::new(client.clone(), lingering).await.unwrap();
    let mut pending = Vec::new();
    for i in 0..10 {
        pending.push(producer.send(record("f", i)).await.unwrap());
    }
    tokio::time::timeout(Duration::from_secs(60), producer.flush()).await.expect("flush waited for the linger");
    for p in pending {
        p.now_or_never().expect("flush returned before an ack").unwrap();
    }
    producer.close().await;

    // 4 KiB of buffer for 2 MB of records: send() waits for room, and everything arrives.
    let small = ProducerConfig { buffer_bytes: 4096, batch_bytes: 2048, ..Default::default() };
    let producer = Producer::new(client.clone(), small).await.unwrap();
    let big_value = Bytes::from(vec![b'x'; 1000]);
    let records = (0..2000).map(|i| ProducerRecord::new("f", big_value.clone()).with_key(format!("k{i}"))).collect();
    let acks = produce_all(&producer, records).await;
    producer.close().await;
    assert_eq!(acks.len(), 2000);
    let consumed = consume_all(&client, "f", 2, 2010).await;
    assert_eq!(consumed.iter().filter(|r| r.value.as_ref() == Some(&big_value)).count(), 2000);
}

#[tokio::test]
async fn zstd_requests_and_a_bound_local_address_work() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let config =
        config(&[broker.addr().to_string()]).with_compression(true).with_bind(std::net::IpAddr::from([127, 0, 0, 1]));
    let client = BrokerClient::connect(config).await.unwrap();
    Admin::new(client.clone()).create_topic("z", 1, TopicConfig::default(), None).await.unwrap();
    let producer = Producer::new(
        client.clone(),
        ProducerConfig { compression: ferry_client::batch::Compression::Zstd, ..Default::default() },
    )
    .await
    .unwrap();
    let acks = produce_all(&producer, (0..100).map(|i| record("z", i)).collect()).await;
    producer.close().await;
    assert_eq!(acks.last().unwrap().offset, 99);
    let consumed = consume_all(&client, "z", 1, 100).await;
    let values: Vec<String> =
        consumed.iter().map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()).collect();
    assert_eq!(values, (0..100).map(|i| format!("value-{i}")).collect::<Vec<_>>());
}
