//! Electing a partition's leader.
//!
//! - **By the controller**, when the leader left the cluster (its lease ran out) or none leads: among the live
//!   members of the ISR that answered the controller's question about their replica, the one with the highest
//!   (last leader epoch, log end), ties in replica order, leads at the next epoch; the old leader leaves the ISR.
//!   Every ISR member holds every acknowledged record (a replica that may have lost some took itself out, see
//!   [`super::eligibility`]), and the one with the most of the rest is chosen, so a new leader never truncates
//!   away a record that another live ISR member holds and the old high watermark covered. A partition with no
//!   such member stays offline: no unclean election by the controller.
//! - **By an operator** ([`manual`]): the first live ISR member that answered, as the preferred leader; with
//!   `unclean`, when no ISR member is live, the live replica with the highest (epoch, log end), which starts a new
//!   partition epoch before it writes. An unclean election is refused while a member of the old ISR may still
//!   lead under the failsafe rule: a live replica holds an unexpired failsafe promise to it. The operator may
//!   override that for members they name as dead.

use std::collections::{BTreeMap, BTreeSet};

use crate::node::replica::PartitionState;

/// A member's account of its replica, asked by the electing broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The last leader epoch in its history (0 when none).
    pub last_epoch: u32,
    /// Its log end offset.
    pub log_end: u64,
    /// The leader it holds an unexpired failsafe promise to, 0 when none.
    pub promised_to: u32,
}

/// Whether `state` needs a new leader: its leader is 0 or not among the `live` brokers.
pub fn needs_leader(state: &PartitionState, live: &BTreeSet<u32>) -> bool {
    state.leader == 0 || !live.contains(&state.leader)
}

/// The members the controller asks for a report before electing: the live ISR members other than the old leader.
pub fn candidates(state: &PartitionState, live: &BTreeSet<u32>) -> Vec<u32> {
    state.replicas.iter().copied().filter(|r| *r != state.leader && state.isr.contains(r) && live.contains(r)).collect()
}

fn best(among: impl Iterator<Item = u32>, order: &[u32], reports: &BTreeMap<u32, Report>) -> Option<u32> {
    among
        .filter_map(|r| reports.get(&r).map(|rep| (r, *rep)))
        .max_by_key(|(r, rep)| {
            let rank = order.iter().position(|x| x == r).unwrap_or(usize::MAX);
            (rep.last_epoch, rep.log_end, std::cmp::Reverse(rank))
        })
        .map(|(r, _)| r)
}

/// The controller's election: the next state, when the partition needs a leader and has an electable one.
pub fn elect(state: &PartitionState, live: &BTreeSet<u32>, reports: &BTreeMap<u32, Report>) -> Option<PartitionState> {
    if !needs_leader(state, live) {
        return None;
    }
    let leader = best(candidates(state, live).into_iter(), &state.replicas, reports)?;
    let isr = state.isr.iter().copied().filter(|r| *r != state.leader || live.contains(r)).collect();
    Some(PartitionState { leader, leader_epoch: state.leader_epoch + 1, isr, ..state.clone() })
}

/// An operator's election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manual {
    /// The preferred live ISR member already leads.
    Unchanged,
    /// A clean election.
    Clean(PartitionState),
    /// An unclean one: what only the lost replicas had is gone.
    Unclean(PartitionState),
}

