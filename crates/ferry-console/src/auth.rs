//! Who may do what, and the record of what they did.
//!
//! - A caller is known by `Authorization: Bearer <token>` (API clients) or by the session cookie a browser gets
//!   from `POST /login` (HttpOnly, SameSite=Strict). With `anonymous_read` a caller with neither reads as
//!   `anonymous`. Tokens are compared as SHA-256 digests in constant time; a token never appears in a URL, a log
//!   line, an audit record or an answer.
//! - Reads need the read or admin scope; actions need admin (403 otherwise) and the caller's CSRF token in the
//!   `X-Ferry-CSRF` header (403 `csrf_required`): an HMAC of the caller's identity under a key drawn at start, which
//!   `GET /api/v1/session` and every page give the caller.
//! - Every action, allowed or refused, writes one audit record (JSON line) naming the caller, never the token.
//! - Both guards run the request with the caller's token digest in a task-local ([`caller_digest`]), from which
//!   [`crate::api::cluster`] picks the caller's own broker client on a cluster with `forward_user_token`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::SystemTime;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;

use crate::AppState;
use crate::config::{LoadedToken, Scope};
use crate::error::{ApiError, ErrorCode};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "ferry_console_session";
/// The header carrying the CSRF token.
pub const CSRF_HEADER: &str = "x-ferry-csrf";
/// The most browser sessions kept (the oldest half is dropped beyond it).
pub const MAX_SESSIONS: usize = 10_000;

/// A known caller.
#[derive(Debug, Clone, Serialize)]
pub struct Principal {
    /// The token's name (or `anonymous`).
    pub name: String,
    /// What it may do.
    pub scope: Scope,
    /// Its CSRF token.
    pub csrf: String,
    /// The SHA-256 digest of the token it presented (directly or at login); `None` for `anonymous`. It selects the
    /// broker client of a cluster with `forward_user_token` and is never serialized.
    #[serde(skip)]
    pub token_digest: Option<[u8; 32]>,
}

tokio::task_local! {
    /// The token digest of the caller whose request the current task serves (set by [`read_guard`] and [`guard`]).
    static CALLER: Option<[u8; 32]>;
}

/// The token digest of the caller the current request runs for; `None` outside a request or for `anonymous`.
pub fn caller_digest() -> Option<[u8; 32]> {
    CALLER.try_with(|c| *c).ok().flatten()
}

/// The SHA-256 digest of a token (the key of per-token broker clients).
pub fn token_digest(token: &str) -> [u8; 32] {
    digest(token.as_bytes())
}

/// A browser session: the token's name, scope and digest.
type Session = (String, Scope, [u8; 32]);

struct Known {
    digest: [u8; 32],
    name: String,
    scope: Scope,
}

