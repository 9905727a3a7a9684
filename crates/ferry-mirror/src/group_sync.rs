//! Consumer-group offset sync, for failover: the committed source offsets of the groups matched by `[groups]` are
//! copied to the target, mapped through the rename policy, so consumers that move to the target DC continue where
//! they were.
//!
//! Each copied offset is `min(committed, target log end)`: a consumer never starts past what the target holds. It
//! only moves forward, only while the group has no active members on the target (a group running there owns its
//! offsets), and never for promoted topics (after failover the target's consumers are the truth).
//!
//! The decisions are plain functions of their inputs ([`selected`], [`map_committed`], [`plan`]), table-tested
//! below; [`GroupSync::round`] only performs the I/O around them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ferry_client::ClientError;
use ferry_client::proto as pb;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cluster::TargetCluster;
use crate::config::GroupsConfig;
use crate::egress::EgressHandle;
use crate::topics::TopicSet;

/// The group offset sync task.
pub struct GroupSync {
    rules: watch::Receiver<GroupsConfig>,
    topics: watch::Receiver<Arc<TopicSet>>,
    target: Arc<dyn TargetCluster>,
    egress: EgressHandle,
    /// The mirror's own groups (never synced).
    own_prefix: String,
}

/// What one round did (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncRound {
    /// Offsets committed on the target.
    pub committed: usize,
    /// Groups skipped because they have active members on the target.
    pub skipped_active: usize,
}

