//! `[source]`: the source cluster, its egress routes (`[[source.routes]]`), how they are probed and switched
//! (`[source.health]`), TLS and librdkafka properties.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;

use super::checks;
use super::secret::{self, SOURCE_TOKEN_ENV, Secret};

/// The kind of cluster on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterKind {
    /// A Ferry broker (the default).
    #[default]
    Ferry,
    /// A Kafka-API cluster.
    Kafka,
}

/// Whether the mirror switches back to the primary route by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwitchBack {
    /// Only an operator switches back (the default).
    #[default]
    Manual,
    /// Switch back once the primary is healthy again.
    Auto,
}

/// TLS client files (`[source.tls]`, `[target.tls]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
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

impl TlsFiles {
    /// The pair rule and that every named file exists.
    pub(super) fn validate(&self, key: &str, p: &mut Problems) {
        if self.cert_file.is_some() != self.key_file.is_some() {
            p.push(key, "cert_file and key_file go together (mutual TLS)");
        }
        for (k, file) in [("ca_file", &self.ca_file), ("cert_file", &self.cert_file), ("key_file", &self.key_file)] {
            if let Some(f) = file
                && !f.is_file()
            {
                p.push(format!("{key}.{k}"), format!("{} does not exist", f.display()));
            }
        }
    }
}

/// One egress route to the source cluster (`[[source.routes]]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Route {
    /// Route name (unique).
    pub name: String,
    /// Broker addresses (`host:port`), or bootstrap servers for Kafka.
    pub brokers: Vec<String>,
    /// Local address to connect from.
    #[serde(deserialize_with = "checks::ip_addr")]
    pub bind: Option<IpAddr>,
    /// The source cluster's named listener this route reaches its brokers on (`[[cluster.listeners]]` of the
    /// brokers): the leaders it fetches from are given at that listener's addresses. Unset: the registered ones.
    pub listener: Option<String>,
}

/// The probe settings of one side: how often, how long one probe may take, and how many failures in a row make
/// the side unavailable. `[target.health]` resolves to one; [`HealthConfig::check`] is the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    /// Probe period.
    pub check_interval: Duration,
    /// Probe timeout.
    pub timeout: Duration,
    /// Consecutive failures that make the side unavailable.
    pub failure_threshold: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthConfig::default().check()
    }
}

/// Smallest `check_interval` of a health section.
pub(super) const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Smallest `timeout` of a health section.
pub(super) const MIN_TIMEOUT: Duration = Duration::from_millis(10);

impl HealthCheck {
    /// The ranges of a health section at `key`.
    pub(super) fn validate(&self, key: &str, p: &mut Problems) {
        p.at_least(format!("{key}.check_interval"), self.check_interval, MIN_CHECK_INTERVAL);
        p.at_least(format!("{key}.timeout"), self.timeout, MIN_TIMEOUT);
        if self.failure_threshold == 0 {
            p.push(format!("{key}.failure_threshold"), "must be at least 1");
        }
    }
}

/// `[source.health]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Probe period.
    #[serde(deserialize_with = "de::duration")]
    pub check_interval: Duration,
    /// Probe timeout.
    #[serde(deserialize_with = "de::duration")]
    pub timeout: Duration,
    /// Consecutive failures that make a route unavailable.
    pub failure_threshold: u32,
    /// Unavailable this long: switch.
    #[serde(deserialize_with = "de::duration")]
    pub switch_after: Duration,
    /// Manual or automatic switch back.
    pub switch_back: SwitchBack,
    /// Least time between two automatic switches.
    #[serde(deserialize_with = "de::duration")]
    pub min_switch_interval: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            check_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failure_threshold: 3,
            switch_after: Duration::from_secs(10),
            switch_back: SwitchBack::Manual,
            min_switch_interval: Duration::from_secs(60),
        }
    }
}

impl HealthConfig {
    /// The probe settings.
    pub fn check(&self) -> HealthCheck {
        HealthCheck {
            check_interval: self.check_interval,
            timeout: self.timeout,
            failure_threshold: self.failure_threshold,
        }
    }
}

/// `[source]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    /// Alias.
    pub cluster: String,
    /// Required cluster id, if set (an empty one is unset).
    pub cluster_id: Option<String>,
    /// Kind.
    pub kind: ClusterKind,
    /// File holding the bearer token (`FERRY_SOURCE_TOKEN` wins over it).
    pub token_file: Option<PathBuf>,
    /// Bearer token, read at load from `FERRY_SOURCE_TOKEN` or `token_file`.
    #[serde(skip)]
    pub token: Option<Secret>,
    /// TLS.
    pub tls: Option<TlsFiles>,
    /// Routes in order of preference; the first is the primary. Required: no default.
    pub routes: Vec<Route>,
    /// Probing and switching.
    pub health: HealthConfig,
    /// librdkafka properties (`"env:VAR"` and `"file:/path"` values resolved at load).
    #[serde(deserialize_with = "checks::kafka_props")]
    pub kafka: BTreeMap<String, String>,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            cluster: "source".into(),
            cluster_id: None,
            kind: ClusterKind::Ferry,
            token_file: None,
            token: None,
            tls: None,
            routes: Vec::new(),
            health: HealthConfig::default(),
            kafka: BTreeMap::new(),
        }
    }
}

impl SourceConfig {
    /// Reads the secrets and drops an empty cluster id.
    pub(super) fn resolve(&mut self, p: &mut Problems) {
        self.cluster_id = self.cluster_id.take().filter(|c| !c.is_empty());
        self.token = secret::read(p, "source.token_file", self.token_file.as_deref(), Some(SOURCE_TOKEN_ENV));
        secret::kafka(p, "source.kafka", &mut self.kafka);
    }

    /// Every problem of `[source]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        checks::name(p, "source.cluster", &self.cluster);
        if self.routes.is_empty() && !p.has("source.routes") {
            p.push("source.routes", "at least one [[source.routes]] is required (no default)");
        }
        let mut seen = BTreeSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            let key = format!("source.routes[{i}]");
            if r.name.is_empty() {
                p.push(format!("{key}.name"), "every route needs a name");
            } else {
                checks::name(p, &format!("{key}.name"), &r.name);
                if !seen.insert(r.name.as_str()) {
                    p.push(format!("{key}.name"), format!("duplicate route name {:?}", r.name));
                }
            }
            checks::addresses(p, &format!("{key}.brokers"), &r.brokers);
            if let Some(l) = &r.listener {
                if self.kind == ClusterKind::Kafka {
                    p.push(format!("{key}.listener"), "listeners are Ferry clusters' (kind = \"ferry\")");
                } else if l.is_empty() || !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                    p.push(format!("{key}.listener"), format!("{l:?} must be a listener name: A-Z a-z 0-9 - _"));
                }
            }
            if r.bind.is_some() && self.kind == ClusterKind::Kafka {
                p.push(
                    format!("{key}.bind"),
                    "a bind address is not supported for kind = \"kafka\": librdkafka cannot bind a local address",
                );
            }
        }
        self.health.check().validate("source.health", p);
        if let Some(tls) = &self.tls {
            tls.validate("source.tls", p);
        }
        if self.kind == ClusterKind::Ferry && !self.kafka.is_empty() {
            p.push("source.kafka", "librdkafka properties apply only with source.kind = \"kafka\"");
        }
    }
}
