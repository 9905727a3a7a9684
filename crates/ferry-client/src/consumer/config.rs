//! [`ConsumerConfig`], [`StartAt`], [`OffsetReset`] and [`ConsumerRecord`].

use std::time::Duration;

use bytes::Bytes;
use ferry_batch::Header;

use crate::error::{Result, config_err};

/// Where a manually assigned partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// This offset.
    Offset(u64),
    /// The log start offset.
    Earliest,
    /// The log end offset: only records produced from now on.
    Latest,
    /// The group's committed offset (needs `ConsumerConfig::group`), else [`ConsumerConfig::auto_offset_reset`].
    Committed,
}

/// Where a partition without a usable position starts: no committed offset, or an offset out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    /// The log start offset.
    Earliest,
    /// The log end offset.
    #[default]
    Latest,
}

impl From<OffsetReset> for StartAt {
    fn from(reset: OffsetReset) -> Self {
        match reset {
            OffsetReset::Earliest => StartAt::Earliest,
            OffsetReset::Latest => StartAt::Latest,
        }
    }
}

/// Consumer settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Group for committed offsets with manual assignment (`subscribe` sets it too).
    pub group: Option<String>,
    /// Start for partitions without a committed offset, and after OFFSET_OUT_OF_RANGE (Latest).
    pub auto_offset_reset: OffsetReset,
    /// Commit positions every `auto_commit_interval`, on rebalance and on close, in group mode (on).
    pub auto_commit: bool,
    /// Auto-commit period (5 s).
    pub auto_commit_interval: Duration,
    /// Heartbeat period in group mode (3 s).
    pub heartbeat_interval: Duration,
    /// Session timeout sent on join (10 s): the broker drops a member silent for this long.
    pub session_timeout: Duration,
    /// How long `stream()` lets one fetch wait for data (500 ms).
    pub max_wait: Duration,
    /// Byte budget per partition and fetch (1 MiB; at least one whole batch is returned regardless).
    pub partition_max_bytes: u64,
    /// Byte budget of one fetch over all partitions (16 MiB).
    pub fetch_max_bytes: u64,
    /// Free text shown by DescribeGroup.
    pub client_id: String,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            group: None,
            auto_offset_reset: OffsetReset::Latest,
            auto_commit: true,
            auto_commit_interval: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(3),
            session_timeout: Duration::from_secs(10),
            max_wait: Duration::from_millis(500),
            partition_max_bytes: 1024 * 1024,
            fetch_max_bytes: 16 * 1024 * 1024,
            client_id: format!("ferry-client pid {}", std::process::id()),
        }
    }
}

impl ConsumerConfig {
    /// Checks the fields; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("consumer.auto_commit_interval", self.auto_commit_interval),
            ("consumer.heartbeat_interval", self.heartbeat_interval),
            ("consumer.session_timeout", self.session_timeout),
        ] {
            if value.is_zero() {
                return Err(config_err(field, "must be greater than zero"));
            }
        }
        if self.heartbeat_interval >= self.session_timeout {
            return Err(config_err(
                "consumer.heartbeat_interval",
                format!(
                    "{:?} must be shorter than session_timeout ({:?}), or the session expires between heartbeats",
                    self.heartbeat_interval, self.session_timeout
                ),
            ));
        }
        if u32::try_from(self.session_timeout.as_millis()).is_err() {
            return Err(config_err("consumer.session_timeout", "must be below 49 days"));
        }
        if u32::try_from(self.max_wait.as_millis()).is_err() {
            return Err(config_err("consumer.max_wait", "must be below 49 days"));
        }
        if self.partition_max_bytes == 0 || self.fetch_max_bytes == 0 {
            return Err(config_err("consumer.fetch_max_bytes", "byte budgets must be greater than zero"));
        }
        if self.group.as_deref() == Some("") {
            return Err(config_err("consumer.group", "must not be empty"));
        }
        Ok(())
    }
}

/// A consumed record. Its key and values are slices of the buffer the fetch arrived in, not copies: a record kept
/// keeps that buffer (the whole fetch response, at most `fetch_max_bytes`) alive; copy the bytes out to keep one for
/// long.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConsumerRecord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Timestamp, ms since the Unix epoch.
    pub timestamp: i64,
    /// Key; `None` is a null key.
    pub key: Option<Bytes>,
    /// Value; `None` is a null value.
    pub value: Option<Bytes>,
    /// Ordered headers.
    pub headers: Vec<Header>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_design() {
        let c = ConsumerConfig::default();
        assert_eq!(c.heartbeat_interval, Duration::from_secs(3));
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.auto_commit_interval, Duration::from_secs(5));
        assert!(c.auto_commit);
        c.validate().unwrap();
    }

    #[test]
    fn heartbeat_must_be_shorter_than_the_session() {
        let c = ConsumerConfig { heartbeat_interval: Duration::from_secs(10), ..Default::default() };
        assert!(matches!(c.validate(), Err(crate::ClientError::Config { field: "consumer.heartbeat_interval", .. })));
    }
}
