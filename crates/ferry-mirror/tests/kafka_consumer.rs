//! `KafkaSourceConsumer` against a real Kafka-API broker (tansu), with the test playing the TargetDcProducer's
//! side of the protocol: it answers Reset, decodes every batch and returns the credit. The Kafka data is produced
//! and read back by confluent-kafka (`kafka_tool.py`), never by the code under test.

#![cfg(feature = "kafka")]

mod kafka_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ferry_batch::{BatchIter, Record, decode_records};
use ferry_client::proto as pb;
use ferry_mirror::kafka::{KafkaConsumerSettings, KafkaRoute, KafkaSourceConsumer, RouteReports};
use ferry_mirror::metrics::Metrics;
use ferry_mirror::source::{ConsumerCmd, PartitionFlow, PartitionSink, SourceMsg};
use ferry_mirror::state::Shared;
use kafka_support::{Tansu, consume, create_topic, digest, produce, produce_transactions};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(60);

/// Route health as the consumer reports it.
#[derive(Default)]
struct Reports {
    failures: Mutex<Vec<(String, String)>>,
    successes: Mutex<Vec<String>>,
}

impl RouteReports for Reports {
    fn report_failure(&self, route: &str, reason: &str) {
        self.failures.lock().push((route.to_owned(), reason.to_owned()));
    }
    fn report_success(&self, route: &str) {
        self.successes.lock().push(route.to_owned());
    }
}

/// One partition as its producer sees it.
struct Side {
    rx: mpsc::UnboundedReceiver<SourceMsg>,
    flow: Arc<PartitionFlow>,
    records: Vec<Record>,
    /// (base offset, next offset) of every batch received.
    batches: Vec<(u64, u64)>,
    errors: Vec<(pb::ErrorCode, String)>,
    positions: u64,
    last_log_end: u64,
    /// Whether received bytes are handed back as credit at once.
    consume: bool,
}

impl Side {
    fn new(cap: u64) -> (Side, PartitionSink) {
        let (tx, rx) = mpsc::unbounded_channel();
        let flow = Arc::new(PartitionFlow::default());
        flow.cap.store(cap, Ordering::Relaxed);
        let sink = PartitionSink { tx, flow: Arc::clone(&flow) };
        let side = Side {
            rx,
            flow,
            records: Vec::new(),
            batches: Vec::new(),
            errors: Vec::new(),
            positions: 0,
            last_log_end: 0,
            consume: true,
        };
        (side, sink)
    }

    /// Handles everything queued; true when something arrived.
    fn drain(&mut self) -> bool {
        let mut any = false;
        while let Ok(msg) = self.rx.try_recv() {
            any = true;
            match msg {
                SourceMsg::Reset { generation } => {
                    // A restart: what was received stays (the test checks continuity), the position is ours.
                    let next =
                        self.records.last().map_or(self.flow.fetch_position.load(Ordering::Relaxed), |r| r.offset + 1);
                    self.flow.fetch_position.store(next, Ordering::Release);
                    self.flow.reset_ack.store(generation, Ordering::Release);
                }
                SourceMsg::Data { batches, records, pos } => {
                    let mut n = 0;
                    for item in BatchIter::new(&batches) {
                        let (h, bytes) = item.unwrap();
                        self.batches.push((h.base_offset, h.next_offset()));
                        let recs = decode_records(bytes).unwrap();
                        n += recs.len() as u64;
                        self.records.extend(recs);
                    }
                    assert_eq!(n, records);
                    self.last_log_end = pos.log_end;
                    assert!(pos.log_end > self.records.last().unwrap().offset, "log end below what was read");
                    assert_eq!(pos.epoch, 0);
                    if self.consume {
                        self.flow.consumed(batches.len() as u64);
                    }
                }
                SourceMsg::Position(pos) => {
                    self.positions += 1;
                    self.last_log_end = pos.log_end;
                }
                SourceMsg::Error { code, message, .. } => self.errors.push((code, message)),
            }
        }
        any
    }

    /// Batches chain without holes from `from`: each starts where the previous ended.
    fn assert_contiguous(&self, from: u64) {
        let mut next = from;
        for (base, end) in &self.batches {
            assert_eq!(*base, next, "batch bases must follow each other: {:?}", self.batches);
            next = *end;
        }
    }
}

struct Harness {
    cmds: mpsc::UnboundedSender<ConsumerCmd>,
    routes: watch::Sender<KafkaRoute>,
    reports: Arc<Reports>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    fn start(brokers: Vec<String>) -> Harness {
        ferry_testkit::init_tracing();
        let (cmds, rx) = mpsc::unbounded_channel();
        let (routes, routes_rx) = watch::channel(KafkaRoute { name: "primary".into(), generation: 0, brokers });
        let reports = Arc::new(Reports::default());
        let mut settings = KafkaConsumerSettings::new("test", BTreeMap::new());
        settings.position_interval = Duration::from_millis(200);
        settings.max_batch_bytes = 4096;
        let consumer = KafkaSourceConsumer::new(
            rx,
            routes_rx,
            Arc::clone(&reports) as Arc<dyn RouteReports>,
            settings,
            Metrics::new(),
            Arc::new(Shared::default()),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(consumer.run(shutdown.clone()));
        Harness { cmds, routes, reports, shutdown, task }
    }

    /// Fails the test if the consumer task ended (it runs until shutdown), with its panic when it panicked.
    async fn assert_running(&mut self, during: &str) {
        if self.task.is_finished() {
            match (&mut self.task).await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                outcome => panic!("the consumer task ended on its own while waiting for {during}: {outcome:?}"),
            }
        }
    }