impl GroupSync {
    /// A sync task.
    pub fn new(
        rules: watch::Receiver<GroupsConfig>,
        topics: watch::Receiver<Arc<TopicSet>>,
        target: Arc<dyn TargetCluster>,
        egress: EgressHandle,
    ) -> GroupSync {
        GroupSync { rules, topics, target, egress, own_prefix: "ferry-mirror.".into() }
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let interval = self.rules.borrow().group_sync_interval;
            if !self.rules.borrow().include.is_empty() {
                match self.round().await {
                    Ok(r) if r.committed > 0 => {
                        tracing::info!(offsets = r.committed, "synced group offsets to the target")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "group offset sync failed"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
                changed = self.rules.changed() => if changed.is_err() { return },
            }
        }
    }

    /// One sync round: the I/O around [`selected`], [`map_committed`] and [`plan`].
    pub async fn round(&self) -> Result<SyncRound, ClientError> {
        let rules = self.rules.borrow().clone();
        let set = self.topics.borrow().clone();
        let source = Arc::clone(&self.egress.active().cluster);
        let mut round = SyncRound::default();
        // Target topics still mirror topics (promoted ones are left alone).
        let mirror_targets: BTreeSet<String> =
            self.target.list_topics().await?.into_iter().filter(|t| t.mirror.is_some()).map(|t| t.name).collect();
        let mut leos: BTreeMap<(String, u32), u64> = BTreeMap::new();
        for name in source.list_groups().await? {
            if !selected(&rules, &self.own_prefix, &name) {
                continue;
            }
            let committed = source.committed(&name, &[]).await?;
            let on_target = self.target.group_state(&name).await?;
            let mapped = map_committed(committed, &set, &mirror_targets);
            if on_target.active_members == 0 {
                for m in &mapped {
                    let key = (m.target_topic.clone(), m.partition);
                    if leos.contains_key(&key) {
                        continue;
                    }
                    match self.target.partition(&crate::tp::TargetTp::new(m.target_topic.as_str(), m.partition)).await {
                        Ok(p) => {
                            leos.insert(key, p.log_end);
                        }
                        // Gone on the target: nothing to copy there (plan skips partitions without a log end).
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            let current: BTreeMap<(String, u32), u64> =
                on_target.offsets.iter().map(|o| ((o.topic.clone(), o.partition), o.offset)).collect();
            let updates = match plan(on_target.active_members, &mapped, &current, &leos) {
                Plan::SkipActive => {
                    round.skipped_active += 1;
                    continue;
                }
                Plan::Commit(updates) => updates,
            };
            if !updates.is_empty() {
                round.committed += updates.len();
                match self.target.commit_group(&name, updates).await {
                    Ok(()) => {}
                    // Members joined on the target between our check and the commit: they own the offsets now.
                    Err(e) if e.is_failed_precondition() => round.skipped_active += 1,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(round)
    }
}

/// Whether the group `name` is synced: matched by an include rule and no exclude rule, and not one of the mirror's
/// own groups (names starting with `own_prefix`).
pub fn selected(rules: &GroupsConfig, own_prefix: &str, name: &str) -> bool {
    !name.starts_with(own_prefix)
        && rules.include.iter().any(|r| r.is_match(name))
        && !rules.exclude.iter().any(|r| r.is_match(name))
}

/// One committed source offset, mapped onto its target partition by the rename policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// Target topic.
    pub target_topic: String,
    /// Partition (the same on both sides).
    pub partition: u32,
    /// The offset committed on the source.
    pub committed: u64,
    /// The commit's metadata, copied as is.
    pub metadata: String,
}

/// Maps a group's committed source offsets onto the target: only topics this mirror mirrors, and only into target
/// topics that are still mirror topics (a promoted topic belongs to the target's consumers).
pub fn map_committed(
    committed: Vec<pb::CommittedOffset>,
    set: &TopicSet,
    mirror_targets: &BTreeSet<String>,
) -> Vec<Mapped> {
    committed
        .into_iter()
        .filter_map(|c| {
            let m = set.topics.get(&c.topic)?;
            mirror_targets.contains(&m.target).then(|| Mapped {
                target_topic: m.target.clone(),
                partition: c.partition,
                committed: c.offset,
                metadata: c.metadata,
            })
        })
        .collect()
}

/// What to do with one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The group has active members on the target: they own its offsets there; nothing is copied.
    SkipActive,
    /// Commit these offsets on the target (possibly none).
    Commit(Vec<pb::CommittedOffset>),
}

/// The sync decision for one group, without I/O: with no active members on the target, each mapped offset is
/// copied as `min(committed, target log end)` when that is ahead of what the target group holds (forward only).
/// A partition whose target log end is unknown (gone on the target) is skipped.
pub fn plan(
    active_members: usize,
    mapped: &[Mapped],
    current: &BTreeMap<(String, u32), u64>,
    leos: &BTreeMap<(String, u32), u64>,
) -> Plan {
    if active_members > 0 {
        return Plan::SkipActive;
    }
    let updates = mapped
        .iter()
        .filter_map(|m| {
            let key = (m.target_topic.clone(), m.partition);
            let offset = m.committed.min(*leos.get(&key)?);
            current.get(&key).is_none_or(|&cur| offset > cur).then(|| pb::CommittedOffset {
                topic: m.target_topic.clone(),
                partition: m.partition,
                offset,
                metadata: m.metadata.clone(),
            })
        })
        .collect();
    Plan::Commit(updates)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use regex::Regex;

    use super::*;
    use crate::topics::MirroredTopic;

    fn rules(include: &[&str], exclude: &[&str]) -> GroupsConfig {
        GroupsConfig {
            include: include.iter().map(|r| Regex::new(r).unwrap()).collect(),
            exclude: exclude.iter().map(|r| Regex::new(r).unwrap()).collect(),
            group_sync_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn selection_by_include_exclude_and_never_the_mirrors_own_groups() {
        let r = rules(&["^app", "^billing$"], &["-test$"]);
        let table = [
            ("app", true),
            ("app-eu", true),
            ("billing", true),
            ("billing2", false),
            ("app-test", false),
            ("other", false),
            ("ferry-mirror.dc-a_to_dc-b", false),
        ];
        for (name, want) in table {
            assert_eq!(selected(&r, "ferry-mirror.", name), want, "{name}");
        }
        assert!(!selected(&rules(&[".*"], &[]), "ferry-mirror.", "ferry-mirror.x"), "own groups even under .*");
        assert!(!selected(&rules(&[], &[]), "ferry-mirror.", "app"), "no include: nothing");
    }

    fn committed(topic: &str, partition: u32, offset: u64) -> pb::CommittedOffset {
        pb::CommittedOffset { topic: topic.into(), partition, offset, metadata: format!("m-{topic}-{partition}") }
    }

    fn mapped(target: &str, partition: u32, offset: u64, source: &str) -> Mapped {
        Mapped {
            target_topic: target.into(),
            partition,
            committed: offset,
            metadata: format!("m-{source}-{partition}"),
        }
    }

    #[test]
    fn committed_offsets_map_through_the_rename_and_skip_promoted_and_unmirrored_topics() {
        let topic = |source: &str, target: &str| MirroredTopic {
            source: source.into(),
            source_id: format!("id-{source}"),
            partitions: 2,
            target: target.into(),
            replicated_source: false,
        };
        let set = TopicSet {
            topics: [
                ("orders".to_owned(), topic("orders", "dc-a.orders")),
                ("payments".to_owned(), topic("payments", "dc-a.payments")),
            ]
            .into(),
            discovered: true,
        };
        // dc-a.payments was promoted: it is no longer a mirror topic on the target.
        let mirror_targets: BTreeSet<String> = ["dc-a.orders".to_owned(), "dc-a.unrelated".to_owned()].into();
        let input = vec![
            committed("orders", 0, 10),
            committed("orders", 1, 20),
            committed("payments", 0, 30),
            committed("not-mirrored", 0, 40),
        ];
        assert_eq!(
            map_committed(input, &set, &mirror_targets),
            vec![mapped("dc-a.orders", 0, 10, "orders"), mapped("dc-a.orders", 1, 20, "orders")]
        );
        assert_eq!(map_committed(Vec::new(), &set, &mirror_targets), Vec::new());
    }

    #[test]
    fn plan_copies_min_of_committed_and_log_end_forward_only_and_never_under_active_members() {
        let key = |p: u32| ("t".to_owned(), p);
        let out = |p: u32, offset: u64| pb::CommittedOffset {
            topic: "t".into(),
            partition: p,
            offset,
            metadata: format!("m-s-{p}"),
        };
        struct Case {
            what: &'static str,
            active: usize,
            committed: u64,
            current: Option<u64>,
            leo: Option<u64>,
            want: Plan,
        }
        let cases = [
            Case {
                what: "first copy",
                active: 0,
                committed: 50,
                current: None,
                leo: Some(100),
                want: Plan::Commit(vec![out(0, 50)]),
            },
            Case {
                what: "capped at the target log end",
                active: 0,
                committed: 500,
                current: None,
                leo: Some(100),
                want: Plan::Commit(vec![out(0, 100)]),
            },
            Case {
                what: "a later commit moves it forward",
                active: 0,
                committed: 80,
                current: Some(50),
                leo: Some(100),
                want: Plan::Commit(vec![out(0, 80)]),
            },
            Case {
                what: "equal: nothing to do",
                active: 0,
                committed: 50,
                current: Some(50),
                leo: Some(100),
                want: Plan::Commit(vec![]),
            },
            Case {
                what: "a source commit moving back is not copied",
                active: 0,
                committed: 20,
                current: Some(50),
                leo: Some(100),
                want: Plan::Commit(vec![]),
            },
            Case {
                what: "the cap below the current offset never moves it back",
                active: 0,
                committed: 500,
                current: Some(120),
                leo: Some(100),
                want: Plan::Commit(vec![]),
            },
            Case {
                what: "the target partition is gone",
                active: 0,
                committed: 50,
                current: None,
                leo: None,
                want: Plan::Commit(vec![]),
            },
            Case {
                what: "active members on the target",
                active: 1,
                committed: 80,
                current: Some(50),
                leo: Some(100),
                want: Plan::SkipActive,
            },
            Case {
                what: "active members, never copied before",
                active: 3,
                committed: 80,
                current: None,
                leo: Some(100),
                want: Plan::SkipActive,
            },
            Case {
                what: "an empty target partition gets 0",
                active: 0,
                committed: 80,
                current: None,
                leo: Some(0),
                want: Plan::Commit(vec![out(0, 0)]),
            },
        ];
        for c in cases {
            let current: BTreeMap<_, _> = c.current.map(|o| (key(0), o)).into_iter().collect();
            let leos: BTreeMap<_, _> = c.leo.map(|o| (key(0), o)).into_iter().collect();
            let got = plan(c.active, &[mapped("t", 0, c.committed, "s")], &current, &leos);
            assert_eq!(got, c.want, "{}", c.what);
        }
    }

    #[test]
    fn plan_decides_each_partition_on_its_own() {
        let key = |p: u32| ("t".to_owned(), p);
        let m: Vec<Mapped> = (0..3).map(|p| mapped("t", p, 100 + u64::from(p), "s")).collect();
        // p0 behind on the target, p1 ahead (a source commit moved back), p2 has no log end.
        let current: BTreeMap<_, _> = [(key(0), 10), (key(1), 500)].into();
        let leos: BTreeMap<_, _> = [(key(0), 1_000), (key(1), 1_000)].into();
        let Plan::Commit(updates) = plan(0, &m, &current, &leos) else { panic!("no active members") };
        assert_eq!(updates.iter().map(|u| (u.partition, u.offset)).collect::<Vec<_>>(), vec![(0, 100)]);
    }
}
