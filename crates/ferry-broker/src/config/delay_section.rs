//! `[delay]`: delayed delivery's limits and the timer's tick (docs/messaging.md, "Delay").

use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;

/// The default and the largest `delay.max_delay`, ms: 7 days.
const DEFAULT_MAX_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;

/// `[delay]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DelaySection {
    /// The longest delay a produce may ask for; a longer one is refused. At most 7 days: the delay store keeps a
    /// record until it falls due (its retention is not time-based), and its wheel has a slot per second of it.
    #[serde(deserialize_with = "de::duration")]
    pub max_delay: Duration,
    /// How often the timer looks for due records: a record becomes readable at most about this long (plus the
    /// write) after its due time.
    #[serde(deserialize_with = "de::duration")]
    pub tick: Duration,
}

impl Default for DelaySection {
    fn default() -> Self {
        DelaySection { max_delay: Duration::from_millis(DEFAULT_MAX_DELAY_MS), tick: Duration::from_millis(100) }
    }
}

impl DelaySection {
    /// Every problem of `[delay]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        let max = Duration::from_millis(DEFAULT_MAX_DELAY_MS);
        if self.max_delay < Duration::from_secs(1) || self.max_delay > max {
            p.push("delay.max_delay", format!("{:?} is outside 1s..7d", self.max_delay));
        }
        if self.tick < Duration::from_millis(10) || self.tick > Duration::from_secs(1) {
            p.push("delay.tick", format!("{:?} is outside 10ms..1s (a record is due within a tick)", self.tick));
        }
    }
}
