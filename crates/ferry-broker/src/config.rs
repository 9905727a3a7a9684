//! The broker's configuration: compiled-in defaults, then the TOML file, then `FERRY_BROKER__SECTION__KEY`
//! environment variables, then command-line overrides. `conf/broker.toml` documents every key.
//!
//! Secrets never live in the config tree: the bearer token comes from `broker.token_file` or `FERRY_BROKER_TOKEN`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use ferry_storage::{FlushPolicy, LogConfig};
use serde::Deserialize;

/// Environment variable holding the bearer token (alternative to `broker.token_file`).
pub const TOKEN_ENV: &str = "FERRY_BROKER_TOKEN";

/// The whole broker configuration.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `[broker]`: identity, listener, limits, security.
    pub broker: BrokerSection,
    /// `[storage]`: defaults for every topic's log.
    pub storage: StorageSection,
    /// `[groups]`: consumer group coordination.
    pub groups: GroupsSection,
}

/// `[broker]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerSection {
    /// Address the gRPC listener binds.
    pub listen: SocketAddr,
    /// Address reported in metadata; defaults to the bound listener address.
    pub advertised_address: Option<String>,
    /// Where topics, partitions and group offsets live.
    pub data_dir: PathBuf,
    /// The cluster's id. Empty: generated on first start and persisted in the data dir.
    pub cluster_id: Option<String>,
    /// Largest record batch accepted.
    pub max_batch_bytes: ByteSize,
    /// Longest long-poll wait a fetch may ask for.
    #[serde(with = "humantime_serde")]
    pub max_fetch_wait: Duration,
    /// File holding the bearer token clients must present. Unset (and no `FERRY_BROKER_TOKEN`): no token check.
    pub token_file: Option<PathBuf>,
    /// TLS for the gRPC listener (rustls). Unset: plaintext.
    pub tls: Option<TlsSection>,
    /// Graceful shutdown budget after SIGTERM.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
}

impl Default for BrokerSection {
    fn default() -> Self {
        BrokerSection {
            listen: SocketAddr::from(([127, 0, 0, 1], 7411)),
            advertised_address: None,
            data_dir: PathBuf::from("./data"),
            cluster_id: None,
            max_batch_bytes: ByteSize::mib(1),
            max_fetch_wait: Duration::from_secs(30),
            token_file: None,
            tls: None,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// `[broker.tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain of the broker.
    pub cert_file: PathBuf,
    /// PEM private key of the broker.
    pub key_file: PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// `[storage]`: defaults for topics that do not override them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageSection {
    /// "sync" (fsync before ack) or "async" (fsync every `flush_interval` or `flush_bytes`).
    pub flush: FlushMode,
    /// Async flush: longest time unflushed data waits.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Async flush: most unflushed bytes.
    pub flush_bytes: ByteSize,
    /// Segment size at which a segment rolls.
    pub segment_bytes: ByteSize,
    /// Segment age at which a segment rolls.
    #[serde(with = "humantime_serde")]
    pub segment_age: Duration,
    /// Bytes between sparse index entries.
    pub index_interval_bytes: ByteSize,
    /// Per-partition size above which the oldest segments are deleted. 0 = unlimited.
    pub retention_bytes: ByteSize,
    /// Age beyond which sealed segments are deleted. 0 = forever.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How often retention runs.
    #[serde(with = "humantime_serde")]
    pub retention_check_interval: Duration,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            flush: FlushMode::Async,
            flush_interval: Duration::from_secs(1),
            flush_bytes: ByteSize::mib(16),
            segment_bytes: ByteSize::mib(100),
            segment_age: Duration::from_secs(7 * 24 * 3600),
            index_interval_bytes: ByteSize::kib(4),
            retention_bytes: ByteSize::b(0),
            retention: Duration::ZERO,
            retention_check_interval: Duration::from_secs(30),
        }
    }
}

/// Flush mode names as written in config and topic settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// fsync before ack.
    Sync,
    /// fsync on an interval or byte threshold.
    Async,
}

/// `[groups]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupsSection {
    /// Smallest session timeout a member may ask for.
    #[serde(with = "humantime_serde")]
    pub min_session_timeout: Duration,
    /// Largest session timeout a member may ask for.
    #[serde(with = "humantime_serde")]
    pub max_session_timeout: Duration,
}

impl Default for GroupsSection {
    fn default() -> Self {
        GroupsSection {
            min_session_timeout: Duration::from_millis(1000),
            max_session_timeout: Duration::from_secs(300),
        }
    }
}

