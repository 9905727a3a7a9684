//! The broker's configuration: compiled-in defaults, then the TOML file, then `FERRY_BROKER__SECTION__KEY`
//! environment variables, then command-line overrides. `conf/broker.toml` documents every key.
//!
//! Read the way every Ferry config is read ([`ferry_config`]): one typed serde section per table, with
//! `deny_unknown_fields` and a `Default` that is the single source of its defaults; every unknown key and bad
//! value collected at once; then each section's `validate` and the rules that span sections
//! ([`BrokerConfig::validate`]), all into one report.
//!
//! Secrets never live in the config tree: the bearer token comes from `broker.token_file` or `FERRY_BROKER_TOKEN`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use ferry_config::{Problems, de};
use ferry_storage::{FlushPolicy, LogConfig};
use serde::Deserialize;

pub use self::cluster_section::ClusterSection;
pub use self::delay_section::DelaySection;
pub use self::groups_section::GroupsSection;
pub use self::kafka_section::KafkaSection;
pub use self::metrics_section::MetricsSection;
pub use self::transactions_section::TransactionsSection;

mod cluster_section;
mod delay_section;
mod groups_section;
mod kafka_section;
mod metrics_section;
mod transactions_section;

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
    /// `[limits]`: bounds on what clients can create or hold open.
    pub limits: LimitsSection,
    /// `[auth]`: scoped bearer tokens.
    pub auth: AuthSection,
    /// `[cluster]`: membership of a cluster under an etcd master (none: a single broker, as by default).
    pub cluster: ClusterSection,
    /// `[metrics]`: the Prometheus endpoint.
    pub metrics: MetricsSection,
    /// `[transactions]`: transactional messages' check-back and bounds.
    pub transactions: TransactionsSection,
    /// `[kafka]`: the Kafka wire-protocol listener (off by default).
    pub kafka: KafkaSection,
    /// `[delay]`: delayed delivery.
    pub delay: DelaySection,
}

/// `[auth]`: the scoped tokens clients may present, besides the all-powerful `broker.token_file` one.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// `[[auth.tokens]]`, one per client role.
    pub tokens: Vec<TokenSection>,
}

/// One `[[auth.tokens]]` entry. docs/broker.md ("Tokens and scopes") says what each scope allows.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    /// The token's name: in denials and logs, never the secret.
    pub name: String,
    /// File holding the secret the client presents as `authorization: Bearer <secret>`.
    pub token_file: PathBuf,
    /// What the token may do.
    pub scopes: Vec<Scope>,
    /// Regexes of the topics it may touch, each matched against the whole name. Empty: none.
    #[serde(default)]
    pub topics: Vec<String>,
    /// Regexes of the consumer groups it may touch, each matched against the whole name. Empty: none.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// What a token may do. docs/broker.md lists the RPCs of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Produce and InitProducer.
    Produce,
    /// Fetch, Subscribe, ListOffsets, and group membership and commits.
    Consume,
    /// Topic create, delete, alter and promote.
    Admin,
    /// What a mirror needs on either side.
    Mirror,
    /// Reserved for broker-to-broker traffic; allows no RPC yet.
    Replica,
}

/// Largest compiled size of one token's topic or group patterns (the regex crate's own bound is 10 MiB).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// `patterns` as one set, each anchored at both ends. The error names the bad pattern, on one line.
pub fn compile_patterns(patterns: &[String]) -> Result<regex::RegexSet, String> {
    for p in patterns {
        if let Err(e) = regex::RegexBuilder::new(p).size_limit(PATTERN_SIZE_LIMIT).build() {
            // The parser's message spans lines (the pattern, a caret, the error): keep its last, the error.
            let text = e.to_string();
            let why = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim_start_matches("error: ");
            return Err(format!("pattern {p:?} is not a valid regex: {why}"));
        }
    }
    regex::RegexSetBuilder::new(patterns.iter().map(|p| format!("^(?:{p})$")))
        .size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("the patterns together are too large: {e}"))
}

