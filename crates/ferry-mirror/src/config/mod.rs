//! The mirror's configuration: defaults, then the TOML file, then `FERRY_MIRROR__SECTION__KEY` environment
//! variables (the `config` crate), converted to typed values by [`validate`](validate::validate), which reports every
//! problem at once. `conf/mirror.toml` documents every key.
//!
//! Secrets never live in the config tree: tokens, the SMTP password and webhook secrets come from their own files
//! or environment variables, are held in [`Secret`] (whose `Debug` is redacted) and are never logged.
//!
//! librdkafka properties (`[source.kafka]`, `[target.kafka]`) have dotted keys, which the `config` crate would
//! split into nested tables, so they are read from the raw TOML separately.

mod raw;
mod validate;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;

pub use validate::validate;

/// Environment variable for the monitor's bearer token.
pub const MONITOR_TOKEN_ENV: &str = "FERRY_MONITOR_TOKEN";
/// Environment variable for the SMTP password of every email channel without a `password_file`.
pub const SMTP_PASSWORD_ENV: &str = "FERRY_SMTP_PASSWORD";
/// Environment variable for the source brokers' bearer token (alternative to `source.token_file`).
pub const SOURCE_TOKEN_ENV: &str = "FERRY_SOURCE_TOKEN";
/// Environment variable for the target brokers' bearer token (alternative to `target.token_file`).
pub const TARGET_TOKEN_ENV: &str = "FERRY_TARGET_TOKEN";

/// A secret value. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// What to do when a partition diverges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDivergence {
    /// Stop the partition and alarm (the default).
    Halt,
    /// Truncate the target to the divergence point and copy again from there.
    Truncate,
}

/// The kind of cluster on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterKind {
    /// A Ferry broker.
    Ferry,
    /// A Kafka-API cluster.
    Kafka,
}

/// Whether the mirror switches back to the primary route by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchBack {
    /// Only an operator switches back.
    Manual,
    /// Switch back once the primary is healthy again.
    Auto,
}

/// How target topic names are derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rename {
    /// Same name.
    Identity,
    /// `{source.cluster}.{topic}`.
    Prefix,
}

/// Where a partition new to the mirror starts on the very first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// The source's log start.
    Earliest,
    /// The source's log end.
    Latest,
}

/// TLS client files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle to trust.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// Client key (mutual TLS).
    pub key_file: Option<PathBuf>,
    /// Server name to verify, when it differs from the address host.
    pub domain: Option<String>,
}

/// One egress route to the source cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Route name (unique).
    pub name: String,
    /// Broker addresses (`host:port`), or bootstrap servers for Kafka.
    pub brokers: Vec<String>,
    /// Local address to connect from.
    pub bind: Option<IpAddr>,
}

/// `[source.health]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// Probe period.
    pub check_interval: Duration,
    /// Probe timeout.
    pub timeout: Duration,
    /// Consecutive failures that make a route unavailable.
    pub failure_threshold: u32,
    /// Unavailable this long: switch.
    pub switch_after: Duration,
    /// Manual or automatic switch back.
    pub switch_back: SwitchBack,
    /// Least time between two automatic switches.
    pub min_switch_interval: Duration,
}

/// `[source]`.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Alias.
    pub cluster: String,
    /// Required cluster id, if set.
    pub cluster_id: Option<String>,
    /// Kind.
    pub kind: ClusterKind,
    /// Bearer token.
    pub token: Option<Secret>,
    /// TLS.
    pub tls: Option<TlsFiles>,
    /// Routes in order of preference; the first is the primary.
    pub routes: Vec<Route>,
    /// Probing and switching.
    pub health: HealthConfig,
    /// librdkafka properties.
    pub kafka: BTreeMap<String, String>,
}

/// `[target]`.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Alias.
    pub cluster: String,
    /// Broker addresses.
    pub brokers: Vec<String>,
    /// Kind.
    pub kind: ClusterKind,
    /// Bearer token.
    pub token: Option<Secret>,
    /// TLS.
    pub tls: Option<TlsFiles>,
    /// librdkafka properties.
    pub kafka: BTreeMap<String, String>,
}

/// `[topics]`.
#[derive(Debug, Clone)]
pub struct TopicsConfig {
    /// Topics to mirror (any match).
    pub include: Vec<Regex>,
    /// Topics never mirrored (any match wins over include).
    pub exclude: Vec<Regex>,
    /// Target naming.
    pub rename: Rename,
    /// Discovery period.
    pub discovery_interval: Duration,
    /// First-run start position.
    pub start_position: StartPosition,
}

/// `[groups]`.
#[derive(Debug, Clone)]
pub struct GroupsConfig {
    /// Groups whose offsets are synced.
    pub include: Vec<Regex>,
    /// Groups never synced.
    pub exclude: Vec<Regex>,
    /// Sync period.
    pub group_sync_interval: Duration,
}

/// `[sync]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncConfig {
    /// How often cache offsets are committed to the source group.
    pub commit_interval: Duration,
    /// Bytes fetched ahead per partition.
    pub queue_bytes: u64,
    /// Bytes fetched ahead over all partitions.
    pub max_memory: u64,
    /// zstd on the source link.
    pub compression: bool,
    /// Byte rate limit, 0 = none.
    pub max_bytes_per_sec: u64,
    /// Record rate limit, 0 = none.
    pub max_records_per_sec: u64,
    /// Graceful stop budget.
    pub shutdown_timeout: Duration,
    /// Session timeout in the scale-out group on the target.
    pub group_session_timeout: Duration,
    /// Largest append request to the target.
    pub max_request_bytes: u64,
    /// How often partition progress is checked for stalls.
    pub stall_check_interval: Duration,
}

