//! [`ClientConfig`]: how the client reaches brokers (addresses, timeouts, TLS, token, local bind address, message
//! size, compression, HTTP/2 windows and keepalive). Plain public fields with defaults; [`ClientConfig::validate`]
//! reports the first bad field by name.
//!
//! The token is a secret: `Debug` prints `<redacted>` in its place, and nothing in this crate logs it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Result, config_err};
use crate::retry::RetryPolicy;

/// The largest batch the client sizes its gRPC messages for by default. Brokers announce their own
/// `max_batch_bytes` in Metadata; 64 MiB leaves room for any sane broker setting.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// TLS settings (rustls with ring). The CA file is required: no system roots are compiled in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of the CA(s) that sign the brokers' certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for mutual TLS (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name to verify the broker certificate against; defaults to the host part of each broker address.
    pub domain: Option<String>,
}

/// How a client connects and talks to brokers.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Broker addresses, `host:port`, in order of preference. On a transport failure the client moves on to the
    /// next one.
    pub brokers: Vec<String>,
    /// Deadline of one unary call (20 s, as Zeze's RpcTimeout). Long-poll fetches get their wait on top.
    pub request_timeout: Duration,
    /// Deadline of establishing a connection (TCP + TLS).
    pub connect_timeout: Duration,
    /// Bearer token, sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// TLS; `None` is plaintext HTTP/2.
    pub tls: Option<TlsOptions>,
    /// Local address to connect from (an egress route through another NIC).
    pub bind: Option<IpAddr>,
    /// Largest gRPC message sent or accepted. Defaults to `ferry_proto::max_message_bytes(64 MiB)`, so a fetch of
    /// large batches is never capped by tonic's 4 MiB default.
    pub max_message_bytes: usize,
    /// zstd gRPC message compression in both directions: requests are compressed and the broker is told it may
    /// compress responses. Off by default: it pays on a WAN link, not on a local one.
    pub compression: bool,
    /// HTTP/2 initial stream window. Fixed and large rather than adaptive: see [`ClientConfig::default`].
    pub stream_window_bytes: u32,
    /// HTTP/2 initial connection window.
    pub connection_window_bytes: u32,
    /// HTTP/2 keepalive ping interval (pings are sent while idle too).
    pub keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection is declared dead.
    pub keepalive_timeout: Duration,
    /// Retry policy of idempotent calls after a transport failure or a timeout.
    pub retry: RetryPolicy,
    /// The cluster's named listener this client reaches brokers on (`[[cluster.listeners]]` of the brokers): asked
    /// for in Metadata, so that the brokers and partition leaders it learns are at that listener's addresses.
    /// `None`: the brokers' registered addresses.
    pub listener: Option<String>,
}

impl Default for ClientConfig {
    /// Defaults: `127.0.0.1:7411`, 20 s requests, 5 s connect, keepalive every 10 s with a 20 s timeout.
    ///
    /// Flow control uses fixed windows of 16 MiB per stream and 64 MiB per connection instead of hyper's adaptive
    /// window. Over a 50 ms WAN link a 16 MiB window allows ~300 MB/s per stream from the first byte, while the
    /// adaptive window starts at 64 KiB and only grows after BDP pings have measured the link, which it must
    /// redo after every reconnect or route switch; its ceiling is 16 MiB anyway. The cost is memory the peer may
    /// buffer for us, bounded by these numbers, and the Subscribe credits bound it further.
    fn default() -> Self {
        ClientConfig {
            brokers: vec!["127.0.0.1:7411".to_owned()],
            request_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
            token: None,
            tls: None,
            bind: None,
            max_message_bytes: ferry_proto::max_message_bytes(DEFAULT_MAX_BATCH_BYTES),
            compression: false,
            stream_window_bytes: 16 * 1024 * 1024,
            connection_window_bytes: 64 * 1024 * 1024,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            retry: RetryPolicy::default(),
            listener: None,
        }
    }
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("brokers", &self.brokers)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("bind", &self.bind)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("compression", &self.compression)
            .field("stream_window_bytes", &self.stream_window_bytes)
            .field("connection_window_bytes", &self.connection_window_bytes)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field("retry", &self.retry)
            .field("listener", &self.listener)
            .finish()
    }
}

impl ClientConfig {
    /// Defaults with the given broker addresses.
    pub fn new<I, S>(brokers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig { brokers: brokers.into_iter().map(Into::into).collect(), ..Default::default() }
    }

