//! Delayed delivery's per-topic limit, the ordinary producer path and retries (docs/messaging.md, "Delay"): a
//! topic's `max_delay_ms` refuses a longer delay naming the topic and its limit, under the broker's ceiling; a
//! record given `deliver_at`/`delay` goes through the `Producer` and comes back with its delay id, and is moved
//! naming its producer in a header; a delayed produce sent twice with the same producer id, epoch and sequence (a
//! lost answer) stores its records once and answers the first attempt's ids, also after a kill -9.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use ferry_batch::{self as batch, BatchIter};
use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{Code, Delayed, DeliverAt, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_status, connect, headers, read_partition, start_broker};
use crate::delay::{TICK, TOPIC, now_ms, record};

const CONFIG: &str = "[delay]\ntick = \"50ms\"\nmax_delay = \"1h\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topics_max_delay_refuses_longer_delays_naming_the_topic_under_the_brokers_ceiling() -> anyhow::Result<()> {
    let broker = start_broker(CONFIG).await?;
    let (client, admin) = connect(&broker);
    let delayed = Delayed::new(client.clone());
    // Above the broker's ceiling (1 h) or below one second: refused, nothing created.
    for (ms, needle) in [(7_200_000, "past the broker's delay.max_delay, 3600000 ms"), (999, "below the 1000 ms")] {
        let config = TopicConfig { max_delay_ms: Some(ms), ..TopicConfig::default() };
        assert_status(admin.create_topic(TOPIC, 1, config, None).await, Code::InvalidArgument, &[TOPIC, needle]);
    }
    assert!(admin.list_topics().await?.is_empty());
    let config = TopicConfig { max_delay_ms: Some(60_000), ..TopicConfig::default() };
    let info = admin.create_topic(TOPIC, 1, config, None).await?;
    assert_eq!(info.config.and_then(|c| c.max_delay_ms), Some(60_000));
    admin.create_topic("plain", 1, TopicConfig::default(), None).await?;

    let one = [record(0, 1)];
    let refusal = assert_status(
        delayed.send(&one, DeliverAt::After(Duration::from_millis(60_001))).await,
        Code::InvalidArgument,
        &["delay_ms 60001 is past the maximum delay of 60000 ms", "topic \"later\" allows at most 60000 ms"],
    );
    assert!(refusal.contains("its max_delay_ms"), "{refusal}");
    assert_status(
        delayed.send(&one, DeliverAt::Time(now_ms() + 120_000)).await,
        Code::InvalidArgument,
        &["past the maximum delay of 60000 ms", "later"],
    );
    assert!(delayed.describe(TOPIC).await?.is_empty(), "a refused produce stores nothing");
    let within = delayed.send(&one, DeliverAt::After(Duration::from_millis(59_000))).await?;
    assert_eq!(within.ids.len(), 1);

    // Raised by alter (the ceiling still holds), a longer delay is taken; past the ceiling, alter is refused.
    let raised = admin.alter_topic_config(TOPIC, TopicConfig { max_delay_ms: Some(120_000), ..Default::default() });
    assert_eq!(raised.await?.config.and_then(|c| c.max_delay_ms), Some(120_000));
    let longer = delayed.send(&one, DeliverAt::After(Duration::from_millis(90_000))).await?;
    assert_eq!(longer.ids.len(), 1);
    let too_far = TopicConfig { max_delay_ms: Some(3_600_001), ..Default::default() };
    assert_status(admin.alter_topic_config(TOPIC, too_far).await, Code::InvalidArgument, &["later", "3600000 ms"]);
    assert_eq!(admin.describe_topic(TOPIC).await?.topic.config.and_then(|c| c.max_delay_ms), Some(120_000));

    // A topic without a setting follows the broker's max_delay, and says so.
    let plain = [record(0, 1).with_partition(0)].map(|r| ProducerRecord { topic: "plain".into(), ..r });
    assert_eq!(delayed.send(&plain, DeliverAt::After(Duration::from_secs(3_000))).await?.ids.len(), 1);
    assert_status(
        delayed.send(&plain, DeliverAt::After(Duration::from_secs(3_601))).await,
        Code::InvalidArgument,
        &["topic \"plain\" allows at most 3600000 ms", "the broker's delay.max_delay"],
    );
    let pending = delayed.describe(TOPIC).await?;
    assert_eq!((pending.len(), pending[0].pending), (1, 2), "{pending:?}");
    for id in within.ids.iter().chain(&longer.ids) {
        delayed.cancel(TOPIC, id).await?;
    }
    Ok(())
}

