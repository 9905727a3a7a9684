//! Egress: the named network routes to the source cluster, their health, and failover between them.
//!
//! - Every route is probed every `check_interval` (gRPC health + Metadata, bounded by `timeout`). A route is
//!   healthy when the probe passes **and** the cluster id it reports is the source's: `source.cluster_id` when set,
//!   else the id recorded on the target's mirror topics, else the first id seen. A route into another cluster is
//!   never used.
//! - Failures of the active route's fetch stream (errors, keepalive timeouts, silence) count as failures too: a
//!   blackholed stream can hang while fresh probes pass, so stream failures have their own counter, cleared only
//!   when the stream delivers again.
//! - `failure_threshold` consecutive failures make a route unavailable (`source_net_not_available`). Once the
//!   active route has been unavailable for `switch_after`, the mirror switches to the next healthy route in
//!   preference order (`source_net_be_switched` {from, to, reason}); the consumer resumes from the cache offsets.
//!   With no healthy route it stays and alarms. `min_switch_interval` spaces automatic switches.
//! - A route that recovers raises `source_net_recovered`. Only with `switch_back = "auto"` does the mirror return
//!   to the primary by itself.
//! - A manual switch (REST, ferryctl) pins the chosen route: no automatic switch happens until it is unpinned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_client::{BrokerClient, ClientConfig, ClientError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cluster::SourceCluster;
use crate::cluster::ferry::FerrySource;
use crate::config::{Route, SourceConfig, SwitchBack};
use crate::events::{Details, Event, EventBus, EventKind, RouteFacts, SwitchFacts};

/// The route the pipeline uses now.
#[derive(Debug)]
pub struct ActiveRoute {
    /// Route name.
    pub name: String,
    /// Bumped on every switch (also a manual switch to the same route restarts streams).
    pub generation: u64,
    /// The route's broker addresses (bootstrap servers for Kafka).
    pub brokers: Vec<String>,
    /// Local address connections are made from.
    pub bind: Option<std::net::IpAddr>,
    /// The source cluster over this route.
    pub cluster: Arc<dyn SourceCluster>,
    /// For a Ferry source, the client the fetch stream uses.
    pub client: Option<BrokerClient>,
}

/// What a route connects through: the cluster interface, and for Ferry the client the fetch stream uses.
#[derive(Debug, Clone)]
pub struct RouteEndpoint {
    /// The source cluster over this route.
    pub cluster: Arc<dyn SourceCluster>,
    /// For a Ferry source, its client.
    pub client: Option<BrokerClient>,
}

/// Builds a route's endpoint (one per route, created once; nothing connects until first use).
pub type RouteFactory<'a> = &'a dyn Fn(&Route) -> Result<RouteEndpoint, ClientError>;

/// The route factory for Ferry sources.
pub fn ferry_routes(
    source: &SourceConfig,
    compression: bool,
) -> impl Fn(&Route) -> Result<RouteEndpoint, ClientError> + '_ {
    move |r| {
        let client = BrokerClient::new(route_client_config(source, r, compression))?;
        Ok(RouteEndpoint { cluster: Arc::new(FerrySource::new(client.clone())), client: Some(client) })
    }
}

/// Why a manual switch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// No route has that name.
    #[error("no route named {0:?}")]
    UnknownRoute(String),
    /// The route leads to another cluster than the source, or the source's id is not known and the route was
    /// never verified: refused, forced or not.
    #[error("route {route:?} cannot be used: {reason}")]
    WrongCluster {
        /// Route name.
        route: String,
        /// Why.
        reason: String,
    },
    /// The route is unhealthy and `force` was not set.
    #[error("route {route:?} is unhealthy ({reason}); pass force to switch anyway")]
    RouteUnhealthy {
        /// Route name.
        route: String,
        /// Why it is unhealthy.
        reason: String,
    },
}

