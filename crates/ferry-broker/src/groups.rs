//! Consumer groups: membership with session timeouts, the assignment rule, generation fencing, and committed
//! offsets that survive restarts.
//!
//! **Assignment** (Zeze's rule, generalised to many topics): list every (topic, partition) of the topics the
//! members subscribe to in sorted order, sort the members by id, and give item `i` to member `i mod n`; when that
//! member does not subscribe to the item's topic, the next member (cyclically) that does takes it. Any change of
//! the assignment bumps the generation; members learn it on their next heartbeat (eager rebalancing).
//!
//! **Commits** from a member must carry the current generation (fencing a member that was expelled). Commits
//! without membership (empty member id, generation 0) are for manual assignment and tools, and are refused while
//! the group has active members.
//!
//! **Durability**: every commit request is appended to a JSON-lines journal and fsynced before it is acknowledged.
//! On open the journal is replayed (a torn last line is dropped) and compacted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_proto as pb;
use ferry_storage::fs::{FileRef, FsRef, OpenMode};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{BrokerError, Result};
use crate::topic::write_atomic;

/// Journal file name inside the broker's meta directory.
pub const OFFSETS_FILE: &str = "group-offsets.jsonl";

type Item = (String, u32);

#[derive(Debug, Clone)]
struct Member {
    client_id: String,
    topics: BTreeSet<String>,
    session_timeout: Duration,
    last_seen: Instant,
}

#[derive(Debug, Default)]
struct Group {
    generation: u64,
    members: BTreeMap<String, Member>,
    assignment: BTreeMap<String, Vec<Item>>,
}

impl Group {
    /// Recomputes the assignment with the current partition counts; bumps the generation when it changed.
    fn rebalance(&mut self, counts: &dyn Fn(&str) -> u32) -> bool {
        let topics: BTreeSet<&String> = self.members.values().flat_map(|m| m.topics.iter()).collect();
        let items: Vec<Item> = topics.iter().flat_map(|t| (0..counts(t)).map(move |p| ((*t).clone(), p))).collect();
        let ids: Vec<&String> = self.members.keys().collect();
        let mut next: BTreeMap<String, Vec<Item>> = ids.iter().map(|id| ((*id).clone(), Vec::new())).collect();
        if !ids.is_empty() {
            for (i, item) in items.into_iter().enumerate() {
                let n = ids.len();
                if let Some(owner) =
                    (0..n).map(|k| ids[(i + k) % n]).find(|id| self.members[*id].topics.contains(&item.0))
                {
                    next.get_mut(owner).expect("member listed").push(item);
                }
            }
        }
        if next != self.assignment {
            self.assignment = next;
            self.generation += 1;
            true
        } else {
            false
        }
    }