/// `[monitor]`.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token for mutating calls.
    pub token: Option<Secret>,
    /// TLS (certificate and key files).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Audit log file for mutating calls (also logged through tracing). Unset: tracing only.
    pub audit_log: Option<PathBuf>,
}

/// SMTP transport security.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpTls {
    /// Plain connection upgraded with STARTTLS.
    StartTls,
    /// TLS from the first byte.
    Tls,
    /// No TLS (loopback relays only).
    None,
}

/// One webhook channel.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Channel name.
    pub name: String,
    /// Target URL.
    pub url: String,
    /// HMAC-SHA256 key.
    pub secret: Option<Secret>,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub retries: u32,
}

/// One email channel.
#[derive(Debug, Clone)]
pub struct EmailConfig {
    /// Channel name.
    pub name: String,
    /// SMTP host.
    pub host: String,
    /// SMTP port.
    pub port: u16,
    /// Transport security.
    pub tls: SmtpTls,
    /// PEM root certificates trusted for the server's certificate, in addition to the built-in roots (a private
    /// CA of an internal relay).
    pub ca_file: Option<PathBuf>,
    /// Login.
    pub username: Option<String>,
    /// Password.
    pub password: Option<Secret>,
    /// Sender.
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
    /// Per-send timeout.
    pub timeout: Duration,
}

/// `[alarms]`.
#[derive(Debug, Clone)]
pub struct AlarmsConfig {
    /// Rules file; `None` means the shipped rules.
    pub rules: Option<PathBuf>,
    /// Queue length per channel (drop-oldest beyond it).
    pub queue_size: usize,
    /// Webhook channels.
    pub webhooks: Vec<WebhookConfig>,
    /// Email channels.
    pub emails: Vec<EmailConfig>,
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// Pipeline identity.
    pub name: String,
    /// Divergence policy.
    pub on_divergence: OnDivergence,
    /// Source side.
    pub source: SourceConfig,
    /// Target side.
    pub target: TargetConfig,
    /// Topic selection.
    pub topics: TopicsConfig,
    /// Group offset sync.
    pub groups: GroupsConfig,
    /// Pipeline tuning.
    pub sync: SyncConfig,
    /// REST and metrics.
    pub monitor: MonitorConfig,
    /// Alarm channels.
    pub alarms: AlarmsConfig,
    /// The file this was loaded from (for reloads).
    pub path: Option<PathBuf>,
}

/// Every problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} config problem(s):\n  - {}", .0.len(), .0.join("\n  - "))]
pub struct ConfigProblems(pub Vec<String>);

impl MirrorConfig {
    /// Loads and validates the configuration in `path`, with environment overrides.
    pub fn load(path: &Path) -> Result<MirrorConfig, ConfigProblems> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigProblems(vec![format!("cannot read {}: {e}", path.display())]))?;
        let mut cfg = Self::from_toml(&text, true)?;
        cfg.path = Some(path.to_owned());
        Ok(cfg)
    }

    /// Parses and validates TOML text (with environment overrides when `env` is set).
    pub fn from_toml(text: &str, env: bool) -> Result<MirrorConfig, ConfigProblems> {
        let mut builder = config::Config::builder().add_source(config::File::from_str(text, config::FileFormat::Toml));
        if env {
            builder = builder.add_source(
                config::Environment::with_prefix("FERRY_MIRROR")
                    .prefix_separator("__")
                    .separator("__")
                    .list_separator(",")
                    .with_list_parse_key("topics.include")
                    .with_list_parse_key("topics.exclude")
                    .with_list_parse_key("groups.include")
                    .with_list_parse_key("groups.exclude")
                    .with_list_parse_key("target.brokers")
                    .try_parsing(true),
            );
        }
        let built = builder.build().map_err(|e| ConfigProblems(vec![e.to_string()]))?;
        let mut unknown = Vec::new();
        let raw: raw::RawConfig = serde_ignored::deserialize(built, |path| unknown.push(path.to_string()))
            .map_err(|e| ConfigProblems(vec![e.to_string()]))?;
        let kafka = kafka_tables(text).map_err(|e| ConfigProblems(vec![e]))?;
        validate::validate_raw(raw, unknown, kafka)
    }
}

/// librdkafka properties of the source and the target sides.
type KafkaTables = (BTreeMap<String, String>, BTreeMap<String, String>);

/// Reads `[source.kafka]` and `[target.kafka]` from the raw TOML as flat string maps.
fn kafka_tables(text: &str) -> Result<KafkaTables, String> {
    let value: toml::Table = text.parse().map_err(|e: toml::de::Error| format!("invalid TOML: {e}"))?;
    let table = |side: &str| -> Result<BTreeMap<String, String>, String> {
        let Some(t) = value.get(side).and_then(|s| s.get("kafka")) else { return Ok(BTreeMap::new()) };
        let t = t.as_table().ok_or_else(|| format!("{side}.kafka must be a table of \"property\" = \"value\""))?;
        let mut out = BTreeMap::new();
        flatten(t, "", &mut out, side)?;
        Ok(out)
    };
    Ok((table("source")?, table("target")?))
}

fn flatten(t: &toml::Table, prefix: &str, out: &mut BTreeMap<String, String>, side: &str) -> Result<(), String> {
    for (k, v) in t {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::String(s) => {
                out.insert(key, s.clone());
            }
            toml::Value::Integer(i) => {
                out.insert(key, i.to_string());
            }
            toml::Value::Boolean(b) => {
                out.insert(key, b.to_string());
            }
            toml::Value::Float(f) => {
                out.insert(key, f.to_string());
            }
            // Unquoted dotted keys parse as nested tables; accept them as the same property.
            toml::Value::Table(inner) => flatten(inner, &key, out, side)?,
            other => return Err(format!("{side}.kafka.{key}: {other} is not a string, number or boolean")),
        }
    }
    Ok(())
}
