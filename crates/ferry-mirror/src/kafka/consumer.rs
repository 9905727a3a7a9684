//! KafkaSourceConsumer: the fetch path of a Kafka source. It speaks the same protocol as
//! `source::SourceDcConsumer`: [`ConsumerCmd`]s in (Add / Remove / Reseat), [`SourceMsg`]s out per partition through
//! its [`PartitionSink`], byte credits through [`crate::source::PartitionFlow`], and the Reset protocol on every
//! (re)start.
//!
//! - One librdkafka consumer per session over the active route's bootstrap servers, in `assign()` mode at each
//!   partition's fetch position: no group rebalancing, no auto commit, `auto.offset.reset = error` (a position
//!   outside the log is reported, never silently moved), `isolation.level = read_committed` unless configured.
//! - Messages become Ferry record batches keeping every record's offset ([`super::PartitionBatcher`]): base offset
//!   = the next offset the partition expects, so Kafka's offset gaps are absorbed. Timestamps, keys, values and
//!   ordered headers (null values kept) are copied; the epoch is 0 (librdkafka does not expose leader epochs).
//! - Credits: a partition is paused in librdkafka when its queued bytes reach its window and resumed below half.
//! - Positions: watermarks are refreshed every `position_interval` and sent as `Position` heartbeats. The log end
//!   sent is never below what was already read (a watermark asked before the newest records arrived would look
//!   like lost records) unless the cluster reports it lower three refreshes in a row, or librdkafka reports log
//!   truncation: then the real value goes out and the producer acts on the divergence.
//! - Route changes rebuild the consumer on the new bootstrap servers (Kafka clients then follow the cluster's
//!   advertised listeners). Failures (no answer for `failure_limit` refreshes, authentication) are reported to the
//!   Egress, and the consumer backs off before it tries again: never a tight crash loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_client::ClientError;
use ferry_client::batch::{Compression, Header};
use ferry_client::proto as pb;
use futures::FutureExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::convert::{PartitionBatcher, Pushed};
use super::props::{Ctx, Side, client_config};
use super::watermarks::{Tp, watermarks};
use crate::metrics::Metrics;
use crate::source::{ConsumerCmd, PartitionSink, SourceMsg, SourcePos};
use crate::state::Shared;

/// The active route as the Kafka consumer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRoute {
    /// Route name.
    pub name: String,
    /// Bumped on every switch (a manual switch to the same route restarts the consumer too).
    pub generation: u64,
    /// Bootstrap servers.
    pub brokers: Vec<String>,
}

/// Where the consumer reports the health of the route it fetches over (the Egress).
pub trait RouteReports: Send + Sync {
    /// The route failed (it counts toward `failure_threshold`).
    fn report_failure(&self, route: &str, reason: &str);
    /// The route delivered.
    fn report_success(&self, route: &str);
}

impl RouteReports for crate::egress::EgressHandle {
    fn report_failure(&self, route: &str, reason: &str) {
        crate::egress::EgressHandle::report_failure(self, route, reason);
    }

    fn report_success(&self, route: &str) {
        crate::egress::EgressHandle::report_success(self, route);
    }
}

/// Tuning of the Kafka consumer.
#[derive(Debug, Clone)]
pub struct KafkaConsumerSettings {
    /// `[source.kafka]` librdkafka properties.
    pub properties: BTreeMap<String, String>,
    /// `mirror.name` (client id and group id `ferry-mirror.{name}`; the consumer never joins the group).
    pub mirror: String,
    /// Watermark refresh and position heartbeat period.
    pub position_interval: Duration,
    /// How often paused partitions are checked for room.
    pub credit_tick: Duration,
    /// Largest batch built (uncompressed), unless a single record is larger.
    pub max_batch_bytes: usize,
    /// Compression of the batches built.
    pub compression: Compression,
    /// Timeout of metadata and watermark calls.
    pub call_timeout: Duration,
    /// Consecutive failed refreshes after which the route counts as failed and the consumer is rebuilt.
    pub failure_limit: u32,
}

