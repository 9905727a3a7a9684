//! The monitor's errors: [`MonitorError`] for starting the server, and [`ApiError`], the one type every endpoint
//! answers errors with.
//!
//! Invariant: every error response, whatever produced it (a handler, an extractor rejection, the body limit, an
//! unknown path, a wrong method), has the body `{"code": CODE, "reason": TEXT}` and comes from the single
//! [`IntoResponse`] impl below. The codes are a stable contract (docs/api.md lists them); the reasons are for
//! humans and may change.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::egress::SwitchError;
use crate::handle::UnknownTopic;

/// Why the monitor could not start.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} (monitor.listen): {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A TLS certificate or key file could not be read or used.
    #[error("monitor TLS file {}: {reason}", path.display())]
    Tls {
        /// The certificate or key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The audit log could not be opened for appending.
    #[error("cannot open the audit log {} (monitor.audit_log): {source}", path.display())]
    AuditLog {
        /// The configured file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The stable error code of a response, stored in the response's extensions so the audit layer can record the
/// outcome without parsing the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

/// An error answered by an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed (body, query or path).
    #[error("{reason}")]
    BadRequest {
        /// What is wrong.
        reason: String,
    },
    /// 401: a mutating call without the right bearer token (or with no token configured).
    #[error("{reason}")]
    Unauthorized {
        /// Why (never contains a token).
        reason: String,
    },
    /// 404: no such endpoint.
    #[error("no endpoint {method} {path}; see docs/api.md for the list")]
    NotFound {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
    /// 404: the route name is not configured.
    #[error("no source route named {route:?}; configured routes: {known}")]
    UnknownRoute {
        /// The asked route.
        route: String,
        /// The configured route names, comma separated.
        known: String,
    },
    /// 404: the topic is not mirrored by this process.
    #[error("topic {topic:?} is not mirrored by this process")]
    UnknownTopic {
        /// The asked topic.
        topic: String,
    },
    /// 405: the path exists but not with this method.
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
    /// 409: the route is unhealthy and `force` was not set.
    #[error("route {route:?} is unhealthy ({reason}); send \"force\": true to switch anyway")]
    RouteUnhealthy {
        /// The route.
        route: String,
        /// Why it is unhealthy.
        reason: String,
    },
    /// 409: the route leads to another cluster (or cannot be verified to lead to the source): never used.
    #[error("route {route:?} cannot be used: {reason}")]
    RouteWrongCluster {
        /// The route.
        route: String,
        /// Why.
        reason: String,
    },
    /// 409: a failover cannot go ahead (a failed pre-check, another job in the way).
    #[error("{reason}")]
    FailoverRefused {
        /// Why.
        reason: String,
    },
    /// 503: a side could not be reached, or the mirror is still starting; the same request may be sent again.
    #[error("{reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
    /// 413: the request body is over the limit.
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
}

impl ApiError {
    /// The stable code.
    pub const fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::Unauthorized { .. } => "unauthorized",
            ApiError::NotFound { .. } => "not_found",
            ApiError::UnknownRoute { .. } => "unknown_route",
            ApiError::UnknownTopic { .. } => "unknown_topic",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::RouteUnhealthy { .. } => "route_unhealthy",
            ApiError::RouteWrongCluster { .. } => "route_wrong_cluster",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::FailoverRefused { .. } => "failover_refused",
            ApiError::Unavailable { .. } => "unavailable",
        }
    }

    /// The HTTP status.
    pub const fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } | ApiError::UnknownRoute { .. } | ApiError::UnknownTopic { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RouteUnhealthy { .. } | ApiError::RouteWrongCluster { .. } => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::FailoverRefused { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Maps a manual switch refusal; `known` lists the configured routes for the reason.
    pub fn from_switch(e: SwitchError, known: &[String]) -> ApiError {
        match e {
            SwitchError::UnknownRoute(route) => ApiError::UnknownRoute { route, known: known.join(", ") },
            SwitchError::RouteUnhealthy { route, reason } => ApiError::RouteUnhealthy { route, reason },
            SwitchError::WrongCluster { route, reason } => ApiError::RouteWrongCluster { route, reason },
        }
    }

    /// Maps a JSON body rejection: over the body limit is 413, anything else (syntax, wrong fields, missing
    /// `Content-Type: application/json`) is 400.
    pub fn from_json(rejection: JsonRejection, limit: usize) -> ApiError {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::BadRequest { reason: format!("invalid JSON body: {}", rejection.body_text()) }
        }
    }
}

impl From<crate::failover::Refusal> for ApiError {
    fn from(e: crate::failover::Refusal) -> Self {
        use crate::failover::Refusal;
        match e {
            Refusal::Bad(reason) => ApiError::BadRequest { reason },
            Refusal::Refused(reason) => ApiError::FailoverRefused { reason },
            Refusal::Unavailable(reason) => ApiError::Unavailable { reason },
        }
    }
}

impl From<UnknownTopic> for ApiError {
    fn from(e: UnknownTopic) -> Self {
        ApiError::UnknownTopic { topic: e.0 }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::BadRequest { reason: format!("invalid query string: {}", r.body_text()) }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::BadRequest { reason: format!("invalid path: {}", r.body_text()) }
    }
}

/// The error body.
#[derive(Debug, Serialize)]
struct Body<'a> {
    code: &'static str,
    reason: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let reason = self.to_string();
        let mut response = (self.status(), Json(Body { code: self.code(), reason: &reason })).into_response();
        if matches!(self, ApiError::Unauthorized { .. }) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(ErrorCode(self.code()));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_statuses_are_stable() {
        let cases = [
            (ApiError::BadRequest { reason: "x".into() }, "bad_request", 400),
            (ApiError::Unauthorized { reason: "x".into() }, "unauthorized", 401),
            (ApiError::NotFound { method: "GET".into(), path: "/x".into() }, "not_found", 404),
            (ApiError::UnknownRoute { route: "r".into(), known: "a".into() }, "unknown_route", 404),
            (ApiError::UnknownTopic { topic: "t".into() }, "unknown_topic", 404),
            (ApiError::MethodNotAllowed { method: "PUT".into(), path: "/x".into() }, "method_not_allowed", 405),
            (ApiError::RouteUnhealthy { route: "r".into(), reason: "down".into() }, "route_unhealthy", 409),
            (ApiError::RouteWrongCluster { route: "r".into(), reason: "x".into() }, "route_wrong_cluster", 409),
            (ApiError::PayloadTooLarge { limit: 16 }, "payload_too_large", 413),
        ];
        for (e, code, status) in cases {
            assert_eq!(e.code(), code);
            assert_eq!(e.status().as_u16(), status);
            let r = e.into_response();
            assert_eq!(r.status().as_u16(), status);
            assert_eq!(r.extensions().get::<ErrorCode>(), Some(&ErrorCode(code)));
        }
    }
}