impl AuthSection {
    /// Every problem of `[auth]` that needs no file read (the secrets are read at start, by
    /// [`crate::rpc::auth::Authorizer::from_config`]).
    fn validate(&self, p: &mut Problems) {
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.tokens.iter().enumerate() {
            let key = format!("auth.tokens[{i}]");
            if t.name.is_empty()
                || t.name.len() > 64
                || !t.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                p.push(format!("{key}.name"), format!("{:?} must be 1-64 characters of A-Z a-z 0-9 - _ .", t.name));
            } else if !names.insert(t.name.as_str()) {
                p.push(format!("{key}.name"), format!("{:?} names two tokens", t.name));
            }
            if t.scopes.is_empty() {
                p.push(
                    format!("{key}.scopes"),
                    "is empty; give at least one of produce, consume, admin, mirror, replica",
                );
            }
            let only_replica = t.scopes.iter().all(|s| *s == Scope::Replica);
            if t.topics.is_empty() && !only_replica {
                p.push(
                    format!("{key}.topics"),
                    "is empty, so the token may touch no topic; write [\"^.*$\"] for every topic",
                );
            }
            for (field, patterns) in [("topics", &t.topics), ("groups", &t.groups)] {
                if let Err(e) = compile_patterns(patterns) {
                    p.push(format!("{key}.{field}"), e);
                }
            }
        }
    }
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
    #[serde(deserialize_with = "de::duration")]
    pub max_fetch_wait: Duration,
    /// File holding the bearer token clients must present. Unset (and no `FERRY_BROKER_TOKEN`): no token check.
    pub token_file: Option<PathBuf>,
    /// TLS for the gRPC listener (rustls). Unset: plaintext.
    pub tls: Option<TlsSection>,
    /// Graceful shutdown budget after SIGTERM.
    #[serde(deserialize_with = "de::duration")]
    pub shutdown_timeout: Duration,
    /// Most decodes of record bodies the broker runs at once (timestamp lookups), off the async workers.
    pub decode_concurrency: usize,
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
            decode_concurrency: 2,
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
    #[serde(deserialize_with = "de::duration")]
    pub flush_interval: Duration,
    /// Async flush: most unflushed bytes.
    pub flush_bytes: ByteSize,
    /// Segment size at which a segment rolls.
    pub segment_bytes: ByteSize,
    /// Segment age at which a segment rolls.
    #[serde(deserialize_with = "de::duration")]
    pub segment_age: Duration,
    /// Bytes between sparse index entries.
    pub index_interval_bytes: ByteSize,
    /// Per-partition size above which the oldest segments are deleted. 0 = unlimited.
    pub retention_bytes: ByteSize,
    /// Age beyond which sealed segments are deleted. 0 = forever.
    #[serde(deserialize_with = "de::duration")]
    pub retention: Duration,
    /// How often retention runs.
    #[serde(deserialize_with = "de::duration")]
    pub retention_check_interval: Duration,
    /// Per partition: most sealed-segment files held open at once (opened on demand, least recently used closed).
    pub max_open_segments: usize,
    /// An idempotent producer id expires when its last batch's timestamp is this far behind the newest batch
    /// timestamp of the partition; a later batch from it (a late retry) is refused.
    #[serde(deserialize_with = "de::duration")]
    pub producer_id_expiration: Duration,
    /// Per partition: most idempotent producer ids tracked (past it, the one with the oldest batch is forgotten).
    pub max_producer_ids: usize,
    /// How far ahead of the broker's clock a produced batch's newest timestamp may be. Mirror appends are exempt
    /// (DC clocks differ).
    #[serde(deserialize_with = "de::duration")]
    pub max_timestamp_ahead: Duration,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            flush: FlushMode::Async,
            flush_interval: Duration::from_secs(1),
            flush_bytes: ByteSize::b(ferry_storage::DEFAULT_FLUSH_BYTES),
            segment_bytes: ByteSize::mib(100),
            segment_age: Duration::from_secs(7 * 24 * 3600),
            index_interval_bytes: ByteSize::kib(4),
            retention_bytes: ByteSize::b(0),
            retention: Duration::ZERO,
            retention_check_interval: Duration::from_secs(30),
            max_open_segments: 8,
            producer_id_expiration: Duration::from_secs(7 * 24 * 3600),
            max_producer_ids: 10_000,
            max_timestamp_ahead: Duration::from_secs(3600),
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

