//! Topic metadata: the name rules, the persisted `topic.json`, per-topic settings and the mirror mark.
//!
//! Layout: `{data_dir}/{topic}/topic.json` beside the partition directories `{data_dir}/{topic}/{partition}/`.
//! `topic.json` is replaced atomically (write a temp file, fsync, rename, fsync the directory), so a crash leaves
//! either the old or the new metadata, never a torn one.

use std::path::Path;
use std::time::Duration;

use ferry_proto as pb;
use ferry_storage::fs::FileSystem;
use ferry_storage::{FlushPolicy, LogConfig};
use serde::{Deserialize, Serialize};

use crate::error::{BrokerError, Result};

/// Longest topic name.
pub const MAX_TOPIC_NAME_LEN: usize = 200;
/// Names starting with this are reserved for the broker's own files.
pub const RESERVED_PREFIX: &str = "__ferry";
/// The metadata file inside a topic directory.
pub const TOPIC_FILE: &str = "topic.json";

/// Checks a topic name: 1 to 200 characters of `A-Z a-z 0-9 . _ -`, not `.` or `..`, not starting with `__ferry`.
pub fn validate_topic_name(name: &str) -> Result<()> {
    let fail = |reason| Err(BrokerError::InvalidTopicName { name: name.to_owned(), reason });
    if name.is_empty() {
        return fail("a topic name cannot be empty");
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return fail("a topic name is at most 200 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return fail("a topic name may only hold A-Z a-z 0-9 . _ -");
    }
    if name == "." || name == ".." {
        return fail("a topic name cannot be . or ..");
    }
    if name.starts_with(RESERVED_PREFIX) {
        return fail("names starting with __ferry are reserved for the broker");
    }
    Ok(())
}

/// Refuses a client's write or admin request (produce, append with offsets, truncate, alter, promote, delete) on
/// a name with the reserved prefix: the broker's internal partitions (the committed offsets in `__ferry_offsets`)
/// are written by the broker alone. Creation is refused by [`validate_topic_name`].
pub fn refuse_reserved(name: &str) -> Result<()> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(BrokerError::InvalidTopicName {
            name: name.to_owned(),
            reason: "names starting with __ferry are reserved for the broker's internal partitions, \
                     which clients cannot write, alter or delete",
        });
    }
    Ok(())
}

/// Per-topic overrides of the broker's storage defaults. Unset fields follow the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSettings {
    /// "sync" or "async".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<String>,
    /// Async flush interval, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_interval_ms: Option<u64>,
    /// Async flush byte threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_bytes: Option<u64>,
    /// Retention by size; 0 = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    /// Retention by age, ms; 0 = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// Segment roll size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u64>,
    /// Segment roll age, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_ms: Option<u64>,
    /// The longest delay a delayed produce may ask for, ms; unset follows the broker's `delay.max_delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
}

impl TopicSettings {
    /// Reads the set fields of a protobuf config, validating them.
    pub fn from_proto(cfg: Option<&pb::TopicConfig>) -> Result<TopicSettings> {
        let Some(c) = cfg else { return Ok(TopicSettings::default()) };
        if let Some(flush) = &c.flush
            && flush != "sync"
            && flush != "async"
        {
            return Err(BrokerError::InvalidArgument(format!(
                "config flush must be \"sync\" or \"async\", not {flush:?}"
            )));
        }
        if c.flush_interval_ms == Some(0) {
            return Err(BrokerError::InvalidArgument("config flush_interval_ms must be above 0".into()));
        }
        if let Some(sb) = c.segment_bytes
            && sb < 64 * 1024
        {
            return Err(BrokerError::InvalidArgument(format!("config segment_bytes {sb} is below the 64 KiB minimum")));
        }
        if let Some(ms) = c.segment_ms
            && ms < ferry_storage::MIN_SEGMENT_MS
        {
            return Err(BrokerError::InvalidArgument(format!(
                "config segment_ms {ms} is below the {} ms minimum (a shorter age would roll a segment on nearly \
                 every append)",
                ferry_storage::MIN_SEGMENT_MS
            )));
        }
        Ok(TopicSettings {
            flush: c.flush.clone(),
            flush_interval_ms: c.flush_interval_ms,
            flush_bytes: c.flush_bytes,
            retention_bytes: c.retention_bytes,
            retention_ms: c.retention_ms,
            segment_bytes: c.segment_bytes,
            segment_ms: c.segment_ms,
            max_delay_ms: c.max_delay_ms,
        })
    }

