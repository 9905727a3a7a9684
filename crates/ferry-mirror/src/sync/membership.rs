//! This process's share of the partitions: membership in the scale-out group `ferry-mirror.{mirror.name}` on the
//! *target* cluster (local, so WAN blips cause no rebalances). Every process with the same `mirror.name` joins it
//! and mirrors what the group assigns it; when a process dies, the group expels it after its session timeout and
//! the survivors take its partitions over by the resume rule. Correctness never depends on this: append with
//! offsets makes a second writer harmless.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::TargetCluster;
use crate::tp::TargetTp;

/// Membership in the scale-out group.
#[derive(Debug)]
pub struct Membership {
    group: String,
    session: Duration,
    member: Option<(String, u64)>,
    joined_topics: BTreeSet<String>,
    assignment: BTreeSet<TargetTp>,
    /// Bumped whenever the assignment changes.
    version: u64,
}

impl Membership {
    /// Not a member yet.
    pub fn new(mirror_name: &str, session: Duration) -> Membership {
        Membership {
            group: format!("ferry-mirror.{mirror_name}"),
            session,
            member: None,
            joined_topics: BTreeSet::new(),
            assignment: BTreeSet::new(),
            version: 0,
        }
    }

    /// The partitions this process mirrors.
    pub fn assignment(&self) -> &BTreeSet<TargetTp> {
        &self.assignment
    }

    /// A number that changes whenever [`Membership::assignment`] does.
    pub fn version(&self) -> u64 {
        self.version
    }

    fn assign(&mut self, assignment: BTreeSet<TargetTp>) {
        if assignment != self.assignment {
            self.assignment = assignment;
            self.version += 1;
        }
    }

    /// [`Membership::assign`] of the (topic, partition) pairs a join or a heartbeat answered with. Every heartbeat
    /// repeats the whole assignment: one equal to the current is recognised in place, without making each
    /// partition's name and the set again (thousands of partitions, every heartbeat).
    fn assign_pairs(&mut self, mut pairs: Vec<(String, u32)>) {
        // The set's own order: by topic, then partition.
        pairs.sort_unstable();
        pairs.dedup();
        let same = pairs.len() == self.assignment.len()
            && pairs.iter().zip(&self.assignment).all(|((topic, p), tp)| tp.topic() == topic && tp.partition == *p);
        if !same {
            self.assign(pairs.into_iter().map(|(t, p)| TargetTp::new(t, p)).collect());
        }
    }

    /// Joins, heartbeats or re-joins for `topics` (target names); leaves when there are none.
    pub async fn refresh(&mut self, target: &Arc<dyn TargetCluster>, topics: BTreeSet<String>) {
        if topics.is_empty() {
            self.leave(target).await;
            self.assign(BTreeSet::new());
            self.joined_topics.clear();
            return;
        }
        if let Some((member, generation)) = self.member.clone()
            && topics == self.joined_topics
        {
            match target.heartbeat(&self.group, &member, generation).await {
                Ok(Some(hb)) => {
                    if let Some(m) = self.member.as_mut() {
                        m.1 = hb.generation;
                    }
                    self.assign_pairs(hb.assignment);
                    return;
                }
                Ok(None) => {
                    tracing::warn!(group = %self.group, "this mirror process was expelled from the scale-out group; joining again")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "scale-out group heartbeat failed");
                    return;
                }
            }
        }
        let member_id = self.member.as_ref().map(|m| m.0.clone()).unwrap_or_default();
        match target.join(&self.group, &member_id, topics.iter().cloned().collect(), self.session).await {
            Ok(j) => {
                tracing::info!(group = %self.group, member = %j.member_id, generation = j.generation, partitions = j.assignment.len(), members = j.members, "joined the scale-out group");
                self.member = Some((j.member_id, j.generation));
                self.joined_topics = topics;
                self.assign_pairs(j.assignment);
            }
            Err(e) => tracing::warn!(error = %e, "cannot join the scale-out group on the target"),
        }
    }

    /// Leaves the group (on shutdown, or when nothing is mirrored).
    pub async fn leave(&mut self, target: &Arc<dyn TargetCluster>) {
        if let Some((member, _)) = self.member.take() {
            let _ = target.leave(&self.group, &member).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, u32)]) -> Vec<(String, u32)> {
        v.iter().map(|&(t, p)| (t.to_owned(), p)).collect()
    }

    #[test]
    fn an_assignment_repeated_in_any_order_is_the_same_and_a_changed_one_bumps_the_version() {
        let mut m = Membership::new("m", Duration::from_secs(10));
        m.assign_pairs(pairs(&[("b", 0), ("a", 1), ("a", 0)]));
        assert_eq!(m.version(), 1);
        let want: BTreeSet<TargetTp> =
            [("a", 0), ("a", 1), ("b", 0)].iter().map(|&(t, p)| TargetTp::new(t, p)).collect();
        assert_eq!(m.assignment(), &want);
        // The same partitions again, in another order and with one named twice: nothing changed.
        m.assign_pairs(pairs(&[("a", 0), ("b", 0), ("a", 1), ("a", 1)]));
        assert_eq!((m.version(), m.assignment()), (1, &want));
        // One partition moves to another topic name of the same length, one is dropped, one is added.
        for (next, version) in [
            (pairs(&[("a", 0), ("a", 1), ("c", 0)]), 2),
            (pairs(&[("a", 0), ("a", 1)]), 3),
            (pairs(&[("a", 0), ("a", 1), ("a", 2)]), 4),
            (Vec::new(), 5),
        ] {
            let expected: BTreeSet<TargetTp> = next.iter().map(|(t, p)| TargetTp::new(t.as_str(), *p)).collect();
            m.assign_pairs(next);
            assert_eq!((m.version(), m.assignment()), (version, &expected));
        }
    }
}
