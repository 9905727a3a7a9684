//! The mirror's read path: the streaming `Subscribe` with per-partition byte credits, and the long-poll `Fetch`
//! waking up when data arrives.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use ferry_batch::{self as batch, BatchIter};
use ferry_client::admin::TopicConfig;
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_testkit::{Proxy, deadline, wait_for, wait_until};
use tokio::sync::mpsc;

use crate::common::{
    IO_BUDGET, Rec, assert_same_records, client_for, connect, headers, plain_batch, read_topic, start_broker,
};

const TS0: i64 = 1_700_000_000_000;
/// The stream's idle heartbeat; waits for "nothing more comes" are derived from it.
const HEARTBEAT: Duration = Duration::from_millis(200);
/// Each partition starts with this much credit.
const FIRST_CREDIT: u64 = 8 * 1024;

fn start(partitions: &[(u32, u64)]) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        kind: Some(pb::subscribe_request::Kind::Start(pb::SubscribeStart {
            partitions: partitions
                .iter()
                .map(|&(partition, credit_bytes)| pb::PartitionStart {
                    topic: "feed".into(),
                    partition,
                    offset: 0,
                    credit_bytes,
                    seat: 0,
                    leader_epoch: None,
                })
                .collect(),
            max_response_bytes: 0,
            idle_heartbeat_ms: HEARTBEAT.as_millis() as u32,
            changed_beats: false,
        })),
    }
}

fn credit(partition: u32, bytes: u64) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        kind: Some(pb::subscribe_request::Kind::Credit(pb::SubscribeCredit {
            partitions: vec![pb::PartitionCredit { topic: "feed".into(), partition, bytes }],
        })),
    }
}

