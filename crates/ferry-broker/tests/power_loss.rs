//! The broker's durability promises, proven under a real power loss.
//!
//! A `kill -9` keeps the page cache, so it cannot show that an acknowledgement waited for the disk. Here the
//! broker runs in-process over the real gRPC server and client, on [`SimFs`], a file layer that keeps what was
//! fsynced apart from what was only written. Cutting the power drops the unsynced part (all of it, a torn tail of
//! each file, or random whole pages, and directory entries never synced) and kills every file handle of the
//! running broker, which is then stopped; a new broker opens the same data directory.
//!
//! - `flush = "sync"`: every record acknowledged before the cut is there afterwards, at its offset, with its key,
//!   value, headers and timestamp, and the epoch of every partition that lost its page cache is bumped.
//! - `flush = "async"`: what may be lost is exactly what was acknowledged since the last flush. With the flush
//!   interval and size out of reach, only the clean stop flushed: after the cut, each partition holds exactly the
//!   records acknowledged before that stop and an exact, in-order prefix of those acknowledged after it (none of
//!   them when the unsynced bytes are dropped whole), and its epoch is bumped.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ferry_broker::config::FlushMode;
use ferry_broker::{BrokerConfig, RunOptions, Started};
use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_storage::fs::{PowerLoss, SimFs};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[path = "../../../tests/support/read.rs"]
mod read;

const TOPIC: &str = "ledger";
const PARTITIONS: u32 = 2;
/// Records outstanding at once: several batches in flight when the power goes.
const WINDOW: usize = 100;
/// How long anything in these in-process tests may take (a loaded 2-core machine, a debug build).
const BUDGET: Duration = Duration::from_secs(60);
const TS0: i64 = 1_700_000_000_000;

/// A broker running in this process on `fs`.
struct Broker {
    started: Started,
    stop: CancellationToken,
    task: JoinHandle<Result<(), ferry_broker::ServerError>>,
}

impl Broker {
    async fn start(fs: &SimFs, flush: FlushMode) -> Broker {
        let mut config = BrokerConfig::default();
        config.broker.listen = "127.0.0.1:0".parse().expect("address");
        config.broker.data_dir = PathBuf::from("/data");
        config.broker.cluster_id = Some("dc-a".into());
        config.storage.flush = flush;
        // Out of reach: under async flush only a clean stop flushes, so the test knows exactly what is durable.
        config.storage.flush_interval = Duration::from_secs(3600);
        config.storage.flush_bytes = bytesize::ByteSize::gib(1);
        // Small segments: the load rolls several, so new segment files and their directory entries are under test.
        config.storage.segment_bytes = bytesize::ByteSize::kib(16);
        // A broker whose disk is gone does not wait long for its clients to hang up.
        config.broker.shutdown_timeout = Duration::from_secs(2);
        let stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let options = RunOptions { fs: Some(Arc::new(fs.clone())), ..RunOptions::default() };
        let token = stop.clone();
        let task = tokio::spawn(async move {
            ferry_broker::run(config, options, token, move |s| {
                let _ = tx.send(s);
            })
            .await
        });
        match tokio::time::timeout(BUDGET, rx).await.expect("broker starts in time") {
            Ok(started) => Broker { started, stop, task },
            Err(_) => panic!("the broker did not start: {:?}", task.await),
        }
    }

    /// A client that does not retry: once the power is gone, outstanding deliveries fail at once instead of
    /// waiting for a broker that will not come back at this address.
    fn client(&self) -> BrokerClient {
        let mut config = ClientConfig::new([self.started.addr.to_string()]);
        config.retry.max_attempts = 1;
        config.connect_timeout = Duration::from_secs(2);
        config.request_timeout = Duration::from_secs(10);
        BrokerClient::new(config).expect("loopback client")
    }

    /// Stops the broker and waits for it. After a power loss its file handles are dead, so its shutdown may fail:
    /// what it says then does not matter, only that it is gone.
    async fn stop(self) -> Result<(), ferry_broker::ServerError> {
        self.stop.cancel();
        tokio::time::timeout(BUDGET, self.task).await.expect("broker stops in time").expect("broker task")
    }
}

