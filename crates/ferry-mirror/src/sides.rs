//! Builds the two sides of the mirror for the configured kinds: the target cluster, the factory of source
//! routes, and the fetch sessions that feed the lanes.

use std::sync::Arc;

use ferry_client::{BrokerClient, ClientConfig, ClientError};

use crate::cluster::TargetCluster;
use crate::cluster::ferry::FerryTarget;
use crate::config::{ClusterKind, MirrorConfig, Route};
use crate::egress::{EgressHandle, RouteEndpoint};
use crate::fetch::SessionFactory;
use crate::fetch::ferry::{FerrySession, FerrySessionSettings};
use crate::metrics::Metrics;
use crate::state::Shared;

/// The client settings of a Ferry target.
fn target_client_config(config: &MirrorConfig) -> ClientConfig {
    let t = &config.target;
    let mut cfg = ClientConfig::new(t.brokers.clone());
    cfg.token = t.token.as_ref().map(|s| s.expose().to_owned());
    cfg.tls = t.tls.as_ref().map(|f| ferry_client::TlsOptions {
        ca_file: f.ca_file.clone(),
        cert_file: f.cert_file.clone(),
        key_file: f.key_file.clone(),
        domain: f.domain.clone(),
    });
    // The target is local: fail fast and retry rather than wait out long timeouts.
    cfg.request_timeout = std::time::Duration::from_secs(10);
    cfg.keepalive_interval = std::time::Duration::from_secs(2);
    cfg.keepalive_timeout = std::time::Duration::from_secs(5);
    cfg
}

/// The target cluster of the configured kind.
pub fn target(config: &MirrorConfig) -> Result<Arc<dyn TargetCluster>, ClientError> {
    match config.target.kind {
        ClusterKind::Ferry => Ok(Arc::new(
            FerryTarget::new(BrokerClient::new(target_client_config(config))?).with_decode_limit(decode_limit(config)),
        )),
        ClusterKind::Kafka => kafka_target(config),
    }
}

/// The decode limit of batches the mirror decodes, before the target's `max_batch_bytes` is known (the lanes use
/// the larger of both, see `reshape::decode_limit`).
fn decode_limit(config: &MirrorConfig) -> usize {
    crate::reshape::decode_limit(config.sync.queue_bytes, 0)
}

/// Builds one source route's endpoint for the configured kind.
pub fn source_route(config: &MirrorConfig, route: &Route) -> Result<RouteEndpoint, ClientError> {
    match config.source.kind {
        ClusterKind::Ferry => {
            crate::egress::ferry_routes(&config.source, config.sync.compression, decode_limit(config))(route)
        }
        ClusterKind::Kafka => kafka_route(config, route),
    }
}

/// The fetch sessions of the configured source kind.
pub fn session_factory(
    config: &MirrorConfig,
    egress: EgressHandle,
    metrics: Metrics,
    shared: Arc<Shared>,
) -> SessionFactory {
    let settings =
        FerrySessionSettings { heartbeat: config.sync.position_heartbeat, ..FerrySessionSettings::default() };
    match config.source.kind {
        ClusterKind::Ferry => Box::new(move || {
            Box::new(FerrySession::new(settings.clone(), egress.clone(), metrics.clone(), Arc::clone(&shared)))
        }),
        ClusterKind::Kafka => kafka_sessions(config, egress, metrics, shared),
    }
}

#[cfg(not(feature = "kafka"))]
fn no_kafka<T>() -> Result<T, ClientError> {
    Err(ClientError::Config {
        field: "kind",
        message: "this ferry-mirror was built without the kafka feature; rebuild with --features kafka".into(),
    })
}

#[cfg(not(feature = "kafka"))]
fn kafka_target(_: &MirrorConfig) -> Result<Arc<dyn TargetCluster>, ClientError> {
    no_kafka()
}

#[cfg(not(feature = "kafka"))]
fn kafka_route(_: &MirrorConfig, _: &Route) -> Result<RouteEndpoint, ClientError> {
    no_kafka()
}

#[cfg(not(feature = "kafka"))]
fn kafka_sessions(_: &MirrorConfig, _: EgressHandle, _: Metrics, _: Arc<Shared>) -> SessionFactory {
    unreachable!("a Kafka source is refused when the source route is built, before any session")
}

#[cfg(feature = "kafka")]
fn kafka_target(config: &MirrorConfig) -> Result<Arc<dyn TargetCluster>, ClientError> {
    let mut options = crate::kafka::KafkaTargetOptions::new(
        config.target.brokers.clone(),
        config.target.kafka.clone(),
        &config.name,
        &config.source.cluster,
        config.topics.rename,
    );
    options.decode_limit = decode_limit(config);
    Ok(Arc::new(crate::kafka::KafkaTarget::new(options)?))
}

#[cfg(feature = "kafka")]
fn kafka_route(config: &MirrorConfig, route: &Route) -> Result<RouteEndpoint, ClientError> {
    let source = crate::kafka::KafkaSource::new(route.brokers.clone(), config.source.kafka.clone(), &config.name)?;
    Ok(RouteEndpoint { cluster: Arc::new(source), client: None })
}

#[cfg(feature = "kafka")]
fn kafka_sessions(
    config: &MirrorConfig,
    egress: EgressHandle,
    metrics: Metrics,
    shared: Arc<Shared>,
) -> SessionFactory {
    let settings = crate::kafka::KafkaConsumerSettings::new(&config.name, config.source.kafka.clone());
    Box::new(move || {
        Box::new(crate::kafka::KafkaSession::new(
            settings.clone(),
            Arc::new(egress.clone()),
            metrics.clone(),
            Arc::clone(&shared),
        ))
    })
}