/// Overrides from the command line; they win over file and environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--cluster-id`.
    pub cluster_id: Option<String>,
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or environment could not be read or parsed.
    #[error("cannot load broker config: {0}")]
    Load(#[from] config::ConfigError),
    /// A value is out of its allowed range.
    #[error("invalid broker config: {key}: {reason}")]
    Invalid {
        /// The config key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The token file could not be read.
    #[error("cannot read broker.token_file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl BrokerConfig {
    /// Loads defaults, then `file` (when given), then `FERRY_BROKER__SECTION__KEY` variables, then `overrides`,
    /// and validates the result.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<BrokerConfig, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = file {
            builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml).required(true));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("FERRY_BROKER").prefix_separator("__").separator("__").try_parsing(true),
        );
        let mut cfg: BrokerConfig = builder.build()?.try_deserialize()?;
        if let Some(listen) = overrides.listen {
            cfg.broker.listen = listen;
        }
        if let Some(dir) = &overrides.data_dir {
            cfg.broker.data_dir = dir.clone();
        }
        if let Some(id) = &overrides.cluster_id {
            cfg.broker.cluster_id = Some(id.clone());
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges and cross-key rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let b = &self.broker;
        if b.max_batch_bytes.as_u64() < 1024 || b.max_batch_bytes.as_u64() > 256 * 1024 * 1024 {
            return Err(ConfigError::Invalid {
                key: "broker.max_batch_bytes",
                reason: format!("{} is outside 1KiB..256MiB", b.max_batch_bytes),
            });
        }
        if let Some(id) = &b.cluster_id
            && (id.is_empty() || id.len() > 128 || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        {
            return Err(ConfigError::Invalid {
                key: "broker.cluster_id",
                reason: format!("{id:?} must be 1-128 characters of A-Z a-z 0-9 - _ ."),
            });
        }
        let s = &self.storage;
        if s.segment_bytes.as_u64() < b.max_batch_bytes.as_u64() {
            return Err(ConfigError::Invalid {
                key: "storage.segment_bytes",
                reason: format!("{} is smaller than broker.max_batch_bytes ({})", s.segment_bytes, b.max_batch_bytes),
            });
        }
        if s.flush_interval.is_zero() {
            return Err(ConfigError::Invalid { key: "storage.flush_interval", reason: "must be above 0".into() });
        }
        if s.retention_check_interval.is_zero() {
            return Err(ConfigError::Invalid {
                key: "storage.retention_check_interval",
                reason: "must be above 0".into(),
            });
        }
        let g = &self.groups;
        if g.min_session_timeout > g.max_session_timeout {
            return Err(ConfigError::Invalid {
                key: "groups.min_session_timeout",
                reason: "is larger than groups.max_session_timeout".into(),
            });
        }
        Ok(())
    }

    /// The bearer token clients must present, from `FERRY_BROKER_TOKEN` or `broker.token_file`.
    pub fn token(&self) -> Result<Option<String>, ConfigError> {
        if let Ok(token) = std::env::var(TOKEN_ENV)
            && !token.trim().is_empty()
        {
            return Ok(Some(token.trim().to_owned()));
        }
        match &self.broker.token_file {
            None => Ok(None),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::TokenFile { path: path.clone(), source })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(ConfigError::Invalid { key: "broker.token_file", reason: "the file is empty".into() });
                }
                Ok(Some(token.to_owned()))
            }
        }
    }

    /// The default log configuration for topics that do not override it.
    pub fn default_log_config(&self) -> LogConfig {
        let s = &self.storage;
        LogConfig {
            segment_bytes: s.segment_bytes.as_u64(),
            segment_ms: s.segment_age.as_millis() as u64,
            index_interval_bytes: s.index_interval_bytes.as_u64().max(1),
            max_batch_bytes: self.broker.max_batch_bytes.as_u64(),
            flush: match s.flush {
                FlushMode::Sync => FlushPolicy::Sync,
                FlushMode::Async => FlushPolicy::Async { interval: s.flush_interval, bytes: s.flush_bytes.as_u64() },
            },
            retention_bytes: (s.retention_bytes.as_u64() > 0).then(|| s.retention_bytes.as_u64()),
            retention_ms: (!s.retention.is_zero()).then_some(s.retention.as_millis() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_serve_loopback_7411_with_local_data() {
        let cfg = BrokerConfig::load(None, &Overrides::default()).unwrap();
        assert_eq!(cfg.broker.listen, "127.0.0.1:7411".parse().unwrap());
        assert_eq!(cfg.broker.data_dir, PathBuf::from("./data"));
        assert_eq!(cfg.default_log_config().max_batch_bytes, 1024 * 1024);
    }

    #[test]
    fn file_values_and_overrides_apply_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.toml");
        std::fs::write(
            &path,
            "[broker]\nmax_batch_bytes = \"4MiB\"\n[storage]\nflush = \"sync\"\nretention = \"1h\"\n",
        )
        .unwrap();
        let over = Overrides { listen: Some("127.0.0.1:9999".parse().unwrap()), ..Default::default() };
        let cfg = BrokerConfig::load(Some(&path), &over).unwrap();
        assert_eq!(cfg.broker.listen.port(), 9999);
        let log = cfg.default_log_config();
        assert_eq!(log.max_batch_bytes, 4 * 1024 * 1024);
        assert_eq!(log.flush, FlushPolicy::Sync);
        assert_eq!(log.retention_ms, Some(3_600_000));

        std::fs::write(&path, "[storage]\nflushh = \"sync\"\n").unwrap();
        let err = BrokerConfig::load(Some(&path), &Overrides::default()).unwrap_err().to_string();
        assert!(err.contains("flushh"), "{err}");
    }

    #[test]
    fn the_shipped_reference_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/broker.toml");
        let cfg = BrokerConfig::load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(cfg.broker.listen, "127.0.0.1:7411".parse().unwrap());
        assert_eq!(cfg.storage.segment_age, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(cfg.default_log_config().retention_bytes, None);
    }

    #[test]
    fn bad_cluster_id_is_named() {
        let over = Overrides { cluster_id: Some("a b".into()), ..Default::default() };
        let err = BrokerConfig::load(None, &over).unwrap_err().to_string();
        assert!(err.contains("broker.cluster_id"), "{err}");
    }
}
