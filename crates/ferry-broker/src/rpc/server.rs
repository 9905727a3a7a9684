//! Running a broker: open the data dir, start the gRPC listener (with health service, optional TLS and bearer
//! scoped tokens, message limits derived from `max_batch_bytes`, zstd accepted), run the background duties (async flush,
//! retention, group session expiry), and on shutdown stop serving, then flush and close every log so the next start
//! is a clean one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::broker_server::BrokerServer;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::cluster::manager::Replication;
use crate::config::BrokerConfig;
use crate::groups::GroupCoordinator;
use crate::node::registry::BrokerCore;
use crate::rpc::service::BrokerService;

/// HTTP/2 windows sized for WAN links: a 50 ms RTT at 1 Gbit/s needs ~6 MiB in flight per stream.
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;
/// Largest HTTP/2 frame a client may send (the protocol's default is 16 KiB): a 1 MiB produce or mirror append
/// then crosses in a frame or two instead of 64, each parsed, woken for and handed to the gRPC decoder apart.
const MAX_FRAME: u32 = 1024 * 1024;

/// Why the broker could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Config problem (token file, TLS files).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Opening the data dir failed.
    #[error(transparent)]
    Broker(#[from] crate::error::BrokerError),
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A TLS file could not be read or used.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The links to the other members could not be set up (`cluster.token_file`, `cluster.tls_ca_file`).
    #[error(transparent)]
    Peers(#[from] crate::cluster::peers::PeerError),
    /// The cluster refused this broker, or its etcd could not be reached.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::membership::ClusterError),
    /// The metrics listener could not bind.
    #[error(
        "cannot serve metrics on {addr} (metrics.listen): {source}; give each broker on a host its own port, or set \
         metrics.enabled = false"
    )]
    MetricsBind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The Kafka listener could not start.
    #[error("kafka listener: {0}")]
    Kafka(String),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// Writing the address file failed.
    #[error("cannot write the address file {path}: {source}")]
    AddrFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn tls_config(cfg: &crate::config::TlsSection) -> Result<ServerTlsConfig, ServerError> {
    let read =
        |p: &PathBuf| std::fs::read(p).map_err(|e| ServerError::Tls(format!("cannot read {}: {e}", p.display())));
    let identity = Identity::from_pem(read(&cfg.cert_file)?, read(&cfg.key_file)?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &cfg.client_ca_file {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    Ok(tls)
}

/// Options that only the process knows (not config keys).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Write the bound listener address here once serving (for supervisors and tests).
    pub addr_file: Option<PathBuf>,
    /// The file layer under the data dir; `None` is the real file system. Tests pass a simulated one to cut the
    /// power under a running broker.
    pub fs: Option<ferry_storage::fs::FsRef>,
}

/// A started broker, for embedding (the demo, tests): its bound address and cluster id.
#[derive(Debug, Clone)]
pub struct Started {
    /// The bound gRPC address.
    pub addr: SocketAddr,
    /// The cluster id.
    pub cluster_id: String,
    /// The bound Kafka listener address (`[kafka] listen`), when it runs.
    pub kafka_addr: Option<SocketAddr>,
}

/// Runs the broker until `shutdown` is cancelled, then shuts down cleanly. `on_started` is told the bound address
/// once the listener is up.
pub async fn run(
    config: BrokerConfig,
    options: RunOptions,
    shutdown: CancellationToken,
    on_started: impl FnOnce(Started) + Send,
) -> Result<(), ServerError> {
    let auth = crate::rpc::auth::Authorizer::from_config(&config)?;
    let tls = config.broker.tls.as_ref().map(tls_config).transpose()?;
    let peer_links = crate::cluster::peers::PeerLinks::from_config(&config)?;
    let data_dir = config.broker.data_dir.clone();
    let defaults = config.default_log_config();
    let cluster = config.broker.cluster_id.clone();
    let groups_cfg = config.groups.clone();
    let limits = config.limits.core_limits();
    let producers = config.producer_settings();
    let fs = options.fs.clone().unwrap_or_else(ferry_storage::fs::os);
    let member = config.cluster.enabled().then(|| config.cluster.broker_id.unwrap_or(0));
    let offsets_partitions = config.groups.offsets_partitions;
    let (core, groups) = tokio::task::spawn_blocking(move || -> Result<_, crate::error::BrokerError> {
        let core = BrokerCore::open_as(fs.clone(), &data_dir, cluster.as_deref(), defaults, producers, member)?
            .with_limits(limits);
        let (min, max) = (groups_cfg.min_session_timeout, groups_cfg.max_session_timeout);
        // A cluster member's committed offsets live in the cluster's replicated offsets partitions.
        let groups = match member {
            Some(_) => GroupCoordinator::for_cluster(min, max, offsets_partitions),
            None => GroupCoordinator::open(fs, &data_dir, min, max)?,
        }
        .with_limits(groups_cfg.group_limits());
        // Offsets of topics that no longer exist (a deletion interrupted before its offsets were dropped).
        let dropped = groups.forget_topics(&|t| core.topic(t).is_err())?;
        if dropped > 0 {
            tracing::info!(dropped, "dropped committed offsets of deleted topics");
        }
        Ok((core, groups))
    })
    .await
    .map_err(|e| crate::error::BrokerError::Internal(e.to_string()))??;
    let core = Arc::new(core);
    let groups = Arc::new(groups);

    let listener = tokio::net::TcpListener::bind(config.broker.listen)
        .await
        .map_err(|source| ServerError::Bind { addr: config.broker.listen, source })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Bind { addr: config.broker.listen, source })?;
    let advertised = config.broker.advertised_address.clone().unwrap_or_else(|| addr.to_string());
    // Named listeners: bound now, so that their addresses are registered with the membership.
    let mut named = Vec::new();
    let mut named_addrs = std::collections::BTreeMap::new();
    for l in &config.cluster.listeners {
        let bound =
            tokio::net::TcpListener::bind(l.addr).await.map_err(|source| ServerError::Bind { addr: l.addr, source })?;
        let local = bound.local_addr().map_err(|source| ServerError::Bind { addr: l.addr, source })?;
        named_addrs.insert(l.name.clone(), l.advertised.clone().unwrap_or_else(|| local.to_string()));
        tracing::info!(listener = %l.name, addr = %local, "named listener bound");
        named.push(bound);
    }
    // The Kafka listener: bound now too, so that a member registers its Kafka address with its named listeners.
    let kafka_bound = match crate::rpc::kafka::bind(&config.kafka).await {
        Ok(b) => b,
        Err(e) => {
            let closing = Arc::clone(&core);
            let _ = tokio::task::spawn_blocking(move || closing.close()).await;
            return Err(ServerError::Kafka(e));
        }
    };
    if let (Some(b), true) = (&kafka_bound, config.cluster.enabled()) {
        named_addrs.insert(crate::rpc::kafka::LISTENER_NAME.to_owned(), b.advertised.clone());
    }
    let ready = Arc::new(crate::readiness::Readiness::default());
    let replication_slot: Arc<std::sync::OnceLock<Arc<Replication>>> = Arc::new(std::sync::OnceLock::new());
    let txns_slot: Arc<std::sync::OnceLock<Arc<crate::txn::Transactions>>> = Arc::new(std::sync::OnceLock::new());
    let delays_slot: Arc<std::sync::OnceLock<Arc<crate::delay::Delays>>> = Arc::default();
    let share_gauges = crate::share::gauges::ShareGauges::default();
    let tasks = TaskTracker::new();
    if config.metrics.enabled {
        let at = config.metrics.listen;
        let bound = match tokio::net::TcpListener::bind(at).await {
            Ok(l) => l,
            Err(source) => {
                let closing = Arc::clone(&core);
                let _ = tokio::task::spawn_blocking(move || closing.close()).await;
                return Err(ServerError::MetricsBind { addr: at, source });
            }
        };
        if let Ok(local) = bound.local_addr() {
            tracing::info!(addr = %local, "metrics listening on /metrics");
        }
        let sources =
            crate::metrics::Sources::new(Arc::clone(&core), Arc::clone(&replication_slot), Arc::clone(&ready))
                .with_transactions(Arc::clone(&txns_slot))
                .with_delays(Arc::clone(&delays_slot))
                .with_shares(share_gauges.clone());
        tasks.spawn(crate::metrics::serve(bound, sources, shutdown.clone()));
    }
    // A cluster member registers before it serves, so a broker refused by its cluster never starts serving.
    let members = auth.members();
    let joined = if config.cluster.enabled() {
        let member_addr = config.cluster.advertised_addr.clone().unwrap_or_else(|| advertised.clone());
        // Boxed: the etcd client's futures are large, and this one would otherwise live in every caller's.
        let joining = crate::cluster::startup::join(
            &config.cluster,
            &core,
            &member_addr,
            &named_addrs,
            &members,
            &peer_links,
            &ready,
            &shutdown,
        );
        match Box::pin(joining).await {
            Ok(j) => Some((j, member_addr)),
            Err(e) => {
                abort_start(&shutdown, &tasks, config.broker.shutdown_timeout, &core).await;
                return Err(ServerError::Cluster(e));
            }
        }
    } else {
        None
    };

    let max_message = ferry_proto::max_message_bytes(config.broker.max_batch_bytes.as_u64() as usize);
    let mut service = BrokerService::new(
        Arc::clone(&core),
        Arc::clone(&groups),
        advertised,
        config.broker.max_fetch_wait,
        config.broker.decode_concurrency,
        shutdown.clone(),
    );
    let mut membership = None;
    if let Some((j, member_addr)) = joined {
        let settings = crate::cluster::manager::Settings::of(&config.cluster, max_message, peer_links);
        let me = settings.me;
        // Fresh while its last read of etcd is at most three beats old.
        let serving = crate::cluster::serving::Serving::new(me, member_addr, j.membership.lease(), settings.beat * 3);
        let r = Replication::new(
            settings,
            Arc::clone(&core),
            Arc::clone(&groups),
            j.membership.client(),
            serving,
            j.membership.lease_id(),
        );
        for _ in 0..j.left_isr {
            r.events().note(crate::events::Event::UncleanRestart);
        }
        let catalog = Arc::downgrade(&r);
        groups.set_topic_ids(Box::new(move |name| catalog.upgrade().and_then(|r| r.topic_id(name))));
        tasks.spawn(Arc::clone(&r).run(shutdown.clone()));
        service = service.with_replication(Arc::clone(&r));
        let _ = replication_slot.set(r);
        membership = Some(j.membership);
    }
    // Internal state topics: a single broker's are local topics made now; a cluster's controller makes them.
    if membership.is_none() {
        for t in crate::node::internal::INTERNAL_TOPICS {
            core.ensure_internal(t).await?;
        }
    }
    let state = Arc::new(crate::state::StateLogs::new(Arc::clone(&core), replication_slot.get().cloned()));
    let txns = Arc::new(crate::txn::Transactions::new(
        Arc::clone(&state),
        Arc::clone(&core),
        replication_slot.get().cloned(),
        crate::txn::Settings::of(&config.transactions, config.broker.max_batch_bytes.as_u64()),
    ));
    tasks.spawn(Arc::clone(&txns).run_checks(shutdown.clone()));
    let _ = txns_slot.set(Arc::clone(&txns));
    let delays = crate::delay::start(&state, config.delay.max_delay, config.delay.tick, &tasks, shutdown.clone());
    let _ = delays_slot.set(Arc::clone(&delays));
    service = service.with_state(state).with_transactions(Arc::clone(&txns)).with_delays(delays);
    service = service.with_share_gauges(share_gauges);
    tasks.spawn(service.clone().run_share_tasks(shutdown.clone()));
    // The Kafka listener (`[kafka] listen`) answers through the same service.
    let kafka = kafka_bound.map(|bound| {
        let max_batch = config.broker.max_batch_bytes.as_u64();
        let advertised = bound.advertised.clone();
        crate::rpc::kafka::Kafka::new(service.clone(), &auth, config.kafka.clone(), advertised, max_batch)
            .map(|k| k.on_cluster(replication_slot.get().cloned()))
            .map(|k| crate::rpc::kafka::start(bound, k, &tasks, shutdown.clone()))
            .map_err(|e| e.to_string())
    });
    let kafka_addr = match kafka.transpose() {
        Ok(a) => a,
        Err(e) => {
            abort_start(&shutdown, &tasks, config.broker.shutdown_timeout, &core).await;
            return Err(ServerError::Kafka(e));
        }
    };
    let grpc = BrokerServer::new(service)
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Zstd);
    let grpc = tonic::service::interceptor::InterceptedService::new(grpc, auth);
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<BrokerServer<BrokerService>>().await;

    spawn_duties(&tasks, &core, &groups, &config, shutdown.clone());

    let make_builder = || -> Result<Server, ServerError> {
        let mut builder = Server::builder()
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            // Without it tonic sets no limit at all, overriding hyper's default.
            .max_concurrent_streams(Some(config.limits.max_concurrent_streams))
            .tcp_nodelay(true);
        if let Some(tls) = &tls {
            builder = builder.tls_config(tls.clone()).map_err(|e| ServerError::Tls(e.to_string()))?;
        }
        Ok(builder)
    };
    let mut builder = make_builder()?;
    // Every named listener serves the same service, and stops with the main one.
    for bound in named {
        let stop = shutdown.clone();
        let incoming = TcpIncoming::from(bound).with_nodelay(Some(true));
        let serving = make_builder()?
            .add_service(health_service.clone())
            .add_service(grpc.clone())
            .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await });
        tasks.spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!(error = %e, "a named listener stopped serving");
            }
        });
    }
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tracing::info!(%addr, cluster_id = core.cluster_id(), "ferry-broker listening");
    if let Some(path) = &options.addr_file {
        std::fs::write(path, addr.to_string())
            .map_err(|source| ServerError::AddrFile { path: path.clone(), source })?;
    }
    on_started(Started { addr, cluster_id: core.cluster_id().to_owned(), kafka_addr });
    ready.ready();

    let stop = shutdown.clone();
    let mut server = tokio::spawn(
        builder
            .add_service(health_service)
            .add_service(grpc)
            .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await }),
    );
    let served = tokio::select! {
        r = &mut server => r,
        _ = shutdown.cancelled() => match tokio::time::timeout(config.broker.shutdown_timeout, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!("connections did not close within shutdown_timeout; closing them");
                server.abort();
                Ok(Ok(()))
            }
        },
    };
    let served = served.unwrap_or(Ok(()));
    if let Some(membership) = membership
        && tokio::time::timeout(config.broker.shutdown_timeout, Box::pin(membership.leave())).await.is_err()
    {
        tracing::warn!("leaving the cluster did not finish within shutdown_timeout; the lease expires on its own");
    }
    // Whatever ended serving, stop the duties and close the logs cleanly.
    shutdown.cancel();
    tasks.close();
    if tokio::time::timeout(config.broker.shutdown_timeout, tasks.wait()).await.is_err() {
        tracing::warn!("background tasks did not stop within shutdown_timeout");
    }
    let (closing, closing_groups) = (Arc::clone(&core), Arc::clone(&groups));
    let _ = tokio::task::spawn_blocking(move || {
        closing.close();
        if let Err(e) = closing_groups.close() {
            tracing::error!(error = %e, "closing the committed offsets partition failed");
        }
    })
    .await;
    tracing::info!("ferry-broker stopped cleanly");
    served.map_err(ServerError::from)
}

