//! Delayed delivery on a single broker (docs/messaging.md, "Delay"): records never readable before their due time,
//! each delivered exactly once into its partition with its key and headers, across kill -9 and a power loss under
//! sync flush; cancel before and after due; order within a second; a million pending in bounded memory; bad
//! requests refused with nothing written.
//!
//! A watcher polls every partition from its last offset and notes when each record first became readable, so "not
//! early" is observed, not assumed; the lateness it saw is printed (the figure that counts is the benchmark's).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferry_batch::{self as batch, BatchIter};
use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{BrokerClient, Code, Delayed, DeliverAt, ProducerRecord};
use ferry_testkit::{BrokerProcess, deadline, wait_until};
use tokio_util::sync::CancellationToken;

use crate::common::{IO_BUDGET, Rec, assert_status, connect, read_topic, start_broker};

pub const TOPIC: &str = "later";
/// The timer's tick in these tests.
pub const TICK: Duration = Duration::from_millis(50);
const CONFIG: &str = "[delay]\ntick = \"50ms\"\n";

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as i64
}

/// A deterministic stream of numbers (the delays), without a dependency.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Record `i` of a test: partition `i % partitions`, key, value and a header naming it.
pub fn record(i: usize, partitions: u32) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("r{i:07}"))
        .with_partition(i as u32 % partitions)
        .with_key(format!("k{i}"))
        .with_header("n", i.to_string())
        .with_timestamp(1_700_000_000_000 + i as i64)
}

pub fn index_of(r: &Rec) -> usize {
    r.value_str().strip_prefix('r').and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("unknown record {r:?}"))
}

/// When each record was first seen readable, by (partition, offset).
#[derive(Default)]
pub struct Seen {
    pub at: BTreeMap<(u32, u64), (Rec, i64)>,
}

/// Polls every partition of `topic` from where it left off until `stop`, noting when records first appear.
pub fn watch(client: BrokerClient, partitions: u32, stop: CancellationToken) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut next = vec![0u64; partitions as usize];
        let mut round = tokio::time::interval(Duration::from_millis(20));
        while !stop.is_cancelled() {
            round.tick().await;
            for p in 0..partitions {
                let request = pb::FetchRequest {
                    partitions: vec![pb::PartitionFetch {
                        topic: TOPIC.into(),
                        partition: p,
                        offset: next[p as usize],
                        max_bytes: 4 << 20,
                        leader_epoch: None,
                    }],
                    max_wait_ms: 0,
                    max_bytes: 8 << 20,
                };
                // A broker being restarted answers nothing for a while: try again on the next round.
                let Ok(response) = client.for_partition(TOPIC, p).fetch(request).await else { continue };
                let observed = now_ms();
                let data = &response.partitions[0];
                if let Some(hint) = &data.leader {
                    client.take_hint(TOPIC, p, hint);
                }
                for (_, bytes) in BatchIter::new(&data.batches).map_while(Result::ok) {
                    for r in batch::decode_records(bytes).expect("decodable batch") {
                        if r.offset < next[p as usize] {
                            continue;
                        }
                        next[p as usize] = r.offset + 1;
                        out.lock()
                            .expect("the watcher's lock")
                            .at
                            .insert((p, r.offset), (Rec::from_batch_record(p, &r), observed));
                    }
                }
            }
        }
    });
    seen
}

/// What a test sent: per record index, its partition and due time.
pub type Sent = HashMap<usize, (u32, i64)>;

/// Sends records `range` in requests of `per_request` (one partition each), each request with a delay drawn from
/// `delays_ms` by `rng`.
pub async fn send_delayed(
    delayed: &Delayed,
    range: std::ops::Range<usize>,
    per_request: usize,
    partitions: u32,
    rng: &mut Lcg,
    delays_ms: (u64, u64),
) -> anyhow::Result<(Sent, Vec<String>)> {
    let (mut sent, mut ids) = (Sent::new(), Vec::new());
    let mut i = range.start;
    while i < range.end {
        let p = (i / per_request) as u32 % partitions;
        let idx: Vec<usize> = (i..(i + per_request).min(range.end)).collect();
        let records: Vec<ProducerRecord> = idx.iter().map(|j| record(*j, partitions).with_partition(p)).collect();
        let delay = delays_ms.0 + rng.below(delays_ms.1 - delays_ms.0 + 1);
        let receipt = delayed.send(&records, DeliverAt::After(Duration::from_millis(delay))).await?;
        anyhow::ensure!(receipt.ids.len() == idx.len() && receipt.written.is_none(), "receipt {receipt:?}");
        for j in &idx {
            sent.insert(*j, (receipt.partition, receipt.due_ms));
        }
        ids.extend(receipt.ids);
        i += per_request;
    }
    Ok((sent, ids))
}

