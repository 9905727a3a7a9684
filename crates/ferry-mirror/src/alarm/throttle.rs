//! The alarm throttle: one governor keyed rate limiter per event kind, keyed by the alarm key
//! ([`Event::key`](crate::events::Event::key)), with the quota of that kind's rule.
//!
//! The quota is a burst of `max` and one more per `window` (GCRA), so in any window of that length at most `max`
//! notifications of one key pass. The limiters read tokio's clock, so tests on a paused clock drive them too.

use std::collections::BTreeMap;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::config::rules::Rules;
use crate::events::EventKind;

/// governor's clock reading tokio's time (which a test may pause and advance).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;

    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

type KeyedLimiter = RateLimiter<String, DashMapStateStore<String>, TokioClock, NoOpMiddleware<std::time::Instant>>;

/// The limiters of one rule set.
pub struct Throttles {
    by_kind: BTreeMap<EventKind, KeyedLimiter>,
}

impl std::fmt::Debug for Throttles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttles").field("kinds", &self.by_kind.len()).finish()
    }
}

impl Throttles {
    /// Fresh limiters for every kind of `rules`.
    pub fn new(rules: &Rules) -> Throttles {
        let by_kind = EventKind::ALL
            .into_iter()
            .filter_map(|kind| {
                let t = rules.rule(kind).throttle;
                // Rules guarantee a non-zero window; a zero one would mean "no limit".
                let quota = Quota::with_period(t.window)?.allow_burst(t.max);
                Some((kind, RateLimiter::dashmap_with_clock(quota, TokioClock)))
            })
            .collect();
        Throttles { by_kind }
    }

    /// Takes one notification of `key` (a `kind` alarm) from its budget; false when the budget is spent.
    pub fn allow(&self, kind: EventKind, key: &str) -> bool {
        self.by_kind.get(&kind).is_none_or(|l| l.check_key(&key.to_owned()).is_ok())
    }

    /// Forgets keys whose budget is full again, so the key set stays bounded by the keys active recently.
    pub fn forget_idle(&self) {
        for l in self.by_kind.values() {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rules(max: u32, window: &str) -> Rules {
        let text = format!("[defaults]\nthrottle = {{ max = {max}, window = \"{window}\" }}\n");
        Rules::parse(Some(&text), &Default::default()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_per_window_per_key() {
        let t = Throttles::new(&rules(3, "10m"));
        let lag = EventKind::LagAboveThreshold;
        let passed = (0..100).filter(|_| t.allow(lag, "lag/orders/0/-")).count();
        assert_eq!(passed, 3);
        // Another key and another kind have their own budgets.
        assert!(t.allow(lag, "lag/orders/1/-"));
        assert!(t.allow(EventKind::SyncError, "lag/orders/0/-"));
        // Within the window nothing more passes for the spent key ...
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(!t.allow(lag, "lag/orders/0/-"));
        // ... then one per window.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(t.allow(lag, "lag/orders/0/-"));
        assert!(!t.allow(lag, "lag/orders/0/-"));
        // After max windows of quiet the full burst is back.
        tokio::time::advance(Duration::from_secs(1800)).await;
        assert_eq!((0..10).filter(|_| t.allow(lag, "lag/orders/0/-")).count(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_keys_are_forgotten() {
        let t = Throttles::new(&rules(1, "1s"));
        for p in 0..50 {
            assert!(t.allow(EventKind::PartitionStalled, &format!("stall/t/{p}/-")));
        }
        assert_eq!(t.by_kind[&EventKind::PartitionStalled].len(), 50);
        tokio::time::advance(Duration::from_secs(2)).await;
        t.forget_idle();
        assert_eq!(t.by_kind[&EventKind::PartitionStalled].len(), 0);
    }
}