/// The producer id, epoch and base sequence of the batch holding `offset` in `topic`/`partition`.
async fn producer_of(
    client: &ferry_client::BrokerClient,
    partition: u32,
    offset: u64,
) -> anyhow::Result<(i64, i16, i32)> {
    let request = pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: TOPIC.into(),
            partition,
            offset,
            max_bytes: 1 << 20,
            leader_epoch: None,
        }],
        max_wait_ms: 0,
        max_bytes: 1 << 20,
    };
    let response = client.fetch(request).await?;
    for (header, _) in BatchIter::new(&response.partitions[0].batches).map_while(Result::ok) {
        if header.base_offset <= offset && offset <= header.base_offset + u64::from(header.last_offset_delta) {
            return Ok((header.producer_id, header.producer_epoch, header.base_sequence));
        }
    }
    anyhow::bail!("no batch holds {TOPIC}/{partition} offset {offset}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_sends_deliver_at_and_delay_records_which_arrive_naming_their_producer() -> anyhow::Result<()> {
    let broker = start_broker(CONFIG).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic(TOPIC, 1, TopicConfig::default(), None).await?;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    // A plain record, then two delayed ones (the first by a delay, the second by a time a second later), then a
    // record whose time has passed: written at once, the ordinary way.
    let at = SystemTime::now() + Duration::from_millis(2_500);
    let sent = [
        record(0, 1),
        record(1, 1).delay(Duration::from_millis(1_500)),
        record(2, 1).deliver_at(at),
        record(3, 1).deliver_at(SystemTime::now() - Duration::from_secs(5)),
    ];
    let mut acks = Vec::new();
    for r in &sent {
        acks.push(producer.send(r.clone()).await?.await?);
    }
    assert_eq!(
        acks.iter().map(|a| (a.offset, a.delay_id.is_some())).collect::<Vec<_>>(),
        vec![(0, false), (0, true), (0, true), (1, false)],
        "{acks:?}"
    );
    let (first_due, second_due) = (acks[1].timestamp, acks[2].timestamp);
    assert_eq!(second_due, at.duration_since(SystemTime::UNIX_EPOCH)?.as_millis() as i64);
    let pending = Delayed::new(client.clone()).describe(TOPIC).await?;
    assert_eq!(pending[0].pending, 2, "{pending:?}");

    let wait = Duration::from_millis(u64::try_from(second_due - now_ms()).unwrap_or(0));
    wait_until("both delayed records to arrive", deadline(&[wait, TICK, IO_BUDGET]), async || {
        read_partition(&client, TOPIC, 0).await.len() == 4
    })
    .await?;
    // Both plain records were written under the producer's id; the delayed ones under the timer's, each naming
    // the producer, its epoch and its delayed sequence (0 and 1: a space of their own) in a header.
    let (pid, epoch, _) = producer_of(&client, 0, 0).await?;
    assert!(pid >= 0, "the producer is idempotent");
    assert_eq!(producer_of(&client, 0, 1).await?.0, pid);
    assert_ne!(producer_of(&client, 0, 2).await?.0, pid, "a moved record is written under the timer's id");
    let moved = |i: usize, offset: u64, due: i64, seq: u32| {
        let r = &sent[i];
        let mut h = headers(&r.headers);
        h.push(("ferry-delay-producer".into(), Some(Bytes::from(format!("{pid}:{epoch}:{seq}")))));
        Rec { partition: 0, offset, key: r.key.clone(), value: r.value.clone(), headers: h, timestamp: due }
    };
    let plain = |i: usize| Rec::acked(&acks[i], sent[i].clone());
    assert_eq!(
        read_partition(&client, TOPIC, 0).await,
        vec![plain(0), plain(3), moved(1, 2, first_due, 0), moved(2, 3, second_due, 1)]
    );
    producer.close().await;
    Ok(())
}

