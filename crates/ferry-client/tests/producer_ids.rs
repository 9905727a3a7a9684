//! The idempotent producer against a real `ferry-broker` whose producer ids expire after one second of batch
//! timestamps (`storage.producer_id_expiration`): a batch refused as `producer_expired` that was never sent before
//! goes again under a new producer id and is written once; one whose earlier attempt may have been written is never
//! re-sent under another id, and fails instead.
//!
//! Needs `target/debug/ferry-broker` (`cargo build -p ferry-broker`); the testkit says so when it is missing.

use std::time::Duration;

use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::batch::BatchHeader;
use ferry_client::{
    Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, OffsetSpec, Producer, ProducerConfig, ProducerRecord,
    RetryPolicy, StartAt,
};
use ferry_testkit::{BrokerProcess, Proxy, deadline, init_tracing, wait_until};

/// Producer ids expire after 1 s of batch timestamps; records below are 5 s apart, so each gap expires them.
const BROKER_CONFIG: &str = "[storage]\nproducer_id_expiration = \"1s\"\n";
const T0: i64 = 1_700_000_000_000;
const GAP_MS: i64 = 5_000;

async fn connect(addr: impl ToString) -> BrokerClient {
    let mut config = ClientConfig::new([addr.to_string()]);
    config.request_timeout = Duration::from_secs(10);
    BrokerClient::connect(config).await.expect("connect to the test broker")
}

fn record(value: &str, timestamp: i64) -> ProducerRecord {
    ProducerRecord {
        topic: "ids".into(),
        partition: Some(0),
        key: None,
        value: Some(Bytes::from(value.to_owned())),
        headers: Vec::new(),
        timestamp: Some(timestamp),
        when: None,
    }
}

/// A producer whose retries wait `backoff`, exactly (no jitter).
async fn producer(client: BrokerClient, backoff: Duration) -> Producer {
    let retry = RetryPolicy { initial_backoff: backoff, max_backoff: backoff, jitter: false, ..RetryPolicy::default() };
    Producer::new(client, ProducerConfig { retry, ..ProducerConfig::default() }).await.unwrap()
}

/// Every record of partition 0 as (offset, value, timestamp).
async fn read_all(client: &BrokerClient, count: usize) -> Vec<(u64, String, i64)> {
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default()).unwrap();
    consumer.assign(vec![("ids".into(), 0, StartAt::Earliest)]).unwrap();
    let mut out = Vec::new();
    wait_until("the partition's records to be read", deadline(&[Duration::from_secs(10)]), async || {
        for r in consumer.poll(Duration::from_millis(200)).await? {
            out.push((r.offset, String::from_utf8(r.value.unwrap().to_vec())?, r.timestamp));
        }
        anyhow::Ok(out.len() >= count)
    })
    .await
    .unwrap();
    out
}

/// The producer id of each batch of partition 0, by base offset.
async fn producer_ids(client: &BrokerClient) -> Vec<(u64, i64)> {
    let request = ferry_client::proto::FetchRequest {
        partitions: vec![ferry_client::proto::PartitionFetch {
            topic: "ids".into(),
            partition: 0,
            offset: 0,
            max_bytes: 1 << 20,
            leader_epoch: None,
        }],
        max_wait_ms: 0,
        max_bytes: 1 << 20,
    };
    let response = client.fetch(request).await.unwrap();
    let batches = &response.partitions[0].batches;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < batches.len() {
        let header = BatchHeader::parse(&batches[pos..]).unwrap();
        out.push((header.base_offset, header.producer_id));
        pos += header.total_len();
    }
    out
}

async fn log_end(client: &BrokerClient) -> u64 {
    Admin::new(client.clone()).list_offset("ids", 0, OffsetSpec::Latest).await.unwrap().log_end_offset
}

