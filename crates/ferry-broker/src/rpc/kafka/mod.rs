//! The Kafka listener (`[kafka] listen`): stock Kafka clients produce, consume in groups and administer Ferry.
//!
//! The codec is the `kafka-protocol` crate; the framing ([`conn`]), the decisions with state ([`core`]) and the
//! semantics are Ferry's. Every handler calls the broker's own `ferry.v1.Broker` service, so both protocols share
//! one truth: the same records and offsets, the same groups and committed offsets, the same checks.
//!
//! What is advertised comes from the compatibility ledger `docs/kafka-compat.toml` ([`versions`]); a request for
//! anything else closes the connection. docs/kafka.md ("The Kafka listener") is the user's view.

pub mod conn;
pub mod core;
pub mod errors;
mod handlers;
pub mod records;
mod tls;
pub mod versions;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::manager::Replication;
use crate::config::KafkaSection;
use crate::rpc::auth::{Authorizer, Caller, Grant};
use crate::rpc::service::BrokerService;

/// Why the Kafka listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The compiled-in ledger is broken (a build that passed its tests cannot have this).
    #[error("the Kafka compatibility ledger is invalid: {0}")]
    Ledger(String),
    /// Tokens are configured, but the Kafka listener would let clients in without one.
    #[error(
        "the broker has tokens, so the Kafka listener must authenticate its clients: set kafka.sasl = true \
         (SASL/PLAIN, a token as the password), with kafka.tls"
    )]
    NeedsSasl,
    /// SASL without tokens to check passwords against.
    #[error("kafka.sasl = true needs tokens ([[auth.tokens]] or broker.token_file) to check passwords against")]
    SaslWithoutTokens,
    /// The TLS files could not be used.
    #[error("{0}")]
    Tls(String),
}

tokio::task_local! {
    /// The grant of the connection whose request is being answered.
    static GRANT: Arc<Grant>;
}

/// Everything a Kafka connection's handlers use.
pub struct Kafka {
    svc: BrokerService,
    authz: Authorizer,
    /// The grant of every connection when the broker has no tokens.
    open: Option<Arc<Grant>>,
    cfg: KafkaSection,
    versions: versions::Versions,
    /// `host:port` of this broker's Kafka listener, as clients reach it.
    advertised: String,
    max_batch_bytes: u64,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// A cluster member's replication manager: the members' Kafka addresses, the partitions' leaders, the groups'
    /// coordinators.
    cluster: Option<Arc<Replication>>,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka").field("advertised", &self.advertised).finish_non_exhaustive()
    }
}

impl Kafka {
    /// The listener's state over `svc`, answering as `advertised`.
    pub fn new(
        svc: BrokerService,
        authz: &Authorizer,
        cfg: KafkaSection,
        advertised: String,
        max_batch_bytes: u64,
    ) -> Result<Kafka, KafkaError> {
        let versions = versions::Versions::ledger().map_err(KafkaError::Ledger)?;
        let open = authz.open_grant();
        match (open.is_some(), cfg.sasl) {
            (false, false) => return Err(KafkaError::NeedsSasl),
            (true, true) => return Err(KafkaError::SaslWithoutTokens),
            _ => {}
        }
        let tls = cfg.tls.as_ref().map(tls::acceptor).transpose().map_err(KafkaError::Tls)?;
        Ok(Kafka { svc, authz: authz.clone(), open, cfg, versions, advertised, max_batch_bytes, tls, cluster: None })
    }

    /// Answers as a member of the cluster `replication` manages.
    pub fn on_cluster(mut self, replication: Option<Arc<Replication>>) -> Kafka {
        self.cluster = replication;
        self
    }

    /// A service request made as the connection's grant (the open grant outside a connection's request).
    fn rpc<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(g) = GRANT.try_with(Arc::clone).ok().or_else(|| self.open.clone()) {
            r.extensions_mut().insert(Caller(g));
        }
        r
    }

    /// The most decompressed bytes one batch may inflate to.
    fn inflate_limit(&self) -> usize {
        ferry_batch::decode_limit(self.max_batch_bytes)
    }
}

/// `host:port` split, the port 0 when it does not parse.
pub fn split_host_port(addr: &str) -> (String, i32) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']').to_owned(), p.parse().unwrap_or(0)),
        None => (addr.to_owned(), 0),
    }
}

/// The name under which a cluster member registers its Kafka listener's advertised address with its named listeners
/// (`/ferry/listeners/{id}`). Not a name `[[cluster.listeners]]` may take (it has a dot).
pub const LISTENER_NAME: &str = "kafka.wire";

/// The Kafka listener bound (before a cluster member registers, so that its address is registered with it).
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    /// The bound address.
    pub addr: SocketAddr,
    /// `host:port` clients are told to dial: `kafka.advertised_address`, else the bound address.
    pub advertised: String,
}

/// Binds `[kafka] listen`; `None` when it is not set.
pub async fn bind(cfg: &KafkaSection) -> Result<Option<Bound>, String> {
    let Some(at) = cfg.listen else { return Ok(None) };
    let listener = TcpListener::bind(at).await.map_err(|e| format!("cannot listen on {at} (kafka.listen): {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("kafka.listen: {e}"))?;
    let advertised = cfg.advertised_address.clone().unwrap_or_else(|| addr.to_string());
    Ok(Some(Bound { listener, addr, advertised }))
}

/// Serves the bound Kafka listener with `kafka` on `tasks` until `shutdown`; returns the bound address.
pub fn start(bound: Bound, kafka: Kafka, tasks: &TaskTracker, shutdown: CancellationToken) -> SocketAddr {
    tracing::info!(addr = %bound.addr, advertised = %kafka.advertised, "kafka listener serving");
    tasks.spawn(serve(Arc::new(kafka), bound.listener, tasks.clone(), shutdown));
    bound.addr
}

/// Serves Kafka connections on `listener` until `shutdown`, at most `kafka.max_connections` at once. Each
/// connection is a task on `tasks`.
pub async fn serve(kafka: Arc<Kafka>, listener: TcpListener, tasks: TaskTracker, shutdown: CancellationToken) {
    let permits = Arc::new(Semaphore::new(kafka.cfg.max_connections));
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "kafka listener: accept failed");
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(%peer, max = kafka.cfg.max_connections, "kafka listener: kafka.max_connections reached; connection closed");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (k, s) = (Arc::clone(&kafka), shutdown.clone());
        tasks.spawn(async move {
            conn::run(k, stream, peer, s).await;
            drop(permit);
        });
    }
}
