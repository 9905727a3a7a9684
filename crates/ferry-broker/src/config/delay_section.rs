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
    /// Every problem of `[delay]`, given the delay store's time retention (`None`: it keeps records until they
    /// fire): a pending record must never be deleted by age before it falls due.
    pub(super) fn validate(&self, store_retention: Option<Duration>, p: &mut Problems) {
        let max = Duration::from_millis(DEFAULT_MAX_DELAY_MS);
        if self.max_delay < Duration::from_secs(1) || self.max_delay > max {
            p.push("delay.max_delay", format!("{:?} is outside 1s..7d", self.max_delay));
        }
        if let Some(retention) = store_retention
            && retention <= self.max_delay
        {
            p.push(
                "delay.max_delay",
                format!(
                    "{:?} is not below the delay store's retention of {retention:?}: a pending record could be \
                     deleted before it falls due",
                    self.max_delay
                ),
            );
        }
        if self.tick < Duration::from_millis(10) || self.tick > Duration::from_secs(1) {
            p.push("delay.tick", format!("{:?} is outside 10ms..1s (a record is due within a tick)", self.tick));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_delay_must_stay_below_the_delay_stores_retention() {
        let section = DelaySection::default();
        let problems = |retention| {
            let mut p = Problems::new();
            section.validate(retention, &mut p);
            p.into_result(()).err().map(|e| e.one_line()).unwrap_or_default()
        };
        assert_eq!(problems(None), "");
        assert_eq!(problems(Some(Duration::from_secs(8 * 24 * 3600))), "");
        let short = problems(Some(Duration::from_secs(24 * 3600)));
        assert!(short.contains("delay.max_delay") && short.contains("deleted before it falls due"), "{short}");
    }
}
