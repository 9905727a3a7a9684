//! `[target]`: the target cluster, its TLS and librdkafka properties, and how it is probed (`[target.health]`,
//! whose keys default to those of `[source.health]`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;

use super::checks;
use super::secret::{self, Secret, TARGET_TOKEN_ENV};
use super::source::{ClusterKind, HealthCheck, HealthConfig, MIN_CHECK_INTERVAL, MIN_TIMEOUT, TlsFiles};

/// `[target.health]` as written: each key that is not set takes the value of `[source.health]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetHealth {
    /// Probe period.
    #[serde(deserialize_with = "de::opt_duration")]
    pub check_interval: Option<Duration>,
    /// Probe timeout.
    #[serde(deserialize_with = "de::opt_duration")]
    pub timeout: Option<Duration>,
    /// Consecutive failures that make the target unavailable.
    pub failure_threshold: Option<u32>,
}

impl TargetHealth {
    /// These settings over the source's.
    pub fn over(&self, source: &HealthConfig) -> HealthCheck {
        HealthCheck {
            check_interval: self.check_interval.unwrap_or(source.check_interval),
            timeout: self.timeout.unwrap_or(source.timeout),
            failure_threshold: self.failure_threshold.unwrap_or(source.failure_threshold),
        }
    }
}

/// `[target]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetConfig {
    /// Alias.
    pub cluster: String,
    /// Broker addresses. Required: no default.
    pub brokers: Vec<String>,
    /// Kind.
    pub kind: ClusterKind,
    /// File holding the bearer token (`FERRY_TARGET_TOKEN` wins over it).
    pub token_file: Option<PathBuf>,
    /// Bearer token, read at load from `FERRY_TARGET_TOKEN` or `token_file`.
    #[serde(skip)]
    pub token: Option<Secret>,
    /// TLS.
    pub tls: Option<TlsFiles>,
    /// librdkafka properties (`"env:VAR"` and `"file:/path"` values resolved at load).
    #[serde(deserialize_with = "checks::kafka_props")]
    pub kafka: BTreeMap<String, String>,
    /// How mirror topics are kept on a Ferry target: `"source"` (the source topic's mode), or `"single"`,
    /// `"double_write"` or `"raft3"` for every topic.
    pub replication: String,
    /// `[target.health]` as written.
    #[serde(rename = "health")]
    pub health_settings: TargetHealth,
    /// How the target is probed: `[target.health]` over `[source.health]`, resolved at load.
    #[serde(skip)]
    pub health: HealthCheck,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            cluster: "target".into(),
            brokers: Vec::new(),
            kind: ClusterKind::Ferry,
            token_file: None,
            token: None,
            tls: None,
            kafka: BTreeMap::new(),
            replication: "source".into(),
            health_settings: TargetHealth::default(),
            health: HealthCheck::default(),
        }
    }
}

impl TargetConfig {
    /// Reads the secrets and resolves `[target.health]` over the source's.
    pub(super) fn resolve(&mut self, source_health: &HealthConfig, p: &mut Problems) {
        self.token = secret::read(p, "target.token_file", self.token_file.as_deref(), Some(TARGET_TOKEN_ENV));
        secret::kafka(p, "target.kafka", &mut self.kafka);
        self.health = self.health_settings.over(source_health);
    }

    /// Every problem of `[target]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        checks::name(p, "target.cluster", &self.cluster);
        if self.brokers.is_empty() && !p.has("target.brokers") {
            p.push("target.brokers", "is required (no default): the target cluster's broker addresses");
        } else if !self.brokers.is_empty() {
            checks::addresses(p, "target.brokers", &self.brokers);
        }
        if let Some(tls) = &self.tls {
            tls.validate("target.tls", p);
        }
        if self.kind == ClusterKind::Ferry && !self.kafka.is_empty() {
            p.push("target.kafka", "librdkafka properties apply only with target.kind = \"kafka\"");
        }
        if !["source", "single", "double_write", "raft3"].contains(&self.replication.as_str()) {
            p.push(
                "target.replication",
                format!("{:?} is not one of \"source\", \"single\", \"double_write\", \"raft3\"", self.replication),
            );
        } else if self.kind == ClusterKind::Kafka && self.replication != "source" {
            p.push(
                "target.replication",
                "applies to Ferry targets; a Kafka target's topics follow its replication.factor",
            );
        }
        // The keys written here, with the ranges of [source.health]; the inherited ones are checked there.
        let h = &self.health_settings;
        if let Some(d) = h.check_interval {
            p.at_least("target.health.check_interval", d, MIN_CHECK_INTERVAL);
        }
        if let Some(d) = h.timeout {
            p.at_least("target.health.timeout", d, MIN_TIMEOUT);
        }
        if h.failure_threshold == Some(0) {
            p.push("target.health.failure_threshold", "must be at least 1");
        }
    }
}