/// `[limits]`: bounds on state that clients control. Each one refuses the request that would pass it with
/// RESOURCE_EXHAUSTED and a message naming the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Topics the broker holds at most.
    pub max_topics: u32,
    /// Partitions over all topics at most.
    pub max_partitions: u32,
    /// Partitions one Subscribe stream may follow at once.
    pub max_subscribe_partitions: u32,
    /// Concurrent HTTP/2 streams (calls) per client connection.
    pub max_concurrent_streams: u32,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            max_topics: 10_000,
            max_partitions: 100_000,
            max_subscribe_partitions: 100_000,
            max_concurrent_streams: 1024,
        }
    }
}

impl LimitsSection {
    /// Every problem of `[limits]`.
    fn validate(&self, p: &mut Problems) {
        for (key, value) in [
            ("limits.max_topics", self.max_topics),
            ("limits.max_partitions", self.max_partitions),
            ("limits.max_subscribe_partitions", self.max_subscribe_partitions),
            ("limits.max_concurrent_streams", self.max_concurrent_streams),
        ] {
            if value == 0 {
                p.push(key, "must be above 0");
            }
        }
    }

    /// The limits the broker core enforces.
    pub fn core_limits(&self) -> crate::node::registry::Limits {
        crate::node::registry::Limits {
            max_topics: self.max_topics,
            max_partitions: self.max_partitions,
            max_subscribe_partitions: self.max_subscribe_partitions,
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
    /// `--etcd URL[,URL]`.
    pub etcd: Option<Vec<String>>,
    /// `--broker-id`.
    pub broker_id: Option<u32>,
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read or is not TOML.
    #[error("cannot load broker config: {0}")]
    Load(String),
    /// Keys are unknown or values bad; every problem names its key.
    #[error("invalid broker config: {}", .0.one_line())]
    Invalid(Problems),
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

/// The environment overrides: `FERRY_BROKER__SECTION__KEY`.
const ENV: ferry_config::Env<'static> = ferry_config::Env { prefix: "FERRY_BROKER", list_keys: &[] };

/// The end of an unknown key's message.
const SEE: &str = "see conf/broker.toml for every key";

impl BrokerSection {
    /// Every problem of `[broker]`.
    fn validate(&self, p: &mut Problems) {
        let batch = self.max_batch_bytes.as_u64();
        if !(1024..=256 * 1024 * 1024).contains(&batch) {
            p.push("broker.max_batch_bytes", format!("{} is outside 1KiB..256MiB", self.max_batch_bytes));
        }
        if !(1..=64).contains(&self.decode_concurrency) {
            p.push("broker.decode_concurrency", format!("{} is outside 1..64", self.decode_concurrency));
        }
        if let Some(id) = &self.cluster_id
            && (id.is_empty() || id.len() > 128 || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        {
            p.push("broker.cluster_id", format!("{id:?} must be 1-128 characters of A-Z a-z 0-9 - _ ."));
        }
    }
}

impl StorageSection {
    /// Every problem of `[storage]`.
    fn validate(&self, p: &mut Problems) {
        if self.flush_interval.is_zero() {
            p.push("storage.flush_interval", "must be above 0");
        }
        if self.retention_check_interval.is_zero() {
            p.push("storage.retention_check_interval", "must be above 0");
        }
        if !(1..=4096).contains(&self.max_open_segments) {
            p.push("storage.max_open_segments", format!("{} is outside 1..4096", self.max_open_segments));
        }
        if self.producer_id_expiration < Duration::from_secs(1) {
            p.push(
                "storage.producer_id_expiration",
                format!("{:?} is below the 1s minimum", self.producer_id_expiration),
            );
        }
        if self.max_timestamp_ahead < Duration::from_secs(1) {
            p.push("storage.max_timestamp_ahead", format!("{:?} is below the 1s minimum", self.max_timestamp_ahead));
        }
        if !(1..=1_000_000).contains(&self.max_producer_ids) {
            p.push("storage.max_producer_ids", format!("{} is outside 1..1000000", self.max_producer_ids));
        }
        if self.segment_age.as_millis() < u128::from(ferry_storage::MIN_SEGMENT_MS) {
            p.push(
                "storage.segment_age",
                format!(
                    "{:?} is below the 1s minimum (a shorter age would roll a segment, two files, on nearly every append)",
                    self.segment_age
                ),
            );
        }
    }
}

impl BrokerConfig {
    /// Loads defaults, then `file` (when given), then `FERRY_BROKER__SECTION__KEY` variables, then `overrides`,
    /// and validates the result. Every problem is in the one error.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<BrokerConfig, ConfigError> {
        let text = match file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| ConfigError::Load(format!("cannot read {}: {e}", path.display())))?,
            None => String::new(),
        };
        Self::parse(&text, true, overrides)
    }

    /// Parses and validates TOML text (with environment overrides when `env` is set), without flags.
    pub fn from_toml(text: &str, env: bool) -> Result<BrokerConfig, ConfigError> {
        Self::parse(text, env, &Overrides::default())
    }

    fn parse(text: &str, env: bool, overrides: &Overrides) -> Result<BrokerConfig, ConfigError> {
        let tree = ferry_config::tree(text, env.then_some(ENV)).map_err(|p| ConfigError::Load(p.one_line()))?;
        let mut p = Problems::new();
        let mut cfg: BrokerConfig = ferry_config::deserialize(tree, &mut p, SEE);
        if let Some(listen) = overrides.listen {
            cfg.broker.listen = listen;
        }
        if let Some(dir) = &overrides.data_dir {
            cfg.broker.data_dir = dir.clone();
        }
        if let Some(id) = &overrides.cluster_id {
            cfg.broker.cluster_id = Some(id.clone());
        }
        if let Some(etcd) = &overrides.etcd {
            cfg.cluster.etcd = etcd.clone();
        }
        if let Some(id) = overrides.broker_id {
            cfg.cluster.broker_id = Some(id);
        }
        cfg.check(&mut p);
        p.into_result(cfg).map_err(ConfigError::Invalid)
    }

    /// Checks ranges and cross-key rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::new();
        self.check(&mut p);
        p.into_result(()).map_err(ConfigError::Invalid)
    }