#[tokio::test]
async fn a_batch_refused_as_producer_expired_goes_again_under_a_new_producer_id_once() {
    init_tracing();
    let broker = BrokerProcess::builder().config(BROKER_CONFIG).start().await.unwrap();
    let client = connect(broker.addr()).await;
    Admin::new(client.clone()).create_topic("ids", 1, TopicConfig::default(), None).await.unwrap();
    let a = producer(client.clone(), Duration::from_millis(50)).await;
    let b = producer(client.clone(), Duration::from_millis(50)).await;

    assert_eq!(a.send(record("a0", T0)).await.unwrap().await.unwrap().offset, 0);
    // Another producer's batch moves the partition's newest timestamp past a's expiry.
    assert_eq!(b.send(record("b0", T0 + GAP_MS)).await.unwrap().await.unwrap().offset, 1);
    // a's id is expired now. Its next batch was never sent before: the broker refuses it as producer_expired and
    // writes nothing; the producer continues under a new id, and the batch is written once.
    assert_eq!(a.send(record("a1", T0 + GAP_MS + 1)).await.unwrap().await.unwrap().offset, 2);
    // The new id works on: its next batch is appended in sequence under it.
    assert_eq!(a.send(record("a2", T0 + GAP_MS + 2)).await.unwrap().await.unwrap().offset, 3);
    a.close().await;
    b.close().await;

    assert_eq!(log_end(&client).await, 4, "a batch was written twice or not at all");
    assert_eq!(
        read_all(&client, 4).await,
        vec![
            (0, "a0".into(), T0),
            (1, "b0".into(), T0 + GAP_MS),
            (2, "a1".into(), T0 + GAP_MS + 1),
            (3, "a2".into(), T0 + GAP_MS + 2),
        ]
    );
    let ids = producer_ids(&client).await;
    assert_eq!(ids.iter().map(|(offset, _)| *offset).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    let (first, other, new) = (ids[0].1, ids[1].1, ids[2].1);
    assert!(first >= 0 && other >= 0 && new >= 0, "every batch is idempotent: {ids:?}");
    assert!(new != first && new != other && first != other, "a1 went under its own new producer id: {ids:?}");
    assert_eq!(ids[3].1, new, "a2 went under the same new id, not yet another one: {ids:?}");
}

#[tokio::test]
async fn a_late_retry_refused_as_producer_expired_fails_and_is_never_written_twice() {
    init_tracing();
    let broker = BrokerProcess::builder().config(BROKER_CONFIG).start().await.unwrap();
    let proxy = Proxy::start(broker.addr()).await.unwrap();
    let direct = connect(broker.addr()).await;
    Admin::new(direct.clone()).create_topic("ids", 1, TopicConfig::default(), None).await.unwrap();
    // a reaches the broker through the proxy. Its retries wait 5 s: the window in which the test expires its id.
    let backoff = Duration::from_secs(5);
    let a = producer(connect(proxy.addr()).await, backoff).await;
    let b = producer(direct.clone(), Duration::from_millis(50)).await;
    assert_eq!(a.send(record("a0", T0)).await.unwrap().await.unwrap().offset, 0);

    // a1 is written, but its answer is lost: a must retry it, not knowing whether it was written.
    proxy.reset_next_responses(1);
    let delivery = a.send(record("a1", T0 + 1)).await.unwrap();
    wait_until("a1's answer to be lost", deadline(&[backoff]), async || anyhow::Ok(proxy.stats().response_resets == 1))
        .await
        .unwrap();
    // Before the retry, hold a off the broker and expire its id with b's batch.
    proxy.cut();
    assert_eq!(b.send(record("b0", T0 + GAP_MS)).await.unwrap().await.unwrap().offset, 2);
    proxy.restore();

    // The retry is refused as producer_expired. The first attempt may have been written (it was), so the producer
    // must not send the batch under a new id: the delivery fails with the broker's reason.
    let err = delivery.await.expect_err("a late retry under an expired producer id was accepted");
    assert!(err.is_producer_expired(), "{err:?}");
    assert_eq!(err.reason(), Some("producer_expired"));
    assert!(err.is_failed_precondition(), "{err:?}");
    a.close().await;
    b.close().await;

    assert_eq!(log_end(&direct).await, 3, "the late retry was written again");
    assert_eq!(
        read_all(&direct, 3).await,
        vec![(0, "a0".into(), T0), (1, "a1".into(), T0 + 1), (2, "b0".into(), T0 + GAP_MS)]
    );
}
