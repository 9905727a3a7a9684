//! `POST /api/v1/failover` (start or resume the failover job; needs `confirm`) and `GET /api/v1/failover` (the
//! job as recorded on the target).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::auth::AuditDetail;
use super::{ApiError, AppState, BODY_LIMIT};
use crate::failover::Request;

/// `POST /api/v1/failover`.
pub async fn start(State(s): State<AppState>, body: Result<Json<Request>, JsonRejection>) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return ApiError::from_json(e, BODY_LIMIT).into_response(),
    };
    let detail = json!({"topics": req.topics, "dry_run": req.dry_run, "source_unreachable": req.source_unreachable,
        "max_rpo": req.max_rpo, "confirm": req.confirm});
    let dry_run = req.dry_run;
    let mut response =
        match s.handle.failover.start(req, s.audit.clone() as std::sync::Arc<dyn crate::failover::Audit>).await {
            Ok(answer) => {
                let code = if dry_run || answer.job.as_ref().is_some_and(|j| j.finished_ms.is_some()) {
                    StatusCode::OK
                } else {
                    StatusCode::ACCEPTED
                };
                (code, Json(answer)).into_response()
            }
            Err(e) => ApiError::from(e).into_response(),
        };
    response.extensions_mut().insert(AuditDetail(detail));
    response
}

/// `GET /api/v1/failover`: `{"job": ..., "running": bool}`; `job` is null when none was ever recorded.
pub async fn status(State(s): State<AppState>) -> Response {
    // `running` first: a job is recorded before its run ends, so a run seen ended has recorded its last step.
    let running = s.handle.failover.running();
    match s.handle.failover.status().await {
        Ok(job) => Json(json!({"job": job, "running": running})).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}