/// The record index `i` becomes once moved: its key, value and headers, at its due time.
pub fn expected(i: usize, partition: u32, offset: u64, due_ms: i64, partitions: u32) -> Rec {
    let r = record(i, partitions);
    Rec {
        partition,
        offset,
        key: r.key,
        value: r.value,
        headers: crate::common::headers(&r.headers),
        timestamp: due_ms,
    }
}

/// Asserts the topic holds exactly the records of `sent`, once each, in their partitions, moved intact and in
/// produced order among those due in the same second, and that none was seen before its due time. Returns the
/// lateness percentiles seen (p50, p99), ms.
pub async fn assert_delivered_once(
    client: &BrokerClient,
    sent: &Sent,
    seen: &Mutex<Seen>,
    partitions: u32,
) -> anyhow::Result<(i64, i64)> {
    let held = read_topic(client, TOPIC).await;
    let mut by_index: HashMap<usize, Rec> = HashMap::new();
    for r in &held {
        if let Some(dup) = by_index.insert(index_of(r), r.clone()) {
            panic!(
                "record {} appears twice: at {}/{} and {}/{}",
                index_of(r),
                dup.partition,
                dup.offset,
                r.partition,
                r.offset
            );
        }
    }
    assert_eq!(held.len(), sent.len(), "the topic holds {} records, {} were sent", held.len(), sent.len());
    let seen = seen.lock().expect("the watcher's lock");
    let mut lateness = Vec::new();
    for (i, (partition, due)) in sent {
        let r = by_index.get(i).unwrap_or_else(|| panic!("record {i} was never delivered"));
        assert_eq!(r, &expected(*i, *partition, r.offset, *due, partitions), "record {i}");
        let (_, observed) = seen.at.get(&(r.partition, r.offset)).unwrap_or_else(|| panic!("record {i} never seen"));
        assert!(observed >= due, "record {i} was readable at {observed}, before its due time {due}");
        lateness.push(observed - due);
    }
    // Produced order among the records of one partition due in the same second.
    let mut last: HashMap<(u32, i64), (usize, u64)> = HashMap::new();
    let mut order: Vec<(usize, u32, i64)> = sent.iter().map(|(i, (p, d))| (*i, *p, *d)).collect();
    order.sort();
    for (i, p, due) in order {
        let offset = by_index[&i].offset;
        if let Some((j, before)) = last.insert((p, due.div_euclid(1000)), (i, offset)) {
            assert!(
                offset > before,
                "record {i} (offset {offset}) overtook record {j} (offset {before}) due in the same second"
            );
        }
    }
    lateness.sort_unstable();
    let at = |q: f64| lateness[((lateness.len() - 1) as f64 * q) as usize];
    Ok((at(0.5), at(0.99)))
}

