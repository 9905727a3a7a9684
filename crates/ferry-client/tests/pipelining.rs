//! The producer's batches in flight, against the real `ferry-broker` binary behind the testkit's proxy: several
//! batches of one partition are at the broker before the first answer comes back, they are written in the order
//! they were sent, answers lost together are retried into exactly one copy, and a batch refused for good does not
//! take the batches that raced it down with it. A partition's first batch under a producer id goes alone.
//!
//! Needs `target/debug/ferry-broker` (`cargo build -p ferry-broker`); the testkit says so when it is missing.

use std::time::Duration;

use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::{
    Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, DeliveryFuture, OffsetSpec, Producer, ProducerConfig,
    ProducerRecord, StartAt,
};
use ferry_testkit::{BrokerProcess, Proxy, deadline, init_tracing, wait_until};
use futures::FutureExt;

/// Every record's value is this long, so that each batch holds exactly one record.
const VALUE_BYTES: usize = 200;
const WAIT: Duration = Duration::from_secs(10);

async fn connect(addr: impl ToString) -> BrokerClient {
    let mut config = ClientConfig::new([addr.to_string()]);
    config.retry.initial_backoff = Duration::from_millis(20);
    config.retry.max_backoff = Duration::from_millis(200);
    config.request_timeout = Duration::from_secs(10);
    BrokerClient::connect(config).await.expect("connect to the test broker")
}

fn value(i: usize) -> Bytes {
    let mut v = format!("value-{i:04}-").into_bytes();
    v.resize(VALUE_BYTES, b'.');
    Bytes::from(v)
}

fn record(topic: &str, i: usize) -> ProducerRecord {
    ProducerRecord::new(topic, value(i)).with_partition(0).with_timestamp(1_700_000_000_000 + i as i64)
}

/// A producer whose batches hold one record each (two do not fit `batch_bytes`), sent without lingering.
async fn producer(client: &BrokerClient) -> Producer {
    let config = ProducerConfig {
        batch_bytes: ferry_client::batch::HEADER_LEN + VALUE_BYTES + 100,
        linger: Duration::ZERO,
        ..ProducerConfig::default()
    };
    Producer::new(client.clone(), config).await.unwrap()
}

/// A broker, a proxy in front of it, a one-partition topic, and a producer through the proxy that already holds
/// its producer id and the topic's metadata (record 0 is written).
async fn setup(topic: &str) -> (BrokerProcess, Proxy, Producer, BrokerClient) {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let proxy = Proxy::start(broker.addr()).await.unwrap();
    let client = connect(proxy.addr()).await;
    Admin::new(client.clone()).create_topic(topic, 1, TopicConfig::default(), None).await.unwrap();
    let producer = producer(&client).await;
    let first = producer.send(record(topic, 0)).await.unwrap().await.unwrap();
    assert_eq!(first.offset, 0);
    let direct = connect(broker.addr()).await;
    (broker, proxy, producer, direct)
}

async fn log_end(direct: &BrokerClient, topic: &str) -> u64 {
    Admin::new(direct.clone()).list_offset(topic, 0, OffsetSpec::Latest).await.unwrap().log_end_offset
}

/// The values of the whole partition, in offset order, with their offsets.
async fn read_all(direct: &BrokerClient, topic: &str, count: usize) -> Vec<(u64, Bytes)> {
    let mut consumer = Consumer::new(direct.clone(), ConsumerConfig::default()).unwrap();
    consumer.assign(vec![(topic.to_owned(), 0, StartAt::Earliest)]).unwrap();
    let mut out = Vec::new();
    wait_until("every record to be read", deadline(&[WAIT]), async || {
        out.extend(consumer.poll(Duration::from_millis(200)).await?.into_iter().map(|r| (r.offset, r.value.unwrap())));
        anyhow::Ok(out.len() >= count)
    })
    .await
    .unwrap();
    out
}

fn unresolved(futures: &mut [DeliveryFuture]) -> usize {
    futures.iter_mut().map(|f| f.now_or_never().is_none()).filter(|pending| *pending).count()
}

#[tokio::test]
async fn five_batches_of_a_partition_reach_the_broker_before_the_first_answer_and_are_written_in_order() {
    let topic = "pipe";
    let (_broker, proxy, producer, direct) = setup(topic).await;
    proxy.hold_responses();
    let mut futures = Vec::new();
    for i in 1..=8 {
        futures.push(producer.send(record(topic, i)).await.unwrap());
    }
    // With no answer arriving, only the batches in flight can be at the broker: five of them.
    wait_until("five batches at the broker", deadline(&[WAIT]), async || log_end(&direct, topic).await >= 6)
        .await
        .unwrap();
    assert_eq!(log_end(&direct, topic).await, 6, "more batches in flight than max_in_flight");
    assert_eq!(unresolved(&mut futures), 8, "an answer arrived while answers were held");
    proxy.release_responses();
    let mut offsets = Vec::new();
    for f in futures {
        offsets.push(f.await.unwrap().offset);
    }
    assert_eq!(offsets, (1..=8).collect::<Vec<u64>>());
    producer.close().await;
    assert_eq!(log_end(&direct, topic).await, 9);
    let read = read_all(&direct, topic, 9).await;
    assert_eq!(read, (0..9).map(|i| (i as u64, value(i))).collect::<Vec<_>>());
}

