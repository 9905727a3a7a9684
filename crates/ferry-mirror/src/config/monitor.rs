//! `[monitor]`: the HTTP listener of the REST API, metrics and dashboard, its bearer token, TLS and audit log.

use std::net::SocketAddr;
use std::path::PathBuf;

use ferry_config::Problems;
use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::checks;
use super::secret::{self, MONITOR_TOKEN_ENV, Secret};

/// `[monitor]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// Listen address.
    #[serde(deserialize_with = "checks::socket_addr")]
    pub listen: SocketAddr,
    /// File holding the bearer token for mutating calls (`FERRY_MONITOR_TOKEN` wins over it).
    pub token_file: Option<PathBuf>,
    /// Bearer token for mutating calls, read at load from `FERRY_MONITOR_TOKEN` or `token_file`.
    #[serde(skip)]
    pub token: Option<Secret>,
    /// TLS (certificate and key files), from `[monitor.tls]` `cert_file` and `key_file`.
    #[serde(deserialize_with = "server_tls")]
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Audit log file for mutating calls (also logged through tracing). Unset: tracing only.
    pub audit_log: Option<PathBuf>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9300)),
            token_file: None,
            token: None,
            tls: None,
            audit_log: None,
        }
    }
}

/// `[monitor.tls]`: both files or nothing.
fn server_tls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(PathBuf, PathBuf)>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Files {
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
    }
    match Files::deserialize(d)? {
        Files { cert_file: Some(c), key_file: Some(k) } => Ok(Some((c, k))),
        _ => Err(de::Error::custom("needs both cert_file and key_file")),
    }
}

impl MonitorConfig {
    /// Reads the token.
    pub(super) fn resolve(&mut self, p: &mut Problems) {
        self.token = secret::read(p, "monitor.token_file", self.token_file.as_deref(), Some(MONITOR_TOKEN_ENV));
    }
}
