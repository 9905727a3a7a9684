//! Authorisation and audit of mutating calls.
//!
//! - A mutating call needs `Authorization: Bearer <token>` with the token from `FERRY_MONITOR_TOKEN` or
//!   `monitor.token_file`. Tokens are compared as SHA-256 digests with a constant-time equality, so neither the
//!   content nor the length of the configured token leaks through timing. With no token configured every mutating
//!   call is refused (401): an unauthenticated write API is never the default.
//! - Every mutating call, allowed or not, produces one audit record: what (action, method, path, details such as
//!   the route), when, from where (the TCP peer), and the outcome (`ok` or the error code) with the status. It is
//!   logged at info with target `audit` and, when `monitor.audit_log` is set, appended to that file as one JSON
//!   line. Records never contain a token or any other secret.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;

use super::AppState;
use super::error::{ApiError, ErrorCode, MonitorError};
use crate::config::{MONITOR_TOKEN_ENV, Secret};

/// Checks bearer tokens against the configured one.
pub struct Auth {
    digest: Option<[u8; 32]>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("token_configured", &self.digest.is_some()).finish()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Auth {
    /// An authoriser for `token`; `None` (or an empty token) refuses every mutating call.
    pub fn new(token: Option<&Secret>) -> Auth {
        Auth { digest: token.map(Secret::expose).filter(|t| !t.is_empty()).map(|t| digest(t.as_bytes())) }
    }

    /// Whether a token is configured.
    pub fn configured(&self) -> bool {
        self.digest.is_some()
    }

    /// Accepts the request when it carries the configured bearer token.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(expected) = &self.digest else {
            return Err(ApiError::Unauthorized {
                reason: format!(
                    "mutating calls are disabled because no monitor token is configured: set {MONITOR_TOKEN_ENV} or \
                     monitor.token_file and restart"
                ),
            });
        };
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(ApiError::Unauthorized { reason: "missing header \"Authorization: Bearer <token>\"".into() });
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(presented) = presented else {
            return Err(ApiError::Unauthorized {
                reason: "the Authorization header must be \"Bearer <token>\"".into(),
            });
        };
        if bool::from(digest(presented.as_bytes()).ct_eq(expected)) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized { reason: "wrong bearer token".into() })
        }
    }
}

/// Details a handler attaches to its response for the audit record (e.g. the route and `force` of a switch).
#[derive(Debug, Clone)]
pub struct AuditDetail(pub serde_json::Value);

/// One audit record (one JSON line in `monitor.audit_log`).
#[derive(Debug, Clone, Serialize)]
pub struct AuditRecord {
    /// When, RFC 3339 UTC with milliseconds.
    pub timestamp: String,
    /// What: `egress.switch`, `egress.unpin`, `topic.pause`, `topic.resume`.
    pub action: &'static str,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// The TCP peer (`ip:port`), or `unknown`.
    pub peer: String,
    /// `ok`, or the error code of the answer.
    pub outcome: String,
    /// HTTP status of the answer.
    pub status: u16,
    /// Handler details (route, force, topic), `null` when the handler did not run.
    pub detail: serde_json::Value,
}

/// Where audit records go: the tracing log always, a file when configured.
#[derive(Debug)]
pub struct AuditLog {
    file: Option<(PathBuf, tokio::sync::Mutex<tokio::fs::File>)>,
}

impl AuditLog {
    /// Opens `path` for appending (created if missing), or logs to tracing only.
    pub async fn open(path: Option<&Path>) -> Result<AuditLog, MonitorError> {
        let Some(path) = path else { return Ok(AuditLog { file: None }) };
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .map_err(|source| MonitorError::AuditLog { path: path.to_owned(), source })?;
        Ok(AuditLog { file: Some((path.to_owned(), tokio::sync::Mutex::new(file))) })
    }

    /// Logs and appends one record. A failing file write is logged as an error: the call itself already
    /// happened, so it is not undone.
    pub async fn record(&self, record: &AuditRecord) {
        tracing::info!(
            target: "audit",
            action = record.action,
            method = %record.method,
            path = %record.path,
            peer = %record.peer,
            outcome = %record.outcome,
            status = record.status,
            detail = %record.detail,
            "monitor call"
        );
        let Some((path, file)) = &self.file else { return };
        let mut line = serde_json::to_vec(record).unwrap_or_default();
        line.push(b'\n');
        let mut file = file.lock().await;
        if let Err(e) = async {
            file.write_all(&line).await?;
            file.flush().await
        }
        .await
        {
            tracing::error!(file = %path.display(), error = %e, "cannot append to the audit log");
        }
    }
}

#[async_trait::async_trait]
impl crate::failover::Audit for AuditLog {
    async fn record(&self, action: &'static str, job: &str, outcome: &str, detail: serde_json::Value) {
        let record = AuditRecord {
            timestamp: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            action,
            method: "JOB".into(),
            path: format!("/api/v1/failover#{job}"),
            peer: "self".into(),
            outcome: outcome.to_owned(),
            status: 0,
            detail,
        };
        AuditLog::record(self, &record).await;
    }
}

/// The per-route state of [`guard`]: the app and the audited action name.
#[derive(Clone)]
pub struct Guarded {
    /// The app.
    pub state: AppState,
    /// The action name in audit records.
    pub action: &'static str,
}

/// Middleware of every mutating route: checks the token, runs the handler, and audits the outcome.
pub async fn guard(State(g): State<Guarded>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |ConnectInfo(a)| a.to_string());
    let response = match g.state.auth.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    };
    let status = response.status();
    let outcome = match response.extensions().get::<ErrorCode>() {
        Some(ErrorCode(code)) => (*code).to_owned(),
        None if status.is_success() => "ok".to_owned(),
        None => format!("http_{}", status.as_u16()),
    };
    let detail = response.extensions().get::<AuditDetail>().map_or(serde_json::Value::Null, |d| d.0.clone());
    let record = AuditRecord {
        timestamp: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        action: g.action,
        method: method.to_string(),
        path,
        peer,
        outcome,
        status: status.as_u16(),
        detail,
    };
    g.state.audit.record(&record).await;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let auth = Auth::new(Some(&Secret::new("s3cret")));
        assert!(auth.check(&headers("Bearer s3cret")).is_ok());
        assert!(auth.check(&headers("bearer s3cret")).is_ok());
        for bad in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer "] {
            let e = auth.check(&headers(bad)).unwrap_err();
            assert_eq!(e.code(), "unauthorized", "{bad}");
            assert!(!e.to_string().contains("s3cret"), "a reason never echoes the token: {e}");
        }
        assert_eq!(auth.check(&HeaderMap::new()).unwrap_err().code(), "unauthorized");
    }

    #[test]
    fn no_token_refuses_everything_and_says_how_to_configure() {
        for auth in [Auth::new(None), Auth::new(Some(&Secret::new("")))] {
            assert!(!auth.configured());
            let e = auth.check(&headers("Bearer ")).unwrap_err();
            assert!(e.to_string().contains("FERRY_MONITOR_TOKEN"), "{e}");
            assert!(e.to_string().contains("monitor.token_file"), "{e}");
        }
    }
}
