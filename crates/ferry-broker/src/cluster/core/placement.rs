//! Where replicas go: a new topic's partitions over the live brokers, and a replacement for a lost or drained
//! replica, balanced by how many replicas (and leaderships) each broker holds.

use std::collections::BTreeMap;

use super::view::Snapshot;
use crate::node::replica::PartitionState;

/// Places `partitions` partitions of `replicas` replicas each over the live brokers that are not being drained,
/// balanced by how many replicas each holds already: each partition takes the least loaded brokers (ties by id),
/// and its first replica (the preferred leader) is the chosen broker leading the fewest partitions. `None` when
/// fewer than `replicas` brokers can take one.
pub fn place(snap: &Snapshot, partitions: u32, replicas: usize) -> Option<Vec<PartitionState>> {
    let mut counts = snap.replica_counts();
    if counts.len() < replicas {
        return None;
    }
    let mut leaders: BTreeMap<u32, usize> = BTreeMap::new();
    for v in snap.partitions.values() {
        *leaders.entry(v.state.leader).or_default() += 1;
    }
    let mut out = Vec::with_capacity(partitions as usize);
    for _ in 0..partitions {
        let mut by_load: Vec<(usize, u32)> = counts.iter().map(|(&id, &c)| (c, id)).collect();
        by_load.sort_unstable();
        let mut chosen: Vec<u32> = by_load.iter().take(replicas).map(|&(_, id)| id).collect();
        let lead = chosen.iter().enumerate().min_by_key(|&(_, id)| (leaders.get(id).copied().unwrap_or(0), *id));
        let lead = lead.map_or(0, |(i, _)| i);
        chosen.swap(0, lead);
        for id in &chosen {
            *counts.entry(*id).or_default() += 1;
        }
        *leaders.entry(chosen[0]).or_default() += 1;
        out.push(PartitionState {
            leader: chosen[0],
            leader_epoch: 1,
            isr: chosen.clone(),
            replicas: chosen,
            target: None,
            unclean_epoch: None,
        });
    }
    Some(out)
}

/// The broker to take a replica in place of a lost or drained one: the least loaded live broker that is not being
/// drained and holds no replica in `taken` (ties by id).
pub fn replacement(snap: &Snapshot, taken: &[u32]) -> Option<u32> {
    snap.replica_counts()
        .into_iter()
        .filter(|(id, _)| !taken.contains(id))
        .min_by_key(|&(id, c)| (c, id))
        .map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::core::view::Versioned;

    fn snap(brokers: &[u32]) -> Snapshot {
        Snapshot { brokers: brokers.iter().map(|&id| (id, format!("h:{id}"))).collect(), ..Snapshot::default() }
    }

    #[test]
    fn placement_spreads_replicas_and_leaders_evenly_over_the_live_brokers() {
        let mut s = snap(&[1, 2, 3, 4]);
        assert_eq!(place(&snap(&[1, 2]), 1, 3), None);
        let states = place(&s, 4, 3).unwrap();
        let mut replicas = BTreeMap::<u32, usize>::new();
        let mut leaders = BTreeMap::<u32, usize>::new();
        for st in &states {
            assert_eq!(st.replicas.len(), 3);
            assert_eq!(st.isr, st.replicas);
            assert_eq!((st.leader, st.leader_epoch), (st.replicas[0], 1));
            let mut distinct = st.replicas.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), 3, "{st:?}");
            for r in &st.replicas {
                *replicas.entry(*r).or_default() += 1;
            }
            *leaders.entry(st.leader).or_default() += 1;
        }
        // 12 replicas over 4 brokers, 4 leaders over 4 brokers.
        assert_eq!(replicas, BTreeMap::from([(1, 3), (2, 3), (3, 3), (4, 3)]));
        assert_eq!(leaders, BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1)]));
        // A fifth broker joins: the next topic's replicas go to the least loaded first.
        for (i, st) in states.into_iter().enumerate() {
            s.partitions.insert(("t".into(), i as u32), Versioned { state: st, revision: 1 });
        }
        s.brokers.insert(5, "h:5".into());
        let next = place(&s, 1, 3).unwrap();
        assert_eq!(next[0].leader, 5);
        assert!(next[0].replicas.contains(&5));
    }
}
