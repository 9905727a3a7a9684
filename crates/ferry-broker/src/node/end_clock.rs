//! [`EndClock`]: when a partition's readable end last moved, on this process's monotonic clock.

use std::sync::atomic::Ordering;

/// When a partition's readable end last moved, on this process's monotonic clock: clients learn how long ago a log
/// end was reached (`ListOffsetsResult.log_end_age_ms`), which tells a mirror when the records below it were
/// received here at the latest, whatever the producers' clocks say.
#[derive(Debug, Default)]
pub struct EndClock {
    /// Nanoseconds after [`EndClock::base`] of the last move, plus one; 0 when it has not moved.
    at: std::sync::atomic::AtomicU64,
}

impl EndClock {
    fn base() -> std::time::Instant {
        static BASE: std::sync::LazyLock<std::time::Instant> = std::sync::LazyLock::new(std::time::Instant::now);
        *BASE
    }

    /// The end moved now.
    pub fn moved(&self) {
        let n = u64::try_from(Self::base().elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        self.at.store(n, Ordering::Release);
    }

    /// How long ago it last moved.
    pub fn age(&self) -> Option<std::time::Duration> {
        match self.at.load(Ordering::Acquire) {
            0 => None,
            n => Some(Self::base().elapsed().saturating_sub(std::time::Duration::from_nanos(n - 1))),
        }
    }
}
