//! Moving a partition's replicas to other brokers, decided without I/O: the controller applies one step per beat,
//! each a compare-and-swap on the partition's state.
//!
//! A move starts when a replica must go: its broker is being drained, or (double_write only) its broker left the
//! cluster, so the partition would stay one replica short. Its `target` is the replica list with each of those
//! replaced by the least loaded broker that can take one; it is written into the partition's state, so the move
//! survives a change of controller and goes on from where it was. Then, one step at a time:
//! 1. a leader that must go hands the leadership to a live in-sync replica that stays (the next leader epoch);
//! 2. the replicas of the target that are missing are added (they fetch from the leader);
//! 3. once every replica of the target is in sync, a leader that must go hands over (when step 1 could not);
//! 4. the replicas that are not in the target are dropped, with them the target: the move is done.
//!
//! The in-sync set never loses a replica that stays, so what was acknowledged stays acknowledged throughout.

use std::collections::BTreeSet;

use crate::node::replica::PartitionState;
use crate::node::topic::Replication;

/// The target of a move that `state` needs now, if any: each replica that is being `draining`, or (double_write)
/// not among the `live` brokers, replaced by `pick` (which is told the brokers already taken and answers the least
/// loaded other one). A move under way gets a new target only when a broker of its target must go too. Replicas no
/// broker can replace stay.
pub fn target_for(
    state: &PartitionState,
    mode: Replication,
    live: &BTreeSet<u32>,
    draining: &BTreeSet<u32>,
    mut pick: impl FnMut(&[u32]) -> Option<u32>,
) -> Option<Vec<u32>> {
    let must_go = |r: &u32| draining.contains(r) || (mode == Replication::DoubleWrite && !live.contains(r));
    let base = state.target.clone().unwrap_or_else(|| state.replicas.clone());
    let mut taken = state.replicas.clone();
    taken.extend(base.iter().filter(|r| !state.replicas.contains(r)));
    let mut target = base;
    let mut moved = false;
    for slot in target.iter_mut() {
        if must_go(slot)
            && let Some(new) = pick(&taken)
        {
            taken.push(new);
            *slot = new;
            moved = true;
        }
    }
    moved.then_some(target)
}

