//! This member's lease clock: until when its etcd lease is certainly valid, on the monotonic clock. The membership
//! extends it after every successful renewal, from the renewal's *send* time (`core::fencing::lease_until`); the
//! serving side reads it before it acknowledges, serves a read, answers as leader or coordinates a group.
//!
//! A lease granted again after the last one expired is a new lease: what this member led under the old one, etcd
//! may have given to another member meanwhile (an election while it was cut off). So after a new grant the clock
//! stays lapsed until the manager has applied a catalog read that began after that grant
//! ([`LeaseClock::catalog_read`]): the member then knows what it still leads.

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
    /// Leases granted after the first one expired.
    regrants: AtomicU64,
    /// How many of those a catalog read applied since had begun after.
    caught_up: AtomicU64,
}

impl LeaseClock {
    /// A clock for leases of `ttl`, with no lease yet.
    pub fn new(ttl: Duration) -> LeaseClock {
        LeaseClock {
            base: Instant::now(),
            until: AtomicU64::new(0),
            ttl,
            regrants: AtomicU64::new(0),
            caught_up: AtomicU64::new(0),
        }
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

    /// A new lease, asked for at `sent` after the last one expired, was granted. The clock stays lapsed until a
    /// catalog read that begins after this is applied.
    pub fn regranted(&self, sent: Instant) {
        self.regrants.fetch_add(1, Ordering::AcqRel);
        self.renewed(sent);
    }

    /// What a catalog read starting now passes to [`LeaseClock::catalog_read`] once it is applied.
    pub fn read_mark(&self) -> u64 {
        self.regrants.load(Ordering::Acquire)
    }

    /// A catalog read that began at `mark` ([`LeaseClock::read_mark`]) was applied: every role this member holds
    /// is what etcd said after the grants before it.
    pub fn catalog_read(&self, mark: u64) {
        self.caught_up.fetch_max(mark, Ordering::AcqRel);
    }

    /// Until when the lease is certainly valid; `None` with no lease, or with a new lease whose catalog has not
    /// been read yet.
    pub fn until(&self) -> Option<Instant> {
        if self.caught_up.load(Ordering::Acquire) < self.regrants.load(Ordering::Acquire) {
            return None;
        }
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

    #[test]
    fn a_lease_granted_again_counts_only_once_a_catalog_read_begun_after_it_is_applied() {
        let c = LeaseClock::new(Duration::from_secs(10));
        let t0 = Instant::now();
        c.renewed(t0);
        // The first lease needs no catalog read: the member led nothing before it.
        assert!(c.valid(t0));
        let before = c.read_mark();
        c.lost();
        c.regranted(t0 + Duration::from_secs(1));
        assert!(!c.valid(t0 + Duration::from_secs(1)), "a new lease does not carry the old one's roles");
        // A read that began before the grant does not count; one begun after does.
        c.catalog_read(before);
        assert_eq!(c.until(), None);
        let after = c.read_mark();
        c.catalog_read(after);
        assert!(c.valid(t0 + Duration::from_secs(1)));
        // Renewals of the same lease extend it without another read.
        let until = c.until().unwrap();
        c.renewed(t0 + Duration::from_secs(2));
        assert_eq!(c.until().unwrap().duration_since(until), Duration::from_secs(1));
    }
}
