//! Idempotent produce across lost responses: the fault proxy resets the connection at the produce response, the
//! client sends the same batch again, and the broker answers the retry with the original offsets.

use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::Proxy;

use crate::common::{Rec, assert_same_records, client_for, connect, leos, read_topic, start_broker};

const TS0: i64 = 1_700_000_000_000;

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new("payments", format!("payment-{i}"))
        .with_key(format!("account-{}", i % 7))
        .with_header("i", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_retries_after_lost_responses_write_each_record_once() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (_, admin) = connect(&broker);
    admin.create_topic("payments", 1, TopicConfig::default(), None).await?;
    let proxy = Proxy::start(broker.addr()).await?;
    let client = client_for(proxy.addr());
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;

    // Warm up through the proxy: topic metadata, producer id and a first batch, so that the next responses the
    // proxy sees are produce responses.
    let first = producer.send(record(0)).await?.await?;
    assert_eq!(first.offset, 0);

    // The next two produce responses are lost: the broker wrote the batch, the client saw its connection reset.
    proxy.reset_next_responses(2);
    let mut deliveries = Vec::new();
    for i in 1..=300 {
        deliveries.push(producer.send(record(i)).await?);
    }
    let acks = futures::future::try_join_all(deliveries).await?;
    producer.close().await;
    assert_eq!(proxy.pending_response_resets(), 0, "the proxy never saw the responses it was to reset");
    // Exactly the two armed resets happened, and no other fault: every reset of the proxy was one of them.
    let stats = proxy.stats();
    assert_eq!((stats.response_resets, stats.resets), (2, 2), "{stats:?}");

    // Acknowledged offsets are contiguous after the first record, and the log holds each record exactly once.
    let offsets: Vec<u64> = acks.iter().map(|a| a.offset).collect();
    assert_eq!(offsets, (1..=300).collect::<Vec<u64>>());
    let expected: Vec<Rec> =
        std::iter::once(&first).chain(acks.iter()).enumerate().map(|(i, ack)| Rec::acked(ack, record(i))).collect();
    assert_same_records("log after lost responses", &expected, &read_topic(&client, "payments").await);
    assert_eq!(leos(&admin, "payments").await, vec![301]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_idempotent_batch_is_answered_as_a_duplicate_with_its_original_offsets() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (_, admin) = connect(&broker);
    admin.create_topic("payments", 2, TopicConfig::default(), None).await?;
    let proxy = Proxy::start(broker.addr()).await?;
    let client = client_for(proxy.addr());
    let id = client.init_producer(pb::InitProducerRequest {}).await?;
    let batch = |base_sequence: i32, values: &[&str]| {
        let mut b = BatchBuilder::new(
            Compression::None,
            ProducerInfo { producer_id: id.producer_id, producer_epoch: id.producer_epoch as i16, base_sequence },
        );
        for (i, v) in values.iter().enumerate() {
            b.push(i as u32, TS0 + i as i64, Some(b"k"), Some(v.as_bytes()), &[]);
        }
        b.build(0, 0)
    };
    let produce = |batches| pb::ProduceRequest { topic: "payments".into(), partition: Some(1), key: None, batches };

    let first = client.produce(produce(batch(0, &["a", "b", "c"]))).await?;
    assert_eq!((first.base_offset, first.last_offset, first.duplicate), (0, 2, false));

    // The response to the next batch is lost; the client's retry of the same bytes is recognised.
    proxy.reset_next_responses(1);
    let second = client.produce(produce(batch(3, &["d", "e"]))).await?;
    assert_eq!(proxy.stats().response_resets, 1);
    assert!(second.duplicate, "the retried batch must take the duplicate path: {second:?}");
    assert_eq!((second.partition, second.base_offset, second.last_offset, second.log_end_offset), (1, 3, 4, 5));

    // Sending an older batch again also answers with its original offsets, and nothing is written.
    let again = client.produce(produce(batch(0, &["a", "b", "c"]))).await?;
    assert_eq!((again.base_offset, again.last_offset, again.duplicate), (0, 2, true));
    assert_eq!(leos(&admin, "payments").await, vec![0, 5]);
    let values: Vec<String> =
        read_topic(&client, "payments").await.iter().map(|r| format!("{}@{}", r.value_str(), r.offset)).collect();
    assert_eq!(values, ["a@0", "b@1", "c@2", "d@3", "e@4"]);
    Ok(())
}
