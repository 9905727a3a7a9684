//! The retry policy: exponential backoff with jitter, built on the `backon` crate, which every retry loop of Ferry
//! uses (the client's calls and producer deliveries, the mirror's fetches, appends and alarms, the broker's links to
//! etcd and its peers). A loop takes the policy's [`RetryPolicy::backoff`] iterator once and asks it for the next
//! delay after each failure; the policy is configured per call site.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::error::{Result, config_err};

/// How retries are spaced and how many are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub initial_backoff: Duration,
    /// Upper bound of any delay (before jitter).
    pub max_backoff: Duration,
    /// Growth factor per attempt (≥ 1).
    pub multiplier: f32,
    /// Whether each delay gets a random extra of up to itself, so that many clients cut off together do not come
    /// back in lockstep.
    pub jitter: bool,
    /// Attempts in total (the first try included) for idempotent calls of [`crate::BrokerClient`]. The producer
    /// ignores it and retries until its delivery timeout.
    pub max_attempts: u32,
}

impl Eq for RetryPolicy {}

impl Default for RetryPolicy {
    /// 100 ms doubling up to 5 s, with jitter, 5 attempts.
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            multiplier: 2.0,
            jitter: true,
            max_attempts: 5,
        }
    }
}

impl RetryPolicy {
    /// Checks the fields.
    pub fn validate(&self) -> Result<()> {
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(config_err("retry.multiplier", format!("{} must be a finite number >= 1", self.multiplier)));
        }
        if self.max_attempts == 0 {
            return Err(config_err("retry.max_attempts", "must be at least 1"));
        }
        if self.max_backoff < self.initial_backoff {
            return Err(config_err("retry.max_backoff", "must not be below initial_backoff"));
        }
        Ok(())
    }

    /// The delays of successive retries, without end (the caller stops by attempts or a deadline).
    pub fn backoff(&self) -> ExponentialBackoff {
        self.build()
    }
}

impl BackoffBuilder for RetryPolicy {
    type Backoff = ExponentialBackoff;

    fn build(self) -> ExponentialBackoff {
        let builder = ExponentialBuilder::default()
            .with_min_delay(self.initial_backoff)
            .with_max_delay(self.max_backoff)
            .with_factor(self.multiplier)
            .without_max_times();
        if self.jitter { builder.with_jitter().build() } else { builder.build() }
    }
}

impl BackoffBuilder for &RetryPolicy {
    type Backoff = ExponentialBackoff;

    fn build(self) -> ExponentialBackoff {
        (*self).build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_up_to_the_cap() {
        let p = RetryPolicy { jitter: false, ..RetryPolicy::default() };
        let ms: Vec<u128> = p.backoff().take(8).map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(p.backoff().nth(1000), Some(Duration::from_secs(5)), "without end");
    }

    #[test]
    fn jitter_adds_at_most_the_delay_itself() {
        let p = RetryPolicy::default();
        for _ in 0..200 {
            let d = p.backoff().nth(2).unwrap();
            assert!(d >= Duration::from_millis(400) && d < Duration::from_millis(800), "{d:?}");
        }
    }

    #[test]
    fn bad_fields_are_named() {
        for (policy, field) in [
            (RetryPolicy { multiplier: 0.5, ..Default::default() }, "retry.multiplier"),
            (RetryPolicy { max_attempts: 0, ..Default::default() }, "retry.max_attempts"),
            (RetryPolicy { max_backoff: Duration::from_millis(1), ..Default::default() }, "retry.max_backoff"),
        ] {
            let err = policy.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        assert!(RetryPolicy::default().validate().is_ok());
    }
}