pub async fn topic(
    broker: &BrokerProcess,
    partitions: u32,
    flush: Option<&str>,
) -> anyhow::Result<(BrokerClient, Delayed)> {
    let (client, admin) = connect(broker);
    let config = TopicConfig { flush: flush.map(str::to_owned), ..TopicConfig::default() };
    admin.create_topic(TOPIC, partitions, config, None).await?;
    Ok((client.clone(), Delayed::new(client)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_delayed_records_arrive_once_never_early_across_a_kill_9() -> anyhow::Result<()> {
    const TOTAL: usize = 10_000;
    const PARTITIONS: u32 = 4;
    let mut broker = start_broker(CONFIG).await?;
    let (client, delayed) = topic(&broker, PARTITIONS, None).await?;
    let stop = CancellationToken::new();
    let seen = watch(client.clone(), PARTITIONS, stop.clone());
    let (sent, _) = send_delayed(&delayed, 0..TOTAL, 20, PARTITIONS, &mut Lcg(31), (1_000, 20_000)).await?;
    let latest = sent.values().map(|(_, d)| *d).max().unwrap_or_default();

    // Crash once about half have fallen due, with the rest pending, then start again on the same data.
    wait_until("half the records to fall due", deadline(&[Duration::from_secs(20), IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() >= TOTAL / 2
    })
    .await?;
    broker.kill9().await?;
    broker.restart().await?;
    let wait = Duration::from_millis(u64::try_from(latest - now_ms()).unwrap_or(0));
    wait_until("every record to be delivered", deadline(&[wait, TICK, IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() >= TOTAL
    })
    .await?;
    stop.cancel();
    let (p50, p99) = assert_delivered_once(&client, &sent, &seen, PARTITIONS).await?;
    println!("lateness seen by a 20 ms poller across a kill -9: p50 {p50} ms, p99 {p99} ms");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_records_survive_a_power_loss_under_sync_flush() -> anyhow::Result<()> {
    const TOTAL: usize = 1_000;
    const PARTITIONS: u32 = 2;
    let mut broker = BrokerProcess::builder().config(CONFIG).sync_journal().start().await?;
    let (client, delayed) = topic(&broker, PARTITIONS, Some("sync")).await?;
    let stop = CancellationToken::new();
    let seen = watch(client.clone(), PARTITIONS, stop.clone());
    let (sent, _) = send_delayed(&delayed, 0..TOTAL, 10, PARTITIONS, &mut Lcg(7), (2_000, 6_000)).await?;
    let latest = sent.values().map(|(_, d)| *d).max().unwrap_or_default();
    // The power goes while records are falling due: some moved, most pending.
    wait_until("the first records to fall due", deadline(&[Duration::from_secs(6), IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() >= TOTAL / 5
    })
    .await?;
    let dropped = broker.power_loss().await?;
    let cut: u64 = dropped.truncated.iter().map(|(_, before, after)| before - after).sum();
    println!("the power loss cut {cut} unsynced bytes and removed {} entries", dropped.removed.len());
    broker.restart().await?;
    let wait = Duration::from_millis(u64::try_from(latest - now_ms()).unwrap_or(0));
    wait_until("every record to be delivered", deadline(&[wait, TICK, IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() >= TOTAL
    })
    .await?;
    stop.cancel();
    assert_delivered_once(&client, &sent, &seen, PARTITIONS).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_due_removes_a_record_and_after_due_is_refused() -> anyhow::Result<()> {
    let broker = start_broker(CONFIG).await?;
    let (client, delayed) = topic(&broker, 1, None).await?;
    let records: Vec<ProducerRecord> = (0..3).map(|i| record(i, 1)).collect();
    let receipt = delayed.send(&records, DeliverAt::After(Duration::from_secs(2))).await?;
    assert_eq!(receipt.ids.len(), 3);
    let pending = delayed.describe(TOPIC).await?;
    assert_eq!((pending.len(), pending[0].partition, pending[0].pending), (1, 0, 3), "{pending:?}");
    assert!(pending[0].earliest_due_ms <= receipt.due_ms && receipt.due_ms <= pending[0].latest_due_ms);
    assert_eq!(delayed.cancel(TOPIC, &receipt.ids[1]).await?, (0, receipt.due_ms));
    assert_eq!(delayed.describe(TOPIC).await?[0].pending, 2);
    wait_until("the metrics to count two pending", deadline(&[TICK]), async || {
        anyhow::Ok(metric_sum(&crate::raft3::scrape(&broker).await?, "ferry_broker_delay_pending{") == 2)
    })
    .await?;
    // Another topic's name, a malformed id and an id that is no delayed record are refused.
    assert_status(delayed.cancel("other", &receipt.ids[0]).await, Code::InvalidArgument, &["does not belong"]);
    assert_status(delayed.cancel(TOPIC, "soon").await, Code::InvalidArgument, &["not a delayed record id"]);
    assert_status(delayed.cancel(TOPIC, "9-0").await, Code::InvalidArgument, &["no delay-store partition"]);
    let wait = Duration::from_millis(u64::try_from(receipt.due_ms - now_ms()).unwrap_or(0));
    wait_until("the two records left to be delivered", deadline(&[wait, TICK, IO_BUDGET]), async || {
        read_topic(&client, TOPIC).await.len() == 2
    })
    .await?;
    for id in [&receipt.ids[0], &receipt.ids[1]] {
        assert_status(delayed.cancel(TOPIC, id).await, Code::FailedPrecondition, &["no longer pending"]);
    }
    let held = read_topic(&client, TOPIC).await;
    assert_eq!(held.iter().map(index_of).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(held, vec![expected(0, 0, 0, receipt.due_ms, 1), expected(2, 0, 1, receipt.due_ms, 1)]);
    assert!(delayed.describe(TOPIC).await?.is_empty());
    let metrics = crate::raft3::scrape(&broker).await?;
    assert_eq!(metric_sum(&metrics, "ferry_broker_delay_moves_total"), 2, "{metrics}");
    assert_eq!(metric_sum(&metrics, "ferry_broker_delay_pending{"), 0, "{metrics}");
    assert!(metrics.contains("ferry_broker_delay_lateness_ms{quantile=\"0.99\"}"), "{metrics}");
    Ok(())
}

/// The sum of the samples of the metric lines starting with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> i64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as i64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_delays_are_refused_and_write_nothing_and_a_passed_time_writes_at_once() -> anyhow::Result<()> {
    let broker = start_broker(&format!("{CONFIG}max_delay = \"1h\"\n")).await?;
    let (client, delayed) = topic(&broker, 1, None).await?;
    let one = [record(0, 1)];
    let cases: [(DeliverAt, &str); 3] = [
        (DeliverAt::After(Duration::from_secs(3_601)), "past the maximum delay"),
        (DeliverAt::Time(-5), "before 1970"),
        (DeliverAt::Time(now_ms() + 2 * 3_600_000), "past the maximum delay"),
    ];
    for (when, needle) in cases {
        assert_status(delayed.send(&one, when).await, Code::InvalidArgument, &[needle]);
    }
    let negative = pb::ProduceDelayedRequest {
        produce: Some(pb::ProduceRequest { topic: TOPIC.into(), partition: Some(0), key: None, batches: Bytes::new() }),
        deliver_at_ms: None,
        delay_ms: Some(-1),
    };
    assert_status(client.produce_delayed(negative).await, Code::InvalidArgument, &["negative"]);
    assert!(delayed.describe(TOPIC).await?.is_empty());
    assert!(read_topic(&client, TOPIC).await.is_empty());
    // A time already passed: written at once, as a plain produce.
    let receipt = delayed.send(&one, DeliverAt::Time(now_ms() - 1_000)).await?;
    assert_eq!((receipt.written, receipt.ids.len()), (Some((0, 0)), 0));
    assert_eq!(read_topic(&client, TOPIC).await.len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_due_in_the_same_second_keep_their_produced_order() -> anyhow::Result<()> {
    let broker = start_broker(CONFIG).await?;
    let (client, delayed) = topic(&broker, 1, None).await?;
    // Both due within one second two seconds from now; the first produced is due later in it.
    let second = (now_ms() / 1000 + 3) * 1000;
    let first = delayed.send(&[record(0, 1)], DeliverAt::Time(second + 800)).await?;
    let later = delayed.send(&[record(1, 1)], DeliverAt::Time(second + 200)).await?;
    let wait = Duration::from_millis(u64::try_from(second + 800 - now_ms()).unwrap_or(0));
    wait_until("both records to be delivered", deadline(&[wait, TICK, IO_BUDGET]), async || {
        read_topic(&client, TOPIC).await.len() == 2
    })
    .await?;
    assert_eq!(
        read_topic(&client, TOPIC).await,
        vec![expected(0, 0, 0, first.due_ms, 1), expected(1, 0, 1, later.due_ms, 1)]
    );
    Ok(())
}

/// The resident set of process `pid`, bytes.
fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_pending_records_cost_at_most_128_mib_of_memory() -> anyhow::Result<()> {
    const TOTAL: usize = 1_000_000;
    const PER_REQUEST: usize = 25_000;
    let mut broker = start_broker(CONFIG).await?;
    let (client, delayed) = topic(&broker, 1, None).await?;
    // The empty broker, with the delay store loaded (one record pending).
    delayed.send(&[record(0, 1)], DeliverAt::After(Duration::from_secs(3_600))).await?;
    let empty = rss(broker.pid())?;
    for start in (0..TOTAL).step_by(PER_REQUEST) {
        let mut b = batch::BatchBuilder::new(batch::Compression::None, batch::ProducerInfo::NONE);
        for i in 0..PER_REQUEST {
            b.push(i as u32, 1_700_000_000_000, None, Some(format!("{:08}", start + i).as_bytes()), &[]);
        }
        let request = pb::ProduceDelayedRequest {
            produce: Some(pb::ProduceRequest {
                topic: TOPIC.into(),
                partition: Some(0),
                key: None,
                batches: b.build(0, 0),
            }),
            deliver_at_ms: None,
            delay_ms: Some(3_600_000),
        };
        let response = client.produce_delayed(request).await?;
        assert_eq!(response.ids.len(), PER_REQUEST);
    }
    let pending = delayed.describe(TOPIC).await?;
    assert_eq!(pending[0].pending, TOTAL as u64 + 1);
    let full = rss(broker.pid())?;
    println!("RSS: empty {} MiB, with {TOTAL} pending {} MiB", empty >> 20, full >> 20);
    assert!(full.saturating_sub(empty) <= 128 << 20, "RSS grew by {} MiB", (full - empty) >> 20);
    // A restart rebuilds the index from the log, in the same bounded memory.
    broker.kill9().await?;
    broker.restart().await?;
    let pending = delayed.describe(TOPIC).await?;
    assert_eq!(pending[0].pending, TOTAL as u64 + 1);
    let rebuilt = rss(broker.pid())?;
    println!("RSS after a restart rebuilt the index: {} MiB", rebuilt >> 20);
    assert!(rebuilt.saturating_sub(empty) <= 128 << 20, "RSS grew by {} MiB", (rebuilt - empty) >> 20);
    Ok(())
}
