//! KafkaSession: the fetch session of a Kafka source, behind the same [`FetchSession`] trait and restart protocol
//! as the Ferry session: partitions come from the SyncManager's [`PartitionSet`], each is fetched from its lane's
//! fetch position under the lane's seat, within the lane's budget, and data, positions and errors go into the
//! lane's link.
//!
//! - One librdkafka consumer per session over the active route's bootstrap servers, in `assign()` mode at each
//!   partition's fetch position: no group rebalancing, no auto commit, `auto.offset.reset = error` (a position
//!   outside the log is reported, never silently moved), `isolation.level = read_committed` unless configured.
//! - Messages become Ferry record batches keeping every record's offset ([`super::PartitionBatcher`]): base offset
//!   = the next offset the partition expects, so Kafka's offset gaps are absorbed. Timestamps, keys, values and
//!   ordered headers (null values kept) are copied; the epoch is 0 (librdkafka does not expose leader epochs).
//! - Credits: a partition whose held bytes (plus its open batch) reach its window is taken out of the librdkafka
//!   assignment, which also drops what librdkafka prefetched for it; once its lane holds less than half the window
//!   it is assigned again at the next offset it expects. Prefetched data therefore never exceeds the budgets.
//! - A re-seat assigns the partition again at the new fetch position (librdkafka drops what it fetched from the old
//!   one); a lane that wants no data is unassigned.
//! - Positions: watermarks are refreshed every `position_interval` and sent as positions. The log end sent is never
//!   below what was already read: a watermark asked before the newest records arrived, a broker whose `ListOffsets`
//!   answers less than its fetches deliver (tansu 0.6 does), or a new leader still catching up would all look like
//!   lost records. Only when librdkafka reports log truncation (KIP-320) does a lower log end go out, and the lane
//!   acts on the divergence.
//! - Failures (no answer for `failure_limit` refreshes, authentication) end the session; the fetcher reports them
//!   to the Egress and backs off before the next one: never a tight crash loop. A route switch drops the session,
//!   whose consumer is then closed on the blocking pool.

mod partitions;
mod refresh;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_client::batch::Compression;
use futures::FutureExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::partitions::{Part, PartState};
use self::refresh::Refresh;
use super::props::{Ctx, Side, client_config};
use super::watermarks::Tp;
use crate::egress::ActiveRoute;
use crate::fetch::{FetchSession, PartitionSet, SessionEnd};
use crate::metrics::Metrics;
use crate::state::Shared;

/// Where the session reports the health of the route it fetches over (the Egress).
pub trait RouteReports: Send + Sync {
    /// The route delivered.
    fn report_success(&self, route: &str);
}

impl RouteReports for crate::egress::EgressHandle {
    fn report_success(&self, route: &str) {
        crate::egress::EgressHandle::report_success(self, route);
    }
}

/// Tuning of the Kafka session.
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

type Kc = StreamConsumer<Ctx>;

/// Closes a librdkafka consumer on the blocking pool (closing blocks until its threads stop), whenever the session
/// ends, also when its future is dropped on a route switch.
struct Closing(Option<Arc<Kc>>);

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            tokio::task::spawn_blocking(move || drop(c));
        }
    }
}

/// The Kafka fetch session (see the module docs).
pub struct KafkaSession {
    reports: Arc<dyn RouteReports>,
    settings: KafkaConsumerSettings,
    metrics: Metrics,
    shared: Arc<Shared>,
    parts: BTreeMap<Tp, Part>,
    /// The bootstrap servers of the route the session runs over (errors name them).
    brokers: String,
}

impl KafkaSession {
    /// A session reporting its route's health to `reports`.
    pub fn new(
        settings: KafkaConsumerSettings,
        reports: Arc<dyn RouteReports>,
        metrics: Metrics,
        shared: Arc<Shared>,
    ) -> KafkaSession {
        KafkaSession { reports, settings, metrics, shared, parts: BTreeMap::new(), brokers: String::new() }
    }

    fn build(&self, route: &ActiveRoute) -> Result<Arc<Kc>, String> {
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

    async fn fetch_loop(
        &mut self,
        route: &ActiveRoute,
        consumer: &Arc<Kc>,
        set: &PartitionSet,
        stop: &CancellationToken,
    ) -> SessionEnd {
        let started = Instant::now();
        // Which topics exist decides what is assigned: ask first.
        let first = self.spawn_refresh(consumer, true, false, false);
        let refresh = tokio::select! {
            _ = stop.cancelled() => return SessionEnd::Shutdown,
            r = first => r,
        };
        let Ok(refresh) = refresh else { return SessionEnd::Failed("the metadata task failed".into()) };
        let mut topics_known = match refresh.topics {
            Some(Ok(t)) => t,
            Some(Err(e)) => return SessionEnd::Failed(format!("cannot read the source's metadata: {e}")),
            None => BTreeMap::new(),
        };
        self.reports.report_success(&route.name);
        // Every partition starts afresh at its lane's fetch position.
        self.parts.clear();
        self.reconcile(consumer, set, &topics_known);
        tracing::info!(route = %route.name, partitions = self.parts.len(), "Kafka source consumer assigned");
        let changed = set.changed();
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
                _ = stop.cancelled() => return SessionEnd::Shutdown,
                done = async { match refresh.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                    refresh = None;
                    let Ok(r) = done else { return SessionEnd::Failed("the watermark task failed".into()) };
                    match self.on_refresh(consumer, r, &mut topics_known) {
                        Ok(()) => failures = 0,
                        Err(e) if e.is_unauthenticated() || e.code() == Some(ferry_client::Code::PermissionDenied) => {
                            return SessionEnd::Failed(format!("the source refused the mirror's credentials: {e}"));
                        }
                        Err(e) => {
                            failures += 1;
                            if failures >= self.settings.failure_limit {
                                return SessionEnd::Failed(format!("no answer from the source for {failures} position refreshes: {e}"));
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
                _ = changed.notified() => {
                    if self.reconcile(consumer, set, &topics_known) { check_topics = true; }
                }
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
    fn on_consume_error(&self, e: &KafkaError, started: Instant, consumer: &Kc) -> Option<SessionEnd> {
        let cause =
            consumer.context().last_error_since(started).map(|l| format!(" ({})", l.reason)).unwrap_or_default();
        match e.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed,
            ) => Some(SessionEnd::Failed(format!("the source refused the mirror: {e}{cause}"))),
            _ if matches!(e, KafkaError::MessageConsumptionFatal(_)) => {
                Some(SessionEnd::Failed(format!("fatal Kafka consumer error: {e}{cause}")))
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

#[async_trait::async_trait]
impl FetchSession for KafkaSession {
    async fn run(&mut self, route: Arc<ActiveRoute>, set: &PartitionSet, stop: &CancellationToken) -> SessionEnd {
        self.brokers = route.brokers.join(",");
        let closing = match self.build(&route) {
            Ok(c) => Closing(Some(c)),
            Err(reason) => return SessionEnd::Failed(reason),
        };
        let Some(consumer) = closing.0.as_ref() else { return SessionEnd::Failed("no consumer".into()) };
        self.fetch_loop(&route, consumer, set, stop).await
    }
}