/// One route as the monitor shows it (deserializable for clients; missing fields default).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RouteView {
    /// Route name.
    pub name: String,
    /// Broker addresses.
    pub brokers: Vec<String>,
    /// Local bind address.
    pub bind: Option<String>,
    /// Whether it is the active route.
    pub active: bool,
    /// Passes probes and leads to the source cluster.
    pub healthy: bool,
    /// False once `failure_threshold` consecutive failures happened, until it passes again.
    pub available: bool,
    /// Consecutive probe failures.
    pub consecutive_failures: u32,
    /// Consecutive fetch stream failures (active route).
    pub stream_failures: u32,
    /// The cluster id the route reported last.
    pub cluster_id: Option<String>,
    /// The last failure reason.
    pub last_error: Option<String>,
    /// Milliseconds since the last probe, if any.
    pub last_probe_ms_ago: Option<u64>,
}

/// The `/api/v1/egress` document (deserializable for clients; missing fields default).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EgressView {
    /// Active route name.
    pub active: String,
    /// Whether a manual switch pinned it.
    pub pinned: bool,
    /// The cluster id every route must report.
    pub expected_cluster_id: Option<String>,
    /// Routes in preference order.
    pub routes: Vec<RouteView>,
}

#[derive(Debug)]
struct RouteState {
    name: String,
    brokers: Vec<String>,
    bind: Option<std::net::IpAddr>,
    endpoint: RouteEndpoint,
    healthy: bool,
    available: bool,
    failures: u32,
    stream_failures: u32,
    cluster_id: Option<String>,
    last_error: Option<String>,
    last_probe: Option<Instant>,
    unavailable_since: Option<Instant>,
    /// Whether the route ever passed a probe since the mirror started.
    ever_healthy: bool,
    /// Whether the "never reached the source" sync_error was raised.
    misconfig_alarmed: bool,
}

impl RouteState {
    fn active(&self, generation: u64) -> ActiveRoute {
        ActiveRoute {
            name: self.name.clone(),
            generation,
            brokers: self.brokers.clone(),
            bind: self.bind,
            cluster: Arc::clone(&self.endpoint.cluster),
            client: self.endpoint.client.clone(),
        }
    }

    fn failing(&self, threshold: u32) -> bool {
        self.failures >= threshold || self.stream_failures >= threshold
    }
}

#[derive(Debug)]
struct Inner {
    routes: Vec<RouteState>,
    active: usize,
    pinned: bool,
    expected_cluster_id: Option<String>,
    configured_cluster_id: bool,
    last_switch: Option<Instant>,
    generation: u64,
    no_route_alarmed: bool,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    tx: watch::Sender<Arc<ActiveRoute>>,
    events: EventBus,
    health: crate::config::HealthConfig,
}

/// A cheap handle to the Egress, for the consumer, the monitor and the pipeline.
#[derive(Debug, Clone)]
pub struct EgressHandle {
    shared: Arc<Shared>,
}

/// Builds the per-route client config from the source section.
pub fn route_client_config(source: &SourceConfig, route: &Route, compression: bool) -> ClientConfig {
    let mut cfg = ClientConfig::new(route.brokers.clone());
    cfg.bind = route.bind;
    cfg.token = source.token.as_ref().map(|t| t.expose().to_owned());
    cfg.tls = source.tls.as_ref().map(|t| ferry_client::TlsOptions {
        ca_file: t.ca_file.clone(),
        cert_file: t.cert_file.clone(),
        key_file: t.key_file.clone(),
        domain: t.domain.clone(),
    });
    cfg.compression = compression;
    // The fetch stream carries every partition; its HTTP/2 window must never be what limits a long link (at a 50 ms
    // RTT, 16 MiB caps the stream near 300 MB/s). Memory stays bounded by the per-partition byte credits, which
    // the broker honours before HTTP/2 flow control comes into play.
    cfg.stream_window_bytes = 256 << 20;
    cfg.connection_window_bytes = 512 << 20;
    // Detect a dead link within a few probe periods rather than the 20 s client default.
    let h = &source.health;
    cfg.keepalive_interval = h.check_interval.max(Duration::from_millis(500));
    cfg.keepalive_timeout = (h.timeout * h.failure_threshold.max(1)).max(Duration::from_secs(1));
    cfg.connect_timeout = h.timeout.max(Duration::from_millis(200)) * 2;
    cfg
}