#[tokio::test]
async fn answers_of_batches_in_flight_lost_together_are_retried_into_one_copy_each() {
    let topic = "lost";
    let (_broker, proxy, producer, direct) = setup(topic).await;
    proxy.hold_responses();
    // The first answer resets the connection (once released): the answers of all five are lost.
    proxy.reset_next_responses(1);
    let mut futures = Vec::new();
    for i in 1..=5 {
        futures.push(producer.send(record(topic, i)).await.unwrap());
    }
    wait_until("five batches at the broker", deadline(&[WAIT]), async || log_end(&direct, topic).await >= 6)
        .await
        .unwrap();
    proxy.release_responses();
    let mut offsets = Vec::new();
    for f in futures {
        offsets.push(f.await.unwrap().offset);
    }
    assert_eq!(proxy.stats().response_resets, 1, "no answer was lost: the test proved nothing");
    assert_eq!(offsets, (1..=5).collect::<Vec<u64>>());
    producer.close().await;
    assert_eq!(log_end(&direct, topic).await, 6, "a resent batch was written twice");
    let read = read_all(&direct, topic, 6).await;
    assert_eq!(read, (0..6).map(|i| (i as u64, value(i))).collect::<Vec<_>>());
}

#[tokio::test]
async fn batches_that_raced_one_refused_for_good_go_on_under_a_new_producer_id() {
    let topic = "raced";
    let (_broker, proxy, producer, direct) = setup(topic).await;
    proxy.hold_responses();
    let sent_before = proxy.stats().bytes_to_upstream;
    // Record 1 is two hours ahead of the broker's clock: refused for good (storage.max_timestamp_ahead is 1 h).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let future = now + 2 * 3600 * 1000;
    let mut futures = vec![producer.send(record(topic, 1).with_timestamp(future)).await.unwrap()];
    for i in 2..=5 {
        futures.push(producer.send(record(topic, i)).await.unwrap());
    }
    // All five requests went out before any answer (each carries a value of VALUE_BYTES).
    wait_until("five requests sent", deadline(&[WAIT]), async || {
        proxy.stats().bytes_to_upstream >= sent_before + 5 * VALUE_BYTES as u64
    })
    .await
    .unwrap();
    assert_eq!(log_end(&direct, topic).await, 1, "the raced batches were written behind a gap");
    proxy.release_responses();
    let mut outcomes = futures.into_iter();
    let refused = outcomes.next().unwrap().await.unwrap_err();
    assert_eq!(refused.code(), Some(ferry_client::Code::InvalidArgument), "{refused:?}");
    let mut offsets = Vec::new();
    for f in outcomes {
        offsets.push(f.await.unwrap().offset);
    }
    assert_eq!(offsets, vec![1, 2, 3, 4]);
    producer.close().await;
    let read = read_all(&direct, topic, 5).await;
    assert_eq!(read, [0, 2, 3, 4, 5].iter().enumerate().map(|(o, &i)| (o as u64, value(i))).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_partitions_first_batch_under_a_producer_id_goes_alone() {
    // A broker that does not know a producer id at a partition yet takes whatever sequence reaches it first: a
    // later batch that overtook the first (the first redirected to a raft3 leader, say) would be written ahead of
    // it, and the first then refused as out of order. So the window opens once the first batch is acknowledged.
    let topic = "opening";
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let proxy = Proxy::start(broker.addr()).await.unwrap();
    let client = connect(proxy.addr()).await;
    Admin::new(client.clone()).create_topic(topic, 2, TopicConfig::default(), None).await.unwrap();
    let direct = connect(broker.addr()).await;
    let producer = producer(&client).await;
    // The producer id is taken, and the topic known, through partition 1.
    let other = producer.send(record(topic, 0).with_partition(1)).await.unwrap().await.unwrap();
    assert_eq!((other.partition, other.offset), (1, 0));
    proxy.hold_responses();
    let sent_before = proxy.stats().bytes_to_upstream;
    let mut futures = Vec::new();
    for i in 1..=6 {
        futures.push(producer.send(record(topic, i)).await.unwrap());
    }
    wait_until("the first batch at the broker", deadline(&[WAIT]), async || log_end(&direct, topic).await >= 1)
        .await
        .unwrap();
    // Its answer held, the first batch is the only one sent: the five formed behind it wait.
    let sent = proxy.stats().bytes_to_upstream - sent_before;
    assert!(sent < 2 * VALUE_BYTES as u64, "{sent} bytes went upstream: more than the first batch was sent");
    assert_eq!(log_end(&direct, topic).await, 1);
    assert_eq!(unresolved(&mut futures), 6, "an answer arrived while answers were held");
    proxy.release_responses();
    let mut offsets = Vec::new();
    for f in futures {
        offsets.push(f.await.unwrap().offset);
    }
    assert_eq!(offsets, (0..6).collect::<Vec<u64>>());
    producer.close().await;
    let read = read_all(&direct, topic, 6).await;
    assert_eq!(read, (0..6).map(|i| (i as u64, value(i + 1))).collect::<Vec<_>>());
}
