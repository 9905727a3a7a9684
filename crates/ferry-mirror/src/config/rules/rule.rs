//! One resolved rule and the thresholds: what the alarm component reads.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::events::{EventKind, Severity};

/// Where a rule's notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channels {
    /// Every configured channel.
    All,
    /// These channels, by name (empty: log only).
    Named(Vec<String>),
}

/// At most `max` notifications per `window` for one alarm key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    /// Burst size.
    pub max: NonZeroU32,
    /// Window length (one more notification is allowed per window after the burst).
    pub window: Duration,
}

/// The resolved rule of one event kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Severity shown in notifications and logs.
    pub severity: Severity,
    /// Target channels.
    pub channels: Channels,
    /// Rate limit per alarm key.
    pub throttle: Throttle,
    /// Re-send interval while the condition lasts; `None`: never.
    pub repeat: Option<Duration>,
    /// Whether a recovery notice is sent when the condition clears.
    pub recovery: bool,
}

/// Thresholds of the conditions the alarm's condition checker evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Lag (records) above which a partition is lagging.
    pub lag_threshold: u64,
    /// Replication latency above which a partition with lag is lagging; zero disables the latency test.
    pub latency_threshold: Duration,
    /// How long a condition must hold before `lag_above_threshold` or `rpo_above_threshold` is raised.
    pub for_duration: Duration,
    /// RPO (how long the oldest source record not yet on the target has waited) above which a partition raises
    /// `rpo_above_threshold`; zero turns the condition off.
    pub rpo_threshold: Duration,
    /// How long a partition with lag may go without progress before `partition_stalled` is raised.
    pub stall_after: Duration,
}

/// Whether `kind` is a condition: an alarm that lasts until a clearing event ends it. Only conditions repeat
/// and have recovery notices; every other kind is a one-shot notice.
pub fn is_condition(kind: EventKind) -> bool {
    matches!(kind, EventKind::LagAboveThreshold | EventKind::PartitionStalled | EventKind::RpoAboveThreshold)
        || EventKind::ALL.iter().any(|k| k.clears() == Some(kind))
}