/// A delayed produce request of `values` under producer (`pid`, `epoch`) from sequence `seq`.
fn delayed_request(pid: i64, epoch: i16, seq: i32, values: &[&str], delay_ms: i64) -> pb::ProduceDelayedRequest {
    let producer = batch::ProducerInfo { producer_id: pid, producer_epoch: epoch, base_sequence: seq };
    let mut b = batch::BatchBuilder::new(batch::Compression::None, producer);
    for (i, v) in values.iter().enumerate() {
        b.push(i as u32, 1_700_000_000_000, Some(v.as_bytes()), Some(v.as_bytes()), &[]);
    }
    pb::ProduceDelayedRequest {
        produce: Some(pb::ProduceRequest {
            topic: TOPIC.into(),
            partition: Some(0),
            key: None,
            batches: b.build(0, 0),
        }),
        deliver_at_ms: None,
        delay_ms: Some(delay_ms),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_delayed_produce_answers_the_first_ids_and_stores_nothing_also_after_a_kill_9() -> anyhow::Result<()>
{
    let mut broker = start_broker(CONFIG).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic(TOPIC, 1, TopicConfig::default(), None).await?;
    let delayed = Delayed::new(client.clone());
    let id = client.init_producer(pb::InitProducerRequest {}).await?;
    let (pid, epoch) = (id.producer_id, id.producer_epoch as i16);
    let first = client.produce_delayed(delayed_request(pid, epoch, 0, &["a", "b", "c"], 3_000)).await?;
    assert_eq!(first.ids.len(), 3);
    // The answer was lost: the same request again.
    let again = client.produce_delayed(delayed_request(pid, epoch, 0, &["a", "b", "c"], 3_000)).await?;
    assert_eq!(again, first, "a retry answers the first attempt's ids and due time");
    assert_eq!(delayed.describe(TOPIC).await?[0].pending, 3, "the retry stored nothing");
    let next = client.produce_delayed(delayed_request(pid, epoch, 3, &["d"], 3_000)).await?;
    assert_eq!(next.ids.len(), 1);
    assert_ne!(next.ids[0], first.ids[2]);
    // A sequence already used by an older batch, or an older epoch: refused, nothing stored.
    let stale = client.produce_delayed(delayed_request(pid, epoch, 1, &["x"], 3_000)).await;
    assert_status(stale, Code::InvalidArgument, &["below its next one, 4"]);
    if epoch > 0 {
        let fenced = client.produce_delayed(delayed_request(pid, epoch - 1, 9, &["x"], 3_000)).await;
        assert_status(fenced, Code::InvalidArgument, &["older than its epoch"]);
    }
    // A new broker process rebuilds the producers from the delay store: the last request is still a duplicate.
    broker.kill9().await?;
    broker.restart().await?;
    let after = client.produce_delayed(delayed_request(pid, epoch, 3, &["d"], 3_000)).await?;
    assert_eq!(after, next);
    assert_eq!(delayed.describe(TOPIC).await?[0].pending, 4);
    let wait = Duration::from_millis(u64::try_from(next.due_ms - now_ms()).unwrap_or(0));
    wait_until("the four records to arrive", deadline(&[wait, TICK, IO_BUDGET]), async || {
        read_partition(&client, TOPIC, 0).await.len() >= 4
    })
    .await?;
    let held: Vec<(u64, String)> =
        read_partition(&client, TOPIC, 0).await.iter().map(|r| (r.offset, r.value_str().to_owned())).collect();
    let want: Vec<(u64, String)> =
        ["a", "b", "c", "d"].iter().enumerate().map(|(i, v)| (i as u64, v.to_string())).collect();
    assert_eq!(held, want, "each record once, in order");
    Ok(())
}
