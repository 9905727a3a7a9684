//! `[metrics]`: the broker's Prometheus endpoint (docs/broker.md, "Metrics").

use std::net::SocketAddr;

use serde::Deserialize;

/// `[metrics]`: where the broker serves `GET /metrics` in the Prometheus text format.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Whether to serve metrics at all.
    pub enabled: bool,
    /// The address to serve them on. Two brokers on one host need two ports.
    pub listen: SocketAddr,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection { enabled: true, listen: SocketAddr::from(([127, 0, 0, 1], 9400)) }
    }
}
