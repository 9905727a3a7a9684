//! The controller's beat, decided: for every partition of the catalog, an election when its leader is gone (once
//! the candidates reported, see [`super::election`]), else the next step of a replica move (see [`super::moves`]).
//! The driver asks the candidates, then writes each decision as a compare-and-swap on the partition's state,
//! fenced by the controller key's create revision.

use std::collections::{BTreeMap, BTreeSet};

use super::election::{self, Report};
use super::moves;
use super::view::Snapshot;
use crate::node::replica::PartitionState;
use crate::node::topic::Replication;

/// A partition, by topic and index.
pub type Key = (String, u32);

/// What the controller asks or writes this beat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask these members for a report of their replica of the partition before electing its leader.
    Ask {
        /// The partition.
        key: Key,
        /// Whom.
        candidates: Vec<u32>,
    },
    /// Write the partition's next state (compare-and-swap at `revision`).
    Write {
        /// The partition.
        key: Key,
        /// The revision the decision was taken at.
        revision: i64,
        /// The next state.
        next: PartitionState,
        /// Why.
        why: Why,
    },
}

/// Why the controller writes a partition's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A leader was elected.
    Elected,
    /// A move starts.
    MoveStarted,
    /// A move went one step on.
    MoveStep,
    /// A move is done.
    MoveDone,
}

/// One beat of the controller over `snap`, once the candidates of the partitions needing a leader reported
/// (`reports`, per partition; a partition without reports gets an [`Action::Ask`]). With `act_on_missing` false
/// (etcd just came back, and members are still re-registering), nothing is decided.
pub fn step(snap: &Snapshot, reports: &BTreeMap<Key, BTreeMap<u32, Report>>, act_on_missing: bool) -> Vec<Action> {
    let mut out = Vec::new();
    if !act_on_missing {
        return out;
    }
    let live: BTreeSet<u32> = snap.brokers.keys().copied().collect();
    // Replica counts as moves start this beat, so that several partitions do not all pick the same broker.
    let mut load = snap.replica_counts();
    for (key, v) in &snap.partitions {
        if election::needs_leader(&v.state, &live) {
            let candidates = election::candidates(&v.state, &live);
            if candidates.is_empty() {
                continue;
            }
            match reports.get(key) {
                None => out.push(Action::Ask { key: key.clone(), candidates }),
                Some(r) => {
                    if let Some(next) = election::elect(&v.state, &live, r) {
                        out.push(Action::Write { key: key.clone(), revision: v.revision, next, why: Why::Elected });
                    }
                }
            }
            continue;
        }
        let mode = snap.topics.get(&key.0).map_or(Replication::Raft3, |t| t.replication);
        let pick = |taken: &[u32]| {
            let id = load.iter().filter(|(id, _)| !taken.contains(id)).min_by_key(|&(id, c)| (*c, *id))?.0;
            Some(*id)
        };
        let (next, why) = match moves::target_for(&v.state, mode, &live, &snap.draining, pick) {
            Some(target) => {
                for id in target.iter().filter(|id| !v.state.replicas.contains(id)) {
                    *load.entry(*id).or_default() += 1;
                }
                (PartitionState { target: Some(target), ..v.state.clone() }, Why::MoveStarted)
            }
            None => match moves::step(&v.state, &live) {
                Some(next) if next.target.is_none() => (next, Why::MoveDone),
                Some(next) => (next, Why::MoveStep),
                None => continue,
            },
        };
        out.push(Action::Write { key: key.clone(), revision: v.revision, next, why });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::core::view::Versioned;

    fn snap(live: &[u32], states: &[(&str, PartitionState)]) -> Snapshot {
        Snapshot {
            brokers: live.iter().map(|&id| (id, format!("h:{id}"))).collect(),
            partitions: states
                .iter()
                .map(|(t, s)| (((*t).to_owned(), 0), Versioned { state: s.clone(), revision: 7 }))
                .collect(),
            ..Snapshot::default()
        }
    }

    fn state(leader: u32, isr: &[u32]) -> PartitionState {
        PartitionState {
            replicas: vec![1, 2, 3],
            leader,
            leader_epoch: 4,
            isr: isr.to_vec(),
            target: None,
            unclean_epoch: None,
        }
    }

    #[test]
    fn the_controller_asks_before_it_elects_and_decides_nothing_while_members_re_register() {
        let s = snap(&[2, 3], &[("t", state(1, &[1, 2, 3]))]);
        let key = ("t".to_owned(), 0);
        assert_eq!(step(&s, &BTreeMap::new(), false), vec![]);
        assert_eq!(step(&s, &BTreeMap::new(), true), vec![Action::Ask { key: key.clone(), candidates: vec![2, 3] }]);
        let r = Report { last_epoch: 4, log_end: 10, promised_to: 0 };
        let reports = BTreeMap::from([(key.clone(), BTreeMap::from([(3, r)]))]);
        let next = PartitionState { leader: 3, leader_epoch: 5, isr: vec![2, 3], ..state(1, &[1, 2, 3]) };
        assert_eq!(step(&s, &reports, true), vec![Action::Write { key, revision: 7, next, why: Why::Elected }]);
        // No live candidate: nothing asked, nothing written (offline).
        assert_eq!(step(&snap(&[2], &[("t", state(1, &[1, 3]))]), &BTreeMap::new(), true), vec![]);
    }

    #[test]
    fn a_drained_broker_starts_a_move_and_a_moving_partition_goes_a_step_on() {
        let mut s = snap(&[1, 2, 3, 4], &[("t", state(1, &[1, 2, 3]))]);
        s.draining.insert(3);
        let got = step(&s, &BTreeMap::new(), true);
        let want = PartitionState { target: Some(vec![1, 2, 4]), ..state(1, &[1, 2, 3]) };
        assert_eq!(
            got,
            vec![Action::Write { key: ("t".into(), 0), revision: 7, next: want.clone(), why: Why::MoveStarted }]
        );
        let s = snap(&[1, 2, 3, 4], &[("t", want)]);
        let got = step(&s, &BTreeMap::new(), true);
        assert!(matches!(&got[..], [Action::Write { why: Why::MoveStep, next, .. }] if next.replicas == [1, 2, 3, 4]));
    }
}