    /// Sets the bearer token.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sets TLS options.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the local address to connect from.
    pub fn with_bind(mut self, bind: IpAddr) -> Self {
        self.bind = Some(bind);
        self
    }

    /// Sets the request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Turns zstd request compression on or off.
    pub fn with_compression(mut self, on: bool) -> Self {
        self.compression = on;
        self
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.brokers.is_empty() {
            return Err(config_err("brokers", "at least one broker address is required"));
        }
        for addr in &self.brokers {
            check_address(addr)?;
        }
        let positive = [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
            ("keepalive_interval", self.keepalive_interval),
            ("keepalive_timeout", self.keepalive_timeout),
        ];
        for (field, value) in positive {
            if value.is_zero() {
                return Err(config_err(field, "must be greater than zero"));
            }
        }
        if self.max_message_bytes < ferry_proto::MESSAGE_OVERHEAD_BYTES {
            return Err(config_err(
                "max_message_bytes",
                format!(
                    "{} is below the protocol overhead of {}",
                    self.max_message_bytes,
                    ferry_proto::MESSAGE_OVERHEAD_BYTES
                ),
            ));
        }
        if let Some(token) = &self.token {
            if token.is_empty() || token.chars().any(|c| !c.is_ascii_graphic()) {
                return Err(config_err("token", "must be non-empty printable ASCII without spaces"));
            }
        }
        if let Some(tls) = &self.tls {
            if tls.ca_file.is_none() {
                return Err(config_err("tls.ca_file", "is required when TLS is on (no system roots are built in)"));
            }
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(config_err("tls.cert_file", "cert_file and key_file must be given together"));
            }
        }
        self.retry.validate()
    }
}

/// Checks that `addr` is `host:port` with a numeric port.
pub(crate) fn check_address(addr: &str) -> Result<()> {
    let bad = |why: &str| config_err("brokers", format!("{addr:?} is not host:port ({why})"));
    if addr.contains("://") {
        return Err(bad("give host:port without a scheme"));
    }
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("missing port"))?;
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    port.parse::<u16>().map_err(|_| bad("port must be a number 0-65535"))?;
    let uri = format!("http://{addr}");
    uri.parse::<http::Uri>().map_err(|e| bad(&e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ClientError;

    #[test]
    fn defaults_follow_the_design() {
        let c = ClientConfig::default();
        assert_eq!(c.brokers, vec!["127.0.0.1:7411".to_owned()]);
        assert_eq!(c.request_timeout, Duration::from_secs(20));
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.keepalive_interval, Duration::from_secs(10));
        assert_eq!(c.keepalive_timeout, Duration::from_secs(20));
        assert_eq!(c.max_message_bytes, 2 * 64 * 1024 * 1024 + 1024 * 1024);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn debug_redacts_the_token() {
        let c = ClientConfig::new(["a:1"]).with_token("s3cr3t-token");
        let text = format!("{c:?}");
        assert!(!text.contains("s3cr3t-token"), "{text}");
        assert!(text.contains("<redacted>"));
    }

    #[test]
    fn bad_addresses_name_the_field_and_value() {
        for addr in ["localhost", "http://a:1", ":7411", "a:port", "a:70000"] {
            let err = ClientConfig::new([addr]).validate().unwrap_err();
            match err {
                ClientError::Config { field: "brokers", message } => assert!(message.contains(addr), "{message}"),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(ClientConfig::new(["[::1]:7411", "broker-1.dc:7411"]).validate().is_ok());
        assert!(matches!(
            ClientConfig::new(Vec::<String>::new()).validate(),
            Err(ClientError::Config { field: "brokers", .. })
        ));
    }

    #[test]
    fn tls_needs_a_ca_and_cert_with_key() {
        let tls = TlsOptions { cert_file: Some("c.pem".into()), ..Default::default() };
        let err = ClientConfig::default().with_tls(tls).validate().unwrap_err();
        assert!(matches!(err, ClientError::Config { field: "tls.ca_file", .. }));
        let tls = TlsOptions { ca_file: Some("ca.pem".into()), cert_file: Some("c.pem".into()), ..Default::default() };
        let err = ClientConfig::default().with_tls(tls).validate().unwrap_err();
        assert!(matches!(err, ClientError::Config { field: "tls.cert_file", .. }));
    }

    #[test]
    fn tokens_with_spaces_are_refused() {
        let err = ClientConfig::default().with_token("a b").validate().unwrap_err();
        assert!(matches!(err, ClientError::Config { field: "token", .. }));
    }
}
