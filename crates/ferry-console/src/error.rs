//! Every error answer of the console: `{"code", "reason"}` with a stable code, from one `IntoResponse` impl. A
//! broker's refusal keeps its gRPC meaning (NOT_FOUND is 404, PERMISSION_DENIED 403, ...); a broker that cannot be
//! reached is 502, never a 500.

use axum::Json;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferry_client::{ClientError, Code};

/// The code of an error answer, attached to the response for the audit record.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

/// An error answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No or an unknown token.
    #[error("{0}")]
    Unauthorized(String),
    /// A token without the scope the call needs.
    #[error("{0}")]
    Forbidden(String),
    /// A mutation without its CSRF token.
    #[error("{0}")]
    Csrf(String),
    /// Bad input: names the field.
    #[error("{0}")]
    BadRequest(String),
    /// A mutation without `"confirm": true`.
    #[error("{0}")]
    ConfirmationRequired(String),
    /// No such cluster, topic, partition, record or path.
    #[error("{0}")]
    NotFound(String),
    /// Refused in the current state (active group members, ...).
    #[error("{0}")]
    Conflict(&'static str, String),
    /// The broker said no.
    #[error("the broker refused: {0}")]
    Broker(String, Code),
    /// The broker could not be reached or answered badly.
    #[error("{0}")]
    Upstream(String),
    /// Wrong method on a known path.
    #[error("method not allowed")]
    MethodNotAllowed,
}

impl ApiError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Csrf(_) => "csrf_required",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::ConfirmationRequired(_) => "confirmation_required",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(code, _) => code,
            ApiError::Broker(_, code) => match code {
                Code::NotFound => "not_found",
                Code::PermissionDenied => "forbidden",
                Code::Unauthenticated => "broker_unauthenticated",
                Code::InvalidArgument | Code::OutOfRange => "bad_request",
                Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => "conflict",
                _ => "broker_error",
            },
            ApiError::Upstream(_) => "broker_unavailable",
            ApiError::MethodNotAllowed => "method_not_allowed",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::Csrf(_) => StatusCode::FORBIDDEN,
            ApiError::BadRequest(_) | ApiError::ConfirmationRequired(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(..) => StatusCode::CONFLICT,
            ApiError::Broker(_, code) => match code {
                Code::NotFound => StatusCode::NOT_FOUND,
                Code::PermissionDenied => StatusCode::FORBIDDEN,
                Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
                Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
                _ => StatusCode::BAD_GATEWAY,
            },
            ApiError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }
}

impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> ApiError {
        match &e {
            ClientError::Status { code, message, .. } => ApiError::Broker(message.clone(), *code),
            ClientError::UnknownPartition { .. } => ApiError::NotFound(e.to_string()),
            ClientError::Partition { code, .. } => match code {
                ferry_client::proto::ErrorCode::UnknownTopicOrPartition => ApiError::NotFound(e.to_string()),
                ferry_client::proto::ErrorCode::OffsetOutOfRange => ApiError::BadRequest(e.to_string()),
                _ => ApiError::Upstream(e.to_string()),
            },
            ClientError::Usage(_) | ClientError::Config { .. } => ApiError::BadRequest(e.to_string()),
            _ => ApiError::Upstream(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code();
        let body = serde_json::json!({"code": code, "reason": self.to_string()});
        let mut response = (self.status(), Json(body)).into_response();
        response.extensions_mut().insert(ErrorCode(code));
        response
    }
}

/// Handler results.
pub type ApiResult<T> = Result<T, ApiError>;

/// Middleware: an error answer under `/api/` that did not come from [`ApiError`] (a query, path or body the
/// extractors refused, a body over the limit) becomes `{"code", "reason"}` too: `bad_request` (400 for 400, 415 and
/// 422), `not_found`, `method_not_allowed` or `payload_too_large`.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let response = next.run(request).await;
    let is_json =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !api || is_json || !(response.status().is_client_error() || response.status().is_server_error()) {
        return response;
    }
    let status = response.status();
    let (status, code) = match status.as_u16() {
        400 | 415 | 422 => (StatusCode::BAD_REQUEST, "bad_request"),
        404 => (status, "not_found"),
        405 => (status, "method_not_allowed"),
        413 => (status, "payload_too_large"),
        _ => (status, "error"),
    };
    let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap_or_default();
    let body = serde_json::json!({"code": code, "reason": String::from_utf8_lossy(&bytes)});
    let mut r = (status, Json(body)).into_response();
    r.extensions_mut().insert(ErrorCode(code));
    r
}
