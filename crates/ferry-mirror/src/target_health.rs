//! The target side's health as one flag: consecutive failures of target calls or probes raise
//! `target_net_not_available` at `failure_threshold`, the first success after that `target_net_recovered`. The
//! lanes and the target watch (`crate::target_watch`) report into it; the monitor's `/readyz` reads it.

use parking_lot::Mutex;

use crate::events::{Details, Event, EventBus, EventKind, FailureFacts};

/// Tracks consecutive target failures for `target_net_not_available` / `target_net_recovered`.
#[derive(Debug)]
pub struct TargetHealth {
    threshold: u32,
    state: Mutex<(u32, bool)>,
}

impl Default for TargetHealth {
    fn default() -> Self {
        TargetHealth::new(3)
    }
}

impl TargetHealth {
    /// Unavailable after `threshold` consecutive failures.
    pub fn new(threshold: u32) -> TargetHealth {
        TargetHealth { threshold: threshold.max(1), state: Mutex::new((0, false)) }
    }

    /// A target call or probe failed at the transport level.
    pub fn failure(&self, events: &EventBus, reason: &str) {
        let mut s = self.state.lock();
        s.0 = s.0.saturating_add(1);
        if s.0 >= self.threshold && !s.1 {
            s.1 = true;
            events.emit(
                Event::new(EventKind::TargetNetNotAvailable, format!("the target cluster cannot be reached: {reason}"))
                    .with(Details::Failure(FailureFacts { reason: Some(reason.to_owned()), ..Default::default() })),
            );
        }
    }

    /// A target call or probe succeeded. Returns whether the target was down until now.
    pub fn success(&self, events: &EventBus) -> bool {
        let mut s = self.state.lock();
        s.0 = 0;
        let recovered = std::mem::replace(&mut s.1, false);
        if recovered {
            events.emit(Event::new(EventKind::TargetNetRecovered, "the target cluster is reachable again"));
        }
        recovered
    }

    /// Whether the target is considered down.
    pub fn is_down(&self) -> bool {
        self.state.lock().1
    }
}