/// Token and session checks.
pub struct Auth {
    tokens: Vec<Known>,
    anonymous_read: bool,
    sessions: parking_lot::Mutex<HashMap<String, Session>>,
    key: [u8; 32],
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Auth {
    /// Over the configured tokens.
    pub fn new(tokens: &[LoadedToken], anonymous_read: bool) -> Auth {
        Auth {
            tokens: tokens
                .iter()
                .map(|t| Known { digest: digest(t.secret.as_bytes()), name: t.name.clone(), scope: t.scope })
                .collect(),
            anonymous_read,
            sessions: parking_lot::Mutex::new(HashMap::new()),
            key: rand::random(),
        }
    }

    fn csrf_for(&self, identity: &str) -> String {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else { return String::new() };
        mac.update(identity.as_bytes());
        hex(&mac.finalize().into_bytes())
    }

    fn by_token(&self, token: &str) -> Option<&Known> {
        let d = digest(token.as_bytes());
        let mut found = None;
        for k in &self.tokens {
            if bool::from(k.digest.ct_eq(&d)) {
                found = Some(k);
            }
        }
        found
    }

    /// A browser session for `token`, or `None` for an unknown token.
    pub fn login(&self, token: &str) -> Option<(String, Principal)> {
        let k = self.by_token(token.trim())?;
        let id = hex(&rand::random::<[u8; 32]>());
        let mut sessions = self.sessions.lock();
        if sessions.len() >= MAX_SESSIONS {
            let drop: Vec<String> = sessions.keys().take(MAX_SESSIONS / 2).cloned().collect();
            for d in drop {
                sessions.remove(&d);
            }
        }
        sessions.insert(id.clone(), (k.name.clone(), k.scope, k.digest));
        let principal = Principal {
            name: k.name.clone(),
            scope: k.scope,
            csrf: self.csrf_for(&format!("s:{id}")),
            token_digest: Some(k.digest),
        };
        Some((id, principal))
    }

    /// The caller of a request.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim())
                .ok_or_else(|| ApiError::Unauthorized("the Authorization header must be \"Bearer <token>\"".into()))?;
            let k = self.by_token(token).ok_or_else(|| ApiError::Unauthorized("unknown bearer token".into()))?;
            let identity = format!("t:{}", hex(&k.digest));
            return Ok(Principal {
                name: k.name.clone(),
                scope: k.scope,
                csrf: self.csrf_for(&identity),
                token_digest: Some(k.digest),
            });
        }
        if let Some(id) = session_cookie(headers) {
            if let Some((name, scope, digest)) = self.sessions.lock().get(id).cloned() {
                let csrf = self.csrf_for(&format!("s:{id}"));
                return Ok(Principal { name, scope, csrf, token_digest: Some(digest) });
            }
        }
        if self.anonymous_read {
            return Ok(Principal {
                name: "anonymous".into(),
                scope: Scope::Read,
                csrf: String::new(),
                token_digest: None,
            });
        }
        Err(ApiError::Unauthorized(
            "missing credentials: send \"Authorization: Bearer <token>\" or log in at /login".into(),
        ))
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let (k, v) = c.trim().split_once('=')?;
        (k == SESSION_COOKIE).then_some(v)
    })
}

/// Details a handler attaches to its answer for the audit record.
#[derive(Debug, Clone)]
pub struct AuditDetail(pub serde_json::Value);

/// One audit record.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRecord {
    /// RFC 3339 UTC, milliseconds.
    pub timestamp: String,
    /// The action (`produce`, `resend`, `redrive`, `offsets.reset`, `txn.resolve`, `login`).
    pub action: &'static str,
    /// The caller's token name, or `unknown` when it was not authenticated.
    pub who: String,
    /// HTTP method and path.
    pub method: String,
    /// Path.
    pub path: String,
    /// TCP peer.
    pub peer: String,
    /// `ok` or the error code.
    pub outcome: String,
    /// HTTP status.
    pub status: u16,
    /// What the handler did (the records written, the job, ...).
    pub detail: serde_json::Value,
}

/// The audit log: the tracing log always, a JSON-lines file when configured.
pub struct AuditLog {
    file: Option<tokio::sync::Mutex<tokio::fs::File>>,
}

impl AuditLog {
    /// Opens `path` for appending.
    pub async fn open(path: Option<&Path>) -> std::io::Result<AuditLog> {
        let file = match path {
            Some(p) => {
                Some(tokio::sync::Mutex::new(tokio::fs::OpenOptions::new().create(true).append(true).open(p).await?))
            }
            None => None,
        };
        Ok(AuditLog { file })
    }

    /// Writes one record.
    pub async fn record(&self, r: &AuditRecord) {
        tracing::info!(target: "audit", action = r.action, who = %r.who, path = %r.path, outcome = %r.outcome,
            status = r.status, detail = %r.detail, "console action");
        let Some(file) = &self.file else { return };
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        let mut f = file.lock().await;
        if let Err(e) = async {
            f.write_all(&line).await?;
            f.flush().await
        }
        .await
        {
            tracing::error!(error = %e, "cannot append to the audit log");
        }
    }
}

