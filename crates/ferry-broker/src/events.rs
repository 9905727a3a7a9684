//! Counts of the broker's cluster events (each is also a structured log line with `event = "..."`), for the
//! `ferry_broker_events_total` metric.

use std::sync::atomic::{AtomicU64, Ordering};

/// A cluster event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// This broker became a partition's leader.
    LeaderChange,
    /// As controller, it elected a partition's new leader.
    LeaderElected,
    /// A leader took followers out of the in-sync set.
    IsrShrink,
    /// A leader put followers back into the in-sync set.
    IsrExpand,
    /// A leader learnt it was deposed and follows the new leader.
    Fenced,
    /// A follower found a corrupt batch in its log and fetches it again from the leader.
    ReplicaRepair,
    /// As controller, it finished moving a partition's replicas (a drain, or a lost double_write replica).
    MoveDone,
    /// A double_write partition led here entered its risk phase: writes go on with one replica.
    RiskPhaseEntered,
    /// A double_write partition led here left its risk phase: both replicas are in sync again.
    RiskPhaseLeft,
    /// A leader was elected uncleanly (an operator's forced election): a new partition epoch starts.
    UncleanElection,
    /// A replica came back from an unclean shutdown and took itself out of its partition's in-sync set.
    UncleanRestart,
    /// A leader's etcd lease could have run out and no failsafe covered it: it stopped acting as leader.
    SelfFenced,
    /// A leader whose lease lapsed keeps its role for a partition under the failsafe (every replica confirmed).
    FailsafeHeld,
}

impl Event {
    /// Every event, in label order.
    pub const ALL: [Event; 13] = [
        Event::LeaderChange,
        Event::LeaderElected,
        Event::IsrShrink,
        Event::IsrExpand,
        Event::Fenced,
        Event::ReplicaRepair,
        Event::MoveDone,
        Event::RiskPhaseEntered,
        Event::RiskPhaseLeft,
        Event::UncleanElection,
        Event::UncleanRestart,
        Event::SelfFenced,
        Event::FailsafeHeld,
    ];

    /// The `event` label.
    pub fn name(self) -> &'static str {
        match self {
            Event::LeaderChange => "leader_change",
            Event::LeaderElected => "leader_elected",
            Event::IsrShrink => "isr_shrink",
            Event::IsrExpand => "isr_expand",
            Event::Fenced => "fenced",
            Event::ReplicaRepair => "replica_repair",
            Event::MoveDone => "move_done",
            Event::RiskPhaseEntered => "risk_phase_entered",
            Event::RiskPhaseLeft => "risk_phase_left",
            Event::UncleanElection => "unclean_election",
            Event::UncleanRestart => "unclean_restart",
            Event::SelfFenced => "self_fenced",
            Event::FailsafeHeld => "failsafe_held",
        }
    }
}

/// The counters, one per [`Event`].
#[derive(Debug, Default)]
pub struct Events {
    counts: [AtomicU64; Event::ALL.len()],
}

impl Events {
    /// Counts one `event`.
    pub fn note(&self, event: Event) {
        self.counts[event as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Every event with its count.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        Event::ALL.iter().map(|e| (e.name(), self.counts[*e as usize].load(Ordering::Relaxed))).collect()
    }
}
