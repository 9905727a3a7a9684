//! `ferry-console`: a web console over one or more Ferry clusters, talking to brokers through `ferry-client` only.
//! It serves server-rendered pages with small inline scripts (`pages/`) and a JSON API under `/api/v1/`
//! (`api/`, described in docs/openapi-console.yaml): overview, topics, browse and filter scans, a message's trace
//! across groups, dead letters, edits and redrives, groups and transactions, and audited actions.
//!
//! Invariants:
//! - Reads need a known caller (token, session, or `anonymous_read`); actions need the admin scope, the caller's
//!   CSRF token and `"confirm": true`, and each writes one audit record ([`auth`]).
//! - Nothing changes a record in place: an edit is a new record naming its source ([`core::lineage`]).
//! - Scans are bounded by a byte budget and stream their progress ([`core::scan`], [`api::browse`]).

#![deny(missing_docs)]

pub mod api;
pub mod auth;
pub mod config;
pub mod core;
pub mod error;
pub mod pages;
pub mod records;
pub mod sampler;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::middleware;
use axum::routing::{MethodRouter, get, post};
use ferry_client::{Admin, BrokerClient, ClientConfig, ShareAdmin};
use tokio_util::sync::CancellationToken;

pub use config::ConsoleConfig;

/// Largest request body (413 beyond it).
pub const BODY_LIMIT: usize = 1024 * 1024;
/// The most idempotency keys remembered (the oldest are forgotten first).
pub const MAX_IDEMPOTENCY_KEYS: usize = 10_000;
/// How long in-flight requests may finish after shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One cluster's clients.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Its name.
    pub name: String,
    /// Its bootstrap list.
    pub brokers: Vec<String>,
    /// The client.
    pub client: BrokerClient,
    /// Admin calls.
    pub admin: Admin,
    /// Message-model calls.
    pub share: ShareAdmin,
    /// With `forward_user_token`: the same cluster's clients presenting each console token, keyed by the token's
    /// SHA-256 digest. One per configured token, built at start and connecting lazily, so the map is bounded by
    /// the config; [`api::cluster`] picks the caller's.
    pub per_user: Option<Arc<HashMap<[u8; 32], Cluster>>>,
}

impl Cluster {
    fn connect(name: &str, brokers: &[String], token: Option<&str>) -> anyhow_free::Result<Cluster> {
        let mut cc = ClientConfig::new(brokers.iter().cloned()).with_request_timeout(Duration::from_secs(10));
        if let Some(t) = token {
            cc = cc.with_token(t.to_owned());
        }
        let client = BrokerClient::new(cc).map_err(|e| format!("cluster {name:?}: {e}"))?;
        Ok(Cluster {
            name: name.to_owned(),
            brokers: brokers.to_vec(),
            admin: Admin::new(client.clone()),
            share: ShareAdmin::new(client.clone()),
            client,
            per_user: None,
        })
    }
}

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    /// Clusters in display order.
    pub clusters: Arc<Vec<Cluster>>,
    /// The checks.
    pub auth: Arc<auth::Auth>,
    /// The audit log.
    pub audit: Arc<auth::AuditLog>,
    /// The config.
    pub config: Arc<ConsoleConfig>,
    /// For the mirror monitors.
    pub http: reqwest::Client,
    /// The groups' recent backlog and counters.
    pub history: Arc<parking_lot::Mutex<core::history::History>>,
    /// The idempotency keys of produce and resend, with their first answers (body, audit detail).
    pub idempotency: Arc<parking_lot::Mutex<core::idempotency::Keys<(serde_json::Value, serde_json::Value)>>>,
}