/// An operator's election of a leader for `state`.
pub fn manual(
    state: &PartitionState,
    live: &BTreeSet<u32>,
    reports: &BTreeMap<u32, Report>,
    unclean: bool,
    named_dead: &[u32],
) -> Result<Manual, String> {
    let in_sync = state.replicas.iter().copied().find(|r| state.isr.contains(r) && live.contains(r));
    match in_sync {
        Some(leader) if leader == state.leader => return Ok(Manual::Unchanged),
        Some(leader) if reports.contains_key(&leader) => {
            return Ok(Manual::Clean(PartitionState { leader, leader_epoch: state.leader_epoch + 1, ..state.clone() }));
        }
        Some(leader) => return Err(format!("broker {leader} is in sync and live but did not answer; try again")),
        None if !unclean => {
            return Err(format!(
                "no in-sync replica is live (in sync: {:?}, live replicas: {:?}); an unclean election (--unclean) makes \
                 a live out-of-sync replica the leader and loses what only the in-sync replicas had",
                state.isr,
                state.replicas.iter().filter(|r| live.contains(r)).collect::<Vec<_>>()
            ));
        }
        None => {}
    }
    // An old ISR member may still lead under the failsafe while a live replica's promise to it runs.
    for (replica, report) in reports {
        let holder = report.promised_to;
        if holder != 0 && state.isr.contains(&holder) && !named_dead.contains(&holder) {
            return Err(format!(
                "broker {holder} of the old in-sync set may still lead: broker {replica} holds its failsafe \
                 confirmation; wait for it to run out, or name broker {holder} with --dead if you know it is down"
            ));
        }
    }
    let live_replicas = state.replicas.iter().copied().filter(|r| live.contains(r));
    let Some(leader) = best(live_replicas, &state.replicas, reports) else {
        return Err(format!(
            "no live replica answered (replicas {:?}); start one of their brokers, or try again",
            state.replicas
        ));
    };
    let epoch = state.leader_epoch + 1;
    Ok(Manual::Unclean(PartitionState {
        leader,
        leader_epoch: epoch,
        isr: vec![leader],
        unclean_epoch: Some(epoch),
        ..state.clone()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(leader: u32, epoch: u32, isr: &[u32]) -> PartitionState {
        PartitionState {
            replicas: vec![1, 2, 3],
            leader,
            leader_epoch: epoch,
            isr: isr.to_vec(),
            target: None,
            unclean_epoch: None,
        }
    }

    fn live(ids: &[u32]) -> BTreeSet<u32> {
        ids.iter().copied().collect()
    }

    fn reports(rs: &[(u32, u32, u64)]) -> BTreeMap<u32, Report> {
        rs.iter().map(|&(id, last_epoch, log_end)| (id, Report { last_epoch, log_end, promised_to: 0 })).collect()
    }

    #[test]
    fn the_controllers_election_rule() {
        let all = reports(&[(1, 4, 100), (2, 4, 100), (3, 4, 100)]);
        let cases = [
            ("the leader is alive: nothing to do", state(1, 4, &[1, 2, 3]), live(&[1, 2, 3]), all.clone(), None),
            (
                "it left: the first in replica order among equals",
                state(1, 4, &[1, 2, 3]),
                live(&[2, 3]),
                all.clone(),
                Some(state(2, 5, &[2, 3])),
            ),
            (
                "the highest log end wins over replica order",
                state(1, 4, &[1, 2, 3]),
                live(&[2, 3]),
                reports(&[(2, 4, 90), (3, 4, 100)]),
                Some(state(3, 5, &[2, 3])),
            ),
            (
                "the highest last epoch wins over the log end",
                state(1, 4, &[1, 2, 3]),
                live(&[2, 3]),
                reports(&[(2, 3, 120), (3, 4, 100)]),
                Some(state(3, 5, &[2, 3])),
            ),
            (
                "case 1: the follower back from a power loss left the ISR and is not elected",
                state(1, 4, &[1, 3]),
                live(&[2, 3]),
                reports(&[(2, 4, 50), (3, 4, 100)]),
                Some(state(3, 5, &[3])),
            ),
            (
                "a live ISR member that did not answer is not elected; the one that did is",
                state(1, 4, &[1, 2, 3]),
                live(&[2, 3]),
                reports(&[(3, 4, 90)]),
                Some(state(3, 5, &[2, 3])),
            ),
            ("no live ISR member: offline", state(1, 4, &[1, 3]), live(&[2]), all.clone(), None),
            (
                "an offline partition whose ISR member is back",
                state(0, 5, &[3]),
                live(&[2, 3]),
                all.clone(),
                Some(state(3, 6, &[3])),
            ),
            (
                "case 11 etc.: a leader that took itself out (leader 0) is replaced",
                state(0, 5, &[2, 3]),
                live(&[1, 2, 3]),
                reports(&[(2, 4, 100), (3, 4, 100)]),
                Some(state(2, 6, &[2, 3])),
            ),
        ];
        for (name, s, l, r, want) in cases {
            assert_eq!(elect(&s, &l, &r), want, "{name}");
        }
        assert_eq!(candidates(&state(1, 4, &[1, 3]), &live(&[2, 3])), vec![3]);
    }

    #[test]
    fn the_operators_election_rule() {
        let all = reports(&[(1, 4, 100), (2, 4, 100), (3, 3, 80)]);
        assert_eq!(manual(&state(1, 4, &[1, 2]), &live(&[1, 2, 3]), &all, false, &[]), Ok(Manual::Unchanged));
        assert_eq!(
            manual(&state(2, 4, &[1, 2]), &live(&[1, 2, 3]), &all, false, &[]),
            Ok(Manual::Clean(state(1, 5, &[1, 2]))),
            "the preferred leader"
        );
        let err = manual(&state(1, 4, &[1, 2]), &live(&[3]), &all, false, &[]).unwrap_err();
        assert!(err.contains("--unclean"), "{err}");
        let unclean = PartitionState { unclean_epoch: Some(5), ..state(3, 5, &[3]) };
        assert_eq!(manual(&state(1, 4, &[1, 2]), &live(&[3]), &all, true, &[]), Ok(Manual::Unclean(unclean.clone())));
        // Case 2: broker 3 promised broker 1 (of the old ISR) its failsafe: refused, unless 1 is named dead.
        let mut promised = all.clone();
        promised.get_mut(&3).unwrap().promised_to = 1;
        let err = manual(&state(1, 4, &[1, 2]), &live(&[3]), &promised, true, &[]).unwrap_err();
        assert!(err.contains("broker 1 of the old in-sync set may still lead"), "{err}");
        assert_eq!(manual(&state(1, 4, &[1, 2]), &live(&[3]), &promised, true, &[1]), Ok(Manual::Unclean(unclean)));
        let err = manual(&state(1, 4, &[1, 2]), &live(&[3]), &BTreeMap::new(), true, &[]).unwrap_err();
        assert!(err.contains("no live replica answered"), "{err}");
    }
}