impl EgressHandle {
    /// Builds the routes (clients are created lazily; nothing connects yet). The first route is active.
    pub fn new(
        source: &SourceConfig,
        factory: RouteFactory<'_>,
        learned_cluster_id: Option<String>,
        events: EventBus,
    ) -> Result<EgressHandle, ClientError> {
        let mut routes = Vec::new();
        for r in &source.routes {
            routes.push(RouteState {
                name: r.name.clone(),
                brokers: r.brokers.clone(),
                bind: r.bind,
                endpoint: factory(r)?,
                healthy: false,
                available: true,
                failures: 0,
                stream_failures: 0,
                cluster_id: None,
                last_error: None,
                last_probe: None,
                unavailable_since: None,
                ever_healthy: false,
                misconfig_alarmed: false,
            });
        }
        let first = routes[0].active(0);
        let (tx, _) = watch::channel(Arc::new(first));
        let configured = source.cluster_id.is_some();
        let inner = Inner {
            routes,
            active: 0,
            pinned: false,
            expected_cluster_id: source.cluster_id.clone().or(learned_cluster_id),
            configured_cluster_id: configured,
            last_switch: None,
            generation: 0,
            no_route_alarmed: false,
        };
        Ok(EgressHandle {
            shared: Arc::new(Shared { inner: Mutex::new(inner), tx, events, health: source.health.clone() }),
        })
    }