    /// Overlays the set fields of `other` on `self`.
    pub fn merge(&mut self, other: &TopicSettings) {
        macro_rules! take {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f.clone(); } )* };
        }
        take!(
            flush,
            flush_interval_ms,
            flush_bytes,
            retention_bytes,
            retention_ms,
            segment_bytes,
            segment_ms,
            max_delay_ms
        );
    }

    /// The effective log config: `defaults` with these overrides applied.
    pub fn log_config(&self, defaults: &LogConfig) -> LogConfig {
        let mut cfg = defaults.clone();
        let (def_interval, def_bytes) = match defaults.flush {
            FlushPolicy::Async { interval, bytes } => (interval, bytes),
            FlushPolicy::Sync => (Duration::from_secs(1), ferry_storage::DEFAULT_FLUSH_BYTES),
        };
        let interval = self.flush_interval_ms.map_or(def_interval, Duration::from_millis);
        let bytes = self.flush_bytes.unwrap_or(def_bytes);
        cfg.flush = match self.flush.as_deref() {
            Some("sync") => FlushPolicy::Sync,
            Some(_) => FlushPolicy::Async { interval, bytes },
            None => match defaults.flush {
                FlushPolicy::Sync => FlushPolicy::Sync,
                FlushPolicy::Async { .. } => FlushPolicy::Async { interval, bytes },
            },
        };
        if let Some(b) = self.retention_bytes {
            cfg.retention_bytes = (b > 0).then_some(b);
        }
        if let Some(ms) = self.retention_ms {
            cfg.retention_ms = (ms > 0).then_some(ms);
        }
        if let Some(b) = self.segment_bytes {
            cfg.segment_bytes = b.max(cfg.max_batch_bytes);
        }
        if let Some(ms) = self.segment_ms {
            // Settings stored before the minimum existed still open, at the minimum.
            cfg.segment_ms = ms.max(ferry_storage::MIN_SEGMENT_MS);
        }
        cfg
    }

    /// The effective config as the protobuf message (every field set).
    pub fn effective_proto(&self, defaults: &LogConfig) -> pb::TopicConfig {
        let cfg = self.log_config(defaults);
        let (flush, interval, bytes) = match cfg.flush {
            FlushPolicy::Sync => (
                "sync",
                self.flush_interval_ms.unwrap_or(1000),
                self.flush_bytes.unwrap_or(ferry_storage::DEFAULT_FLUSH_BYTES),
            ),
            FlushPolicy::Async { interval, bytes } => ("async", interval.as_millis() as u64, bytes),
        };
        pb::TopicConfig {
            flush: Some(flush.to_owned()),
            flush_interval_ms: Some(interval),
            flush_bytes: Some(bytes),
            retention_bytes: Some(cfg.retention_bytes.unwrap_or(0)),
            retention_ms: Some(cfg.retention_ms.unwrap_or(0)),
            segment_bytes: Some(cfg.segment_bytes),
            segment_ms: Some(cfg.segment_ms),
            // Unset while the topic follows the broker's `delay.max_delay`.
            max_delay_ms: self.max_delay_ms,
        }
    }
}

/// How a topic's partitions are kept (the cluster's catalog holds it for replicated topics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replication {
    /// One copy, on the broker that created the topic (a single broker's topic).
    #[default]
    Single,
    /// Two replicas on two brokers (the seed's DoubleWrite); a write is acknowledged once both have it, or, in the
    /// risk phase, once the leader has it while a lost replica is replaced.
    DoubleWrite,
    /// Three replicas on three brokers; a write is acknowledged once the whole in-sync set (at least two) has it.
    Raft3,
}

impl Replication {
    /// Parses a request's `replication` field ("" is single).
    pub fn parse(text: &str) -> Result<Replication, String> {
        match text {
            "" | "single" => Ok(Replication::Single),
            "double_write" => Ok(Replication::DoubleWrite),
            "raft3" => Ok(Replication::Raft3),
            other => Err(format!("replication {other:?} is not one of \"single\", \"double_write\", \"raft3\"")),
        }
    }

    /// How many replicas a partition has.
    pub fn replicas(self) -> usize {
        match self {
            Replication::Single => 1,
            Replication::DoubleWrite => 2,
            Replication::Raft3 => 3,
        }
    }

    /// The smallest in-sync set a write is acknowledged with: raft3's two of three; double_write's both, or, in
    /// the risk phase, the leader alone.
    pub fn min_insync(self, risk_phase: bool) -> usize {
        match self {
            Replication::Single => 1,
            Replication::DoubleWrite if risk_phase => 1,
            Replication::DoubleWrite | Replication::Raft3 => 2,
        }
    }

