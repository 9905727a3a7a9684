//! The Monitor: the mirror's HTTP face on `monitor.listen` (loopback by default) — health, readiness, Prometheus
//! metrics, a JSON API over the shared state, the manual operations of the seed's monitor (switch the source route,
//! pause and resume topics) and a self-refreshing dashboard. docs/api.md and docs/openapi.yaml describe every
//! endpoint.
//!
//! Invariants:
//! - Every error answer is `{"code", "reason"}` from [`error::ApiError`]'s single `IntoResponse` impl, including
//!   unknown paths (404 `not_found`), wrong methods (405 `method_not_allowed`) and oversized bodies (413
//!   `payload_too_large`, limit [`BODY_LIMIT`]).
//! - Mutating calls pass [`auth::guard`]: bearer token checked in constant time, and one audit record per call,
//!   allowed or refused. Tokens never appear in logs, audit records or answers.
//! - Reads never block the pipeline: they take snapshots of atomics and short mutex sections.
//! - The server stops on `shutdown`, finishing in-flight requests for up to [`SHUTDOWN_GRACE`].

pub mod auth;
pub mod error;
pub mod failover;
pub mod handlers;
pub mod process;
pub mod tls;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::middleware;
use axum::routing::{MethodRouter, get, post};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use error::{ApiError, MonitorError};

use crate::config::MonitorConfig;
use crate::handle::MirrorHandle;

/// Largest request body accepted (413 `payload_too_large` beyond it).
pub const BODY_LIMIT: usize = 16 * 1024;

/// How long in-flight requests may finish after shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    /// The running mirror.
    pub handle: MirrorHandle,
    /// The token check.
    pub auth: Arc<auth::Auth>,
    /// Where audit records go.
    pub audit: Arc<auth::AuditLog>,
    /// Process gauges.
    pub process: process::ProcessStats,
}

fn mutating<H, T>(state: &AppState, action: &'static str, handler: H) -> MethodRouter<AppState>
where
    H: Handler<T, AppState>,
    T: 'static,
{
    post(handler)
        .route_layer(middleware::from_fn_with_state(auth::Guarded { state: state.clone(), action }, auth::guard))
}

/// The router with every endpoint (exposed for embedding; [`start`] serves it).
pub fn router(state: AppState) -> Router {
    use handlers as h;
    Router::new()
        .route("/", get(h::dashboard))
        .route("/healthz", get(h::healthz))
        .route("/readyz", get(h::readyz))
        .route("/metrics", get(h::metrics))
        .route("/api/v1/status", get(h::status))
        .route("/api/v1/partitions", get(h::partitions))
        .route("/api/v1/topics", get(h::topics))
        .route("/api/v1/egress", get(h::egress))
        .route("/api/v1/events", get(h::events))
        .route("/api/v1/egress/switch", mutating(&state, "egress.switch", h::switch))
        .route("/api/v1/egress/unpin", mutating(&state, "egress.unpin", h::unpin))
        .route("/api/v1/topics/{topic}/pause", mutating(&state, "topic.pause", h::pause))
        .route("/api/v1/topics/{topic}/resume", mutating(&state, "topic.resume", h::resume))
        .route("/api/v1/failover", mutating(&state, "failover", failover::start).get(failover::status))
        .fallback(h::not_found)
        // After every route: it applies to the method routers registered so far.
        .method_not_allowed_fallback(h::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Binds `config.listen` (port 0 picks a free port), starts serving (over TLS when `config.tls` is set) and returns
/// the bound address and the server task, which ends after `shutdown` once in-flight requests finished (at most
/// [`SHUTDOWN_GRACE`]).
pub async fn start(
    handle: MirrorHandle,
    config: &MonitorConfig,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), MonitorError> {
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls::rustls_config(cert, key)?),
        None => None,
    };
    let audit = auth::AuditLog::open(config.audit_log.as_deref()).await?;
    let bind_error = |source| MonitorError::Bind { addr: config.listen, source };
    let listener = std::net::TcpListener::bind(config.listen).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;

    let auth = auth::Auth::new(config.token.as_ref());
    if !auth.configured() {
        tracing::warn!(
            "no monitor token configured (FERRY_MONITOR_TOKEN or monitor.token_file): mutating calls are refused"
        );
    }
    let state =
        AppState { handle, auth: Arc::new(auth), audit: Arc::new(audit), process: process::ProcessStats::default() };
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    let server = axum_server::Handle::new();
    let stopper = server.clone();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let task = tokio::spawn(async move {
        let stop = tokio::spawn(async move {
            shutdown.cancelled().await;
            stopper.graceful_shutdown(Some(SHUTDOWN_GRACE));
        });
        let result = match tls {
            Some(tls) => axum_server::from_tcp_rustls(listener, tls).handle(server).serve(app).await,
            None => axum_server::from_tcp(listener).handle(server).serve(app).await,
        };
        stop.abort();
        match result {
            Ok(()) => tracing::info!(%addr, "monitor stopped"),
            Err(e) => tracing::error!(%addr, error = %e, "monitor failed"),
        }
    });
    tracing::info!(%addr, scheme, "monitor listening");
    Ok((addr, task))
}
