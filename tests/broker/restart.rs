//! Crashes and clean stops: kill -9 under load loses no acknowledged record and bumps the epoch; SIGTERM exits 0
//! and the next start keeps the epoch.
//!
//! kill -9 keeps the page cache, so these tests prove the process-crash case only. The sync-flush promise under a
//! power loss is proven by `crates/ferry-broker/tests/power_loss.rs`, on a file layer that drops what was never
//! fsynced.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferry_client::admin::TopicConfig;
use ferry_client::{Producer, ProducerConfig, ProducerRecord, RecordMetadata};
use ferry_testkit::{deadline, wait_until};

use crate::common::{
    IO_BUDGET, Rec, STOP_GRACE, assert_same_records, by_partition, connect, epochs, headers, read_topic, start_broker,
};

const TOTAL: usize = 4_000;
/// Records that may be outstanding at once: enough for several batches in flight, few enough to keep the load
/// spread over the whole run.
const WINDOW: usize = 200;
const TS0: i64 = 1_700_000_000_000;

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new("ledger", format!("entry-{i:05}"))
        .with_partition((i % 2) as u32)
        .with_key(format!("k{}", i % 13))
        .with_header("n", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

fn index_of(r: &Rec) -> usize {
    r.value_str().strip_prefix("entry-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("unknown record {r:?}"))
}

fn as_rec(i: usize, partition: u32, offset: u64) -> Rec {
    let r = record(i);
    Rec { partition, offset, key: r.key, value: r.value, headers: headers(&r.headers), timestamp: r.timestamp.unwrap() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_keeps_every_acknowledged_record_and_bumps_the_epoch() -> anyhow::Result<()> {
    let mut broker = start_broker("[storage]\nflush = \"sync\"\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("ledger", 2, TopicConfig::default(), None).await?;
    assert_eq!(epochs(&admin, "ledger").await, vec![0, 0]);

    // A producer keeps up to WINDOW records outstanding until all TOTAL are resolved.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let acked = Arc::new(AtomicUsize::new(0));
    let load = {
        let (producer, acked) = (producer.clone(), acked.clone());
        tokio::spawn(async move {
            let mut outcomes: Vec<(usize, Result<RecordMetadata, ferry_client::ClientError>)> = Vec::new();
            let mut outstanding = VecDeque::new();
            for i in 0..TOTAL {
                outstanding.push_back((i, producer.send(record(i)).await.expect("queue a record")));
                while outstanding.len() > WINDOW || (i + 1 == TOTAL && !outstanding.is_empty()) {
                    let (j, delivery) = outstanding.pop_front().expect("not empty");
                    let outcome = delivery.await;
                    if outcome.is_ok() {
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                    outcomes.push((j, outcome));
                }
            }
            outcomes
        })
    };

    // Crash mid-load, then start again on the same data dir and port.
    wait_until("a third of the records to be acknowledged", deadline(&[IO_BUDGET]), async || {
        acked.load(Ordering::SeqCst) >= TOTAL / 3
    })
    .await?;
    broker.kill9().await?;
    let acked_at_kill = acked.load(Ordering::SeqCst);
    assert!(acked_at_kill < TOTAL, "the load finished before the crash; nothing was under test");
    broker.restart().await?;

    let outcomes = tokio::time::timeout(deadline(&[IO_BUDGET]), load).await??;
    producer.close().await;
    assert_eq!(outcomes.len(), TOTAL);

    let log = read_topic(&client, "ledger").await;
    // Every acknowledged record is at the offset its acknowledgement named.
    let acknowledged: Vec<Rec> =
        outcomes.iter().filter_map(|(i, o)| o.as_ref().ok().map(|m| as_rec(*i, m.partition, m.offset))).collect();
    let at: HashMap<(u32, u64), &Rec> = log.iter().map(|r| ((r.partition, r.offset), r)).collect();
    for want in &acknowledged {
        assert_eq!(at.get(&(want.partition, want.offset)), Some(&want), "acknowledged record lost or changed");
    }
    // Everything in the log was produced, on its partition, and no record is there twice (the retried batches
    // of the crash were recognised by the rebuilt producer state). Offsets are unique: read_topic checks that
    // they strictly increase per partition.
    let mut seen = HashMap::new();
    for r in &log {
        let i = index_of(r);
        assert_eq!(r, &as_rec(i, r.partition, r.offset), "a record in the log that was never produced");
        assert!(seen.insert(i, r.offset).is_none(), "record {i} is in the log twice");
    }
    // With retries across the restart, every record ends up acknowledged exactly once.
    let failed: Vec<String> =
        outcomes.iter().filter_map(|(i, o)| o.as_ref().err().map(|e| format!("{i}: {e}"))).collect();
    assert!(failed.is_empty(), "records failed for good: {failed:?}");
    assert_same_records("log vs acknowledgements", &acknowledged, &log);
    assert_eq!(by_partition(&log).len(), 2);

    // The one unclean start bumped every partition's epoch by exactly one.
    assert_eq!(epochs(&admin, "ledger").await, vec![1, 1], "epochs after one kill -9");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_0_and_the_restart_keeps_the_epoch_and_the_data() -> anyhow::Result<()> {
    let mut broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("calm", 3, TopicConfig::default(), None).await?;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut deliveries = Vec::new();
    for i in 0..900 {
        let r = ProducerRecord::new("calm", format!("v{i}")).with_key(format!("k{i}")).with_timestamp(TS0 + i);
        deliveries.push(producer.send(r).await?);
    }
    futures::future::try_join_all(deliveries).await?;
    producer.close().await;
    let before = read_topic(&client, "calm").await;
    assert_eq!(before.len(), 900);

    let status = broker.terminate(STOP_GRACE).await?;
    assert_eq!(status.code(), Some(0), "SIGTERM must stop the broker with exit code 0; log:\n{}", broker.logs());
    broker.restart().await?;

    assert_eq!(epochs(&admin, "calm").await, vec![0, 0, 0], "a clean stop must not bump the epoch");
    assert_same_records("data across a clean restart", &before, &read_topic(&client, "calm").await);
    Ok(())
}
