//! Consumer groups: membership with session timeouts, the assignment rule, generation fencing, and committed
//! offsets that survive restarts.
//!
//! **Assignment** (Zeze's rule, generalised to many topics): list every (topic, partition) of the topics the
//! members subscribe to in sorted order, sort the members by id, and give item `i` to member `i mod n`; when that
//! member does not subscribe to the item's topic, the next member (cyclically) that does takes it. Any change of
//! the assignment bumps the generation; members learn it on their next heartbeat (eager rebalancing).
//!
//! On a cluster, a group's generations start at its coordinator's leader epoch (of the offsets partition) times
//! 2^32: a member that still holds a generation of a deposed coordinator is never confused with one of the new.
//!
//! **Commits** from a member must carry the current generation (fencing a member that was expelled). Commits
//! without membership (empty member id, generation 0) are for manual assignment and tools, and are refused while
//! the group has active members.
//!
//! **Durability**: committed offsets live in the reserved internal partition `__ferry_offsets/0`, a segmented log
//! like any partition's (CRC per batch, exact recovery) written with the sync flush policy: a commit is on disk
//! before it is acknowledged, and a failed write (a full disk) is taken back whole and acknowledges nothing. On open
//! the partition is replayed, last write wins (module `offsets`).

mod assignment;
mod cluster;
mod offsets;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ferry_proto as pb;
use ferry_storage::fs::FsRef;
use parking_lot::Mutex;

use self::assignment::{Group, Member};
use self::offsets::{OffsetStore, Tuning};
use crate::error::{BrokerError, GroupRefusal, Result};

pub use self::cluster::{CLUSTER_OFFSETS_TOPIC, ClusterOffsets, CommitBatches};
pub use self::offsets::{OFFSETS_FILE, OFFSETS_TOPIC};

/// Where committed offsets live: a single broker's own internal partition, or a cluster's replicated ones.
enum Backend {
    Local(Box<Mutex<OffsetStore>>),
    Cluster { offsets: ClusterOffsets, topic_ids: std::sync::OnceLock<TopicIds> },
}

/// The id of the topic a name now names, `None` when none does (a cluster's catalog knows it).
pub type TopicIds = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Local(_) => f.write_str("Local"),
            Backend::Cluster { offsets, .. } => write!(f, "Cluster({} partitions)", offsets.partitions()),
        }
    }
}

impl Backend {
    fn has_group(&self, group: &str) -> bool {
        match self {
            Backend::Local(s) => s.lock().has_group(group),
            Backend::Cluster { offsets, .. } => offsets.has_group(group),
        }
    }

    fn group_count(&self) -> usize {
        match self {
            Backend::Local(s) => s.lock().group_count(),
            Backend::Cluster { offsets, .. } => offsets.group_count(),
        }
    }

    fn groups(&self) -> std::collections::BTreeSet<String> {
        match self {
            Backend::Local(s) => s.lock().groups(),
            Backend::Cluster { offsets, .. } => offsets.groups(),
        }
    }

    fn of_group(&self, group: &str) -> Vec<pb::CommittedOffset> {
        match self {
            Backend::Local(s) => s.lock().of_group(group),
            Backend::Cluster { offsets, topic_ids } => match topic_ids.get() {
                Some(ids) => offsets.of_group(group, ids),
                None => Vec::new(),
            },
        }
    }
}

/// What a join returns.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The member's id.
    pub member_id: String,
    /// Current generation.
    pub generation: u64,
    /// The member's partitions.
    pub assignment: Vec<pb::TopicPartition>,
    /// All member ids.
    pub members: Vec<String>,
}

/// Bounds on what members present (`[groups]` of the broker config, whose defaults these are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest member id and client id, in bytes (`groups.max_id_bytes`).
    pub max_id_bytes: usize,
    /// Most members of one group (`groups.max_members`).
    pub max_members: usize,
    /// Most groups, with members or committed offsets (`groups.max_groups`).
    pub max_groups: usize,
    /// Longest metadata of one committed offset, in bytes (`groups.max_metadata_bytes`).
    pub max_metadata_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_id_bytes: 255, max_members: 1000, max_groups: 10_000, max_metadata_bytes: 4096 }
    }
}