    /// Whether this is [`Replication::Single`].
    pub fn is_single(&self) -> bool {
        *self == Replication::Single
    }

    /// The name the protocol and the CLI use.
    pub fn as_str(self) -> &'static str {
        match self {
            Replication::Single => "single",
            Replication::DoubleWrite => "double_write",
            Replication::Raft3 => "raft3",
        }
    }
}

/// The mirror mark of a topic created by a mirror.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorMark {
    /// Source cluster id.
    pub source_cluster_id: String,
    /// Source topic UUID.
    pub source_topic_id: String,
    /// Source topic name.
    pub source_topic: String,
    /// Source cluster alias.
    pub source_cluster: String,
}

impl MirrorMark {
    /// From the protobuf message.
    pub fn from_proto(m: &pb::MirrorSource) -> Result<MirrorMark> {
        if m.source_cluster_id.is_empty() || m.source_topic_id.is_empty() {
            return Err(BrokerError::InvalidArgument(
                "a mirror topic needs its source_cluster_id and source_topic_id".into(),
            ));
        }
        Ok(MirrorMark {
            source_cluster_id: m.source_cluster_id.clone(),
            source_topic_id: m.source_topic_id.clone(),
            source_topic: m.source_topic.clone(),
            source_cluster: m.source_cluster.clone(),
        })
    }

    /// To the protobuf message.
    pub fn to_proto(&self) -> pb::MirrorSource {
        pb::MirrorSource {
            source_cluster_id: self.source_cluster_id.clone(),
            source_topic_id: self.source_topic_id.clone(),
            source_topic: self.source_topic.clone(),
            source_cluster: self.source_cluster.clone(),
        }
    }

    /// The name to show for the source cluster: the alias, else the id.
    pub fn source_display(&self) -> &str {
        if self.source_cluster.is_empty() { &self.source_cluster_id } else { &self.source_cluster }
    }
}

/// What `topic.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicMeta {
    /// Topic name. (The catalog in etcd keys a replicated topic's record by it.)
    #[serde(default)]
    pub name: String,
    /// UUID fixed at creation.
    pub topic_id: String,
    /// Partition count.
    pub partitions: u32,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Overrides of the storage defaults.
    #[serde(default)]
    pub settings: TopicSettings,
    /// Set while the topic is a mirror topic.
    #[serde(default)]
    pub mirror: Option<MirrorMark>,
    /// When the topic was promoted from a mirror topic, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_ms: Option<i64>,
    /// How the topic's partitions are kept; a replicated topic's truth is the cluster's catalog in etcd.
    #[serde(default, skip_serializing_if = "Replication::is_single")]
    pub replication: Replication,
    /// double_write: writes go on with one replica while a lost one is replaced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub risk_phase: bool,
    /// Set while the topic is fenced: read-only (see [`Fence`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    /// Set by a promotion: the partition epoch the first local write after it starts at, at least (above every
    /// epoch in the mirrored history, one cut for every topic a failover promotes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_epoch: Option<u32>,
}

/// A fence: the topic is read-only at `epoch`, so that what it holds is final (a failover drains it). Produce and
/// the mirror's appends are refused naming the fence; reads go on. A fence only ever moves up: a stale job cannot
/// replace a newer fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fence {
    /// The fence epoch (a failover's job epoch).
    pub epoch: u64,
    /// Why, naming the failover (shown in every refusal).
    pub reason: String,
    /// When it was set, ms since the epoch.
    pub at_ms: i64,
}

impl TopicMeta {
    /// The topic's log config: `defaults` with its overrides. A topic that holds mirrored data (a mirror topic, or
    /// one promoted from it) has time retention capped at append time: its timestamps come from another DC's clock
    /// and were not bounded by `storage.max_timestamp_ahead` on the way in.
    pub fn log_config(&self, defaults: &LogConfig) -> LogConfig {
        let mut cfg = self.settings.log_config(defaults);
        cfg.retention_caps_timestamps_at_append_time = self.mirror.is_some() || self.promoted_ms.is_some();
        cfg
    }

