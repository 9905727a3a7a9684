//! Exponential backoff with jitter, shared by the connection's retries of idempotent calls and the producer's
//! delivery loop.
//!
//! Written here rather than taken from `backoff`/`tokio-retry` because the retry loops interleave it with
//! reconnecting to the next broker and with a delivery deadline; the policy itself is a few lines and this keeps
//! it a pure, testable function of the attempt number.

use std::time::Duration;

use crate::error::{Result, config_err};

/// How retries are spaced and how many are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub initial_backoff: Duration,
    /// Upper bound of any delay.
    pub max_backoff: Duration,
    /// Growth factor per attempt (≥ 1).
    pub multiplier: f64,
    /// Fraction of each delay that is randomised away (0 = none, 1 = "full jitter"), so that many clients cut off
    /// together do not come back in lockstep.
    pub jitter: f64,
    /// Attempts in total (the first try included) for idempotent calls of [`crate::BrokerClient`]. The producer
    /// ignores it and retries until its delivery timeout.
    pub max_attempts: u32,
}

impl Eq for RetryPolicy {}

impl Default for RetryPolicy {
    /// 100 ms doubling up to 5 s, 20 % jitter, 5 attempts.
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            multiplier: 2.0,
            jitter: 0.2,
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
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(config_err("retry.jitter", format!("{} must be within 0..=1", self.jitter)));
        }
        if self.max_attempts == 0 {
            return Err(config_err("retry.max_attempts", "must be at least 1"));
        }
        if self.max_backoff < self.initial_backoff {
            return Err(config_err("retry.max_backoff", "must not be below initial_backoff"));
        }
        Ok(())
    }

    /// The delay before retry number `retry` (0 = the first retry), given a uniform random number in `[0, 1)`:
    /// `min(max, initial * multiplier^retry) * (1 - jitter * unit)`.
    pub fn delay_with(&self, retry: u32, unit: f64) -> Duration {
        let base = self.initial_backoff.as_secs_f64() * self.multiplier.powi(retry.min(64) as i32);
        let capped = base.min(self.max_backoff.as_secs_f64());
        let factor = 1.0 - self.jitter * unit.clamp(0.0, 1.0);
        Duration::from_secs_f64((capped * factor).max(0.0))
    }

    /// The delay before retry number `retry`, with fresh randomness.
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_up_to_the_cap() {
        let p = RetryPolicy { jitter: 0.0, ..RetryPolicy::default() };
        let ms: Vec<u128> = (0..8).map(|i| p.delay_with(i, 0.5).as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(p.delay_with(u32::MAX, 0.0), Duration::from_secs(5));
    }

    #[test]
    fn jitter_shrinks_a_delay_within_its_fraction() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_with(2, 0.0), Duration::from_millis(400));
        assert_eq!(p.delay_with(2, 1.0), Duration::from_millis(320));
        assert_eq!(p.delay_with(2, 0.5), Duration::from_millis(360));
        for _ in 0..200 {
            let d = p.delay(3);
            assert!(d > Duration::from_millis(639) && d <= Duration::from_millis(800), "{d:?}");
        }
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let bad = [
            (RetryPolicy { multiplier: 0.5, ..Default::default() }, "retry.multiplier"),
            (RetryPolicy { jitter: 1.5, ..Default::default() }, "retry.jitter"),
            (RetryPolicy { max_attempts: 0, ..Default::default() }, "retry.max_attempts"),
            (RetryPolicy { max_backoff: Duration::from_millis(1), ..Default::default() }, "retry.max_backoff"),
        ];
        for (policy, field) in bad {
            match policy.validate() {
                Err(crate::ClientError::Config { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