    /// Every section's checks, then the rules that span sections.
    fn check(&self, p: &mut Problems) {
        self.broker.validate(p);
        self.storage.validate(p);
        self.groups.validate(p);
        self.limits.validate(p);
        self.auth.validate(p);
        self.cluster.validate(p);
        let retention = crate::node::internal::TRANSACTIONS.retention_ms;
        self.transactions.validate((retention > 0).then(|| std::time::Duration::from_millis(retention)), p);
        self.kafka.validate(p);
        let store = crate::node::internal::DELAY_TOPIC.retention_ms;
        self.delay.validate((store > 0).then(|| std::time::Duration::from_millis(store)), p);
        let (segment, batch) = (self.storage.segment_bytes, self.broker.max_batch_bytes);
        if segment.as_u64() < batch.as_u64() {
            p.push("storage.segment_bytes", format!("{segment} is smaller than broker.max_batch_bytes ({batch})"));
        }
    }

    /// The all-scope bearer token, from `FERRY_BROKER_TOKEN` or `broker.token_file`, with the name of where it
    /// came from.
    pub fn token(&self) -> Result<Option<(&'static str, String)>, ConfigError> {
        if let Ok(token) = std::env::var(TOKEN_ENV)
            && !token.trim().is_empty()
        {
            return Ok(Some((TOKEN_ENV, token.trim().to_owned())));
        }
        match &self.broker.token_file {
            None => Ok(None),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::TokenFile { path: path.clone(), source })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(ConfigError::Invalid(Problems(vec!["broker.token_file: the file is empty".into()])));
                }
                Ok(Some(("broker.token_file", token.to_owned())))
            }
        }
    }

    /// Expiry and bound of every partition's idempotent-producer state.
    pub fn producer_settings(&self) -> crate::node::producer_state::Settings {
        crate::node::producer_state::Settings {
            expiration_ms: i64::try_from(self.storage.producer_id_expiration.as_millis()).unwrap_or(i64::MAX),
            max_producers: self.storage.max_producer_ids,
            max_timestamp_ahead_ms: i64::try_from(self.storage.max_timestamp_ahead.as_millis()).unwrap_or(i64::MAX),
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
            retention_caps_timestamps_at_append_time: false,
            keep_corrupt_batches_followed_by_valid_ones: false,
            max_open_segments: s.max_open_segments,
        }
    }
}

#[cfg(test)]
mod tests;
