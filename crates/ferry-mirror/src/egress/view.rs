//! The monitor's view of the egress: the `/api/v1/egress` document and one entry per route.

use serde::{Deserialize, Serialize};

use super::EgressHandle;

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

impl EgressHandle {
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
}