    fn assignment_of(&self, member: &str) -> Vec<pb::TopicPartition> {
        self.assignment
            .get(member)
            .map(|items| items.iter().map(|(t, p)| pb::TopicPartition { topic: t.clone(), partition: *p }).collect())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct JournalLine {
    g: String,
    t: String,
    p: u32,
    o: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    m: String,
}

/// Committed offsets with their journal.
#[derive(Debug)]
struct OffsetStore {
    fs: FsRef,
    path: PathBuf,
    map: BTreeMap<(String, String, u32), (u64, String)>,
    file: FileRef,
    lines: usize,
}

impl OffsetStore {
    fn open(fs: FsRef, path: PathBuf) -> Result<OffsetStore> {
        let io = |source| BrokerError::Io { path: path.clone(), source };
        let mut map = BTreeMap::new();
        match fs.read(&path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                for line in text.lines() {
                    match serde_json::from_str::<JournalLine>(line) {
                        Ok(l) => {
                            map.insert((l.g, l.t, l.p), (l.o, l.m));
                        }
                        Err(_) => {
                            tracing::warn!(path = %path.display(), "dropping a torn line at the end of the group offsets journal");
                            break;
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let file = fs.open(&path, OpenMode::Create).map_err(io)?;
        let mut store = OffsetStore { fs, file, path, map, lines: 0 };
        store.compact()?;
        Ok(store)
    }

    fn compact(&mut self) -> Result<()> {
        let mut text = Vec::new();
        for ((g, t, p), (o, m)) in &self.map {
            let line = JournalLine { g: g.clone(), t: t.clone(), p: *p, o: *o, m: m.clone() };
            serde_json::to_writer(&mut text, &line).map_err(|e| BrokerError::Internal(e.to_string()))?;
            text.push(b'\n');
        }
        write_atomic(&*self.fs, &self.path, &text)?;
        self.file = self
            .fs
            .open(&self.path, OpenMode::Create)
            .map_err(|source| BrokerError::Io { path: self.path.clone(), source })?;
        self.lines = self.map.len();
        Ok(())
    }

    fn commit(&mut self, group: &str, offsets: &[pb::CommittedOffset]) -> Result<()> {
        let mut text = Vec::new();
        for o in offsets {
            let line = JournalLine {
                g: group.to_owned(),
                t: o.topic.clone(),
                p: o.partition,
                o: o.offset,
                m: o.metadata.clone(),
            };
            serde_json::to_writer(&mut text, &line).map_err(|e| BrokerError::Internal(e.to_string()))?;
            text.push(b'\n');
        }
        let io = |source| BrokerError::Io { path: self.path.clone(), source };
        self.file.append(&[&text]).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        for o in offsets {
            self.map.insert((group.to_owned(), o.topic.clone(), o.partition), (o.offset, o.metadata.clone()));
        }
        self.lines += offsets.len();
        if self.lines > 10_000 && self.lines > self.map.len() * 4 {
            self.compact()?;
        }
        Ok(())
    }

    /// Drops the offsets of every topic `gone` says no longer exists, rewriting the journal when any were dropped.
    fn forget(&mut self, gone: &dyn Fn(&str) -> bool) -> Result<usize> {
        let before = self.map.len();
        self.map.retain(|(_, topic, _), _| !gone(topic));
        let dropped = before - self.map.len();
        if dropped > 0 {
            self.compact()?;
        }
        Ok(dropped)
    }

    fn of_group(&self, group: &str) -> Vec<pb::CommittedOffset> {
        self.map
            .range((group.to_owned(), String::new(), 0)..)
            .take_while(|((g, _, _), _)| g == group)
            .map(|((_, t, p), (o, m))| pb::CommittedOffset {
                topic: t.clone(),
                partition: *p,
                offset: *o,
                metadata: m.clone(),
            })
            .collect()
    }

    fn groups(&self) -> BTreeSet<String> {
        self.map.keys().map(|(g, _, _)| g.clone()).collect()
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

/// The group coordinator of one broker.
#[derive(Debug)]
pub struct GroupCoordinator {
    groups: Mutex<HashMap<String, Group>>,
    offsets: Mutex<OffsetStore>,
    min_session: Duration,
    max_session: Duration,
}

fn check_group_name(group: &str) -> Result<()> {
    if group.is_empty() || group.len() > 255 {
        return Err(BrokerError::InvalidArgument(format!("group name {group:?} must be 1-255 characters")));
    }
    Ok(())
}

impl GroupCoordinator {
    /// Opens the offsets journal in `meta_dir`. Blocking.
    pub fn open(fs: FsRef, meta_dir: &Path, min_session: Duration, max_session: Duration) -> Result<GroupCoordinator> {
        Ok(GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            offsets: Mutex::new(OffsetStore::open(fs, meta_dir.join(OFFSETS_FILE))?),
            min_session,
            max_session,
        })
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
        let session =
            Duration::from_millis(u64::from(req.session_timeout_ms)).clamp(self.min_session, self.max_session);
        let member_id = if req.member_id.is_empty() {
            let prefix = if req.client_id.is_empty() { "member" } else { req.client_id.as_str() };
            format!("{prefix}-{}", uuid::Uuid::new_v4())
        } else {
            req.member_id.clone()
        };
        let mut groups = self.groups.lock();
        let group = groups.entry(req.group.clone()).or_default();
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
        if group.rebalance(counts) {
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

    /// Commits offsets, fencing stale generations. Blocking (fsync).
    pub fn commit(&self, req: &pb::CommitOffsetsRequest) -> Result<()> {
        check_group_name(&req.group)?;
        {
            let groups = self.groups.lock();
            let group = groups.get(&req.group);
            let active = group.is_some_and(|g| !g.members.is_empty());
            if req.member_id.is_empty() {
                if active {
                    return Err(BrokerError::Group {
                        group: req.group.clone(),
                        reason: "has active members; commit as a member with its generation, or stop the members first"
                            .into(),
                    });
                }
            } else {
                let Some(g) = group.filter(|g| g.members.contains_key(&req.member_id)) else {
                    return Err(BrokerError::Group {
                        group: req.group.clone(),
                        reason: format!("member {} is not in the group (expired?); join again", req.member_id),
                    });
                };
                if g.generation != req.generation {
                    return Err(BrokerError::Group {
                        group: req.group.clone(),
                        reason: format!(
                            "stale generation {} (current {}); rejoin and commit again",
                            req.generation, g.generation
                        ),
                    });
                }
            }
        }
        self.offsets.lock().commit(&req.group, &req.offsets)
    }

    /// Drops every group's committed offsets of the topics `gone` names: a deleted topic's offsets must not apply
    /// to a topic later created under the same name, which starts from offset 0. Run after a topic is deleted and
    /// at start-up (for a deletion that a crash interrupted). Returns how many offsets were dropped. Blocking.
    pub fn forget_topics(&self, gone: &dyn Fn(&str) -> bool) -> Result<usize> {
        self.offsets.lock().forget(gone)
    }

    /// Committed offsets of a group, optionally restricted to some partitions.
    pub fn committed(&self, group: &str, only: &[pb::TopicPartition]) -> Vec<pb::CommittedOffset> {
        let all = self.offsets.lock().of_group(group);
        if only.is_empty() {
            return all;
        }
        all.into_iter().filter(|o| only.iter().any(|tp| tp.topic == o.topic && tp.partition == o.partition)).collect()
    }

    /// Every group with members or committed offsets.
    pub fn list(&self) -> Vec<pb::GroupSummary> {
        let groups = self.groups.lock();
        let mut names = self.offsets.lock().groups();
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
        let offsets = self.offsets.lock().of_group(group_name);
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
mod tests {
    use super::*;

    fn join(c: &GroupCoordinator, group: &str, id: &str, topics: &[&str], counts: &dyn Fn(&str) -> u32) -> Joined {
        c.join(
            &pb::JoinGroupRequest {
                group: group.into(),
                member_id: id.into(),
                topics: topics.iter().map(|t| (*t).to_owned()).collect(),
                session_timeout_ms: 10_000,
                client_id: String::new(),
            },
            counts,
        )
        .unwrap()
    }

    fn items(a: &[pb::TopicPartition]) -> Vec<(String, u32)> {
        a.iter().map(|tp| (tp.topic.clone(), tp.partition)).collect()
    }

    #[test]
    fn zeze_rule_deals_sorted_items_over_sorted_members() {
        let dir = tempfile::tempdir().unwrap();
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        let counts = |t: &str| if t == "a" { 3 } else { 2 };
        let j1 = join(&c, "g", "m2", &["a", "b"], &counts);
        assert_eq!(j1.generation, 1);
        assert_eq!(items(&j1.assignment).len(), 5);
        let j2 = join(&c, "g", "m1", &["a", "b"], &counts);
        assert_eq!(j2.generation, 2);
        // Items: a0 a1 a2 b0 b1; members sorted: m1 m2.
        assert_eq!(items(&j2.assignment), vec![("a".into(), 0), ("a".into(), 2), ("b".into(), 1)]);
        let hb =
            c.heartbeat(&pb::HeartbeatRequest { group: "g".into(), member_id: "m2".into(), generation: 1 }, &counts);
        assert_eq!(hb.generation, 2);
        assert_eq!(items(&hb.assignment), vec![("a".into(), 1), ("b".into(), 0)]);
    }

    #[test]
    fn stale_generations_are_fenced_and_offsets_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let counts = |_: &str| 4;
        {
            let c = GroupCoordinator::open(
                ferry_storage::fs::os(),
                dir.path(),
                Duration::from_millis(1),
                Duration::from_secs(60),
            )
            .unwrap();
            let j = join(&c, "g", "m1", &["t"], &counts);
            let commit = |generation| pb::CommitOffsetsRequest {
                group: "g".into(),
                member_id: "m1".into(),
                generation,
                offsets: vec![pb::CommittedOffset {
                    topic: "t".into(),
                    partition: 1,
                    offset: 42,
                    metadata: "x".into(),
                }],
            };
            let err = c.commit(&commit(j.generation + 7)).unwrap_err();
            assert!(err.to_string().contains("stale generation"), "{err}");
            c.commit(&commit(j.generation)).unwrap();
            // Manual commits are refused while the group has members.
            let manual = pb::CommitOffsetsRequest { member_id: String::new(), generation: 0, ..commit(0) };
            assert!(c.commit(&manual).is_err());
            c.leave("g", "m1", &counts);
            c.commit(&pb::CommitOffsetsRequest {
                offsets: vec![pb::CommittedOffset {
                    topic: "t".into(),
                    partition: 2,
                    offset: 7,
                    metadata: String::new(),
                }],
                ..manual
            })
            .unwrap();
        }
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        let got: Vec<(u32, u64)> = c.committed("g", &[]).iter().map(|o| (o.partition, o.offset)).collect();
        assert_eq!(got, vec![(1, 42), (2, 7)]);
    }

    #[test]
    fn offsets_of_deleted_topics_are_forgotten_durably() {
        let dir = tempfile::tempdir().unwrap();
        let offset =
            |t: &str, o| pb::CommittedOffset { topic: t.into(), partition: 0, offset: o, metadata: String::new() };
        {
            let c = GroupCoordinator::open(
                ferry_storage::fs::os(),
                dir.path(),
                Duration::from_millis(1),
                Duration::from_secs(60),
            )
            .unwrap();
            for g in ["g1", "g2"] {
                let req = pb::CommitOffsetsRequest {
                    group: g.into(),
                    member_id: String::new(),
                    generation: 0,
                    offsets: vec![offset("gone", 5), offset("kept", 7)],
                };
                c.commit(&req).unwrap();
            }
            assert_eq!(c.forget_topics(&|t| t == "gone").unwrap(), 2);
            assert_eq!(c.forget_topics(&|t| t == "gone").unwrap(), 0);
        }
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(c.committed("g1", &[]), vec![offset("kept", 7)]);
        assert_eq!(c.committed("g2", &[]), vec![offset("kept", 7)]);
    }

    #[test]
    fn a_torn_journal_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(OFFSETS_FILE), "{\"g\":\"g\",\"t\":\"t\",\"p\":0,\"o\":5}\n{\"g\":\"g\",\"t\"")
            .unwrap();
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(c.committed("g", &[]).len(), 1);
    }

    #[test]
    fn expired_members_lose_their_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        let counts = |_: &str| 4;
        let mut req = pb::JoinGroupRequest {
            group: "g".into(),
            member_id: "a".into(),
            topics: vec!["t".into()],
            session_timeout_ms: 1,
            client_id: String::new(),
        };
        c.join(&req, &counts).unwrap();
        req.member_id = "b".into();
        req.session_timeout_ms = 60_000;
        c.join(&req, &counts).unwrap();
        // Member "a" has a 1 ms session; wait until it has certainly passed.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(5) {
            std::thread::yield_now();
        }
        assert_eq!(c.expire(&counts), 1);
        let hb =
            c.heartbeat(&pb::HeartbeatRequest { group: "g".into(), member_id: "b".into(), generation: 0 }, &counts);
        assert_eq!(hb.assignment.len(), 4);
    }
}