/// Stops what a start that failed part-way had begun: its tasks (within `grace`), then the core's files.
async fn abort_start(
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
    grace: std::time::Duration,
    core: &Arc<BrokerCore>,
) {
    shutdown.cancel();
    tasks.close();
    let _ = tokio::time::timeout(grace, tasks.wait()).await;
    let closing = Arc::clone(core);
    let _ = tokio::task::spawn_blocking(move || closing.close()).await;
}

fn spawn_duties(
    tasks: &TaskTracker,
    core: &Arc<BrokerCore>,
    groups: &Arc<GroupCoordinator>,
    config: &BrokerConfig,
    shutdown: CancellationToken,
) {
    // Async flush: check often enough that the shortest sensible interval is honoured.
    let flush_tick = (config.storage.flush_interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let (c, s) = (Arc::clone(core), shutdown.clone());
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(flush_tick);
        loop {
            tokio::select! {
                _ = s.cancelled() => break,
                _ = tick.tick() => {
                    let c = Arc::clone(&c);
                    let _ = tokio::task::spawn_blocking(move || c.flush_due()).await;
                }
            }
        }
    });
    let (c, s) = (Arc::clone(core), shutdown.clone());
    let every = config.storage.retention_check_interval;
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = s.cancelled() => break,
                _ = tick.tick() => {
                    let c = Arc::clone(&c);
                    let _ = tokio::task::spawn_blocking(move || c.apply_retention()).await;
                }
            }
        }
    });
    let (c, g, s) = (Arc::clone(core), Arc::clone(groups), shutdown);
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = s.cancelled() => break,
                _ = tick.tick() => {
                    g.expire(&|t: &str| c.topic(t).map_or(0, |t| t.partition_count()));
                }
            }
        }
    });
}
