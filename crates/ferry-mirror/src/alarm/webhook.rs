//! The webhook channel: a JSON POST per notice (reqwest over rustls), a timeout per attempt, retries with
//! exponential backoff and jitter, and an optional HMAC-SHA256 signature of the exact body bytes in
//! `X-Ferry-Signature: sha256=<hex>`.
//!
//! The URL may itself carry a token (many chat webhooks do), so logs and errors show only its scheme and host,
//! and reqwest errors are stripped of the URL.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::AlarmError;
use super::notice::{AlarmIdentity, Notice, webhook_body};
use crate::config::{Secret, WebhookConfig};

/// The header holding the body's signature.
pub const SIGNATURE_HEADER: &str = "X-Ferry-Signature";
/// The header naming the event.
pub const EVENT_HEADER: &str = "X-Ferry-Event";

/// First retry delay; doubled per retry (capped at [`MAX_BACKOFF`]), with jitter.
const BASE_BACKOFF: Duration = Duration::from_millis(200);
/// Longest delay between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// `sha256=<hex of HMAC-SHA256(key, body)>`.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The webhook's retry policy: `BASE_BACKOFF` doubling to `MAX_BACKOFF`, with jitter.
fn policy() -> ferry_client::RetryPolicy {
    ferry_client::RetryPolicy {
        initial_backoff: BASE_BACKOFF,
        max_backoff: MAX_BACKOFF,
        multiplier: 2.0,
        jitter: true,
        max_attempts: u32::MAX,
    }
}

/// One webhook channel.
pub struct WebhookChannel {
    name: String,
    url: reqwest::Url,
    shown_url: String,
    secret: Option<Secret>,
    retries: u32,
    client: reqwest::Client,
    identity: Arc<AlarmIdentity>,
}

impl std::fmt::Debug for WebhookChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookChannel").field("name", &self.name).field("url", &self.shown_url).finish()
    }
}

impl WebhookChannel {
    /// Builds the channel (the HTTP client and its timeout).
    pub fn new(cfg: &WebhookConfig, identity: Arc<AlarmIdentity>) -> Result<WebhookChannel, AlarmError> {
        let bad = |reason: String| AlarmError::Channel { channel: cfg.name.clone(), reason };
        let url = reqwest::Url::parse(&cfg.url).map_err(|e| bad(format!("url is not a valid URL: {e}")))?;
        let shown_url = format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or("?"),
            url.port().map_or(String::new(), |p| format!(":{p}"))
        );
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(cfg.timeout)
            .user_agent(concat!("ferry-mirror/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| bad(format!("cannot build the HTTP client: {}", e.without_url())))?;
        Ok(WebhookChannel {
            name: cfg.name.clone(),
            url,
            shown_url,
            secret: cfg.secret.clone(),
            retries: cfg.retries,
            client,
            identity,
        })
    }

    /// The channel name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// POSTs `notice`, retrying transport errors, timeouts, 408, 429 and 5xx up to `retries` times.
    pub async fn send(&self, notice: &Notice) -> Result<(), AlarmError> {
        let body = webhook_body(notice, &self.identity);
        let sig = self.secret.as_ref().map(|s| signature(s.expose().as_bytes(), &body));
        let mut attempt = 0;
        let mut backoff = policy().backoff();
        loop {
            attempt += 1;
            let mut req = self
                .client
                .post(self.url.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(EVENT_HEADER, notice.event.kind.name())
                .body(body.clone());
            if let Some(sig) = &sig {
                req = req.header(SIGNATURE_HEADER, sig);
            }
            let err = match req.send().await {
                Ok(resp) if resp.status().is_success() => return Ok(()),
                Ok(resp) => {
                    let status = resp.status();
                    let retryable = status.is_server_error()
                        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                        || status == reqwest::StatusCode::REQUEST_TIMEOUT;
                    let err = AlarmError::WebhookStatus {
                        channel: self.name.clone(),
                        url: self.shown_url.clone(),
                        status: status.as_u16(),
                        attempts: attempt,
                    };
                    if !retryable {
                        return Err(err);
                    }
                    err
                }
                Err(e) => AlarmError::WebhookRequest {
                    channel: self.name.clone(),
                    url: self.shown_url.clone(),
                    attempts: attempt,
                    source: e.without_url(),
                },
            };
            if attempt > self.retries {
                return Err(err);
            }
            tracing::debug!(channel = %self.name, attempt, error = %err, "webhook attempt failed; retrying");
            tokio::time::sleep(backoff.next().unwrap_or(MAX_BACKOFF)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_rfc_4231_vector() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn the_url_token_is_not_shown() {
        let cfg = WebhookConfig {
            name: "chat".into(),
            url: "https://hooks.example:8443/services/T000/B000/s3cr3t-token".into(),
            secret_file: None,
            secret: Some(Secret::new("k")),
            timeout: Duration::from_secs(1),
            retries: 0,
        };
        let id = Arc::new(AlarmIdentity { mirror: "m".into(), source_cluster: "a".into(), target_cluster: "b".into() });
        let ch = WebhookChannel::new(&cfg, id).unwrap();
        let shown = format!("{ch:?}");
        assert_eq!(shown, "WebhookChannel { name: \"chat\", url: \"https://hooks.example:8443\" }");
    }
}
