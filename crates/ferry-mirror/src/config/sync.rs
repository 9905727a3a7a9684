//! `[sync]`: the pipeline's tuning: commits, memory per partition and overall, compression, rate limits, the
//! shutdown budget, the scale-out group and the stall check.

use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;
use serde::de::Deserializer;

/// Smallest per-partition queue and append request.
const MIN_BYTES: u64 = 64 * 1024;

/// `[sync]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncConfig {
    /// How often cache offsets are committed to the source group.
    #[serde(deserialize_with = "de::duration")]
    pub commit_interval: Duration,
    /// Bytes fetched ahead per partition.
    #[serde(deserialize_with = "de::size")]
    pub queue_bytes: u64,
    /// Bytes fetched ahead over all partitions.
    #[serde(deserialize_with = "de::size")]
    pub max_memory: u64,
    /// zstd on the source link (`compression = "zstd"`, or `"none"`).
    #[serde(deserialize_with = "compression")]
    pub compression: bool,
    /// Byte rate limit, 0 = none.
    #[serde(deserialize_with = "de::size")]
    pub max_bytes_per_sec: u64,
    /// Record rate limit, 0 = none.
    pub max_records_per_sec: u64,
    /// Graceful stop budget.
    #[serde(deserialize_with = "de::duration")]
    pub shutdown_timeout: Duration,
    /// Session timeout in the scale-out group on the target.
    #[serde(deserialize_with = "de::duration")]
    pub group_session_timeout: Duration,
    /// Largest append request to the target.
    #[serde(deserialize_with = "de::size")]
    pub max_request_bytes: u64,
    /// How often partition progress is checked for stalls.
    #[serde(deserialize_with = "de::duration")]
    pub stall_check_interval: Duration,
    /// How often the source sends every fetched partition's position while it has no data for it; six missed
    /// beats (plus 2 s) make the fetch stream count as failed, noticed within one beat more (an idle stream
    /// checks once a beat).
    #[serde(deserialize_with = "de::duration")]
    pub position_heartbeat: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            commit_interval: Duration::from_secs(5),
            queue_bytes: 64 << 20,
            max_memory: 512 << 20,
            compression: true,
            max_bytes_per_sec: 0,
            max_records_per_sec: 0,
            shutdown_timeout: Duration::from_secs(30),
            group_session_timeout: Duration::from_secs(10),
            max_request_bytes: 4 << 20,
            stall_check_interval: Duration::from_secs(1),
            position_heartbeat: Duration::from_millis(500),
        }
    }
}

/// `"zstd"` (true) or `"none"` (false).
fn compression<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Compression {
        Zstd,
        None,
    }
    Ok(matches!(Compression::deserialize(d)?, Compression::Zstd))
}

impl SyncConfig {
    /// Every problem of `[sync]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        p.at_least("sync.commit_interval", self.commit_interval, Duration::from_millis(10));
        p.at_least("sync.shutdown_timeout", self.shutdown_timeout, Duration::from_millis(100));
        p.at_least("sync.group_session_timeout", self.group_session_timeout, Duration::from_secs(1));
        p.at_least("sync.stall_check_interval", self.stall_check_interval, Duration::from_millis(50));
        p.at_least("sync.position_heartbeat", self.position_heartbeat, Duration::from_millis(10));
        if self.queue_bytes < MIN_BYTES {
            p.push("sync.queue_bytes", "must be at least 64KiB");
        }
        if self.max_memory < self.queue_bytes {
            p.push("sync.max_memory", format!("must be at least sync.queue_bytes ({})", self.queue_bytes));
        }
        if self.max_request_bytes < MIN_BYTES {
            p.push("sync.max_request_bytes", "must be at least 64KiB");
        }
    }
}
