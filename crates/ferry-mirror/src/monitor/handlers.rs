//! The endpoint handlers. Reads build their document from snapshots ([`super::views`]); writes go through the
//! [`MirrorHandle`] and the [`EgressHandle`](crate::egress::EgressHandle), and attach an [`AuditDetail`] for the
//! audit record written by [`super::auth::guard`].

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::auth::AuditDetail;
use super::error::ApiError;
use super::views::{self, EventView, STATES};
use super::{AppState, BODY_LIMIT};
use crate::events::HISTORY;

/// The dashboard page, compiled into the binary.
const DASHBOARD: &str = include_str!("dashboard.html");

/// Events returned by `/api/v1/events` when `limit` is not given.
pub const DEFAULT_EVENTS: usize = 50;

/// `GET /`.
pub async fn dashboard() -> Response {
    let mut r = Html(DASHBOARD).into_response();
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; \
             img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    r
}

/// `GET /healthz`.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`.
pub async fn readyz(State(s): State<AppState>) -> Response {
    let h = &s.handle;
    let topics = h.shared.topics.lock().len();
    let r = views::readiness(&h.egress.view(), h.target_health.is_down(), topics, &h.shared.partition_views(None));
    let status = if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(r)).into_response()
}

/// `GET /metrics`: refreshes the gauges derived from shared state, then encodes every family.
///
/// The per-partition lag, offset and RPO gauges, the per-state partition counts and the route gauges are set here, at
/// scrape time, from snapshots of the shared state and the Egress, so `/metrics` always agrees with
/// `/api/v1/partitions` and `/api/v1/egress` (the probe loop also sets the route gauges, but only once per round: a
/// manual switch would otherwise show the old route as active until the next probe).
pub async fn metrics(State(s): State<AppState>) -> Response {
    let h = &s.handle;
    for r in h.egress.view().routes {
        h.metrics.route(&r.name, r.active, r.healthy);
    }
    let views = h.shared.partition_views(None);
    for v in &views {
        h.metrics.partition(&v.topic, v.partition, v.source_offset, v.cache_offset, v.commit_offset, v.target_offset);
    }
    h.metrics.rpo(views.iter().map(|v| (v.topic.as_str(), v.partition, v.rpo_seconds)));
    let counts = views::count_states(&views);
    let counts: Vec<(&str, i64)> = STATES.iter().map(|st| (*st, counts[*st] as i64)).collect();
    h.metrics.partition_states(&counts);
    if let Some((rss, cpu)) = s.process.sample() {
        h.metrics.process(rss, cpu);
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], h.metrics.encode())
        .into_response()
}

/// `GET /api/v1/status`.
pub async fn status(State(s): State<AppState>) -> Json<views::StatusView> {
    Json(views::status(&s.handle))
}

/// Query of `/api/v1/partitions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionsQuery {
    /// Only this source topic.
    pub topic: Option<String>,
}

/// `GET /api/v1/partitions[?topic=T]`: an unknown topic is 404 `unknown_topic`, so a typo is not mistaken for a
/// topic without partitions.
pub async fn partitions(
    State(s): State<AppState>,
    query: Result<Query<PartitionsQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(q) = query?;
    let shared = &s.handle.shared;
    if let Some(t) = &q.topic {
        let known = shared.topics.lock().contains_key(t) || shared.partitions.iter().any(|e| e.key().topic() == t);
        if !known {
            return Err(ApiError::UnknownTopic { topic: t.clone() });
        }
    }
    Ok(Json(json!({"partitions": shared.partition_views(q.topic.as_deref())})))
}

/// `GET /api/v1/topics`.
pub async fn topics(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({"topics": views::topics(&s.handle)}))
}

/// `GET /api/v1/egress`.
pub async fn egress(State(s): State<AppState>) -> Json<crate::egress::EgressView> {
    Json(s.handle.egress.view())
}

/// Query of `/api/v1/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// How many of the most recent events (default 50, at most the history size 200).
    pub limit: Option<usize>,
}

/// `GET /api/v1/events[?limit=N]`: the most recent events, newest first.
pub async fn events(
    State(s): State<AppState>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(q) = query?;
    let limit = q.limit.unwrap_or(DEFAULT_EVENTS).min(HISTORY);
    let recent = s.handle.events.recent();
    let out: Vec<EventView<'_>> =
        recent.iter().rev().take(limit).map(|e| EventView { event: e, severity: e.kind.default_severity() }).collect();
    Ok(Json(json!({"events": out})))
}

/// Body of `POST /api/v1/egress/switch`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchRequest {
    /// The route to switch to.
    pub route: String,
    /// Switch even when the route is unhealthy.
    #[serde(default)]
    pub force: bool,
}

fn with_detail(detail: serde_json::Value, result: Result<impl IntoResponse, ApiError>) -> Response {
    let mut r = result.into_response();
    r.extensions_mut().insert(AuditDetail(detail));
    r
}

/// `POST /api/v1/egress/switch`: a manual switch, which pins the route.
pub async fn switch(State(s): State<AppState>, body: Result<Json<SwitchRequest>, JsonRejection>) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return ApiError::from_json(e, BODY_LIMIT).into_response(),
    };
    let egress = &s.handle.egress;
    let result = egress.switch(&req.route, req.force).map(|()| Json(egress.view())).map_err(|e| {
        let known: Vec<String> = egress.view().routes.into_iter().map(|r| r.name).collect();
        ApiError::from_switch(e, &known)
    });
    with_detail(json!({"route": req.route, "force": req.force}), result)
}

/// `POST /api/v1/egress/unpin`: automatic switching applies again.
pub async fn unpin(State(s): State<AppState>) -> Response {
    s.handle.egress.unpin();
    let view = s.handle.egress.view();
    with_detail(json!({"active": view.active}), Ok::<_, ApiError>(Json(view)))
}

/// `POST /api/v1/topics/{topic}/pause`.
pub async fn pause(State(s): State<AppState>, topic: Result<Path<String>, PathRejection>) -> Response {
    control(&s, topic, true)
}

/// `POST /api/v1/topics/{topic}/resume` (also restarts halted partitions of the topic).
pub async fn resume(State(s): State<AppState>, topic: Result<Path<String>, PathRejection>) -> Response {
    control(&s, topic, false)
}

fn control(s: &AppState, topic: Result<Path<String>, PathRejection>, pause: bool) -> Response {
    let Path(topic) = match topic {
        Ok(t) => t,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let h = &s.handle;
    let result = if pause { h.pause(&topic) } else { h.resume(&topic) };
    let result =
        result.map(|()| Json(json!({"topic": topic, "paused": h.shared.is_paused(&topic)}))).map_err(ApiError::from);
    with_detail(json!({"topic": topic}), result)
}

/// Unknown paths.
pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound { method: method.to_string(), path: uri.path().to_owned() }
}

/// Known paths with a method they do not serve.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_owned() }
}