/// What one record is, everywhere in this test: (offset, key, value, headers, timestamp) per partition.
type Stored = (u64, Option<Bytes>, Option<Bytes>, Vec<(String, Option<Bytes>)>, i64);

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("entry-{i:05}"))
        .with_partition((i % PARTITIONS as usize) as u32)
        .with_key(format!("k{}", i % 13))
        .with_header("n", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

fn stored(i: usize, offset: u64) -> Stored {
    let r = record(i);
    let headers = r.headers.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
    (offset, r.key, r.value, headers, r.timestamp.expect("set"))
}

/// Produces records `from..to` with up to [`WINDOW`] outstanding, until `stop` says so or all are resolved.
/// Returns every acknowledged record by partition, in offset order.
async fn produce(
    client: BrokerClient,
    range: std::ops::Range<usize>,
    acked: Arc<AtomicUsize>,
    stop: CancellationToken,
) -> BTreeMap<u32, Vec<Stored>> {
    // Once the power is gone, a delivery fails within seconds instead of retrying into the next broker.
    let config = ProducerConfig { delivery_timeout: Duration::from_secs(5), ..ProducerConfig::default() };
    let producer = Producer::new(client, config).await.expect("producer");
    let mut out: BTreeMap<u32, Vec<Stored>> = BTreeMap::new();
    let mut outstanding = VecDeque::new();
    let last = range.end;
    for i in range {
        if stop.is_cancelled() {
            break;
        }
        match producer.send(record(i)).await {
            Ok(delivery) => outstanding.push_back((i, delivery)),
            Err(_) => break,
        }
        while outstanding.len() > WINDOW || (i + 1 == last && !outstanding.is_empty()) {
            let (j, delivery) = outstanding.pop_front().expect("not empty");
            if let Ok(meta) = delivery.await {
                out.entry(meta.partition).or_default().push(stored(j, meta.offset));
                acked.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    // Whatever is still outstanding resolves one way or the other once the broker is gone.
    for (j, delivery) in outstanding {
        if let Ok(Ok(meta)) = tokio::time::timeout(BUDGET, delivery).await {
            out.entry(meta.partition).or_default().push(stored(j, meta.offset));
        }
    }
    producer.close().await;
    for v in out.values_mut() {
        v.sort_by_key(|r| r.0);
    }
    out
}

/// Every record of every partition, and each partition's epoch.
async fn read_all(client: &BrokerClient) -> (BTreeMap<u32, Vec<Stored>>, Vec<u32>) {
    let mut out = BTreeMap::new();
    for p in 0..PARTITIONS {
        let read = read::read_partition(client, TOPIC, p, None).await.expect("read the partition");
        let records = read
            .records
            .into_iter()
            .map(|r| {
                let headers = r.headers.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
                (r.offset, r.key, r.value, headers, r.timestamp)
            })
            .collect();
        out.insert(p, records);
    }
    let d = Admin::new(client.clone()).describe_topic(TOPIC).await.expect("describe");
    (out, d.partitions.iter().map(|p| p.epoch).collect())
}

/// Waits until `n` records are acknowledged.
async fn wait_acked(acked: &AtomicUsize, n: usize) {
    ferry_testkit::wait_until(&format!("{n} records to be acknowledged"), BUDGET, async || {
        acked.load(Ordering::SeqCst) >= n
    })
    .await
    .expect("acknowledgements");
}

/// Sync flush: produce, cut the power mid-load, restart, and check every acknowledged record.
async fn sync_flush_keeps_every_acknowledged_record(mode: PowerLoss, seed: u64) {
    const TOTAL: usize = 3_000;
    let fs = SimFs::new();
    let broker = Broker::start(&fs, FlushMode::Sync).await;
    Admin::new(broker.client()).create_topic(TOPIC, PARTITIONS, TopicConfig::default(), None).await.expect("create");

    let acked = Arc::new(AtomicUsize::new(0));
    let stop_load = CancellationToken::new();
    let load = tokio::spawn(produce(broker.client(), 0..TOTAL, acked.clone(), stop_load.clone()));
    wait_acked(&acked, TOTAL / 3).await;
    let rebooted = fs.power_loss(mode, seed);
    stop_load.cancel();
    let at_cut = acked.load(Ordering::SeqCst);
    assert!(at_cut < TOTAL, "the load finished before the power loss; nothing was under test");
    let _ = broker.stop().await;
    let acknowledged = tokio::time::timeout(BUDGET, load).await.expect("load ends").expect("load task");

    let broker = Broker::start(&rebooted, FlushMode::Sync).await;
    let (got, epochs) = read_all(&broker.client()).await;
    let total_acked: usize = acknowledged.values().map(Vec::len).sum();
    assert!(total_acked >= at_cut, "{total_acked} acknowledged in all, {at_cut} when the power went");
    for p in 0..PARTITIONS {
        let want = acknowledged.get(&p).cloned().unwrap_or_default();
        let have: BTreeMap<u64, &Stored> = got[&p].iter().map(|r| (r.0, r)).collect();
        for r in &want {
            assert_eq!(have.get(&r.0), Some(&r), "partition {p}: acknowledged record at offset {} after {mode:?}", r.0);
        }
        // Nothing acknowledged was written twice: the acknowledged values are distinct and each sits at one offset.
        let values: std::collections::BTreeSet<_> = got[&p].iter().map(|r| r.2.clone()).collect();
        assert_eq!(values.len(), got[&p].len(), "partition {p}: a record appears twice");
    }
    assert_eq!(epochs, vec![1; PARTITIONS as usize], "the unclean start bumps every partition's epoch once");
    broker.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_flush_keeps_every_acknowledged_record_when_unsynced_bytes_are_dropped() {
    sync_flush_keeps_every_acknowledged_record(PowerLoss::DropUnsynced, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_flush_keeps_every_acknowledged_record_under_torn_tails() {
    sync_flush_keeps_every_acknowledged_record(PowerLoss::TornTail, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_flush_keeps_every_acknowledged_record_under_torn_pages() {
    sync_flush_keeps_every_acknowledged_record(PowerLoss::TornPages, 3).await;
}

/// Async flush: records acknowledged before a clean stop survive; of those acknowledged after it, exactly an
/// in-order prefix survives per partition (`exact_loss`: none at all).
async fn async_flush_loses_at_most_what_was_acknowledged_since_the_last_flush(mode: PowerLoss, exact_loss: bool) {
    const FIRST: usize = 600;
    const SECOND: usize = 600;
    let fs = SimFs::new();
    let broker = Broker::start(&fs, FlushMode::Async).await;
    Admin::new(broker.client()).create_topic(TOPIC, PARTITIONS, TopicConfig::default(), None).await.expect("create");
    let acked = Arc::new(AtomicUsize::new(0));
    let first = produce(broker.client(), 0..FIRST, acked.clone(), CancellationToken::new()).await;
    assert_eq!(first.values().map(Vec::len).sum::<usize>(), FIRST);
    // The clean stop is the last flush.
    broker.stop().await.expect("clean stop");

    let broker = Broker::start(&fs, FlushMode::Async).await;
    let second = produce(broker.client(), FIRST..FIRST + SECOND, acked.clone(), CancellationToken::new()).await;
    assert_eq!(second.values().map(Vec::len).sum::<usize>(), SECOND, "all acknowledged before the power loss");
    let rebooted = fs.power_loss(mode, 7);
    let _ = broker.stop().await;

    let broker = Broker::start(&rebooted, FlushMode::Async).await;
    let (got, epochs) = read_all(&broker.client()).await;
    for p in 0..PARTITIONS {
        let before = first.get(&p).cloned().unwrap_or_default();
        let after = second.get(&p).cloned().unwrap_or_default();
        let have = &got[&p];
        assert!(have.len() >= before.len(), "partition {p}: lost records flushed by the clean stop");
        assert_eq!(&have[..before.len()], &before[..], "partition {p}: the flushed records are intact");
        let kept = &have[before.len()..];
        assert!(kept.len() <= after.len(), "partition {p}: more records than were written");
        assert_eq!(kept, &after[..kept.len()], "partition {p}: the survivors are an exact prefix of the unflushed");
        if exact_loss {
            assert!(kept.is_empty(), "partition {p}: nothing unflushed survives when unsynced bytes are dropped");
        }
    }
    assert_eq!(epochs, vec![1; PARTITIONS as usize], "the unclean start bumps every partition's epoch once");
    broker.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_flush_loses_exactly_what_was_acknowledged_since_the_last_flush() {
    async_flush_loses_at_most_what_was_acknowledged_since_the_last_flush(PowerLoss::DropUnsynced, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_flush_under_torn_tails_keeps_an_exact_prefix_of_the_unflushed() {
    async_flush_loses_at_most_what_was_acknowledged_since_the_last_flush(PowerLoss::TornTail, false).await;
}
