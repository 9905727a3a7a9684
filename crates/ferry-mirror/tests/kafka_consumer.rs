//! `KafkaSession` against a real Kafka-API broker (tansu), with the test playing the lanes: it seats each
//! partition's link, takes what the session delivered, decodes every batch, checks the seat and position it
//! carries, and consumes it by dropping its held bytes (which returns the credit). Restarts are what the Fetcher
//! does: `run` again over the (new) route. The Kafka data is produced and read back by confluent-kafka
//! (`kafka_tool.py`), never by the code under test.

#![cfg(feature = "kafka")]

mod kafka_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_batch::{Record, decode_records};
use ferry_mirror::egress::ActiveRoute;
use ferry_mirror::fetch::{FetchSession, PartitionSet, SessionEnd};
use ferry_mirror::kafka::{KafkaConsumerSettings, KafkaSession, KafkaSource, RouteReports, kafka_topic_id};
use ferry_mirror::lane::budget::{Budget, Held};
use ferry_mirror::lane::core::{Input, SourceFault};
use ferry_mirror::lane::link::LaneLink;
use ferry_mirror::metrics::Metrics;
use ferry_mirror::state::{PartitionStatus, Shared};
use ferry_mirror::tp::SourceTp;
use kafka_support::{Tansu, consume, create_topic, digest, produce, produce_transactions};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(60);

/// Route health as the session reports it (failures are the session's end, reported by the Fetcher).
#[derive(Default)]
struct Reports {
    successes: Mutex<Vec<String>>,
}

impl RouteReports for Reports {
    fn report_success(&self, route: &str) {
        self.successes.lock().push(route.to_owned());
    }
}

/// A route over `brokers`, as the Egress hands it to the Fetcher.
fn route(name: &str, generation: u64, brokers: Vec<String>) -> Arc<ActiveRoute> {
    let cluster = KafkaSource::new(brokers.clone(), BTreeMap::new(), "test").unwrap();
    Arc::new(ActiveRoute {
        name: name.into(),
        generation,
        brokers,
        bind: None,
        cluster: Arc::new(cluster),
        client: None,
    })
}

/// One partition as its lane sees it.
struct Side {
    link: Arc<LaneLink>,
    /// The seat the lane sits in now (data of another seat is dropped, as the lane does).
    seat: u64,
    records: Vec<Record>,
    /// (base offset, next offset) of every batch received.
    batches: Vec<(u64, u64)>,
    errors: Vec<(SourceFault, String)>,
    positions: u64,
    last_log_end: u64,
    /// Deliveries of an older seat, dropped.
    stale: u64,
    /// What received batches hold while they are not consumed.
    held: Vec<Held>,
    /// Whether received batches are consumed at once (their held bytes dropped, which returns the credit).
    consume: bool,
}

impl Side {
    /// A lane of `topic`/`partition` with a budget of `cap` bytes, seated at offset 0 and added to `set`.
    fn new(set: &PartitionSet, topic: &str, partition: u32, cap: u64) -> Side {
        let status = Arc::new(PartitionStatus::new(topic, topic, partition));
        let link = LaneLink::new(SourceTp::new(topic, partition), Budget::new(cap, cap / 8), set.changed(), status);
        link.set_seat(Some((1, 0)));
        set.insert(Arc::clone(&link));
        Side {
            link,
            seat: 1,
            records: Vec::new(),
            batches: Vec::new(),
            errors: Vec::new(),
            positions: 0,
            last_log_end: 0,
            stale: 0,
            held: Vec::new(),
            consume: true,
        }
    }

    /// Re-seats the lane: it wants the partition again from `from`, under a new seat.
    fn reseat(&mut self, from: u64) {
        self.seat += 1;
        self.link.set_seat(Some((self.seat, from)));
    }