    /// Cancels the consumer and waits for it to end; a panic of the task fails the test with that panic.
    async fn stop(mut self) {
        self.assert_running("the shutdown").await;
        self.shutdown.cancel();
        match tokio::time::timeout(DEADLINE, self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("the consumer task did not finish: {e}"),
            Err(_) => panic!("the consumer task did not stop within {DEADLINE:?} of the shutdown"),
        }
    }
}

/// Drains every side until `done` holds; fails at once if the consumer task ends (or panics) meanwhile.
async fn until(h: &mut Harness, sides: &mut [&mut Side], what: &str, mut done: impl FnMut(&[&mut Side]) -> bool) {
    let task = &h.task;
    let ended = ferry_testkit::wait_for(what, DEADLINE, async || {
        if task.is_finished() {
            return Ok::<_, anyhow::Error>(Some(true));
        }
        for s in sides.iter_mut() {
            s.drain();
        }
        Ok(done(sides).then_some(false))
    })
    .await
    .unwrap();
    if ended {
        h.assert_running(what).await;
    }
}

/// Partition 0 holds plain records, partition 1 12 transactions of 10 records with every third one aborted (80
/// committed, 40 aborted; each transaction's marker takes an offset without a record).
///
/// **Does not prove that aborted records are left out**: tansu 0.6 shows them to read_committed readers
/// (docs/kafka.md, "What was tested"). The producer records which records it aborted; the test pins that tansu
/// shows them, and that the consumer then delivers exactly what tansu shows, at the same offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_records_arrive_as_batches_that_keep_every_offset_and_on_tansu_aborted_records_arrive_too() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 2).await;
    let plain = produce_transactions(&k, "orders", 0, 300, 1, &[]).await;
    let txns = produce_transactions(&k, "orders", 1, 120, 2, &["--txn", "app-tx", "--abort-every", "3"]).await;
    assert_eq!((plain.committed.len(), plain.aborted.len()), (300, 0));
    assert_eq!((txns.committed.len(), txns.aborted.len()), (80, 40), "every third transaction aborted");
    let (truth0, truth1) = (plain.committed, txns.all());
    assert!(truth1.windows(2).any(|w| w[1].offset > w[0].offset + 1), "transaction markers leave gaps");
    assert_eq!(consume(&k, "orders", 0, 0).await, truth0);
    assert_eq!(consume(&k, "orders", 1, 0).await, truth1, "tansu 0.6 shows aborted records to read_committed");

    let mut h = Harness::start(vec![k.bootstrap()]);
    let (mut s0, sink0) = Side::new(8 << 20);
    let (mut s1, sink1) = Side::new(8 << 20);
    h.cmds.send(ConsumerCmd::Add(vec![(("orders".into(), 0), sink0), (("orders".into(), 1), sink1)])).unwrap();
    let (n0, n1) = (truth0.len(), truth1.len());
    until(&mut h, &mut [&mut s0, &mut s1], "all records", |s| s[0].records.len() >= n0 && s[1].records.len() >= n1)
        .await;
    // Position heartbeats keep coming, with the log end at least what was read.
    let p0 = s0.positions;
    until(&mut h, &mut [&mut s0, &mut s1], "position heartbeats", |s| s[0].positions >= p0 + 2).await;

    assert_eq!(s0.records, truth0);
    assert_eq!(digest(&s1.records), digest(&truth1));
    assert_eq!(s1.records, truth1);
    s0.assert_contiguous(0);
    s1.assert_contiguous(0);
    assert!(s0.batches.len() > 1, "small batches were asked for");
    // The log ends: 300 records; 120 records and 12 transaction markers.
    assert_eq!((s0.last_log_end, s1.last_log_end), (300, 132));
    assert!(s0.errors.is_empty() && s1.errors.is_empty(), "{:?} {:?}", s0.errors, s1.errors);
    assert!(h.reports.failures.lock().is_empty());
    assert!(!h.reports.successes.lock().is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_stops_at_its_credit_and_resumes_when_it_drains() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "big", 1).await;
    produce(&k, "big", 0, 1500, 3, &["--size", "1000"]).await;
    let truth = consume(&k, "big", 0, 0).await;
    let mut h = Harness::start(vec![k.bootstrap()]);
    let cap = 64 << 10;
    let (mut s, sink) = Side::new(cap);
    s.consume = false;
    h.cmds.send(ConsumerCmd::Add(vec![(("big".into(), 0), sink)])).unwrap();
    until(&mut h, &mut [&mut s], "the window to fill", |s| {
        s[0].flow.queued.load(Ordering::Relaxed) >= s[0].flow.window()
    })
    .await;
    // Paused: heartbeats continue while no data comes.
    let (got, p) = (s.records.len(), s.positions);
    until(&mut h, &mut [&mut s], "five heartbeats", |s| s[0].positions >= p + 5).await;
    let stalled = s.records.len();
    let before = s.positions;
    until(&mut h, &mut [&mut s], "five more heartbeats", |s| s[0].positions >= before + 5).await;
    assert_eq!(s.records.len(), stalled, "no data may arrive while the partition has no credit");
    assert!(stalled < truth.len(), "the partition must stop before the end ({got} then {stalled} of {})", truth.len());
    // Hand the credit back: everything arrives, exactly once.
    s.flow.queued.store(0, Ordering::Relaxed);
    s.consume = true;
    let n = truth.len();
    until(&mut h, &mut [&mut s], "all records", |s| s[0].records.len() >= n).await;
    assert_eq!(s.records, truth);
    s.assert_contiguous(0);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reseat_refetches_from_the_new_position_and_unknown_topics_are_reported_then_picked_up() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 1).await;
    produce(&k, "orders", 0, 100, 4, &[]).await;
    let truth = consume(&k, "orders", 0, 0).await;
    let mut h = Harness::start(vec![k.bootstrap()]);
    let (mut s, sink) = Side::new(8 << 20);
    let (mut m, missing) = Side::new(8 << 20);
    h.cmds.send(ConsumerCmd::Add(vec![(("orders".into(), 0), sink), (("later".into(), 0), missing)])).unwrap();
    until(&mut h, &mut [&mut s, &mut m], "records and the unknown-topic error", |s| {
        s[0].records.len() >= 100 && !s[1].errors.is_empty()
    })
    .await;
    assert_eq!(s.records, truth);
    assert_eq!(m.errors[0].0, pb::ErrorCode::UnknownTopicOrPartition);
    assert!(m.errors[0].1.contains("later"), "{:?}", m.errors);

    // Re-seat at 40: the partition is fetched again from there.
    s.flow.fetch_position.store(40, Ordering::Release);
    s.records.clear();
    s.batches.clear();
    h.cmds.send(ConsumerCmd::Reseat(("orders".into(), 0))).unwrap();
    until(&mut h, &mut [&mut s], "records from 40", |s| s[0].records.len() >= 60).await;
    assert_eq!(s.records, truth[40..].to_vec());
    s.assert_contiguous(40);

    // The missing topic appears: it is assigned from offset 0 without any command.
    create_topic(&k, "later", 1).await;
    produce(&k, "later", 0, 5, 5, &[]).await;
    let later = consume(&k, "later", 0, 0).await;
    until(&mut h, &mut [&mut m], "records of the new topic", |s| s[0].records.len() >= 5).await;
    assert_eq!(m.records, later);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_is_not_kafka_is_reported_and_a_switch_rebuilds_the_consumer_without_loss() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 1).await;
    produce(&k, "orders", 0, 50, 6, &[]).await;
    let backup = ferry_testkit::Proxy::start(k.bootstrap().parse().unwrap()).await.unwrap();
    let closed = ferry_testkit::reserve_port().unwrap();
    let mut h = Harness::start(vec![format!("127.0.0.1:{closed}")]);
    let (mut s, sink) = Side::new(8 << 20);
    h.cmds.send(ConsumerCmd::Add(vec![(("orders".into(), 0), sink)])).unwrap();
    // The route fails, is reported, and the consumer backs off instead of spinning.
    let reports = Arc::clone(&h.reports);
    until(&mut h, &mut [&mut s], "two route failure reports", |_| reports.failures.lock().len() >= 2).await;
    {
        let failures = h.reports.failures.lock();
        assert_eq!(failures[0].0, "primary");
        assert!(failures[0].1.contains("metadata"), "{:?}", failures[0]);
    }
    s.drain();
    assert!(s.records.is_empty());

    // The Egress switches to the backup route: the consumer is rebuilt there and reads everything once.
    h.routes.send_replace(KafkaRoute {
        name: "backup".into(),
        generation: 1,
        brokers: vec![backup.addr().to_string()],
    });
    until(&mut h, &mut [&mut s], "records over the backup route", |s| s[0].records.len() >= 50).await;
    let truth = consume(&k, "orders", 0, 0).await;
    assert_eq!(s.records, truth);
    assert!(backup.stats().connections_accepted > 0, "the backup route's bootstrap servers were used");
    assert!(h.reports.successes.lock().iter().any(|r| r == "backup"));

    // More data after a second switch (same route, new generation): continues exactly where it was.
    produce(&k, "orders", 0, 20, 7, &[]).await;
    h.routes.send_replace(KafkaRoute {
        name: "backup".into(),
        generation: 2,
        brokers: vec![backup.addr().to_string()],
    });
    until(&mut h, &mut [&mut s], "the later records", |s| s[0].records.len() >= 70).await;
    assert_eq!(s.records, consume(&k, "orders", 0, 0).await);
    s.assert_contiguous(0);
    h.stop().await;
}