impl KafkaConsumerSettings {
    /// Defaults for `mirror` with `properties`.
    pub fn new(mirror: &str, properties: BTreeMap<String, String>) -> KafkaConsumerSettings {
        KafkaConsumerSettings {
            properties,
            mirror: mirror.to_owned(),
            position_interval: Duration::from_millis(500),
            credit_tick: Duration::from_millis(10),
            max_batch_bytes: 512 << 10,
            compression: Compression::None,
            call_timeout: Duration::from_secs(5),
            failure_limit: 3,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartState {
    /// Assigned in librdkafka and fetching.
    Fetching,
    /// Its topic or partition does not exist (reported; checked again).
    Missing,
    /// Its position is outside the log (reported); waits for a re-seat.
    Stopped,
}

struct Part {
    sink: PartitionSink,
    batcher: PartitionBatcher,
    state: PartState,
    paused: bool,
    lo: u64,
    hi: u64,
    below: u32,
    topic_id: String,
}

impl Part {
    fn new(topic: &str, sink: PartitionSink, settings: &KafkaConsumerSettings) -> Part {
        let at = sink.flow.fetch_position.load(Ordering::Acquire);
        Part {
            sink,
            batcher: PartitionBatcher::new(at, settings.max_batch_bytes, settings.compression),
            state: PartState::Fetching,
            paused: false,
            lo: 0,
            hi: 0,
            below: 0,
            topic_id: super::kafka_topic_id(topic),
        }
    }

    fn pos(&self) -> SourcePos {
        SourcePos {
            log_start: self.lo,
            log_end: self.hi.max(self.batcher.expected()),
            epoch: 0,
            topic_id: self.topic_id.clone(),
        }
    }
}

enum End {
    Shutdown,
    RouteChanged,
    Failed(String),
}

/// What one background refresh found.
struct Refresh {
    /// Each fetching partition's expected offset when the refresh was asked.
    asked_at: BTreeMap<Tp, u64>,
    watermarks: Result<BTreeMap<Tp, (u64, u64)>, ClientError>,
    /// Topic partition counts, when metadata was asked too.
    topics: Option<Result<BTreeMap<String, u32>, ClientError>>,
    out_of_range: bool,
    truncation: bool,
}

/// The Kafka fetch path (see the module docs).
pub struct KafkaSourceConsumer {
    cmds: mpsc::UnboundedReceiver<ConsumerCmd>,
    routes: watch::Receiver<KafkaRoute>,
    reports: Arc<dyn RouteReports>,
    settings: KafkaConsumerSettings,
    metrics: Metrics,
    shared: Arc<Shared>,
    parts: BTreeMap<Tp, Part>,
    generation: u64,
}

type Kc = StreamConsumer<Ctx>;

fn tpl_of<'a>(items: impl IntoIterator<Item = (&'a Tp, Option<u64>)>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((t, p), at) in items {
        match at {
            Some(o) => {
                let _ = tpl.add_partition_offset(t, *p as i32, Offset::Offset(o as i64));
            }
            None => {
                tpl.add_partition(t, *p as i32);
            }
        }
    }
    tpl
}

fn headers_of(m: &BorrowedMessage<'_>) -> Vec<Header> {
    let Some(hs) = m.headers() else { return Vec::new() };
    hs.iter().map(|h| Header { key: h.key.to_owned(), value: h.value.map(bytes::Bytes::copy_from_slice) }).collect()
}

impl KafkaSourceConsumer {
    /// A consumer fed by `cmds`, fetching over the route `routes` names, reporting its health to `reports`.
    pub fn new(
        cmds: mpsc::UnboundedReceiver<ConsumerCmd>,
        routes: watch::Receiver<KafkaRoute>,
        reports: Arc<dyn RouteReports>,
        settings: KafkaConsumerSettings,
        metrics: Metrics,
        shared: Arc<Shared>,
    ) -> KafkaSourceConsumer {
        KafkaSourceConsumer { cmds, routes, reports, settings, metrics, shared, parts: BTreeMap::new(), generation: 0 }
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            if self.parts.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    cmd = self.cmds.recv() => match cmd {
                        Some(cmd) => { self.apply_offline(cmd); continue; }
                        None => return,
                    },
                }
            }
            let route = self.routes.borrow_and_update().clone();
            self.reset_partitions(&shutdown).await;
            match self.session(&route, &shutdown).await {
                End::Shutdown => return,
                End::RouteChanged => backoff = Duration::from_millis(100),
                End::Failed(reason) => {
                    tracing::warn!(route = %route.name, brokers = ?route.brokers, %reason, "Kafka source consumer failed");
                    self.reports.report_failure(&route.name, &reason);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.routes.changed() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    fn apply_offline(&mut self, cmd: ConsumerCmd) {
        match cmd {
            ConsumerCmd::Add(list) => {
                for (tp, sink) in list {
                    let part = Part::new(&tp.0, sink, &self.settings);
                    self.parts.insert(tp, part);
                }
            }
            ConsumerCmd::Remove(list) => {
                for tp in list {
                    self.parts.remove(&tp);
                }
            }
            ConsumerCmd::Reseat(_) => {}
        }
    }

    /// The restart protocol: every partition drops what it queued and reports its fetch position.
    async fn reset_partitions(&mut self, shutdown: &CancellationToken) {
        self.generation += 1;
        let generation = self.generation;
        self.parts.retain(|_, p| p.sink.tx.send(SourceMsg::Reset { generation }).is_ok());
        let all_acked = |parts: &BTreeMap<Tp, Part>| {
            parts.values().all(|p| p.sink.flow.reset_ack.load(Ordering::Acquire) >= generation)
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !all_acked(&self.parts) && tokio::time::Instant::now() < deadline && !shutdown.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for p in self.parts.values_mut() {
            p.batcher.reset(p.sink.flow.fetch_position.load(Ordering::Acquire));
            p.state = PartState::Fetching;
            p.paused = false;
            p.below = 0;
        }
    }

    fn build(&self, route: &KafkaRoute) -> Result<Arc<Kc>, String> {
        let s = &self.settings;
        let owned = [
            ("client.id", format!("ferry-mirror.{}", s.mirror)),
            // Required by librdkafka for assign(); the consumer never joins nor commits to it.
            ("group.id", format!("ferry-mirror.{}", s.mirror)),
            ("enable.auto.commit", "false".to_owned()),
            ("enable.auto.offset.store", "false".to_owned()),
            ("auto.offset.reset", "error".to_owned()),
            ("enable.partition.eof", "false".to_owned()),
        ];
        let defaults = [("isolation.level", "read_committed"), ("queued.max.messages.kbytes", "16384")];
        let cfg =
            client_config(Side::Source, &route.brokers, &s.properties, &owned, &defaults).map_err(|e| e.to_string())?;
        let label = format!("source consumer, route {} [{}]", route.name, route.brokers.join(","));
        cfg.create_with_context::<_, Kc>(Ctx::new(label))
            .map(Arc::new)
            .map_err(|e| format!("cannot create the Kafka consumer: {e}"))
    }

    /// One consumer over one route, until it fails, the route changes or shutdown.
    async fn session(&mut self, route: &KafkaRoute, shutdown: &CancellationToken) -> End {
        let consumer = match self.build(route) {
            Ok(c) => c,
            Err(reason) => return End::Failed(reason),
        };
        let end = self.fetch_loop(route, &consumer, shutdown).await;
        // Closing a librdkafka consumer blocks until its threads stop.
        tokio::task::spawn_blocking(move || drop(consumer));
        end
    }

    fn spawn_refresh(
        &self,
        consumer: &Arc<Kc>,
        with_topics: bool,
        out_of_range: bool,
        truncation: bool,
    ) -> JoinHandle<Refresh> {
        let asked_at: BTreeMap<Tp, u64> = self
            .parts
            .iter()
            .filter(|(_, p)| p.state == PartState::Fetching)
            .map(|(tp, p)| (tp.clone(), p.batcher.expected()))
            .collect();
        let c = Arc::clone(consumer);
        let timeout = self.settings.call_timeout;
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let tps: Vec<Tp> = asked_at.keys().cloned().collect();
            let cause =
                |c: &Kc| c.context().last_error_since(started).map(|e| format!("; {}", e.reason)).unwrap_or_default();
            let watermarks = watermarks(c.as_ref(), &tps, timeout)
                .map_err(|e| super::error::map_error(&e, "watermarks of", "the mirrored partitions", "", &cause(&c)));
            let topics = with_topics.then(|| {
                c.fetch_metadata(None, timeout)
                    .map(|md| {
                        md.topics()
                            .iter()
                            .filter(|t| t.error().is_none())
                            .map(|t| (t.name().to_owned(), t.partitions().len() as u32))
                            .collect()
                    })
                    .map_err(|e| super::error::map_error(&e, "metadata", "", "", &cause(&c)))
            });
            Refresh { asked_at, watermarks, topics, out_of_range, truncation }
        })
    }

    async fn fetch_loop(&mut self, route: &KafkaRoute, consumer: &Arc<Kc>, shutdown: &CancellationToken) -> End {
        let started = Instant::now();
        // Which topics exist decides what is assigned: ask first.
        let first = self.spawn_refresh(consumer, true, false, false);
        let refresh = tokio::select! {
            _ = shutdown.cancelled() => return End::Shutdown,
            r = first => r,
        };
        let Ok(refresh) = refresh else { return End::Failed("the metadata task failed".into()) };
        let topics = match refresh.topics {
            Some(Ok(t)) => t,
            Some(Err(e)) => return End::Failed(format!("cannot read the source's metadata: {e}")),
            None => BTreeMap::new(),
        };
        self.reports.report_success(&route.name);
        let mut assign = Vec::new();
        for (tp, p) in self.parts.iter_mut() {
            if topics.get(&tp.0).is_some_and(|&n| tp.1 < n) {
                p.state = PartState::Fetching;
                assign.push((tp, Some(p.batcher.expected())));
            } else {
                p.state = PartState::Missing;
            }
        }
        if let Err(e) = consumer.assign(&tpl_of(assign)) {
            return End::Failed(format!("cannot assign the partitions: {e}"));
        }
        self.report_missing();
        tracing::info!(route = %route.name, partitions = self.parts.len(), "Kafka source consumer assigned");
        let mut topics_known = topics;
        let mut credit_tick = tokio::time::interval(self.settings.credit_tick);
        credit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut position_tick = tokio::time::interval(self.settings.position_interval);
        position_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refresh: Option<JoinHandle<Refresh>> = None;
        let mut failures = 0u32;
        let mut last_topics_check = Instant::now();
        let (mut out_of_range, mut truncation, mut check_topics) = (false, false, false);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return End::Shutdown,
                changed = self.routes.changed() => {
                    if changed.is_err() { return End::Shutdown; }
                    let now = self.routes.borrow().clone();
                    if now.name != route.name || now.generation != route.generation || now.brokers != route.brokers {
                        tracing::info!(from = %route.name, to = %now.name, "route changed; rebuilding the Kafka consumer");
                        return End::RouteChanged;
                    }
                }
                done = async { match refresh.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                    refresh = None;
                    let Ok(r) = done else { return End::Failed("the watermark task failed".into()) };
                    match self.on_refresh(consumer, r, &mut topics_known) {
                        Ok(()) => failures = 0,
                        Err(e) if e.is_unauthenticated() || e.code() == Some(ferry_client::Code::PermissionDenied) => {
                            return End::Failed(format!("the source refused the mirror's credentials: {e}"));
                        }
                        Err(e) => {
                            failures += 1;
                            if failures >= self.settings.failure_limit {
                                return End::Failed(format!("no answer from the source for {failures} position refreshes: {e}"));
                            }
                        }
                    }
                }
                msg = consumer.recv() => {
                    match msg {
                        Ok(m) => self.on_message(&m),
                        Err(e) => match self.on_consume_error(&e, started, consumer) {
                            Some(end) => return end,
                            None => {
                                let code = e.rdkafka_error_code();
                                out_of_range |= code == Some(RDKafkaErrorCode::OffsetOutOfRange);
                                truncation |= code == Some(RDKafkaErrorCode::LogTruncation);
                                check_topics |= matches!(code, Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownPartition));
                            }
                        },
                    }
                    // Take what else is ready now, then hand the batches over.
                    for _ in 0..4096 {
                        match consumer.recv().now_or_never() {
                            Some(Ok(m)) => self.on_message(&m),
                            Some(Err(e)) => {
                                if let Some(end) = self.on_consume_error(&e, started, consumer) { return end; }
                                let code = e.rdkafka_error_code();
                                out_of_range |= code == Some(RDKafkaErrorCode::OffsetOutOfRange);
                                truncation |= code == Some(RDKafkaErrorCode::LogTruncation);
                            }
                            None => break,
                        }
                    }
                    self.flush_all(consumer);
                }
                cmd = self.cmds.recv() => match cmd {
                    None => return End::Shutdown,
                    Some(cmd) => {
                        if self.on_command(cmd, consumer, &topics_known) { check_topics = true; }
                    }
                },
                _ = credit_tick.tick() => self.credits(consumer),
                _ = position_tick.tick() => {
                    if refresh.is_none() {
                        let missing = self.parts.values().any(|p| p.state == PartState::Missing);
                        let with_topics = check_topics || (missing && last_topics_check.elapsed() >= Duration::from_secs(5));
                        if with_topics { last_topics_check = Instant::now(); }
                        refresh = Some(self.spawn_refresh(consumer, with_topics, out_of_range, truncation));
                        (out_of_range, truncation, check_topics) = (false, false, false);
                    }
                }
            }
        }
    }

    /// A consumption error: `Some` when the session must end.
    fn on_consume_error(&self, e: &KafkaError, started: Instant, consumer: &Kc) -> Option<End> {
        let cause =
            consumer.context().last_error_since(started).map(|l| format!(" ({})", l.reason)).unwrap_or_default();
        match e.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed,
            ) => Some(End::Failed(format!("the source refused the mirror: {e}{cause}"))),
            _ if matches!(e, KafkaError::MessageConsumptionFatal(_)) => {
                Some(End::Failed(format!("fatal Kafka consumer error: {e}{cause}")))
            }
            Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::LogTruncation) => {
                tracing::warn!(error = %e, "Kafka source: a fetch position is outside the log; checking the watermarks");
                None
            }
            _ => {
                tracing::debug!(error = %e, "Kafka source consumer error");
                None
            }
        }
    }

    fn on_message(&mut self, m: &BorrowedMessage<'_>) {
        let Ok(partition) = u32::try_from(m.partition()) else { return };
        let Some(part) = self.parts.get_mut(&(m.topic().to_owned(), partition)) else { return };
        if part.state != PartState::Fetching || m.offset() < 0 {
            return;
        }
        let headers = headers_of(m);
        let ts = m.timestamp().to_millis().unwrap_or(-1);
        if let Pushed::Completed(bytes, records) =
            part.batcher.push(m.offset() as u64, ts, m.key(), m.payload(), &headers)
        {
            let tp = (m.topic().to_owned(), partition);
            self.deliver(&tp, bytes, records);
        }
    }

    /// Sends one batch to its producer.
    fn deliver(&mut self, tp: &Tp, bytes: bytes::Bytes, records: u64) {
        let Some(part) = self.parts.get_mut(tp) else { return };
        let n = bytes.len() as u64;
        part.sink.flow.queued.fetch_add(n, Ordering::Relaxed);
        self.metrics.received(records, n);
        self.shared.source_rates.add(records, n);
        let pos = part.pos();
        if part.sink.tx.send(SourceMsg::Data { batches: bytes, records, pos }).is_err() {
            // The producer stopped: stop fetching the partition.
            self.parts.remove(tp);
        }
    }

    fn flush_all(&mut self, consumer: &Kc) {
        let ready: Vec<Tp> =
            self.parts.iter().filter(|(_, p)| p.batcher.has_pending()).map(|(tp, _)| tp.clone()).collect();
        for tp in ready {
            if let Some((bytes, records)) = self.parts.get_mut(&tp).and_then(|p| p.batcher.flush()) {
                self.deliver(&tp, bytes, records);
            }
        }
        self.credits(consumer);
    }

    /// Pauses partitions whose queue reached their window; resumes those back below half of it.
    fn credits(&mut self, consumer: &Kc) {
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (tp, p) in self.parts.iter_mut() {
            if p.state != PartState::Fetching {
                continue;
            }
            let window = p.sink.flow.window();
            let queued = p.sink.flow.queued.load(Ordering::Relaxed);
            if !p.paused && window > 0 && queued >= window {
                p.paused = true;
                pause.push((tp, None));
            } else if p.paused && (window == 0 || queued <= window / 2) {
                p.paused = false;
                resume.push((tp, None));
            }
        }
        if !pause.is_empty()
            && let Err(e) = consumer.pause(&tpl_of(pause))
        {
            tracing::warn!(error = %e, "cannot pause Kafka partitions");
        }
        if !resume.is_empty()
            && let Err(e) = consumer.resume(&tpl_of(resume))
        {
            tracing::warn!(error = %e, "cannot resume Kafka partitions");
        }
    }

    /// Applies a command; true when topic metadata should be checked.
    fn on_command(&mut self, cmd: ConsumerCmd, consumer: &Kc, topics: &BTreeMap<String, u32>) -> bool {
        let mut check = false;
        match cmd {
            ConsumerCmd::Add(list) => {
                let mut assign = Vec::new();
                let mut unassign = Vec::new();
                for (tp, sink) in list {
                    if self.parts.get(&tp).is_some_and(|p| p.state == PartState::Fetching) {
                        unassign.push(tp.clone());
                    }
                    let mut part = Part::new(&tp.0, sink, &self.settings);
                    if topics.get(&tp.0).is_some_and(|&n| tp.1 < n) {
                        assign.push((tp.clone(), part.batcher.expected()));
                    } else {
                        part.state = PartState::Missing;
                        check = true;
                    }
                    self.parts.insert(tp, part);
                }
                self.unassign(consumer, &unassign);
                self.assign(consumer, &assign);
                self.report_missing();
            }
            ConsumerCmd::Remove(list) => {
                let fetching: Vec<Tp> = list
                    .iter()
                    .filter(|tp| self.parts.get(*tp).is_some_and(|p| p.state == PartState::Fetching))
                    .cloned()
                    .collect();
                self.unassign(consumer, &fetching);
                for tp in list {
                    self.parts.remove(&tp);
                }
            }
            ConsumerCmd::Reseat(tp) => {
                let Some(p) = self.parts.get_mut(&tp) else { return false };
                let was_fetching = p.state == PartState::Fetching;
                let at = p.sink.flow.fetch_position.load(Ordering::Acquire);
                p.batcher.reset(at);
                p.paused = false;
                p.below = 0;
                if p.state == PartState::Missing {
                    return true;
                }
                p.state = PartState::Fetching;
                if was_fetching {
                    self.unassign(consumer, std::slice::from_ref(&tp));
                }
                self.assign(consumer, &[(tp, at)]);
            }
        }
        check
    }

    fn assign(&self, consumer: &Kc, list: &[(Tp, u64)]) {
        if list.is_empty() {
            return;
        }
        if let Err(e) = consumer.incremental_assign(&tpl_of(list.iter().map(|(tp, at)| (tp, Some(*at))))) {
            tracing::warn!(error = %e, "cannot assign Kafka partitions");
        }
    }

    fn unassign(&self, consumer: &Kc, list: &[Tp]) {
        if list.is_empty() {
            return;
        }
        if let Err(e) = consumer.incremental_unassign(&tpl_of(list.iter().map(|tp| (tp, None)))) {
            tracing::warn!(error = %e, "cannot unassign Kafka partitions");
        }
    }

    /// Tells the producers of missing partitions that their topic or partition does not exist.
    fn report_missing(&mut self) {
        for ((topic, partition), p) in &self.parts {
            if p.state == PartState::Missing {
                let message = format!(
                    "Kafka topic {topic} has no partition {partition} (the topic does not exist or has fewer partitions)"
                );
                let _ = p.sink.tx.send(SourceMsg::Error {
                    code: pb::ErrorCode::UnknownTopicOrPartition,
                    message,
                    pos: SourcePos { topic_id: p.topic_id.clone(), ..Default::default() },
                });
            }
        }
    }

    fn on_refresh(
        &mut self,
        consumer: &Kc,
        r: Refresh,
        topics_known: &mut BTreeMap<String, u32>,
    ) -> Result<(), ClientError> {
        if let Some(topics) = r.topics {
            let topics = topics?;
            let mut assign = Vec::new();
            let mut gone = Vec::new();
            for (tp, p) in self.parts.iter_mut() {
                let exists = topics.get(&tp.0).is_some_and(|&n| tp.1 < n);
                match (p.state, exists) {
                    (PartState::Missing, true) => {
                        p.state = PartState::Fetching;
                        assign.push((tp.clone(), p.batcher.expected()));
                    }
                    (PartState::Fetching | PartState::Stopped, false) => {
                        if p.state == PartState::Fetching {
                            gone.push(tp.clone());
                        }
                        p.state = PartState::Missing;
                    }
                    _ => {}
                }
            }
            self.unassign(consumer, &gone);
            self.assign(consumer, &assign);
            if !gone.is_empty() {
                self.report_missing();
            }
            *topics_known = topics;
        }
        let marks = r.watermarks?;
        let mut stop = Vec::new();
        for (tp, (lo, hi)) in marks {
            let Some(p) = self.parts.get_mut(&tp) else { continue };
            if p.state != PartState::Fetching {
                continue;
            }
            let asked = r.asked_at.get(&tp).copied().unwrap_or(0);
            p.below = if hi < asked { p.below + 1 } else { 0 };
            p.lo = lo;
            p.hi = hi;
            let expected = p.batcher.expected();
            if r.out_of_range && expected < lo {
                let _ = p.sink.tx.send(SourceMsg::Error {
                    code: pb::ErrorCode::OffsetOutOfRange,
                    message: format!("{}/{}: offset {expected} is below the log start {lo}", tp.0, tp.1),
                    pos: SourcePos { log_start: lo, log_end: hi, epoch: 0, topic_id: p.topic_id.clone() },
                });
                p.state = PartState::Stopped;
                stop.push(tp.clone());
                continue;
            }
            let mut pos = p.pos();
            if hi < asked && (p.below >= 3 || r.truncation) {
                // The source holds less than was read from it: the producer halts the partition (divergence).
                pos.log_end = hi;
            }
            if p.sink.tx.send(SourceMsg::Position(pos)).is_err() {
                stop.push(tp.clone());
            }
        }
        self.unassign(consumer, &stop);
        self.parts.retain(|_, p| !p.sink.tx.is_closed());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_lists_carry_offsets() {
        let a: Tp = ("t".into(), 1);
        let b: Tp = ("u".into(), 0);
        let tpl = tpl_of([(&a, Some(5)), (&b, None)]);
        let elems = tpl.elements();
        assert_eq!(elems.len(), 2);
        assert_eq!((elems[0].topic(), elems[0].partition(), elems[0].offset()), ("t", 1, Offset::Offset(5)));
        assert_eq!((elems[1].topic(), elems[1].partition()), ("u", 0));
    }
}
