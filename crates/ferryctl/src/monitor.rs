//! A small HTTP client for the mirror's monitor (`--monitor ADDR`): GET and POST of the JSON API, the bearer token
//! on mutating calls, and errors that name the monitor's address.
//!
//! The monitor answers errors as `{"code", "reason"}` with a stable code; [`MonitorError::Api`] keeps both so the
//! commands can restate the codes operators hit (`unknown_route`, `route_unhealthy`, `unknown_topic`) as one
//! sentence. The documents are read into the lenient structs below (missing fields take defaults), so a field the
//! monitor adds later never breaks the text output; `--format json` prints the body as received.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::common::{GlobalOpts, UsageError};

/// Why a monitor call failed.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// Nothing answered at the address (refused, unresolvable, TLS failure, reset).
    #[error("cannot reach the mirror monitor at {addr}: {cause}")]
    Unreachable {
        /// The monitor address as given.
        addr: String,
        /// The innermost cause, e.g. "Connection refused (os error 111)".
        cause: String,
    },
    /// No answer within `--timeout`.
    #[error("the mirror monitor at {addr} did not answer within {}", humantime::format_duration(*timeout))]
    Timeout {
        /// The monitor address as given.
        addr: String,
        /// The timeout.
        timeout: Duration,
    },
    /// 401: the bearer token is missing or wrong.
    #[error("{}", unauthorized_sentence(addr, *token_given, reason))]
    Unauthorized {
        /// The monitor address as given.
        addr: String,
        /// Whether ferryctl sent a token.
        token_given: bool,
        /// The monitor's reason.
        reason: String,
    },
    /// Any other error answer.
    #[error("the mirror monitor at {addr} answered {status} {code}: {reason}")]
    Api {
        /// The monitor address as given.
        addr: String,
        /// HTTP status.
        status: u16,
        /// The stable error code (or "http_error" when the body was not the error document).
        code: String,
        /// The monitor's reason.
        reason: String,
    },
    /// A 2xx answer whose body is not the expected document.
    #[error("the mirror monitor at {addr} sent an unexpected answer to {path}: {reason}")]
    BadAnswer {
        /// The monitor address as given.
        addr: String,
        /// The request path.
        path: String,
        /// What was wrong.
        reason: String,
    },
}

fn unauthorized_sentence(addr: &str, token_given: bool, reason: &str) -> String {
    if reason.contains("no monitor token is configured") {
        format!("the mirror monitor at {addr} refuses every change: {reason}")
    } else if token_given {
        format!(
            "the mirror monitor at {addr} rejected the token: it is wrong (pass the monitor's token with --token or FERRY_TOKEN)"
        )
    } else {
        format!(
            "the mirror monitor at {addr} needs a token for this call and none was given (pass it with --token or FERRY_TOKEN)"
        )
    }
}

/// The error body.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    code: String,
    reason: String,
}

/// A client for one monitor.
#[derive(Debug, Clone)]
pub struct MonitorClient {
    http: reqwest::Client,
    base: reqwest::Url,
    addr: String,
    token: Option<String>,
    timeout: Duration,
}

impl MonitorClient {
    /// A client for `--monitor` with `--token` and `--timeout`; an https URL uses `--ca-file` as its trust root
    /// when given. A malformed address is a usage error (exit 2).
    pub fn new(global: &GlobalOpts) -> anyhow::Result<MonitorClient> {
        let addr = global.monitor_addr().trim().to_owned();
        let url = if addr.contains("://") { addr.clone() } else { format!("http://{addr}") };
        let base = reqwest::Url::parse(&url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| UsageError(format!("--monitor {addr:?} is not host:port or an http(s) URL")))?;
        let mut builder = reqwest::Client::builder().timeout(global.timeout).connect_timeout(global.timeout);
        if base.scheme() == "https"
            && let Some(ca) = &global.ca_file
        {
            let pem =
                std::fs::read(ca).map_err(|e| UsageError(format!("cannot read --ca-file {}: {e}", ca.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| UsageError(format!("--ca-file {} is not a PEM certificate: {e}", ca.display())))?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().map_err(|e| anyhow::anyhow!("cannot set up the HTTP client: {e}"))?;
        Ok(MonitorClient { http, base, addr, token: global.token.clone(), timeout: global.timeout })
    }

    /// The address as given, for messages.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `base` + path segments (each percent-encoded) + optional query pair.
    fn url_for(&self, segments: &[&str], query: Option<(&str, &str)>) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty();
            path.extend(segments);
        }
        if let Some((k, v)) = query {
            url.query_pairs_mut().append_pair(k, v);
        }
        url
    }

    /// GET: the body as text and parsed.
    pub async fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: Option<(&str, &str)>,
    ) -> Result<(String, T), MonitorError> {
        let url = self.url_for(segments, query);
        let body = self.send(self.http.get(url.clone())).await?;
        let parsed = self.parse(&url, &body)?;
        Ok((body, parsed))
    }

