//! librdkafka client configuration: the operator's properties, then the ones the mirror owns; the client context
//! that forwards librdkafka's logs to tracing and remembers its last error (so a failed call can say why); and the
//! bridge that runs librdkafka's blocking calls off the async runtime.

use std::collections::BTreeMap;
use std::time::Instant;

use ferry_client::ClientError;
use parking_lot::Mutex;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::error::KafkaSetupError;

/// Property values whose names contain one of these are secrets: never logged.
const SECRET_MARKERS: &[&str] = &["password", "secret", "key"];

/// The properties with secret values replaced by `"***"`, for logs and error messages.
pub fn redacted(properties: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    properties
        .iter()
        .map(|(k, v)| {
            let lower = k.to_ascii_lowercase();
            let secret = SECRET_MARKERS.iter().any(|m| lower.contains(m));
            (k.clone(), if secret { "***".to_owned() } else { v.clone() })
        })
        .collect()
}

/// Which side a client serves, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Source,
    Target,
}

impl Side {
    pub(crate) fn section(self) -> &'static str {
        match self {
            Side::Source => "source.kafka",
            Side::Target => "target.kafka",
        }
    }
}

/// A client configuration: the operator's properties, then `owned` (which always win), then `defaults` for keys
/// the operator did not set. Checks every property with librdkafka before any client is created.
pub(crate) fn client_config(
    side: Side,
    brokers: &[String],
    properties: &BTreeMap<String, String>,
    owned: &[(&str, String)],
    defaults: &[(&str, &str)],
) -> Result<ClientConfig, KafkaSetupError> {
    if brokers.is_empty() {
        return Err(KafkaSetupError::NoBootstrapServers { section: side.section() });
    }
    let mut cfg = ClientConfig::new();
    for (k, v) in properties {
        cfg.set(k, v);
    }
    for (k, v) in defaults {
        if !properties.contains_key(*k) {
            cfg.set(*k, *v);
        }
    }
    for (k, v) in owned {
        cfg.set(*k, v);
    }
    cfg.set("bootstrap.servers", brokers.join(","));
    cfg.set_log_level(RDKafkaLogLevel::Warning);
    if let Err(e) = cfg.create_native_config() {
        let message = match &e {
            // The value is left out: it may be a secret.
            KafkaError::ClientConfig(_, description, key, _) => format!("{key}: {description}"),
            other => other.to_string(),
        };
        return Err(KafkaSetupError::InvalidProperty { section: side.section(), message });
    }
    Ok(cfg)
}

/// The last error librdkafka reported on a client.
#[derive(Debug, Clone)]
pub(crate) struct LastError {
    pub(crate) code: Option<RDKafkaErrorCode>,
    pub(crate) reason: String,
    pub(crate) at: Instant,
}

/// Client context shared by every librdkafka client of the mirror: logs go to tracing with a label saying which
/// client spoke, and the last error is kept so that a failed call can name the underlying cause ("Connection
/// refused", "SASL authentication failed", "Invalid response size", ...).
#[derive(Clone)]
pub(crate) struct Ctx {
    inner: std::sync::Arc<CtxInner>,
}

struct CtxInner {
    label: String,
    last: Mutex<Option<LastError>>,
}

impl Ctx {
    pub(crate) fn new(label: impl Into<String>) -> Ctx {
        Ctx { inner: std::sync::Arc::new(CtxInner { label: label.into(), last: Mutex::new(None) }) }
    }

    /// The last error, if any was reported since `since`.
    pub(crate) fn last_error_since(&self, since: Instant) -> Option<LastError> {
        self.inner.last.lock().clone().filter(|e| e.at >= since)
    }

    /// The last error reported, as a suffix for messages.
    pub(crate) fn cause(&self) -> String {
        self.inner.last.lock().as_ref().map(|e| format!("; last client error: {}", e.reason)).unwrap_or_default()
    }
}

impl ClientContext for Ctx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let label = &self.inner.label;
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => tracing::warn!(client = %label, facility = fac, "librdkafka: {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(client = %label, facility = fac, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(client = %label, facility = fac, "librdkafka: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(client = %self.inner.label, %error, reason, "librdkafka error");
        *self.inner.last.lock() =
            Some(LastError { code: error.rdkafka_error_code(), reason: reason.to_owned(), at: Instant::now() });
    }

    // Statistics are not enabled; nothing to log.
    fn stats(&self, _statistics: rdkafka::Statistics) {}
}

impl ConsumerContext for Ctx {}

/// Runs a blocking librdkafka call on the blocking pool.
pub(crate) async fn blocking<T, F>(what: &'static str, f: F) -> Result<T, ClientError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ClientError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(ClientError::Usage(format!("{what}: the blocking librdkafka call did not finish: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn secrets_are_redacted_by_name() {
        let r = redacted(&props(&[
            ("sasl.password", "hunter2"),
            ("ssl.key.location", "/etc/key.pem"),
            ("sasl.oauthbearer.client.secret", "s"),
            ("session.timeout.ms", "6000"),
        ]));
        assert_eq!(r["sasl.password"], "***");
        assert_eq!(r["ssl.key.location"], "***");
        assert_eq!(r["sasl.oauthbearer.client.secret"], "***");
        assert_eq!(r["session.timeout.ms"], "6000");
    }

    #[test]
    fn owned_properties_win_and_defaults_fill_in() {
        let user = props(&[("enable.auto.commit", "true"), ("isolation.level", "read_uncommitted")]);
        let cfg = client_config(
            Side::Source,
            &["127.0.0.1:9092".into()],
            &user,
            &[("enable.auto.commit", "false".into())],
            &[("isolation.level", "read_committed"), ("queued.max.messages.kbytes", "8192")],
        )
        .unwrap();
        assert_eq!(cfg.get("enable.auto.commit"), Some("false"));
        assert_eq!(cfg.get("isolation.level"), Some("read_uncommitted"));
        assert_eq!(cfg.get("queued.max.messages.kbytes"), Some("8192"));
        assert_eq!(cfg.get("bootstrap.servers"), Some("127.0.0.1:9092"));
    }

    #[test]
    fn an_unknown_property_is_a_clear_error_without_its_value() {
        let user = props(&[("no.such.property", "topsecret")]);
        let err = client_config(Side::Target, &["h:1".into()], &user, &[], &[]).unwrap_err().to_string();
        assert!(err.contains("target.kafka") && err.contains("no.such.property"), "{err}");
        assert!(!err.contains("topsecret"), "{err}");
    }

    #[test]
    fn bootstrap_servers_are_required() {
        let err = client_config(Side::Source, &[], &BTreeMap::new(), &[], &[]).unwrap_err();
        assert!(err.to_string().contains("bootstrap"), "{err}");
    }
}