/// The next state of a partition that is moving to `state.target`, or `None` while it waits (for new replicas to
/// get in sync) or when it is not moving.
pub fn step(state: &PartitionState, live: &BTreeSet<u32>) -> Option<PartitionState> {
    let target = state.target.as_ref()?;
    let leader_stays = target.contains(&state.leader);
    let successor = target.iter().copied().find(|r| *r != state.leader && state.isr.contains(r) && live.contains(r));
    let hand_over = |to: u32| PartitionState { leader: to, leader_epoch: state.leader_epoch + 1, ..state.clone() };
    // 1. Leadership first, when a replica that stays can take it.
    if !leader_stays
        && state.leader != 0
        && let Some(to) = successor
    {
        return Some(hand_over(to));
    }
    // 2. Add what is missing.
    let missing: Vec<u32> = target.iter().copied().filter(|r| !state.replicas.contains(r)).collect();
    if !missing.is_empty() {
        let mut replicas = state.replicas.clone();
        replicas.extend(missing);
        return Some(PartitionState { replicas, ..state.clone() });
    }
    // 3. Wait until the whole target is in sync.
    if !target.iter().all(|r| state.isr.contains(r)) {
        return None;
    }
    if !leader_stays {
        return successor.map(hand_over);
    }
    // 4. Drop the others.
    Some(PartitionState {
        replicas: target.clone(),
        isr: state.isr.iter().copied().filter(|r| target.contains(r)).collect(),
        target: None,
        ..state.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(replicas: &[u32], leader: u32, isr: &[u32], target: Option<&[u32]>) -> PartitionState {
        PartitionState {
            replicas: replicas.to_vec(),
            leader,
            leader_epoch: 4,
            isr: isr.to_vec(),
            target: target.map(<[u32]>::to_vec),
            unclean_epoch: None,
        }
    }

    fn set(ids: &[u32]) -> BTreeSet<u32> {
        ids.iter().copied().collect()
    }

    /// A picker over brokers 1..=6 that answers the lowest id not taken.
    fn lowest(taken: &[u32]) -> Option<u32> {
        (1..=6).find(|id| !taken.contains(id))
    }

    #[test]
    fn a_move_starts_for_drained_replicas_and_for_lost_double_write_ones_only() {
        let live = set(&[1, 2, 3, 4, 5]);
        let s = state(&[1, 2, 3], 1, &[1, 2, 3], None);
        assert_eq!(target_for(&s, Replication::Raft3, &live, &set(&[]), lowest), None);
        assert_eq!(target_for(&s, Replication::Raft3, &live, &set(&[2]), lowest), Some(vec![1, 4, 3]));
        assert_eq!(target_for(&s, Replication::Raft3, &live, &set(&[1, 3]), lowest), Some(vec![4, 2, 5]));
        // A raft3 replica whose broker left waits for it; a double_write one is replaced.
        let d = state(&[1, 2], 1, &[1], None);
        assert_eq!(target_for(&d, Replication::Raft3, &set(&[1, 3]), &set(&[]), lowest), None);
        assert_eq!(target_for(&d, Replication::DoubleWrite, &set(&[1, 3]), &set(&[]), lowest), Some(vec![1, 3]));
        // Nothing can take it: no move. A move under way is not started again, unless its target lost a broker.
        assert_eq!(target_for(&d, Replication::DoubleWrite, &set(&[1]), &set(&[]), |_| None), None);
        let moving = state(&[1, 2], 1, &[1], Some(&[1, 3]));
        assert_eq!(target_for(&moving, Replication::DoubleWrite, &set(&[1, 3]), &set(&[]), lowest), None);
        assert_eq!(target_for(&moving, Replication::DoubleWrite, &set(&[1, 4]), &set(&[]), lowest), Some(vec![1, 4]));
    }

    #[test]
    fn a_drained_leader_hands_over_first_then_replicas_are_added_synced_and_dropped() {
        let live = set(&[1, 2, 3, 4]);
        // Broker 1 leads and is drained; 4 replaces it.
        let s0 = state(&[1, 2, 3], 1, &[1, 2, 3], Some(&[4, 2, 3]));
        let s1 = step(&s0, &live).unwrap();
        assert_eq!((s1.leader, s1.leader_epoch, &s1.replicas), (2, 5, &vec![1, 2, 3]), "leadership first");
        let s2 = step(&s1, &live).unwrap();
        assert_eq!((&s2.replicas, &s2.isr), (&vec![1, 2, 3, 4], &vec![1, 2, 3]), "4 is added");
        assert_eq!(step(&s2, &live), None, "waits for 4 to get in sync");
        let s3 = PartitionState { isr: vec![1, 2, 3, 4], ..s2 };
        let s4 = step(&s3, &live).unwrap();
        assert_eq!(s4, state(&[4, 2, 3], 2, &[2, 3, 4], None).with_epoch(5), "1 is dropped, the move is done");
        assert_eq!(step(&s4, &live), None);
    }

    #[test]
    fn a_lost_double_write_replica_is_replaced_and_a_leader_without_a_successor_hands_over_after_the_sync() {
        // The follower 2 is gone: 3 is added and, once in sync, 2 is dropped; the leader stays.
        let live = set(&[1, 3]);
        let s0 = state(&[1, 2], 1, &[1], Some(&[1, 3]));
        let s1 = step(&s0, &live).unwrap();
        assert_eq!((s1.leader, &s1.replicas), (1, &vec![1, 2, 3]));
        assert_eq!(step(&s1, &live), None);
        let s2 = PartitionState { isr: vec![1, 3], ..s1 };
        assert_eq!(step(&s2, &live).unwrap(), state(&[1, 3], 1, &[1, 3], None));
        // A drained leader whose only peer is out of sync: the replacement first, then the hand-over.
        let live = set(&[1, 2, 3]);
        let t0 = state(&[1, 2], 1, &[1], Some(&[3, 2]));
        let t1 = step(&t0, &live).unwrap();
        assert_eq!((t1.leader, &t1.replicas), (1, &vec![1, 2, 3]), "no in-sync successor yet: add first");
        let t2 = PartitionState { isr: vec![1, 2, 3], ..t1 };
        let t3 = step(&t2, &live).unwrap();
        assert_eq!((t3.leader, t3.leader_epoch), (3, 5), "then hand over to the first of the target in sync");
        assert_eq!(step(&t3, &live).unwrap(), state(&[3, 2], 3, &[2, 3], None).with_epoch(5));
    }

    impl PartitionState {
        fn with_epoch(self, leader_epoch: u32) -> PartitionState {
            PartitionState { leader_epoch, ..self }
        }
    }
}
