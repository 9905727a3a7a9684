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
//!
//! This module holds the handle and its shared state; `route` the routes and their endpoints, `health` the probes
//! and failure counting, `switching` the failover and manual-switch decisions, `view` the monitor's document.

mod health;
mod route;
mod switching;
mod view;

use std::sync::Arc;
use std::time::Instant;

use ferry_client::{BrokerClient, ClientError};
use parking_lot::Mutex;
use tokio::sync::watch;

use self::route::RouteState;
pub use self::route::{RouteEndpoint, RouteFactory, ferry_routes, route_client_config};
pub use self::switching::SwitchError;
pub use self::view::{EgressView, RouteView};
use crate::cluster::SourceCluster;
use crate::config::SourceConfig;
use crate::events::EventBus;

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
}

#[cfg(test)]
pub(crate) mod tests;