/// Decodes what one partition entry carried.
fn records_of(data: &pb::PartitionData) -> Vec<Rec> {
    let mut out = Vec::new();
    for item in BatchIter::new(&data.batches) {
        let (_, bytes) = item.expect("whole batches");
        for r in batch::decode_records(bytes).expect("decodable") {
            out.push(Rec {
                partition: data.partition,
                offset: r.offset,
                key: r.key,
                value: r.value,
                headers: headers(&r.headers),
                timestamp: r.timestamp,
            });
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_sends_only_against_credit_and_delivers_everything_in_order() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("feed", 3, TopicConfig::default(), None).await?;
    // 40 batches of 10 records (~1.3 KiB per batch) on partitions 0 and 1; partition 2 stays empty.
    let mut largest_batch = 0;
    for p in 0..2u32 {
        for b in 0..40 {
            let values: Vec<String> = (0..10).map(|i| format!("p{p}-b{b}-r{i}-{}", "v".repeat(100))).collect();
            let refs: Vec<&str> = values.iter().map(String::as_str).collect();
            let batch = plain_batch(&refs, TS0 + b);
            largest_batch = largest_batch.max(batch.len() as u64);
            let request = pb::ProduceRequest { topic: "feed".into(), partition: Some(p), key: None, batches: batch };
            client.produce(request).await?;
        }
    }

    let (tx, rx) = mpsc::channel::<pb::SubscribeRequest>(16);
    let requests = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    tx.send(start(&[(0, FIRST_CREDIT), (1, FIRST_CREDIT), (2, FIRST_CREDIT)])).await?;
    let mut stream = client.raw().await?.subscribe(requests).await?.into_inner();

    // With the first credit alone, each partition gets at most its credit plus one overdrawing batch; then only
    // position heartbeats come, which tell each log end.
    let mut got: BTreeMap<u32, Vec<Rec>> = BTreeMap::new();
    let mut sent_bytes: BTreeMap<u32, u64> = BTreeMap::new();
    let mut ends: BTreeMap<u32, u64> = BTreeMap::new();
    let quiet = deadline(&[HEARTBEAT * 4]);
    let stalled = wait_for("a heartbeat after the first credit ran out", quiet, async || {
        let msg = stream.message().await?.ok_or_else(|| anyhow::anyhow!("the stream ended"))?;
        let mut heartbeat = !msg.partitions.is_empty();
        for d in &msg.partitions {
            assert_eq!(d.error, ErrorCode::None as i32, "{}", d.message);
            ends.insert(d.partition, d.log_end_offset);
            *sent_bytes.entry(d.partition).or_default() += d.batches.len() as u64;
            heartbeat &= d.batches.is_empty();
            got.entry(d.partition).or_default().extend(records_of(d));
        }
        // A heartbeat while the partitions with data have used up their credit: the stream has stalled.
        let spent = |p| sent_bytes.get(&p).copied().unwrap_or(0) >= FIRST_CREDIT;
        anyhow::Ok((heartbeat && spent(0) && spent(1)).then_some(()))
    })
    .await;
    stalled?;
    assert_eq!(ends, BTreeMap::from([(0, 400), (1, 400), (2, 0)]));
    for p in [0, 1] {
        let sent = sent_bytes[&p];
        assert!(sent < FIRST_CREDIT + largest_batch, "partition {p}: {sent} bytes against {FIRST_CREDIT} of credit");
        assert!(got[&p].len() < 400, "partition {p} was sent everything without credit");
    }

    // More credit for partition 1 only: it resumes where it stopped and finishes; partition 0 stays where it is.
    tx.send(credit(1, 1 << 20)).await?;
    wait_for("partition 1 to be delivered to its end", deadline(&[IO_BUDGET]), async || {
        let msg = stream.message().await?.ok_or_else(|| anyhow::anyhow!("the stream ended"))?;
        for d in &msg.partitions {
            got.entry(d.partition).or_default().extend(records_of(d));
        }
        anyhow::Ok((got.get(&1).map_or(0, Vec::len) == 400).then_some(()))
    })
    .await?;
    assert!(got[&0].len() < 400);

    // New data arrives on the stream as it is written (no polling), for a partition with credit.
    tx.send(credit(2, 1 << 20)).await?;
    tx.send(credit(0, 1 << 20)).await?;
    let late = pb::ProduceRequest {
        topic: "feed".into(),
        partition: Some(2),
        key: None,
        batches: plain_batch(&["late-1", "late-2"], TS0 + 99),
    };
    client.produce(late).await?;
    wait_for("every record, the late ones included", deadline(&[IO_BUDGET]), async || {
        let msg = stream.message().await?.ok_or_else(|| anyhow::anyhow!("the stream ended"))?;
        for d in &msg.partitions {
            got.entry(d.partition).or_default().extend(records_of(d));
        }
        anyhow::Ok((got.values().map(Vec::len).sum::<usize>() == 802).then_some(()))
    })
    .await?;

    // Exactly the log, each partition in offset order without repeats (a stream never re-sends a batch).
    for (p, recs) in &got {
        assert!(recs.windows(2).all(|w| w[0].offset + 1 == w[1].offset), "partition {p} out of order or repeated");
    }
    let all: Vec<Rec> = got.into_values().flatten().collect();
    assert_same_records("subscribed records", &read_topic(&client, "feed").await, &all);
    drop(tx);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_fetch_returns_as_soon_as_data_arrives() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("feed", 2, TopicConfig::default(), None).await?;
    // The fetch goes through a proxy, so the test sees when its request has been passed to the broker.
    let proxy = Proxy::start(broker.addr()).await?;
    let reader = client_for(proxy.addr());
    reader.metadata().await?;
    let before = proxy.stats().bytes_to_upstream;
    // A fetch that may wait 60 s for data on both (empty) partitions.
    let waiting = tokio::spawn(async move {
        reader
            .fetch(pb::FetchRequest {
                partitions: (0..2)
                    .map(|p| pb::PartitionFetch {
                        topic: "feed".into(),
                        partition: p,
                        offset: 0,
                        max_bytes: 0,
                        leader_epoch: None,
                    })
                    .collect(),
                max_wait_ms: 60_000,
                max_bytes: 0,
            })
            .await
    });
    wait_until("the fetch request to reach the broker", deadline(&[]), async || {
        proxy.stats().bytes_to_upstream > before
    })
    .await?;
    client
        .produce(pb::ProduceRequest {
            topic: "feed".into(),
            partition: Some(1),
            key: None,
            batches: plain_batch(&["wake"], TS0),
        })
        .await?;
    // The answer comes long before the 60 s wait runs out: the append wakes the waiting fetch (the bound here is
    // what is under test, with a wide margin).
    let response = tokio::time::timeout(deadline(&[]), waiting).await???;
    let d = &response.partitions[1];
    assert_eq!(d.error, ErrorCode::None as i32);
    let values: Vec<Bytes> = records_of(d).into_iter().filter_map(|r| r.value).collect();
    assert_eq!(values, [Bytes::from_static(b"wake")]);
    assert_eq!((d.next_offset, d.log_end_offset), (1, 1));
    assert!(response.partitions[0].batches.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_shares_small_responses_between_partitions_with_backlog() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("feed", 2, TopicConfig::default(), None).await?;
    // ~320 KiB of backlog on each partition, in ~16 KiB batches.
    for p in 0..2u32 {
        for b in 0..20 {
            let values: Vec<String> = (0..16).map(|i| format!("p{p}-b{b}-r{i}-{}", "f".repeat(1000))).collect();
            let refs: Vec<&str> = values.iter().map(String::as_str).collect();
            let request = pb::ProduceRequest {
                topic: "feed".into(),
                partition: Some(p),
                key: None,
                batches: plain_batch(&refs, TS0),
            };
            client.produce(request).await?;
        }
    }
    // Responses of at most 64 KiB (the smallest the broker takes) and plenty of credit for both partitions.
    let (tx, rx) = mpsc::channel::<pb::SubscribeRequest>(4);
    let requests = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut first = start(&[(0, 16 << 20), (1, 16 << 20)]);
    if let Some(pb::subscribe_request::Kind::Start(s)) = &mut first.kind {
        s.max_response_bytes = 64 * 1024;
    }
    tx.send(first).await?;
    let mut stream = client.raw().await?.subscribe(requests).await?.into_inner();

    // Partition 1 gets data while partition 0 still has most of its backlog: the responses take turns.
    let mut delivered = [0usize; 2];
    wait_until("partition 1's first data", deadline(&[IO_BUDGET]), async || {
        let msg = stream.message().await?.ok_or_else(|| anyhow::anyhow!("the stream ended"))?;
        let size: usize = msg.partitions.iter().map(|d| d.batches.len()).sum();
        assert!(size <= 64 * 1024, "a response of {size} bytes");
        for d in &msg.partitions {
            delivered[d.partition as usize] += records_of(d).len();
        }
        anyhow::Ok(delivered[1] > 0)
    })
    .await?;
    assert!(delivered[0] <= 2 * 4 * 16, "partition 0 took {} records before partition 1 got any", delivered[0]);
    drop(tx);
    Ok(())
}

/// One message of a changes-only stream, as (beat kind, [(partition, log end, next offset)], records carried).
type Said = (i32, Vec<(u32, u64, u64)>, usize);

fn said(msg: &pb::SubscribeResponse) -> Said {
    let parts = msg.partitions.iter().map(|d| (d.partition, d.log_end_offset, d.next_offset)).collect();
    (msg.beat, parts, msg.partitions.iter().map(|d| records_of(d).len()).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changes_only_stream_beats_what_changed_and_everything_every_tenth_beat() -> anyhow::Result<()> {
    const CHANGES: i32 = pb::BeatKind::BeatChanges as i32;
    const FULL: i32 = pb::BeatKind::BeatFull as i32;
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("feed", 3, TopicConfig::default(), None).await?;
    let (tx, rx) = mpsc::channel::<pb::SubscribeRequest>(4);
    let requests = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut first = start(&[(0, 1 << 20), (1, 1 << 20), (2, 1 << 20)]);
    if let Some(pb::subscribe_request::Kind::Start(s)) = &mut first.kind {
        s.changed_beats = true;
    }
    tx.send(first).await?;
    let mut stream = client.raw().await?.subscribe(requests).await?.into_inner();
    // The stream's first beat is due at the broker's default period (1 s), before the start's own took effect;
    // every later one at HEARTBEAT.
    let mut within = Duration::from_secs(1) * 3;
    let mut next = async || -> anyhow::Result<Said> {
        let msg = tokio::time::timeout(within, stream.message()).await??;
        within = HEARTBEAT * 3;
        Ok(said(&msg.ok_or_else(|| anyhow::anyhow!("the stream ended"))?))
    };
    // Idle: the first beat says every partition, the next eight nothing, the tenth every partition again.
    let all = vec![(0, 0, 0), (1, 0, 0), (2, 0, 0)];
    let mut beats = vec![next().await?];
    for _ in 1..10 {
        beats.push(next().await?);
    }
    let mut expected = vec![(CHANGES, all.clone(), 0)];
    expected.extend((0..8).map(|_| (CHANGES, vec![], 0)));
    expected.push((FULL, all, 0));
    assert_eq!(beats, expected);

    // Three records on partition 1: its data comes (not a beat), and the first beat after it says partition 1's
    // new position and nothing of the others. A beat may fall between the append and the read of the data; it
    // says partition 1 too, with the offset before the data.
    let request = pb::ProduceRequest {
        topic: "feed".into(),
        partition: Some(1),
        key: None,
        batches: plain_batch(&["a", "b", "c"], TS0),
    };
    client.produce(request).await?;
    let mut msg = next().await?;
    if msg.2 == 0 {
        assert_eq!(msg, (CHANGES, vec![(1, 3, 0)], 0), "a beat before the data");
        msg = next().await?;
    }
    assert_eq!(msg, (pb::BeatKind::BeatNone as i32, vec![(1, 3, 3)], 3), "partition 1's data");
    assert_eq!(next().await?, (CHANGES, vec![(1, 3, 3)], 0));
    assert_eq!(next().await?, (CHANGES, vec![], 0));
    Ok(())
}