/// Builds an audit record from an answer.
pub fn audit_record(
    action: &'static str,
    who: &str,
    method: &str,
    path: &str,
    peer: &str,
    response: &Response,
) -> AuditRecord {
    let status = response.status();
    let outcome = match response.extensions().get::<ErrorCode>() {
        Some(ErrorCode(code)) => (*code).to_owned(),
        None if status.is_success() || status.is_redirection() => "ok".to_owned(),
        None => format!("http_{}", status.as_u16()),
    };
    AuditRecord {
        timestamp: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        action,
        who: who.to_owned(),
        method: method.to_owned(),
        path: path.to_owned(),
        peer: peer.to_owned(),
        outcome,
        status: status.as_u16(),
        detail: response.extensions().get::<AuditDetail>().map_or(serde_json::Value::Null, |d| d.0.clone()),
    }
}

/// Middleware of reads: a known caller (any scope), put in the request's extensions.
pub async fn read_guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    match state.auth.authenticate(request.headers()) {
        Ok(p) => {
            let caller = p.token_digest;
            request.extensions_mut().insert(p);
            CALLER.scope(caller, next.run(request)).await
        }
        Err(e) if request.uri().path().starts_with("/api/") => e.into_response(),
        Err(_) => axum::response::Redirect::to("/login").into_response(),
    }
}

/// The per-route state of [`guard`].
#[derive(Clone)]
pub struct Guarded {
    /// The app.
    pub state: AppState,
    /// The audited action.
    pub action: &'static str,
}

/// Middleware of actions: admin scope, CSRF token, one audit record.
pub async fn guard(State(g): State<Guarded>, mut request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |ConnectInfo(a)| a.to_string());
    let checked = match g.state.auth.authenticate(request.headers()) {
        Err(e) => Err(("unknown".to_owned(), e)),
        Ok(p) if p.scope != Scope::Admin => {
            let e = ApiError::Forbidden(format!("{:?} has the read scope; this action needs admin", p.name));
            Err((p.name, e))
        }
        Ok(p) => {
            let presented = request.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
            if p.csrf.is_empty() || !bool::from(presented.as_bytes().ct_eq(p.csrf.as_bytes())) {
                let e = ApiError::Csrf(format!(
                    "missing or wrong {CSRF_HEADER} header: take it from GET /api/v1/session or the page"
                ));
                Err((p.name, e))
            } else {
                Ok(p)
            }
        }
    };
    let (who, response) = match checked {
        Ok(p) => {
            let (who, caller) = (p.name.clone(), p.token_digest);
            request.extensions_mut().insert(p);
            (who, CALLER.scope(caller, next.run(request)).await)
        }
        Err((who, e)) => (who, e.into_response()),
    };
    g.state.audit.record(&audit_record(g.action, &who, &method, &path, &peer, &response)).await;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn token(name: &str, secret: &str, scope: Scope) -> LoadedToken {
        LoadedToken { name: name.into(), scope, secret: secret.into() }
    }

    fn bearer(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn tokens_sessions_and_csrf() {
        let auth = Auth::new(&[token("ops", "s3cret", Scope::Admin), token("view", "look", Scope::Read)], false);
        let ops = auth.authenticate(&bearer("Bearer s3cret")).unwrap();
        assert_eq!((ops.name.as_str(), ops.scope), ("ops", Scope::Admin));
        assert_eq!(auth.authenticate(&bearer("Bearer look")).unwrap().scope, Scope::Read);
        for bad in ["Bearer s3cre", "Basic s3cret", "s3cret"] {
            let e = auth.authenticate(&bearer(bad)).unwrap_err();
            assert_eq!(e.code(), "unauthorized");
            assert!(!e.to_string().contains("s3cret"));
        }
        assert_eq!(auth.authenticate(&HeaderMap::new()).unwrap_err().code(), "unauthorized");
        let (id, p) = auth.login("s3cret").unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("a=b; {SESSION_COOKIE}={id}")).unwrap());
        let again = auth.authenticate(&h).unwrap();
        assert_eq!((again.name.as_str(), again.csrf.as_str()), ("ops", p.csrf.as_str()));
        assert_ne!(again.csrf, ops.csrf, "a CSRF token is bound to its session");
        assert!(auth.login("nope").is_none());
    }

    #[test]
    fn anonymous_read_has_no_csrf_token() {
        let auth = Auth::new(&[], true);
        let p = auth.authenticate(&HeaderMap::new()).unwrap();
        assert_eq!((p.scope, p.csrf.as_str()), (Scope::Read, ""));
    }
}
