//! The target side's health as one flag: consecutive failures of target calls or probes raise
//! `target_net_not_available` at `failure_threshold`, the first success after that `target_net_recovered`. The
//! lanes and the target watch (`crate::target_watch`) report into it; the monitor's `/readyz` reads it.
//!
//! Many calls run at once. A call answered just before the link failed can be reported after the failures of the
//! calls that began with it, and after the alarm they raised. Its success says nothing about the link since those
//! failures: a success counts only for a call that began after the last failure was reported ([`Ticket`]).

use parking_lot::Mutex;

use crate::events::{Details, Event, EventBus, EventKind, FailureFacts};

/// Tracks consecutive target failures for `target_net_not_available` / `target_net_recovered`.
#[derive(Debug)]
pub struct TargetHealth {
    threshold: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Consecutive failures: the target is down while they are at least the threshold.
    failures: u32,
    /// Failures reported ever: a call's [`Ticket`] is this number when it began.
    reported: u64,
}

/// When a call began, in reported failures: taken with [`TargetHealth::ticket`] before the call is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

impl Default for TargetHealth {
    fn default() -> Self {
        TargetHealth::new(3)
    }
}

impl TargetHealth {
    /// Unavailable after `threshold` consecutive failures.
    pub fn new(threshold: u32) -> TargetHealth {
        TargetHealth { threshold: threshold.max(1), state: Mutex::new(State::default()) }
    }

    /// Taken before a call is sent; handed to [`TargetHealth::success`] when it is answered.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.state.lock().reported)
    }

    /// A target call or probe failed at the transport level.
    pub fn failure(&self, events: &EventBus, reason: &str) {
        let mut s = self.state.lock();
        s.reported += 1;
        let before = s.failures;
        s.failures = before.saturating_add(1);
        if before < self.threshold && s.failures >= self.threshold {
            events.emit(
                Event::new(EventKind::TargetNetNotAvailable, format!("the target cluster cannot be reached: {reason}"))
                    .with(Details::Failure(FailureFacts { reason: Some(reason.to_owned()), ..Default::default() })),
            );
        }
    }

    /// A target call or probe that began at `began` succeeded. Returns whether the target was down until now.
    /// A call that began before the last reported failure changes nothing: its answer may predate that failure.
    pub fn success(&self, events: &EventBus, began: Ticket) -> bool {
        let mut s = self.state.lock();
        if began.0 < s.reported {
            return false;
        }
        let recovered = std::mem::take(&mut s.failures) >= self.threshold;
        if recovered {
            events.emit(Event::new(EventKind::TargetNetRecovered, "the target cluster is reachable again"));
        }
        recovered
    }

    /// Whether the target is considered down.
    pub fn is_down(&self) -> bool {
        self.state.lock().failures >= self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_of_a_call_begun_before_the_failures_neither_recovers_nor_resets_the_count() {
        let events = EventBus::new(crate::metrics::Metrics::new());
        let health = TargetHealth::new(3);
        // Four calls leave at once; the link fails; three fail, and the fourth's answer (read before the cut)
        // is reported last.
        let early = health.ticket();
        for _ in 0..3 {
            health.failure(&events, "connection reset");
        }
        assert!(health.is_down());
        assert!(!health.success(&events, early), "a stale success is no recovery");
        assert!(health.is_down());
        // Nor does it reset the count: with the target up again (a fresh success), two failures stay below three.
        let late = health.ticket();
        health.failure(&events, "connection reset");
        assert!(!health.success(&events, early));
        health.failure(&events, "connection reset");
        assert!(health.is_down(), "still down: no fresh success yet");
        assert!(!health.success(&events, late), "began before the two failures");
        let fresh = health.ticket();
        assert!(health.success(&events, fresh), "a call begun after the last failure recovers");
        assert!(!health.is_down());
        let began = health.ticket();
        health.failure(&events, "connection reset");
        health.failure(&events, "connection reset");
        assert!(!health.success(&events, began), "began before both failures: the count stays at two");
        health.failure(&events, "connection reset");
        assert!(health.is_down(), "three in a row, with only a stale success between them");
        assert_eq!(
            events.recent().iter().map(|e| e.kind).collect::<Vec<_>>(),
            [EventKind::TargetNetNotAvailable, EventKind::TargetNetRecovered, EventKind::TargetNetNotAvailable]
        );
    }
}
