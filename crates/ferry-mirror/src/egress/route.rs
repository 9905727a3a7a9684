//! The routes themselves: what each one connects through (its [`RouteEndpoint`], built once by a
//! [`RouteFactory`]), the client settings derived from the source section, and the per-route state the health
//! checks and switching decisions update.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_client::{BrokerClient, ClientConfig, ClientError};

use super::ActiveRoute;
use crate::cluster::SourceCluster;
use crate::cluster::ferry::FerrySource;
use crate::config::{Route, SourceConfig};

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

/// The route factory for Ferry sources. `decode_limit` bounds the batches the source side decodes (tail checks).
pub fn ferry_routes(
    source: &SourceConfig,
    compression: bool,
    decode_limit: usize,
) -> impl Fn(&Route) -> Result<RouteEndpoint, ClientError> + '_ {
    move |r| {
        let client = BrokerClient::new(route_client_config(source, r, compression))?;
        let cluster = FerrySource::new(client.clone()).with_decode_limit(decode_limit);
        Ok(RouteEndpoint { cluster: Arc::new(cluster), client: Some(client) })
    }
}

/// Builds the per-route client config from the source section.
pub fn route_client_config(source: &SourceConfig, route: &Route, compression: bool) -> ClientConfig {
    let mut cfg = ClientConfig::new(route.brokers.clone());
    cfg.bind = route.bind;
    cfg.listener = route.listener.clone();
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

/// One route's configuration, endpoint and health as the egress tracks it.
#[derive(Debug)]
pub(super) struct RouteState {
    pub(super) name: String,
    pub(super) brokers: Vec<String>,
    pub(super) bind: Option<std::net::IpAddr>,
    pub(super) endpoint: RouteEndpoint,
    pub(super) healthy: bool,
    pub(super) available: bool,
    pub(super) failures: u32,
    pub(super) stream_failures: u32,
    pub(super) cluster_id: Option<String>,
    pub(super) last_error: Option<String>,
    pub(super) last_probe: Option<Instant>,
    pub(super) unavailable_since: Option<Instant>,
    /// Whether the route ever passed a probe since the mirror started.
    pub(super) ever_healthy: bool,
    /// Whether the "never reached the source" sync_error was raised.
    pub(super) misconfig_alarmed: bool,
}

impl RouteState {
    /// The route as the pipeline sees it once it is active, at switch `generation`.
    pub(super) fn active(&self, generation: u64) -> ActiveRoute {
        ActiveRoute {
            name: self.name.clone(),
            generation,
            brokers: self.brokers.clone(),
            bind: self.bind,
            cluster: Arc::clone(&self.endpoint.cluster),
            client: self.endpoint.client.clone(),
        }
    }

    /// Whether probes or the fetch stream failed `threshold` times in a row.
    pub(super) fn failing(&self, threshold: u32) -> bool {
        self.failures >= threshold || self.stream_failures >= threshold
    }
}
