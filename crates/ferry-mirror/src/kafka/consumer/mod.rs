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
//! - Credits: a partition whose queued bytes (plus its open batch) reach its window is taken out of the librdkafka
//!   assignment, which also drops what librdkafka prefetched for it; once its queue is back below half the window
//!   it is assigned again at the next offset it expects. Prefetched data therefore never exceeds the caps.
//! - Positions: watermarks are refreshed every `position_interval` and sent as `Position` heartbeats. The log end
//!   sent is never below what was already read: a watermark asked before the newest records arrived, a broker
//!   whose `ListOffsets` answers less than its fetches deliver (tansu 0.6 does), or a new leader still catching up
//!   would all look like lost records. Only when librdkafka reports log truncation (KIP-320) does a lower log end
//!   go out, and the producer acts on the divergence.
//! - Route changes rebuild the consumer on the new bootstrap servers (Kafka clients then follow the cluster's
//!   advertised listeners). Failures (no answer for `failure_limit` refreshes, authentication) are reported to the
//!   Egress, and the consumer backs off before it tries again: never a tight crash loop.

mod partitions;
mod refresh;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_batch::Compression;
use futures::FutureExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::partitions::{Part, PartState, tpl_of};
use self::refresh::Refresh;
use super::props::{Ctx, Side, client_config};
use super::watermarks::Tp;
use crate::metrics::Metrics;
use crate::source::{ConsumerCmd, apply_offline, reset_sinks};
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

enum End {
    Shutdown,
    RouteChanged,
    Failed(String),
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
                        Some(cmd) => {
                            let settings = &self.settings;
                            apply_offline(&mut self.parts, cmd, |tp, sink| Part::new(&tp.0, sink, settings));
                            continue;
                        }
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

    /// The restart protocol: every partition drops what it queued and reports its fetch position.
    async fn reset_partitions(&mut self, shutdown: &CancellationToken) {
        self.generation += 1;
        let generation = self.generation;
        let alive = reset_sinks(self.parts.values().map(|p| &p.sink), generation, shutdown).await;
        // `retain` visits the map in key order, as `values` did.
        let mut alive = alive.into_iter();
        self.parts.retain(|_, _| alive.next().unwrap_or(false));
        for p in self.parts.values_mut() {
            p.batcher.reset(p.sink.flow.fetch_position.load(Ordering::Acquire));
            p.state = PartState::Fetching;
            p.paused = false;
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
                        Ok(m) => self.on_message(consumer, &m),
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
                            Some(Ok(m)) => self.on_message(consumer, &m),
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
}