    /// Reads `topic.json` from a topic directory.
    pub fn load(fs: &dyn FileSystem, dir: &Path) -> Result<TopicMeta> {
        let path = dir.join(TOPIC_FILE);
        let text = fs.read(&path).map_err(|source| BrokerError::Io { path: path.clone(), source })?;
        serde_json::from_slice(&text).map_err(|e| BrokerError::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        })
    }

    /// Writes `topic.json` atomically.
    pub fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| BrokerError::Internal(e.to_string()))?;
        write_atomic(fs, &dir.join(TOPIC_FILE), &text)
    }

    /// The protobuf view, given the broker's storage defaults.
    pub fn to_proto(&self, defaults: &LogConfig) -> pb::TopicInfo {
        pb::TopicInfo {
            name: self.name.clone(),
            topic_id: self.topic_id.clone(),
            partitions: self.partitions,
            config: Some(self.settings.effective_proto(defaults)),
            mirror: self.mirror.as_ref().map(MirrorMark::to_proto),
            created_ms: self.created_ms,
            replication: self.replication.as_str().to_owned(),
            risk_phase: self.risk_phase,
            fence: self.fence.as_ref().map(|f| pb::TopicFence {
                epoch: f.epoch,
                reason: f.reason.clone(),
                at_ms: f.at_ms,
            }),
            promote_epoch: self.promote_epoch.unwrap_or(0),
        }
    }
}

/// Replaces `path` with `data` atomically and durably.
pub fn write_atomic(fs: &dyn FileSystem, path: &Path, data: &[u8]) -> Result<()> {
    ferry_storage::fs::write_atomic(fs, path, data).map_err(|source| BrokerError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rules() {
        for ok in ["orders", "orders.eu-1", "A_b", &"x".repeat(200)] {
            validate_topic_name(ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", "__ferry_groups", &"x".repeat(201)] {
            let err = validate_topic_name(bad).unwrap_err();
            assert!(matches!(err, BrokerError::InvalidTopicName { .. }), "{bad}: {err}");
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
        }
        refuse_reserved("orders").unwrap();
        let err = refuse_reserved("__ferry_offsets").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.to_string(),
            "invalid topic name \"__ferry_offsets\": names starting with __ferry are reserved for the broker's \
             internal partitions, which clients cannot write, alter or delete"
        );
    }

    #[test]
    fn settings_overlay_defaults() {
        let defaults = LogConfig::default();
        let s = TopicSettings { flush: Some("sync".into()), retention_ms: Some(0), ..Default::default() };
        let cfg = s.log_config(&defaults);
        assert_eq!(cfg.flush, FlushPolicy::Sync);
        assert_eq!(cfg.retention_ms, None);
        let p = s.effective_proto(&defaults);
        assert_eq!(p.flush.as_deref(), Some("sync"));
        let mut merged = TopicSettings::default();
        merged.merge(&TopicSettings { retention_bytes: Some(5), ..Default::default() });
        merged.merge(&s);
        assert_eq!(merged.retention_bytes, Some(5));
        assert_eq!(merged.flush.as_deref(), Some("sync"));
    }

    #[test]
    fn segment_ms_below_one_second_is_refused_and_a_stored_one_is_raised() {
        let ask = |ms| pb::TopicConfig { segment_ms: Some(ms), ..Default::default() };
        let err = TopicSettings::from_proto(Some(&ask(999))).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.to_string(),
            "invalid request: config segment_ms 999 is below the 1000 ms minimum (a shorter age would roll a \
             segment on nearly every append)"
        );
        assert!(TopicSettings::from_proto(Some(&ask(0))).is_err());
        assert_eq!(TopicSettings::from_proto(Some(&ask(1000))).unwrap().segment_ms, Some(1000));
        // A setting stored before the minimum existed opens at the minimum.
        let stored = TopicSettings { segment_ms: Some(1), ..Default::default() };
        assert_eq!(stored.log_config(&LogConfig::default()).segment_ms, 1000);
    }

    #[test]
    fn meta_round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let meta = TopicMeta {
            name: "t".into(),
            topic_id: uuid::Uuid::new_v4().to_string(),
            partitions: 3,
            created_ms: 5,
            settings: TopicSettings::default(),
            mirror: None,
            promoted_ms: Some(7),
            replication: Replication::Single,
            risk_phase: false,
            fence: Some(Fence { epoch: 9, reason: "failover f-1".into(), at_ms: 8 }),
            promote_epoch: Some(4),
        };
        meta.store(&ferry_storage::fs::OsFs, dir.path()).unwrap();
        assert_eq!(TopicMeta::load(&ferry_storage::fs::OsFs, dir.path()).unwrap(), meta);
        // A single topic's file has no replication key (files of earlier versions load as single); raft3 is kept.
        assert!(!std::fs::read_to_string(dir.path().join(TOPIC_FILE)).unwrap().contains("replication"));
        let raft3 = TopicMeta { replication: Replication::Raft3, ..meta };
        raft3.store(&ferry_storage::fs::OsFs, dir.path()).unwrap();
        assert_eq!(TopicMeta::load(&ferry_storage::fs::OsFs, dir.path()).unwrap(), raft3);
    }
}
