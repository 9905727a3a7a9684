//! The config file as written: every value a string or plain type, every key optional. Conversion to typed
//! values happens in `validate`, which collects every problem instead of stopping at the first.

use serde::Deserialize;

/// `[mirror]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawMirror {
    pub name: Option<String>,
    pub on_divergence: Option<String>,
}

/// `[source.tls]` / `[target.tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawTls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub domain: Option<String>,
}

/// One `[[source.routes]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawRoute {
    pub name: Option<String>,
    pub brokers: Option<Vec<String>>,
    pub bind: Option<String>,
}

/// `[source.health]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawHealth {
    pub check_interval: Option<String>,
    pub timeout: Option<String>,
    pub failure_threshold: Option<u32>,
    pub switch_after: Option<String>,
    pub switch_back: Option<String>,
    pub min_switch_interval: Option<String>,
}

/// `[source]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawSource {
    pub cluster: Option<String>,
    pub cluster_id: Option<String>,
    pub kind: Option<String>,
    pub token_file: Option<String>,
    pub tls: Option<RawTls>,
    pub routes: Option<Vec<RawRoute>>,
    pub health: RawHealth,
    /// librdkafka properties: parsed separately from the raw TOML (their keys hold dots).
    pub kafka: Option<serde::de::IgnoredAny>,
}

/// `[target]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawTarget {
    pub cluster: Option<String>,
    pub brokers: Option<Vec<String>>,
    pub kind: Option<String>,
    pub token_file: Option<String>,
    pub tls: Option<RawTls>,
    /// librdkafka properties: parsed separately from the raw TOML.
    pub kafka: Option<serde::de::IgnoredAny>,
}

/// `[topics]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawTopics {
    pub include: Option<Vec<String>>,
    pub exclude: Option<Vec<String>>,
    pub rename: Option<String>,
    pub discovery_interval: Option<String>,
    pub start_position: Option<String>,
}

/// `[groups]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawGroups {
    pub include: Option<Vec<String>>,
    pub exclude: Option<Vec<String>>,
    pub group_sync_interval: Option<String>,
}

/// `[sync]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawSync {
    pub commit_interval: Option<String>,
    pub queue_bytes: Option<String>,
    pub max_memory: Option<String>,
    pub compression: Option<String>,
    pub max_bytes_per_sec: Option<String>,
    pub max_records_per_sec: Option<u64>,
    pub shutdown_timeout: Option<String>,
    pub group_session_timeout: Option<String>,
    pub max_request_bytes: Option<String>,
    pub stall_check_interval: Option<String>,
}

/// `[monitor.tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawServerTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

/// `[monitor]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawMonitor {
    pub listen: Option<String>,
    pub token_file: Option<String>,
    pub tls: Option<RawServerTls>,
    pub audit_log: Option<String>,
}

/// One `[[alarms.webhook]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawWebhook {
    pub name: Option<String>,
    pub url: Option<String>,
    pub secret_file: Option<String>,
    pub timeout: Option<String>,
    pub retries: Option<u32>,
}

/// One `[[alarms.email]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawEmail {
    pub name: Option<String>,
    pub smtp: Option<String>,
    pub tls: Option<String>,
    pub ca_file: Option<String>,
    pub username: Option<String>,
    pub password_file: Option<String>,
    pub from: Option<String>,
    pub to: Option<Vec<String>>,
    pub timeout: Option<String>,
}

/// `[alarms]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawAlarms {
    pub rules: Option<String>,
    pub queue_size: Option<u32>,
    pub webhook: Option<Vec<RawWebhook>>,
    pub email: Option<Vec<RawEmail>>,
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawConfig {
    pub mirror: RawMirror,
    pub source: RawSource,
    pub target: RawTarget,
    pub topics: RawTopics,
    pub groups: RawGroups,
    pub sync: RawSync,
    pub monitor: RawMonitor,
    pub alarms: RawAlarms,
}
