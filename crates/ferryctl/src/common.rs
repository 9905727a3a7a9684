//! What every subcommand shares: the global options and the broker client they describe, the usage error that
//! makes `main` exit with 2, value parsers, and the wording of common client errors. A leaf: it imports no other
//! module of ferryctl.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use ferry_client::{BrokerClient, ClientConfig, ClientError, TlsOptions};

/// Where the mirror monitor is when `--monitor` and `FERRY_MONITOR` are not given.
pub const DEFAULT_MONITOR: &str = "127.0.0.1:9300";

/// Options shared by every subcommand. Not `Debug`: it holds the token.
#[derive(Args, Clone)]
pub struct GlobalOpts {
    /// Broker address host:port (a comma-separated list fails over in order).
    #[arg(long, global = true, env = "FERRY_BROKER", default_value = "127.0.0.1:7411", value_delimiter = ',')]
    pub broker: Vec<String>,
    /// Mirror monitor address host:port or URL (for mirror commands) [default: 127.0.0.1:9300].
    #[arg(long, global = true, env = "FERRY_MONITOR")]
    pub monitor: Option<String>,
    /// Bearer token for the broker or monitor.
    #[arg(long, global = true, env = "FERRY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Request timeout, e.g. 20s, 500ms, or plain seconds.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "20s")]
    pub timeout: Duration,
    /// CA certificate (PEM) for TLS to the broker; turns TLS on.
    #[arg(long, global = true, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, global = true, value_name = "FILE")]
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of --cert-file.
    #[arg(long, global = true, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Name to verify the broker certificate against (default: the host of --broker).
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

impl GlobalOpts {
    /// The client configuration these options describe.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.broker.iter().map(|b| b.trim().to_owned()));
        config.request_timeout = self.timeout;
        config.token = self.token.clone();
        if self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some() {
            config.tls = Some(TlsOptions {
                ca_file: self.ca_file.clone(),
                cert_file: self.cert_file.clone(),
                key_file: self.key_file.clone(),
                domain: self.tls_domain.clone(),
            });
        }
        config
    }

    /// A broker client; bad options are usage errors (exit 2).
    pub fn client(&self) -> anyhow::Result<BrokerClient> {
        BrokerClient::new(self.client_config()).map_err(|e| match e {
            ClientError::Config { .. } => UsageError(e.to_string()).into(),
            other => other.into(),
        })
    }

    /// The broker addresses, for messages.
    pub fn brokers(&self) -> String {
        self.broker.join(",")
    }

    /// The monitor address: `--monitor`, `FERRY_MONITOR`, or [`DEFAULT_MONITOR`].
    pub fn monitor_addr(&self) -> &str {
        self.monitor.as_deref().unwrap_or(DEFAULT_MONITOR)
    }

    /// A client for the same TLS and token options but other broker addresses (`mirror verify`).
    pub fn client_for(&self, brokers: &[String]) -> anyhow::Result<BrokerClient> {
        let mut opts = self.clone();
        opts.broker = brokers.to_vec();
        opts.client()
    }
}

/// A mistake in how ferryctl was called, found after parsing (an unknown `--config` key, a bad `k=v`).
/// `main` prints it and exits with 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Parses `20s`, `500ms`, `1m` or plain (possibly fractional) seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{text:?} is not a duration"));
    }
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e}); try 20s or 500ms"))
}

/// Splits `key=value` at the first `=`; `what` names the option in the error.
pub fn parse_key_value(text: &str, what: &str) -> Result<(String, String), UsageError> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(UsageError(format!("{what} {text:?} is not key=value"))),
    }
}

/// Restates NOT_FOUND and ALREADY_EXISTS about `topic` as one sentence; other errors pass through.
pub fn explain(err: ClientError, topic: &str, brokers: &str) -> anyhow::Error {
    let broker = match &err {
        ClientError::Status { broker, .. } => broker.clone(),
        _ => brokers.to_owned(),
    };
    if err.is_not_found() {
        anyhow!("topic {topic:?} does not exist on {broker}")
    } else if err.is_already_exists() {
        anyhow!("topic {topic:?} already exists on {broker}")
    } else {
        err.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn key_values() {
        assert_eq!(parse_key_value("a=b=c", "--header").unwrap(), ("a".into(), "b=c".into()));
        assert_eq!(parse_key_value("a=", "--header").unwrap(), ("a".into(), String::new()));
        assert!(parse_key_value("=b", "--header").is_err());
        assert_eq!(parse_key_value("ab", "--header").unwrap_err().0, "--header \"ab\" is not key=value");
    }

    #[test]
    fn not_found_becomes_one_sentence() {
        let err = ClientError::Status {
            code: ferry_client::Code::NotFound,
            message: "unknown topic \"orders\"".into(),
            broker: "127.0.0.1:7411".into(),
            reason: None,
        };
        assert_eq!(explain(err, "orders", "x").to_string(), "topic \"orders\" does not exist on 127.0.0.1:7411");
    }
}