fn action<H, T>(state: &AppState, name: &'static str, handler: H) -> MethodRouter<AppState>
where
    H: Handler<T, AppState>,
    T: 'static,
{
    post(handler)
        .route_layer(middleware::from_fn_with_state(auth::Guarded { state: state.clone(), action: name }, auth::guard))
}

/// Every route.
pub fn router(state: AppState) -> Router {
    use api::{actions as a, browse as b, read as r, trace as t};
    let reads = Router::new()
        .route("/api/v1/session", get(r::session))
        .route("/api/v1/clusters", get(r::clusters))
        .route("/api/v1/clusters/{cluster}/overview", get(r::overview))
        .route("/api/v1/clusters/{cluster}/topics", get(r::topics))
        .route("/api/v1/clusters/{cluster}/topics/{topic}", get(r::topic))
        .route("/api/v1/clusters/{cluster}/topics/{topic}/partitions/{partition}/records", get(b::records))
        .route("/api/v1/clusters/{cluster}/topics/{topic}/scan", get(b::scan))
        .route("/api/v1/clusters/{cluster}/topics/{topic}/partitions/{partition}/records/{offset}", get(t::trace))
        .route("/api/v1/clusters/{cluster}/groups", get(r::groups))
        .route("/api/v1/clusters/{cluster}/groups/{group}", get(r::group))
        .route("/api/v1/clusters/{cluster}/groups/{group}/redrive", get(a::redrive_status))
        .route("/api/v1/clusters/{cluster}/transactions", get(r::transactions))
        .merge(pages::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::read_guard));
    Router::new()
        .merge(reads)
        .route("/login", get(pages::login).post(pages::login_post))
        .route("/healthz", get(|| async { "ok" }))
        .route("/api/v1/clusters/{cluster}/produce", action(&state, "produce", a::produce))
        .route("/api/v1/clusters/{cluster}/resend", action(&state, "resend", a::resend))
        .route("/api/v1/clusters/{cluster}/groups/{group}/redrive", action(&state, "redrive", a::redrive))
        .route("/api/v1/clusters/{cluster}/groups/{group}/offsets", action(&state, "offsets.reset", a::reset_offsets))
        .route("/api/v1/clusters/{cluster}/transactions/resolve", action(&state, "txn.resolve", a::resolve_txn))
        .fallback(|| async { error::ApiError::NotFound("no such page or endpoint".into()) })
        .method_not_allowed_fallback(|| async { error::ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(error::json_errors))
        .with_state(state)
}

/// Builds the clients (connecting lazily), binds `config.listen` and serves until `shutdown`. Returns the bound
/// address and the server task.
pub async fn start(
    config: ConsoleConfig,
    shutdown: CancellationToken,
) -> anyhow_free::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let mut clusters = Vec::new();
    for (c, token) in config.clusters.iter().zip(&config.broker_tokens) {
        let mut cluster = Cluster::connect(&c.name, &c.brokers, token.as_deref())?;
        if c.forward_user_token {
            let mut users = HashMap::new();
            for t in &config.tokens {
                users.insert(auth::token_digest(&t.secret), Cluster::connect(&c.name, &c.brokers, Some(&t.secret))?);
            }
            cluster.per_user = Some(Arc::new(users));
        }
        clusters.push(cluster);
    }
    let audit = auth::AuditLog::open(config.audit_log.as_deref())
        .await
        .map_err(|e| format!("audit_log: cannot open {:?}: {e}", config.audit_log))?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "the console listens beyond loopback: put TLS in front of it");
    }
    if config.tokens.is_empty() {
        tracing::warn!("no console tokens configured: every action is refused");
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().map_err(|e| e.to_string())?;
    let state = AppState {
        clusters: Arc::new(clusters),
        auth: Arc::new(auth::Auth::new(&config.tokens, config.anonymous_read)),
        audit: Arc::new(audit),
        config: Arc::new(config),
        http,
        history: Arc::new(parking_lot::Mutex::new(core::history::History::new(crate::config::LAG_SAMPLES))),
        idempotency: Arc::new(parking_lot::Mutex::new(core::idempotency::Keys::new(MAX_IDEMPOTENCY_KEYS))),
    };
    tokio::spawn(sampler::run(state.clone(), shutdown.clone()));
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    let task = tokio::spawn(async move {
        let stop = shutdown.clone();
        let served = axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await });
        if let Err(e) = served.await {
            tracing::error!(error = %e, "console server failed");
        }
    });
    tracing::info!(%addr, "console listening");
    Ok((addr, task))
}

/// Results of start-up: a message saying what is wrong.
pub mod anyhow_free {
    /// A start-up result.
    pub type Result<T> = std::result::Result<T, String>;
}
