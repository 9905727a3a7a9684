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
        let mut cc = ClientConfig::new(c.brokers.iter().cloned()).with_request_timeout(Duration::from_secs(10));
        if let Some(t) = token {
            cc = cc.with_token(t.clone());
        }
        let client = BrokerClient::new(cc).map_err(|e| format!("cluster {:?}: {e}", c.name))?;
        clusters.push(Cluster {
            name: c.name.clone(),
            brokers: c.brokers.clone(),
            admin: Admin::new(client.clone()),
            share: ShareAdmin::new(client.clone()),
            client,
        });
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