/// The group coordinator of one broker.
#[derive(Debug)]
pub struct GroupCoordinator {
    groups: Mutex<HashMap<String, Group>>,
    offsets: Backend,
    min_session: Duration,
    max_session: Duration,
    limits: Limits,
}

fn check_group_name(group: &str) -> Result<()> {
    if group.is_empty() || group.len() > 255 {
        return Err(BrokerError::InvalidArgument(format!("group name {group:?} must be 1-255 characters")));
    }
    Ok(())
}

impl GroupCoordinator {
    /// Opens the committed offsets partition under `data_dir` (importing the journal of an earlier version, if
    /// one is left in the meta directory). Blocking.
    pub fn open(fs: FsRef, data_dir: &Path, min_session: Duration, max_session: Duration) -> Result<GroupCoordinator> {
        GroupCoordinator::open_tuned(fs, data_dir, min_session, max_session, Tuning::default())
    }

    fn open_tuned(
        fs: FsRef,
        data_dir: &Path,
        min_session: Duration,
        max_session: Duration,
        tuning: Tuning,
    ) -> Result<GroupCoordinator> {
        Ok(GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            offsets: Backend::Local(Box::new(Mutex::new(OffsetStore::open(fs, data_dir, tuning)?))),
            min_session,
            max_session,
            limits: Limits::default(),
        })
    }

    /// The coordinator of a cluster member, whose committed offsets live in the `offsets_partitions` partitions of
    /// the replicated [`CLUSTER_OFFSETS_TOPIC`] (see the `cluster` module); it coordinates the groups of the
    /// partitions it leads. Give it the topic ids ([`GroupCoordinator::set_topic_ids`]) before it serves.
    pub fn for_cluster(min_session: Duration, max_session: Duration, offsets_partitions: u32) -> GroupCoordinator {
        GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            offsets: Backend::Cluster {
                offsets: ClusterOffsets::new(offsets_partitions),
                topic_ids: std::sync::OnceLock::new(),
            },
            min_session,
            max_session,
            limits: Limits::default(),
        }
    }

    /// How a cluster member's coordinator learns which topic a name names now (offsets of a deleted topic are
    /// not returned). Set once.
    pub fn set_topic_ids(&self, ids: TopicIds) {
        if let Backend::Cluster { topic_ids, .. } = &self.offsets {
            let _ = topic_ids.set(ids);
        }
    }

    /// A cluster member's offsets store; `None` on a single broker.
    pub fn cluster(&self) -> Option<&ClusterOffsets> {
        match &self.offsets {
            Backend::Cluster { offsets, .. } => Some(offsets),
            Backend::Local(_) => None,
        }
    }

    /// The id of the topic `name` names now, as the cluster knows it (the empty string when it knows none).
    pub fn topic_id(&self, name: &str) -> String {
        match &self.offsets {
            Backend::Cluster { topic_ids, .. } => topic_ids.get().and_then(|ids| ids(name)).unwrap_or_default(),
            Backend::Local(_) => String::new(),
        }
    }

    /// Stops coordinating the groups of offsets partition `k` (another broker leads it now): their members
    /// rejoin at the new coordinator. Returns whether it coordinated them.
    pub fn unload_partition(&self, k: u32) -> bool {
        let Some(cluster) = self.cluster() else { return false };
        let was = cluster.unload(k);
        self.groups.lock().retain(|name, _| cluster.partition_of(name) != k);
        was
    }

    /// Enforces `limits` on later joins.
    pub fn with_limits(mut self, limits: Limits) -> GroupCoordinator {
        self.limits = limits;
        self
    }

    /// Refuses a member id or client id longer than `groups.max_id_bytes`.
    fn check_id(&self, group: &str, what: &str, id: &str) -> Result<()> {
        let max = self.limits.max_id_bytes;
        if id.len() > max {
            return Err(BrokerError::InvalidArgument(format!(
                "group {group:?}: the {what} is {} bytes, above groups.max_id_bytes ({max})",
                id.len()
            )));
        }
        Ok(())
    }

    /// Refuses a group the broker does not know yet once it knows `groups.max_groups` (with members or committed
    /// offsets). Takes the offsets lock inside the groups lock, the order every caller keeps.
    fn check_new_group(&self, group: &str, groups: &HashMap<String, Group>) -> Result<()> {
        let offsets = &self.offsets;
        if groups.contains_key(group) || offsets.has_group(group) {
            return Ok(());
        }
        let known = offsets.group_count() + groups.keys().filter(|g| !offsets.has_group(g)).count();
        if known >= self.limits.max_groups {
            return Err(BrokerError::LimitReached {
                what: format!(
                    "group \"{group}\" would pass the broker's {} groups (with members or committed offsets)",
                    self.limits.max_groups
                ),
                key: "groups.max_groups",
            });
        }
        Ok(())
    }

    /// Offset ranges of the batches of the offsets partition that were found corrupt on open and skipped (their
    /// commits are lost; the error log names each one).
    pub fn skipped_batches(&self) -> Vec<(u64, u64)> {
        match &self.offsets {
            Backend::Local(s) => s.lock().skipped().to_vec(),
            Backend::Cluster { .. } => Vec::new(),
        }
    }

    /// Closes the offsets partition cleanly (at shutdown). Blocking.
    pub fn close(&self) -> Result<()> {
        match &self.offsets {
            Backend::Local(s) => s.lock().close(),
            Backend::Cluster { .. } => Ok(()),
        }
    }

    /// Adds (or refreshes) a member and returns its assignment.
    pub fn join(&self, req: &pb::JoinGroupRequest, counts: &dyn Fn(&str) -> u32) -> Result<Joined> {
        check_group_name(&req.group)?;
        if req.topics.is_empty() {
            return Err(BrokerError::InvalidArgument(format!(
                "group \"{}\": a member must subscribe to a topic",
                req.group
            )));
        }
        self.check_id(&req.group, "member id", &req.member_id)?;
        self.check_id(&req.group, "client id", &req.client_id)?;
        let session =
            Duration::from_millis(u64::from(req.session_timeout_ms)).clamp(self.min_session, self.max_session);
        let member_id = if req.member_id.is_empty() {
            let mut prefix = if req.client_id.is_empty() { "member" } else { req.client_id.as_str() };
            // Cut to leave room for "-" and the UUID, so that the member can join again with the id it was given.
            let mut room = self.limits.max_id_bytes.saturating_sub(37).min(prefix.len());
            while !prefix.is_char_boundary(room) {
                room -= 1;
            }
            prefix = &prefix[..room];
            format!("{prefix}-{}", uuid::Uuid::new_v4())
        } else {
            req.member_id.clone()
        };
        let mut groups = self.groups.lock();
        self.check_new_group(&req.group, &groups)?;
        if let Some(group) = groups.get(&req.group)
            && group.members.len() >= self.limits.max_members
            && !group.members.contains_key(&member_id)
        {
            return Err(BrokerError::LimitReached {
                what: format!(
                    "member {member_id:?} joining group \"{}\" would pass its {} members",
                    req.group, self.limits.max_members
                ),
                key: "groups.max_members",
            });
        }
        // On a cluster a group's generations start above every one an earlier coordinator gave (the leader epoch
        // of its offsets partition is the high half), so two coordinators never hand out the same generation.
        let base =
            self.cluster().and_then(|c| c.loaded_epoch(c.partition_of(&req.group))).map_or(0, |e| u64::from(e) << 32);
        let group = groups.entry(req.group.clone()).or_insert_with(|| Group { generation: base, ..Group::default() });
        group.members.insert(
            member_id.clone(),
            Member {
                client_id: req.client_id.clone(),
                topics: req.topics.iter().cloned().collect(),
                session_timeout: session,
                last_seen: Instant::now(),
            },
        );
        if group.rebalance(counts) {
            tracing::info!(group = %req.group, member = %member_id, generation = group.generation, "member joined; rebalanced");
        }
        Ok(Joined {
            assignment: group.assignment_of(&member_id),
            generation: group.generation,
            members: group.members.keys().cloned().collect(),
            member_id,
        })
    }

    /// Refreshes a member's session and returns the current generation and its assignment.
    pub fn heartbeat(&self, req: &pb::HeartbeatRequest, counts: &dyn Fn(&str) -> u32) -> pb::HeartbeatResponse {
        let mut groups = self.groups.lock();
        let Some(group) = groups.get_mut(&req.group) else {
            return pb::HeartbeatResponse { generation: 0, assignment: vec![], member_known: false };
        };
        let Some(member) = group.members.get_mut(&req.member_id) else {
            return pb::HeartbeatResponse { generation: group.generation, assignment: vec![], member_known: false };
        };
        member.last_seen = Instant::now();
        // Membership did not change: only new partitions of the subscribed topics can move the assignment, and
        // comparing their counts is far cheaper than dealing every partition again.
        if group.refresh(counts) {
            tracing::info!(group = %req.group, generation = group.generation, "partitions changed; rebalanced");
        }
        pb::HeartbeatResponse {
            generation: group.generation,
            assignment: group.assignment_of(&req.member_id),
            member_known: true,
        }
    }

    /// Removes a member.
    pub fn leave(&self, group_name: &str, member_id: &str, counts: &dyn Fn(&str) -> u32) {
        let mut groups = self.groups.lock();
        if let Some(group) = groups.get_mut(group_name)
            && group.members.remove(member_id).is_some()
        {
            group.rebalance(counts);
            tracing::info!(
                group = group_name,
                member = member_id,
                generation = group.generation,
                "member left; rebalanced"
            );
        }
    }

    /// Expels members whose session timed out. Returns how many were expelled.
    pub fn expire(&self, counts: &dyn Fn(&str) -> u32) -> usize {
        let now = Instant::now();
        let mut expelled = 0;
        let mut groups = self.groups.lock();
        for (name, group) in groups.iter_mut() {
            let dead: Vec<String> = group
                .members
                .iter()
                .filter(|(_, m)| now.duration_since(m.last_seen) > m.session_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &dead {
                group.members.remove(id);
                tracing::warn!(group = %name, member = %id, "member session timed out; expelled");
            }
            if !dead.is_empty() {
                expelled += dead.len();
                group.rebalance(counts);
            }
        }
        groups.retain(|_, g| !g.members.is_empty() || g.generation == 0);
        expelled
    }

    /// Commits offsets, fencing stale generations. Blocking (fsync). On error the batch that failed is taken back
    /// whole; a commit spanning several batches (over 1 MiB of offsets) keeps those written before it. A cluster
    /// member checks with [`GroupCoordinator::check_commit`] and writes through the offsets partition instead.
    pub fn commit(&self, req: &pb::CommitOffsetsRequest) -> Result<()> {
        self.check_commit(req)?;
        match &self.offsets {
            Backend::Local(s) => s.lock().commit(&req.group, &req.offsets),
            Backend::Cluster { .. } => {
                Err(BrokerError::Internal("a cluster's commits are written through its offsets partition".into()))
            }
        }
    }

    /// Checks a commit without writing it: the metadata bound, the group bound, and generation fencing.
    pub fn check_commit(&self, req: &pb::CommitOffsetsRequest) -> Result<()> {
        check_group_name(&req.group)?;
        let max = self.limits.max_metadata_bytes;
        if let Some(o) = req.offsets.iter().find(|o| o.metadata.len() > max) {
            return Err(BrokerError::InvalidArgument(format!(
                "group {:?}: the metadata of the offset of {}/{} is {} bytes, above groups.max_metadata_bytes ({max})",
                req.group,
                o.topic,
                o.partition,
                o.metadata.len()
            )));
        }
        {
            let groups = self.groups.lock();
            self.check_new_group(&req.group, &groups)?;
            let group = groups.get(&req.group);
            let active = group.is_some_and(|g| !g.members.is_empty());
            if req.member_id.is_empty() {
                if active {
                    return Err(BrokerError::Group {
                        group: req.group.clone(),
                        kind: GroupRefusal::ActiveMembers,
                        reason: "has active members; commit as a member with its generation, or stop the members first"
                            .into(),
                    });
                }
            } else {
                let Some(g) = group.filter(|g| g.members.contains_key(&req.member_id)) else {
                    return Err(BrokerError::Group {
                        group: req.group.clone(),
                        kind: GroupRefusal::UnknownMember,
                        reason: format!("member {} is not in the group (expired?); join again", req.member_id),
                    });
                };
                if g.generation != req.generation {
                    return Err(BrokerError::Group {
                        group: req.group.clone(),
                        kind: GroupRefusal::StaleGeneration,
                        reason: format!(
                            "stale generation {} (current {}); rejoin and commit again",
                            req.generation, g.generation
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Drops every group's committed offsets of the topics `gone` names: a deleted topic's offsets must not apply
    /// to a topic later created under the same name, which starts from offset 0. Run after a topic is deleted and
    /// at start-up (for a deletion that a crash interrupted). Returns how many offsets were dropped. Blocking.
    pub fn forget_topics(&self, gone: &dyn Fn(&str) -> bool) -> Result<usize> {
        match &self.offsets {
            Backend::Local(s) => s.lock().forget(gone),
            // Each offset names its topic's id, and one of a deleted topic is never returned.
            Backend::Cluster { .. } => Ok(0),
        }
    }

    /// The first step of deleting `group`: refused while it has members (`group_has_members`); otherwise its empty
    /// record is dropped. Whether the group was known (a record or committed offsets). Its offsets are then dropped
    /// with [`GroupCoordinator::delete_offsets`] (a single broker) or through the offsets partition (a cluster).
    pub fn check_delete(&self, group: &str) -> Result<bool> {
        check_group_name(group)?;
        let mut groups = self.groups.lock();
        if groups.get(group).is_some_and(|g| !g.members.is_empty()) {
            return Err(BrokerError::Group {
                group: group.to_owned(),
                kind: GroupRefusal::ActiveMembers,
                reason: "has active members; stop them (or let their sessions expire) before deleting it".into(),
            });
        }
        let had_record = groups.remove(group).is_some();
        Ok(had_record || self.offsets.has_group(group))
    }

    /// Drops a single broker's committed offsets of `group` (tombstones in its offsets partition); how many.
    /// Blocking.
    pub fn delete_offsets(&self, group: &str) -> Result<usize> {
        match &self.offsets {
            Backend::Local(s) => s.lock().delete_group(group),
            Backend::Cluster { .. } => {
                Err(BrokerError::Internal("a cluster's offsets are deleted through its offsets partition".into()))
            }
        }
    }

    /// Committed offsets of a group, optionally restricted to some partitions.
    pub fn committed(&self, group: &str, only: &[pb::TopicPartition]) -> Vec<pb::CommittedOffset> {
        let all = self.offsets.of_group(group);
        if only.is_empty() {
            return all;
        }
        all.into_iter().filter(|o| only.iter().any(|tp| tp.topic == o.topic && tp.partition == o.partition)).collect()
    }

    /// Every group with members or committed offsets.
    pub fn list(&self) -> Vec<pb::GroupSummary> {
        let groups = self.groups.lock();
        let mut names = self.offsets.groups();
        names.extend(groups.keys().cloned());
        names
            .into_iter()
            .map(|name| {
                let (members, generation) =
                    groups.get(&name).map_or((0, 0), |g| (g.members.len() as u32, g.generation));
                pb::GroupSummary { group: name, members, generation }
            })
            .collect()
    }

    /// Members, assignment and committed offsets of a group.
    pub fn describe(&self, group_name: &str) -> pb::DescribeGroupResponse {
        let offsets = self.offsets.of_group(group_name);
        let groups = self.groups.lock();
        let (generation, members) = match groups.get(group_name) {
            None => (0, vec![]),
            Some(g) => (
                g.generation,
                g.members
                    .iter()
                    .map(|(id, m)| pb::GroupMember {
                        member_id: id.clone(),
                        client_id: m.client_id.clone(),
                        assignment: g.assignment_of(id),
                        topics: m.topics.iter().cloned().collect(),
                    })
                    .collect(),
            ),
        };
        pb::DescribeGroupResponse { group: group_name.to_owned(), generation, members, offsets }
    }
}

#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