    /// Handles everything delivered, as the lane would: data of its seat is decoded and its fetch position
    /// published (a restarted session starts there), positions and errors recorded.
    fn drain(&mut self) {
        let topic_id = kafka_topic_id(self.link.tp.topic());
        for input in self.link.drain_inputs() {
            match input {
                Input::Data { seat, batches, held, pos } => {
                    if seat != self.seat {
                        self.stale += 1;
                        continue;
                    }
                    assert!(!batches.is_empty(), "a delivery carries batches");
                    let bytes: u64 = batches.iter().map(|b| b.len() as u64).sum();
                    assert_eq!(held.bytes(), bytes, "every delivered byte is held");
                    for b in &batches {
                        self.batches.push((b.base_offset(), b.next_offset()));
                        let recs = decode_records(b.bytes()).unwrap();
                        assert_eq!(recs.len() as u64, u64::from(b.record_count()));
                        assert_eq!(
                            recs.last().map(|r| r.offset),
                            Some(b.last_offset()),
                            "a batch ends at its last record"
                        );
                        self.records.extend(recs);
                    }
                    assert!(pos.log_end > self.records.last().unwrap().offset, "log end below what was read");
                    assert_eq!((pos.epoch, pos.topic_id.as_str()), (0, topic_id.as_str()));
                    self.last_log_end = pos.log_end;
                    self.link.set_fetch_from(batches.last().unwrap().next_offset());
                    if !self.consume {
                        self.held.push(held);
                    }
                }
                Input::Position(pos) => {
                    assert_eq!((pos.epoch, pos.topic_id.as_str()), (0, topic_id.as_str()));
                    self.positions += 1;
                    self.last_log_end = pos.log_end;
                }
                Input::SourceError { fault, message, .. } => self.errors.push((fault, message)),
                other => panic!("a fetch session delivers only data, positions and errors, not {other:?}"),
            }
        }
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

/// A running session: its task gives the session back with how it ended (`None`: dropped by a route switch).
struct Running {
    task: JoinHandle<(KafkaSession, Option<SessionEnd>)>,
    /// The process stopping.
    stop: CancellationToken,
    /// A route switch: the Fetcher drops the session's future.
    switch: CancellationToken,
}

/// The Fetcher's part: one session, run over a route until it ends, then run again.
struct Harness {
    set: PartitionSet,
    reports: Arc<Reports>,
    settings: KafkaConsumerSettings,
    session: Option<KafkaSession>,
    running: Option<Running>,
}

impl Harness {
    fn new() -> Harness {
        ferry_testkit::init_tracing();
        let reports = Arc::new(Reports::default());
        let mut settings = KafkaConsumerSettings::new("test", BTreeMap::new());
        settings.position_interval = Duration::from_millis(200);
        settings.max_batch_bytes = 4096;
        let session = KafkaSession::new(
            settings.clone(),
            Arc::clone(&reports) as Arc<dyn RouteReports>,
            Metrics::new(),
            Arc::new(Shared::default()),
        );
        Harness { set: PartitionSet::default(), reports, settings, session: Some(session), running: None }
    }

    /// Runs the session over `route`.
    fn start(&mut self, route: Arc<ActiveRoute>) {
        let mut session = self.session.take().expect("the session is not running");
        let set = self.set.clone();
        let (stop, switch) = (CancellationToken::new(), CancellationToken::new());
        let (stopped, switched) = (stop.clone(), switch.clone());
        let task = tokio::spawn(async move {
            let end = tokio::select! {
                end = session.run(route, &set, &stopped) => Some(end),
                _ = switched.cancelled() => None,
            };
            (session, end)
        });
        self.running = Some(Running { task, stop, switch });
    }

    /// Waits up to `deadline` for the running session's task; a panic of it fails the test with that panic.
    async fn join(&mut self, deadline: Duration) -> Option<SessionEnd> {
        let running = self.running.take().expect("a session runs");
        match tokio::time::timeout(deadline, running.task).await {
            Ok(Ok((session, end))) => {
                self.session = Some(session);
                end
            }
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("the session task did not finish: {e}"),
            Err(_) => panic!("the session did not end within {deadline:?}"),
        }
    }

    /// How the running session ends by itself (within the deadline its calls' timeout gives it).
    async fn ended(&mut self) -> SessionEnd {
        let deadline = ferry_testkit::deadline(&[self.settings.call_timeout]);
        self.join(deadline).await.expect("the session ended by itself")
    }

    /// Drops the running session, as the Fetcher does when the route changes.
    async fn switch(&mut self) {
        self.running.as_ref().expect("a session runs").switch.cancel();
        let end = self.join(DEADLINE).await;
        assert_eq!(end, None, "the session ended by itself before the route switch");
    }

    /// Stops the running session: it must end with `Shutdown`.
    async fn stop(&mut self) {
        self.running.as_ref().expect("a session runs").stop.cancel();
        assert_eq!(self.join(DEADLINE).await, Some(SessionEnd::Shutdown));
    }
}

/// Drains every side until `done` holds; fails at once if the session ends (or panics) meanwhile.
async fn until(h: &mut Harness, sides: &mut [&mut Side], what: &str, mut done: impl FnMut(&[&mut Side]) -> bool) {
    let task = &h.running.as_ref().expect("a session runs").task;
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
        let end = h.join(DEADLINE).await;
        panic!("the session ended by itself while waiting for {what}: {end:?}");
    }
}

/// Partition 0 holds plain records, partition 1 12 transactions of 10 records with every third one aborted (80
/// committed, 40 aborted; each transaction's marker takes an offset without a record).
///
/// **Does not prove that aborted records are left out**: tansu 0.6 shows them to read_committed readers
/// (docs/kafka.md, "What was tested"). The producer records which records it aborted; the test pins that tansu
/// shows them, and that the session then delivers exactly what tansu shows, at the same offsets.
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