    /// Watches the active route.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ActiveRoute>> {
        self.shared.tx.subscribe()
    }

    /// The active route now.
    pub fn active(&self) -> Arc<ActiveRoute> {
        self.shared.tx.borrow().clone()
    }

    /// The source cluster id every route must report, once known.
    pub fn expected_cluster_id(&self) -> Option<String> {
        self.shared.inner.lock().expected_cluster_id.clone()
    }

    /// A fetch-stream failure on `route` (counts toward its failure threshold).
    pub fn report_failure(&self, route: &str, reason: &str) {
        let mut inner = self.shared.inner.lock();
        let threshold = self.shared.health.failure_threshold;
        let Some(i) = inner.routes.iter().position(|r| r.name == route) else { return };
        let r = &mut inner.routes[i];
        r.stream_failures += 1;
        r.last_error = Some(reason.to_owned());
        let newly_failing = r.stream_failures == threshold && r.failures < threshold;
        if newly_failing {
            self.mark_unavailable(&mut inner, i, reason);
        }
        self.evaluate(&mut inner);
    }

    /// The active route's stream delivered again.
    pub fn report_success(&self, route: &str) {
        let mut inner = self.shared.inner.lock();
        if let Some(r) = inner.routes.iter_mut().find(|r| r.name == route) {
            r.stream_failures = 0;
        }
    }

    /// A manual switch: pins the route. Refused for an unknown route, and for an unhealthy one unless forced.
    pub fn switch(&self, route: &str, force: bool) -> Result<(), SwitchError> {
        let mut inner = self.shared.inner.lock();
        let Some(i) = inner.routes.iter().position(|r| r.name == route) else {
            return Err(SwitchError::UnknownRoute(route.to_owned()));
        };
        let r = &inner.routes[i];
        // No route into another cluster is ever used, forced or not.
        match (&inner.expected_cluster_id, &r.cluster_id) {
            (Some(expected), Some(id)) if id != expected => {
                return Err(SwitchError::WrongCluster {
                    route: route.to_owned(),
                    reason: format!("it leads to cluster {id:?}, not the source cluster {expected:?}"),
                });
            }
            (None, _) if i != inner.active && !r.ever_healthy => {
                return Err(SwitchError::WrongCluster {
                    route: route.to_owned(),
                    reason: "the source cluster's id is not known yet and this route was never verified to lead \
                             to it (set source.cluster_id, or let the active route answer first)"
                        .to_owned(),
                });
            }
            _ => {}
        }
        if !r.healthy && !force {
            let reason = r.last_error.clone().unwrap_or_else(|| "not probed successfully yet".into());
            return Err(SwitchError::RouteUnhealthy { route: route.to_owned(), reason });
        }
        inner.pinned = true;
        if inner.active != i {
            self.switch_to(&mut inner, i, "manual switch by an operator");
        }
        Ok(())
    }

    /// Why `route` must not be fetched from now: it reported another cluster's id than the source's.
    pub fn leads_elsewhere(&self, route: &str) -> Option<String> {
        let inner = self.shared.inner.lock();
        let r = inner.routes.iter().find(|r| r.name == route)?;
        match (&inner.expected_cluster_id, &r.cluster_id) {
            (Some(expected), Some(id)) if id != expected => {
                Some(format!("route {route:?} leads to cluster {id:?}, not the source cluster {expected:?}"))
            }
            _ => None,
        }
    }

    /// Removes the pin of a manual switch; automatic switching applies again.
    pub fn unpin(&self) {
        let mut inner = self.shared.inner.lock();
        inner.pinned = false;
        self.evaluate(&mut inner);
    }

    /// The monitor's view.
    pub fn view(&self) -> EgressView {
        let inner = self.shared.inner.lock();
        EgressView {
            active: inner.routes[inner.active].name.clone(),
            pinned: inner.pinned,
            expected_cluster_id: inner.expected_cluster_id.clone(),
            routes: inner
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| RouteView {
                    name: r.name.clone(),
                    brokers: r.brokers.clone(),
                    bind: r.bind.map(|b| b.to_string()),
                    active: i == inner.active,
                    healthy: r.healthy,
                    available: r.available,
                    consecutive_failures: r.failures,
                    stream_failures: r.stream_failures,
                    cluster_id: r.cluster_id.clone(),
                    last_error: r.last_error.clone(),
                    last_probe_ms_ago: r.last_probe.map(|t| t.elapsed().as_millis() as u64),
                })
                .collect(),
        }
    }

    fn mark_unavailable(&self, inner: &mut Inner, i: usize, reason: &str) {
        let r = &mut inner.routes[i];
        if r.available {
            r.available = false;
            r.unavailable_since = Some(Instant::now());
            self.shared.events.emit(
                Event::new(
                    EventKind::SourceNetNotAvailable,
                    format!(
                        "source route {:?} failed {} times in a row: {reason}",
                        r.name, self.shared.health.failure_threshold
                    ),
                )
                .route(&r.name)
                .with(Details::Route(RouteFacts {
                    reason: Some(reason.to_string()),
                    brokers: Some(r.brokers.join(",")),
                    active: None,
                })),
            );
        }
    }

    fn switch_to(&self, inner: &mut Inner, to: usize, reason: &str) {
        let from = inner.active;
        // Stream failures only describe the active route; the route we leave is judged by its probes from now on.
        inner.routes[from].stream_failures = 0;
        inner.active = to;
        inner.generation += 1;
        inner.last_switch = Some(Instant::now());
        let route = &inner.routes[to];
        self.shared.tx.send_replace(Arc::new(route.active(inner.generation)));
        let (from_name, to_name) = (inner.routes[from].name.clone(), route.name.clone());
        self.shared.events.emit(
            Event::new(
                EventKind::SourceNetBeSwitched,
                format!("switched source route {from_name:?} -> {to_name:?}: {reason}"),
            )
            .route(&to_name)
            .with(Details::Switch(SwitchFacts { from: from_name, to: to_name, reason: reason.to_owned() })),
        );
    }

    /// Decides on automatic switches after a probe round or a reported failure.
    fn evaluate(&self, inner: &mut Inner) {
        if inner.pinned {
            return;
        }
        let h = &self.shared.health;
        let spaced = inner.last_switch.is_none_or(|t| t.elapsed() >= h.min_switch_interval);
        let active = inner.active;
        let a = &inner.routes[active];
        if a.failing(h.failure_threshold) {
            let long_enough = a.unavailable_since.is_some_and(|t| t.elapsed() >= h.switch_after);
            if !long_enough || !spaced {
                return;
            }
            let reason = format!(
                "route {:?} unavailable for {}: {}",
                a.name,
                humantime::format_duration(Duration::from_secs(
                    a.unavailable_since.map_or(0, |t| t.elapsed().as_secs())
                )),
                a.last_error.clone().unwrap_or_default()
            );
            match inner.routes.iter().position(|r| r.healthy && !r.failing(h.failure_threshold)) {
                Some(to) if to != active => {
                    inner.no_route_alarmed = false;
                    self.switch_to(inner, to, &reason);
                }
                _ => {
                    if !inner.no_route_alarmed {
                        inner.no_route_alarmed = true;
                        self.shared.events.emit(
                            Event::new(
                                EventKind::SourceNetNotAvailable,
                                format!("no healthy source route to switch to; staying on {:?}", a.name),
                            )
                            .route("*")
                            .with(Details::Route(RouteFacts { active: Some(a.name.clone()), ..Default::default() })),
                        );
                    }
                }
            }
        } else if h.switch_back == SwitchBack::Auto && active != 0 && spaced {
            let primary = &inner.routes[0];
            if primary.healthy && !primary.failing(h.failure_threshold) {
                self.switch_to(inner, 0, "the primary route recovered (switch_back = auto)");
            }
        }
    }

    /// Records one probe result.
    fn probe_result(&self, i: usize, result: Result<String, String>) {
        let mut inner = self.shared.inner.lock();
        let threshold = self.shared.health.failure_threshold;
        // Learn the source cluster id only from the active route (the primary at start): a backup that answers
        // first while the primary is briefly down must not teach the mirror a foreign cluster's id.
        if let Ok(id) = &result
            && inner.expected_cluster_id.is_none()
            && i == inner.active
        {
            tracing::info!(route = %inner.routes[i].name, cluster_id = %id, "learned the source cluster id from the active route");
            inner.expected_cluster_id = Some(id.clone());
        }
        let expected = inner.expected_cluster_id.clone();
        let configured = inner.configured_cluster_id;
        let outcome = match result {
            Ok(id) if expected.as_deref() == Some(id.as_str()) => Ok(id),
            // Until the source cluster's id is known, no other route can be trusted to lead to it.
            // It answered: not a fault of the route itself, so no misconfiguration alarm for it.
            Ok(id) if expected.is_none() => Err((
                Some(id),
                "the source cluster id is not known yet (set source.cluster_id, or let the active route answer first)"
                    .to_owned(),
                false,
            )),
            Ok(id) => Err((
                Some(id.clone()),
                format!(
                    "leads to cluster {id:?}, not the source cluster {:?}{}",
                    expected.unwrap_or_default(),
                    if configured { " (source.cluster_id)" } else { "" }
                ),
                true,
            )),
            Err(e) => Err((None, e, true)),
        };
        let r = &mut inner.routes[i];
        r.last_probe = Some(Instant::now());
        match outcome {
            Ok(id) => {
                r.cluster_id = Some(id);
                r.healthy = true;
                r.ever_healthy = true;
                r.failures = 0;
                r.last_error = None;
                if !r.available && r.stream_failures < threshold {
                    r.available = true;
                    r.unavailable_since = None;
                    let name = r.name.clone();
                    self.shared.events.emit(
                        Event::new(EventKind::SourceNetRecovered, format!("source route {name:?} is healthy again"))
                            .route(&name),
                    );
                }
            }
            Err((id, reason, route_fault)) => {
                if id.is_some() {
                    r.cluster_id = id;
                }
                r.healthy = false;
                r.failures = r.failures.saturating_add(1);
                r.last_error = Some(reason.clone());
                if r.failures == threshold {
                    // A route that never worked since the start is most likely misconfigured (a wrong address, an
                    // endpoint of another kind, credentials): say so once, besides the availability alarm.
                    if route_fault && !r.ever_healthy && !r.misconfig_alarmed {
                        r.misconfig_alarmed = true;
                        let (name, brokers) = (r.name.clone(), r.brokers.join(","));
                        self.shared.events.emit(
                            Event::new(
                                EventKind::SyncError,
                                format!(
                                    "source route {name:?} ({brokers}) has not reached the source cluster since the \
                                     mirror started: {reason}"
                                ),
                            )
                            .route(&name)
                            .with(Details::Route(RouteFacts {
                                reason: Some(reason.clone()),
                                brokers: Some(brokers),
                                active: None,
                            })),
                        );
                    }
                    self.mark_unavailable(&mut inner, i, &reason);
                }
            }
        }
    }

    /// Probes every route every `check_interval` until `shutdown`.
    pub async fn run(self, metrics: crate::metrics::Metrics, shutdown: CancellationToken) {
        let h = self.shared.health.clone();
        let mut tick = tokio::time::interval(h.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let clusters: Vec<Arc<dyn SourceCluster>> =
                self.shared.inner.lock().routes.iter().map(|r| Arc::clone(&r.endpoint.cluster)).collect();
            let probes = clusters.into_iter().map(|c| async move {
                match c.probe(h.timeout).await {
                    Ok(cluster_id) => Ok(cluster_id),
                    Err(e) => {
                        // Drop a possibly dead connection so the next probe dials afresh.
                        c.reconnect();
                        Err(e.to_string())
                    }
                }
            });
            let results = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = futures::future::join_all(probes) => r,
            };
            for (i, r) in results.into_iter().enumerate() {
                self.probe_result(i, r);
            }
            let mut inner = self.shared.inner.lock();
            self.evaluate(&mut inner);
            for (i, r) in inner.routes.iter().enumerate() {
                metrics.route(&r.name, i == inner.active, r.healthy);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClusterKind, HealthConfig, Route};
    use crate::metrics::Metrics;

    fn source(threshold: u32, switch_back: SwitchBack) -> SourceConfig {
        SourceConfig {
            cluster: "dc-a".into(),
            cluster_id: Some("A".into()),
            kind: ClusterKind::Ferry,
            token_file: None,
            token: None,
            tls: None,
            routes: vec![
                Route { name: "primary".into(), brokers: vec!["127.0.0.1:1".into()], bind: None },
                Route { name: "backup".into(), brokers: vec!["127.0.0.1:2".into()], bind: None },
            ],
            health: HealthConfig {
                check_interval: Duration::from_millis(100),
                timeout: Duration::from_millis(100),
                failure_threshold: threshold,
                switch_after: Duration::ZERO,
                switch_back,
                min_switch_interval: Duration::ZERO,
            },
            kafka: Default::default(),
        }
    }

    fn kinds(bus: &EventBus) -> Vec<EventKind> {
        bus.recent().iter().map(|e| e.kind).collect()
    }

    #[tokio::test]
    async fn fails_over_after_threshold_and_only_to_the_right_cluster() {
        let bus = EventBus::new(Metrics::new());
        let e = EgressHandle::new(
            &source(2, SwitchBack::Manual),
            &ferry_routes(&source(2, SwitchBack::Manual), false),
            None,
            bus.clone(),
        )
        .unwrap();
        // The primary worked once; the backup leads to another cluster: never used.
        e.probe_result(0, Ok("A".into()));
        e.probe_result(1, Ok("B".into()));
        e.probe_result(0, Err("refused".into()));
        e.probe_result(0, Err("refused".into()));
        e.evaluate(&mut e.shared.inner.lock());
        assert_eq!(e.active().name, "primary");
        assert!(e.view().routes[1].last_error.as_deref().unwrap().contains("not the source cluster"));
        // Now the backup reports the right id: switch.
        e.probe_result(1, Ok("A".into()));
        e.evaluate(&mut e.shared.inner.lock());
        assert_eq!(e.active().name, "backup");
        assert_eq!(
            kinds(&bus),
            vec![EventKind::SourceNetNotAvailable, EventKind::SourceNetNotAvailable, EventKind::SourceNetBeSwitched]
        );
        // Primary recovers: notice, but manual switch-back stays on backup.
        e.probe_result(0, Ok("A".into()));
        e.evaluate(&mut e.shared.inner.lock());
        assert_eq!(e.active().name, "backup");
        assert_eq!(*kinds(&bus).last().unwrap(), EventKind::SourceNetRecovered);
    }

    #[tokio::test]
    async fn the_cluster_id_is_learned_from_the_active_route_only() {
        let bus = EventBus::new(Metrics::new());
        let mut cfg = source(1, SwitchBack::Manual);
        cfg.cluster_id = None;
        let e = EgressHandle::new(&cfg, &ferry_routes(&cfg, false), None, bus.clone()).unwrap();
        // The primary is down at the first round and a backup answers with another cluster's id: not learned,
        // and the backup is not healthy.
        e.probe_result(0, Err("refused".into()));
        e.probe_result(1, Ok("X".into()));
        assert_eq!(e.expected_cluster_id(), None);
        assert!(!e.view().routes[1].healthy);
        e.evaluate(&mut e.shared.inner.lock());
        assert_eq!(e.active().name, "primary", "never switch into an unverified cluster");
        // The primary answers: its id is the source's; the backup is judged against it.
        e.probe_result(0, Ok("A".into()));
        e.probe_result(1, Ok("X".into()));
        assert_eq!(e.expected_cluster_id().as_deref(), Some("A"));
        assert!(!e.view().routes[1].healthy);
        e.probe_result(1, Ok("A".into()));
        assert!(e.view().routes[1].healthy);
        // The primary failed its threshold (1) before it ever worked: a misconfiguration alarm, once.
        let syncs = bus.recent().iter().filter(|ev| ev.kind == EventKind::SyncError).count();
        assert_eq!(syncs, 1);
        assert!(
            bus.recent().iter().any(|ev| ev.kind == EventKind::SyncError && ev.message.contains("has not reached"))
        );
    }

    #[tokio::test]
    async fn no_switch_forced_or_not_leads_into_another_cluster() {
        let bus = EventBus::new(Metrics::new());
        let mut cfg = source(1, SwitchBack::Manual);
        cfg.cluster_id = None;
        let e = EgressHandle::new(&cfg, &ferry_routes(&cfg, false), None, bus).unwrap();
        // The source's id is not known yet: a route never verified is refused, forced or not.
        e.probe_result(1, Ok("X".into()));
        assert!(matches!(e.switch("backup", true), Err(SwitchError::WrongCluster { .. })));
        // Known now: a route reporting another id is refused even when forced, and never fetched from.
        e.probe_result(0, Ok("A".into()));
        e.probe_result(1, Ok("X".into()));
        match e.switch("backup", true) {
            Err(SwitchError::WrongCluster { route, reason }) => {
                assert_eq!(route, "backup");
                assert!(reason.contains("\"X\"") && reason.contains("\"A\""), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((e.active().name.as_str(), e.view().pinned), ("primary", false));
        assert!(e.leads_elsewhere("backup").is_some_and(|r| r.contains("\"X\"")));
        assert_eq!(e.leads_elsewhere("primary"), None);
        // Once it leads to the source, a forced switch to it is taken.
        e.probe_result(1, Ok("A".into()));
        e.switch("backup", true).unwrap();
        assert_eq!(e.active().name, "backup");
    }

    #[tokio::test]
    async fn manual_switch_pins_and_checks() {
        let bus = EventBus::new(Metrics::new());
        let e = EgressHandle::new(
            &source(1, SwitchBack::Auto),
            &ferry_routes(&source(1, SwitchBack::Auto), false),
            None,
            bus,
        )
        .unwrap();
        assert_eq!(e.switch("nope", false), Err(SwitchError::UnknownRoute("nope".into())));
        assert!(matches!(e.switch("backup", false), Err(SwitchError::RouteUnhealthy { .. })));
        e.probe_result(1, Ok("A".into()));
        e.switch("backup", false).unwrap();
        assert_eq!(e.active().name, "backup");
        assert!(e.view().pinned);
        // Pinned: a healthy primary with auto switch-back does not move it.
        e.probe_result(0, Ok("A".into()));
        e.evaluate(&mut e.shared.inner.lock());
        assert_eq!(e.active().name, "backup");
        e.unpin();
        assert_eq!(e.active().name, "primary");
    }

    #[tokio::test]
    async fn stream_failures_count_even_while_probes_pass() {
        let bus = EventBus::new(Metrics::new());
        let e = EgressHandle::new(
            &source(2, SwitchBack::Manual),
            &ferry_routes(&source(2, SwitchBack::Manual), false),
            None,
            bus,
        )
        .unwrap();
        e.probe_result(0, Ok("A".into()));
        e.probe_result(1, Ok("A".into()));
        e.report_failure("primary", "stream silent");
        e.probe_result(0, Ok("A".into()));
        e.report_failure("primary", "stream silent");
        assert_eq!(e.active().name, "backup");
    }
}