    /// POST with the bearer token and an optional JSON body: the answer as text and parsed.
    pub async fn post<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        body: Option<serde_json::Value>,
    ) -> Result<(String, T), MonitorError> {
        let url = self.url_for(segments, None);
        let mut request = self.http.post(url.clone());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let text = self.send(request).await?;
        let parsed = self.parse(&url, &text)?;
        Ok((text, parsed))
    }

    fn parse<T: DeserializeOwned>(&self, url: &reqwest::Url, body: &str) -> Result<T, MonitorError> {
        serde_json::from_str(body).map_err(|e| MonitorError::BadAnswer {
            addr: self.addr.clone(),
            path: url.path().to_owned(),
            reason: e.to_string(),
        })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<String, MonitorError> {
        let response = request.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| self.transport(&e))?;
        if status.is_success() {
            return Ok(body);
        }
        let (code, reason) = match serde_json::from_str::<ErrorBody>(&body) {
            Ok(e) => (e.code, e.reason),
            Err(_) => ("http_error".to_owned(), body.trim().chars().take(200).collect()),
        };
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(MonitorError::Unauthorized {
                addr: self.addr.clone(),
                token_given: self.token.as_ref().is_some_and(|t| !t.is_empty()),
                reason,
            });
        }
        Err(MonitorError::Api { addr: self.addr.clone(), status: status.as_u16(), code, reason })
    }

    fn transport(&self, e: &reqwest::Error) -> MonitorError {
        if e.is_timeout() {
            return MonitorError::Timeout { addr: self.addr.clone(), timeout: self.timeout };
        }
        // The innermost cause says what happened ("Connection refused"); the outer ones repeat the URL.
        let mut cause: &dyn std::error::Error = e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        MonitorError::Unreachable { addr: self.addr.clone(), cause: cause.to_string() }
    }
}

// The documents are the monitor's own types, which deserialize with missing fields defaulted: a renamed field
// fails to compile here instead of reading as zero.
pub use ferry_mirror::egress::EgressView as EgressDoc;
pub use ferry_mirror::monitor::views::{SideRateView as SideRatesDoc, StatusView as StatusDoc};
pub use ferry_mirror::state::PartitionView as PartitionDoc;

/// `GET /api/v1/partitions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PartitionsDoc {
    /// The partitions, sorted by topic and partition.
    pub partitions: Vec<PartitionDoc>,
}

/// The answer of pause and resume.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ControlDoc {
    /// The topic.
    pub topic: String,
    /// Whether it is paused now.
    pub paused: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The global options alone, as the command line parses them.
    #[derive(Parser)]
    struct Opts {
        #[command(flatten)]
        global: GlobalOpts,
    }

    fn client(args: &[&str]) -> anyhow::Result<MonitorClient> {
        let opts = Opts::try_parse_from(["ferryctl"].iter().chain(args).copied()).unwrap();
        MonitorClient::new(&opts.global)
    }

    #[test]
    fn addresses_become_urls_and_paths_are_encoded() {
        let c = client(&["--monitor", "10.0.0.1:9300"]).unwrap();
        assert_eq!(c.url_for(&[], None).as_str(), "http://10.0.0.1:9300/");
        assert_eq!(
            c.url_for(&["api", "v1", "topics", "a/b c", "pause"], None).as_str(),
            "http://10.0.0.1:9300/api/v1/topics/a%2Fb%20c/pause"
        );
        assert_eq!(
            c.url_for(&["api", "v1", "partitions"], Some(("topic", "x&y"))).as_str(),
            "http://10.0.0.1:9300/api/v1/partitions?topic=x%26y"
        );
        let c = client(&["--monitor", "https://mon.example:9443/"]).unwrap();
        assert_eq!(c.url_for(&["api", "v1", "status"], None).as_str(), "https://mon.example:9443/api/v1/status");
        let err = client(&["--monitor", "ftp://x"]).unwrap_err();
        assert!(err.downcast_ref::<UsageError>().is_some(), "{err}");
    }

    #[test]
    fn unauthorized_says_what_to_do() {
        let e = MonitorError::Unauthorized { addr: "m:1".into(), token_given: false, reason: "missing".into() };
        assert_eq!(
            e.to_string(),
            "the mirror monitor at m:1 needs a token for this call and none was given (pass it with --token or \
             FERRY_TOKEN)"
        );
        let e = MonitorError::Unauthorized { addr: "m:1".into(), token_given: true, reason: "wrong".into() };
        assert!(e.to_string().contains("rejected the token: it is wrong"), "{e}");
    }

    #[test]
    fn documents_tolerate_missing_and_extra_fields() {
        let d: PartitionsDoc =
            serde_json::from_str(r#"{"partitions":[{"topic":"t","partition":1,"lag":3,"new_field":true}]}"#).unwrap();
        assert_eq!(d.partitions[0].topic, "t");
        assert_eq!((d.partitions[0].partition, d.partitions[0].lag), (1, 3));
        assert_eq!(d.partitions[0].last_error, None);
        let s: StatusDoc = serde_json::from_str(r#"{"rates":{"source":{"records_per_sec":{"1s":2.5}}}}"#).unwrap();
        assert_eq!(s.rates.source.records_per_sec.w1, 2.5);
    }
}