    let mut h = Harness::new();
    let mut s0 = Side::new(&h.set, "orders", 0, 8 << 20);
    let mut s1 = Side::new(&h.set, "orders", 1, 8 << 20);
    h.start(route("primary", 0, vec![k.bootstrap()]));
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
    assert_eq!((s0.stale, s1.stale), (0, 0));
    // Everything was consumed: nothing is held any more.
    assert_eq!((s0.link.budget.held(), s1.link.budget.held()), (0, 0));
    assert_eq!(*h.reports.successes.lock(), vec!["primary".to_owned()]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_stops_at_its_credit_and_resumes_when_it_drains() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "big", 1).await;
    produce(&k, "big", 0, 1500, 3, &["--size", "1000"]).await;
    let truth = consume(&k, "big", 0, 0).await;
    let mut h = Harness::new();
    let cap = 64 << 10;
    let mut s = Side::new(&h.set, "big", 0, cap);
    s.consume = false;
    h.start(route("primary", 0, vec![k.bootstrap()]));
    until(&mut h, &mut [&mut s], "the window to fill", |s| s[0].link.budget.held() >= s[0].link.budget.window()).await;
    // Paused: heartbeats continue while no data comes.
    let (got, p) = (s.records.len(), s.positions);
    until(&mut h, &mut [&mut s], "five heartbeats", |s| s[0].positions >= p + 5).await;
    let stalled = s.records.len();
    let before = s.positions;
    until(&mut h, &mut [&mut s], "five more heartbeats", |s| s[0].positions >= before + 5).await;
    assert_eq!(s.records.len(), stalled, "no data may arrive while the partition has no credit");
    assert!(stalled < truth.len(), "the partition must stop before the end ({got} then {stalled} of {})", truth.len());
    // What arrived is exactly what is held, and within the partition's cap.
    let held: u64 = s.held.iter().map(Held::bytes).sum();
    assert_eq!(s.link.budget.held(), held);
    assert!(held <= cap, "held {held} bytes, over the cap {cap}");
    // Hand the credit back: everything arrives, exactly once.
    s.held.clear();
    s.consume = true;
    let n = truth.len();
    until(&mut h, &mut [&mut s], "all records", |s| s[0].records.len() >= n).await;
    assert_eq!(s.records, truth);
    s.assert_contiguous(0);
    assert_eq!((s.stale, s.link.budget.held()), (0, 0));
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reseat_refetches_from_the_new_position_and_unknown_topics_are_reported_then_picked_up() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 1).await;
    produce(&k, "orders", 0, 100, 4, &[]).await;
    let truth = consume(&k, "orders", 0, 0).await;
    let mut h = Harness::new();
    let mut s = Side::new(&h.set, "orders", 0, 8 << 20);
    let mut m = Side::new(&h.set, "later", 0, 8 << 20);
    h.start(route("primary", 0, vec![k.bootstrap()]));
    until(&mut h, &mut [&mut s, &mut m], "records and the unknown-topic error", |s| {
        s[0].records.len() >= 100 && !s[1].errors.is_empty()
    })
    .await;
    assert_eq!(s.records, truth);
    assert_eq!(
        m.errors[0],
        (
            SourceFault::Missing,
            "Kafka topic later has no partition 0 (the topic does not exist or has fewer partitions)".to_owned()
        )
    );
    assert!(s.errors.is_empty(), "{:?}", s.errors);

    // Re-seat at 40: the partition is fetched again from there, under the new seat.
    s.records.clear();
    s.batches.clear();
    s.reseat(40);
    until(&mut h, &mut [&mut s], "records from 40", |s| s[0].records.len() >= 60).await;
    assert_eq!(s.records, truth[40..].to_vec());
    s.assert_contiguous(40);
    assert_eq!(s.stale, 0);

    // The missing topic appears: it is assigned from offset 0 without any re-seat.
    create_topic(&k, "later", 1).await;
    produce(&k, "later", 0, 5, 5, &[]).await;
    let later = consume(&k, "later", 0, 0).await;
    until(&mut h, &mut [&mut m], "records of the new topic", |s| s[0].records.len() >= 5).await;
    assert_eq!(m.records, later);
    m.assert_contiguous(0);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_is_not_kafka_fails_the_session_and_a_new_session_on_another_route_continues_without_loss() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 1).await;
    produce(&k, "orders", 0, 50, 6, &[]).await;
    let backup = ferry_testkit::Proxy::start(k.bootstrap().parse().unwrap()).await.unwrap();
    let closed = ferry_testkit::reserve_port().unwrap();
    let endpoint = format!("127.0.0.1:{closed}");
    let mut h = Harness::new();
    let mut s = Side::new(&h.set, "orders", 0, 8 << 20);
    // The route fails: the session ends with the reason the Fetcher reports, naming the route's endpoint, every
    // time it is run again.
    let failed = SessionEnd::Failed(format!(
        "cannot read the source's metadata: connection to broker {endpoint} failed: Kafka metadata : Meta data fetch \
         error: BrokerTransportFailure (Local: Broker transport failure)"
    ));
    for _ in 0..2 {
        h.start(route("primary", 0, vec![endpoint.clone()]));
        assert_eq!(h.ended().await, failed);
    }
    s.drain();
    assert!(s.records.is_empty() && s.errors.is_empty() && s.positions == 0, "{:?}", s.errors);
    assert!(h.reports.successes.lock().is_empty());

    // The Egress switches to the backup route: a new session there reads everything once.
    h.start(route("backup", 1, vec![backup.addr().to_string()]));
    until(&mut h, &mut [&mut s], "records over the backup route", |s| s[0].records.len() >= 50).await;
    let truth = consume(&k, "orders", 0, 0).await;
    assert_eq!(s.records, truth);
    assert!(backup.stats().connections_accepted > 0, "the backup route's bootstrap servers were used");
    assert_eq!(*h.reports.successes.lock(), vec!["backup".to_owned()]);

    // More data, then a second switch (same route, new generation): the session is dropped, and the new one
    // continues exactly at the lane's fetch position.
    produce(&k, "orders", 0, 20, 7, &[]).await;
    h.switch().await;
    s.drain();
    h.start(route("backup", 2, vec![backup.addr().to_string()]));
    until(&mut h, &mut [&mut s], "the later records", |s| s[0].records.len() >= 70).await;
    assert_eq!(s.records, consume(&k, "orders", 0, 0).await);
    s.assert_contiguous(0);
    assert_eq!(s.stale, 0);
    assert_eq!(*h.reports.successes.lock(), vec!["backup".to_owned(), "backup".to_owned()]);
    h.stop().await;
}
