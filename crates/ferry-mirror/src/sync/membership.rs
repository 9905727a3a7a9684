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
                    self.assign(hb.assignment.into_iter().map(|(t, p)| TargetTp::new(t, p)).collect());
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
                self.assign(j.assignment.into_iter().map(|(t, p)| TargetTp::new(t, p)).collect());
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
