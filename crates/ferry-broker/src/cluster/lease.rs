//! This member's lease clock: until when its etcd lease is certainly valid, on the monotonic clock. The membership
//! extends it after every successful renewal, from the renewal's *send* time (`core::fencing::lease_until`); the
//! serving side reads it before it acknowledges, serves a read, answers as leader or coordinates a group.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::core::fencing;

/// A shared deadline, `None` until the first successful registration.
#[derive(Debug)]
pub struct LeaseClock {
    base: Instant,
    /// Nanoseconds after `base` of the deadline, plus one; 0 when there is none.
    until: AtomicU64,
    ttl: Duration,
}

impl LeaseClock {
    /// A clock for leases of `ttl`, with no lease yet.
    pub fn new(ttl: Duration) -> LeaseClock {
        LeaseClock { base: Instant::now(), until: AtomicU64::new(0), ttl }
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A renewal (or grant) sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        let until = fencing::lease_until(sent, self.ttl);
        let nanos = u64::try_from(until.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        self.until.fetch_max(nanos, Ordering::AcqRel);
    }

    /// The lease is gone (revoked, or etcd said it expired).
    pub fn lost(&self) {
        self.until.store(0, Ordering::Release);
    }

    /// Until when the lease is certainly valid.
    pub fn until(&self) -> Option<Instant> {
        match self.until.load(Ordering::Acquire) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n - 1)),
        }
    }

    /// Whether the lease is valid at `now`.
    pub fn valid(&self, now: Instant) -> bool {
        self.until().is_some_and(|t| now < t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_holds_the_latest_deadline_until_lost() {
        let c = LeaseClock::new(Duration::from_secs(10));
        assert_eq!(c.until(), None);
        let t0 = Instant::now();
        c.renewed(t0 + Duration::from_secs(1));
        let until = c.until().unwrap();
        assert!(until.duration_since(t0 + Duration::from_secs(10)) < Duration::from_millis(1));
        c.renewed(t0);
        assert_eq!(c.until(), Some(until), "an older send does not shorten it");
        assert!(c.valid(t0) && !c.valid(until));
        c.lost();
        assert!(!c.valid(t0));
    }
}
