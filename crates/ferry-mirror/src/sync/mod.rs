//! SyncManager: the arranger. It owns this process's pipeline: which partitions it mirrors (the topic set from the
//! TopicAndOffsetManager, intersected with this process's share of the scale-out group), one lane per owned
//! partition, the fetcher's partition sets (it is their only writer), the memory caps, and commits of the cache
//! offsets to the source group.
//!
//! It listens to the event bus, as the seed says: `add_topic`, `remove_topic`, `modify_partition_num` and
//! `source_net_be_switched` each trigger a reconcile, and so does every heartbeat of the scale-out group. A
//! reconcile reads the current state (the topic set, the assignment, the lanes), never the event's contents, so a
//! missed or lagged event can never leave the pipeline wrong: the next trigger puts it right.
//!
//! **Commits.** Every `commit_interval` and on shutdown, cache offsets are committed to the source group
//! `ferry-mirror.{mirror.name}`, so source-side tools see the mirror's progress.

mod links;
mod membership;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_client::proto as pb;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::TargetCluster;
use crate::config::OnDivergence;
use crate::events::{Event, EventKind};
use crate::fetch::Fetcher;
use crate::lane::budget::Budget;
use crate::lane::core::{CoreConfig, SourceKind};
use crate::lane::link::{LINK_OVERHEAD_BYTES, LaneLink};
use crate::lane::{Ended, Lane, LaneCtx, Owner};
use crate::state::{PartitionState, PartitionStatus};
use crate::topics::{MirroredTopic, TopicSet};
use crate::tp::{SourceTp, TargetTp};

pub use links::{LinkList, LinkMap};
pub use membership::Membership;

/// The lanes' links, by source partition: the monitor pauses and resumes through them, the probes deliver into
/// them. The SyncManager is the only writer.
pub type Links = Arc<LinkMap>;

/// Tuning the SyncManager needs.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    /// `mirror.name`.
    pub mirror_name: String,
    /// Cache-offset commit period.
    pub commit_interval: Duration,
    /// Bytes held per partition at most.
    pub queue_bytes: u64,
    /// Bytes held overall at most.
    pub max_memory: u64,
    /// Largest append request.
    pub max_request_bytes: u64,
    /// Scale-out group session timeout.
    pub session_timeout: Duration,
    /// Graceful stop budget.
    pub shutdown_timeout: Duration,
    /// `start_position = latest` on the mirror's very first run.
    pub first_run_latest: bool,
    /// Divergence policy.
    pub on_divergence: OnDivergence,
    /// The target's `max_batch_bytes`.
    pub target_max_batch: u64,
    /// How the source's epochs read.
    pub source_kind: SourceKind,
}

/// Per-partition memory cap and largest append request for `partitions` owned partitions.
fn caps(settings: &SyncSettings, partitions: usize) -> (u64, u64) {
    let n = partitions.max(1) as u64;
    let share = (settings.max_memory / n).saturating_sub(LINK_OVERHEAD_BYTES);
    let cap = share.min(settings.queue_bytes).max(64 * 1024);
    (cap, (cap / 8).min(settings.max_request_bytes))
}

/// Whether a partition was present at the mirror's first discovery (so `start_position = latest` applies to it).
fn initially_present(initial: Option<&BTreeMap<String, u32>>, tp: &SourceTp) -> bool {
    initial.and_then(|t| t.get(tp.topic())).is_some_and(|count| tp.partition < *count)
}

/// The SyncManager.
pub struct SyncManager {
    settings: SyncSettings,
    ctx: LaneCtx,
    target: Arc<dyn TargetCluster>,
    topics: watch::Receiver<Arc<TopicSet>>,
    events: broadcast::Receiver<Arc<Event>>,
    fetcher: Fetcher,
    links: Links,
    lanes: BTreeMap<SourceTp, Lane>,
    membership: Membership,
    /// Source topics and their partition counts at the first discovery: only those partitions may start at
    /// `latest`; partitions added later start at the earliest offset like new topics.
    initial_topics: Option<BTreeMap<String, u32>>,
    /// Lanes stopping in the background after their partition left this process.
    stopping: TaskTracker,
    lanes_token: CancellationToken,
    /// The topic set and assignment version the lanes were last reconciled with; `None` forces the next reconcile
    /// (a lane was reaped). With thousands of partitions a reconcile is not free, and most heartbeats change
    /// nothing.
    reconciled: Option<(Arc<TopicSet>, u64)>,
    /// The lanes whose task ended, by partition and id (each lane sends its own), and the next lane's id.
    ended: (mpsc::UnboundedSender<Ended>, mpsc::UnboundedReceiver<Ended>),
    next_lane_id: u64,
    /// Lanes whose task said it ended but was not yet seen finished: looked at again at the next heartbeat.
    ending: Vec<Ended>,
}

impl SyncManager {
    /// A manager over the pipeline context. `lanes_token` is the parent of every lane's kill token.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: SyncSettings,
        ctx: LaneCtx,
        target: Arc<dyn TargetCluster>,
        topics: watch::Receiver<Arc<TopicSet>>,
        events: broadcast::Receiver<Arc<Event>>,
        fetcher: Fetcher,
        links: Links,
        lanes_token: CancellationToken,
    ) -> SyncManager {
        let membership = Membership::new(&settings.mirror_name, settings.session_timeout);
        SyncManager {
            settings,
            ctx,
            target,
            topics,
            events,
            fetcher,
            links,
            lanes: BTreeMap::new(),
            membership,
            initial_topics: None,
            stopping: TaskTracker::new(),
            lanes_token,
            reconciled: None,
            ended: mpsc::unbounded_channel(),
            next_lane_id: 0,
            ending: Vec::new(),
        }
    }

    /// Runs until `shutdown`, then stops the lanes (draining in-flight appends), commits, and leaves the scale-out
    /// group. Every task it started has ended when it returns.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let heartbeat_every = (self.settings.session_timeout / 5).max(Duration::from_millis(100));
        let mut heartbeat = tokio::time::interval(heartbeat_every);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut commit = tokio::time::interval(self.settings.commit_interval);
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        commit.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                event = self.events.recv() => {
                    let trigger = match event {
                        Ok(e) => matches!(
                            e.kind,
                            EventKind::AddTopic
                                | EventKind::RemoveTopic
                                | EventKind::ModifyPartitionNum
                                | EventKind::SourceNetBeSwitched
                        ),
                        // Events were missed: reconcile anyway, it reads the current state.
                        Err(broadcast::error::RecvError::Lagged(_)) => true,
                        Err(broadcast::error::RecvError::Closed) => break,
                    };
                    if trigger {
                        // A discovery round that found a thousand topics raises a thousand add_topic events at once:
                        // they all lead to the same state, so everything already queued is taken first and one
                        // refresh follows.
                        if self.drain_events() {
                            break;
                        }
                        self.refresh().await;
                    }
                }
                _ = heartbeat.tick() => {
                    self.reap();
                    self.refresh().await;
                }
                _ = commit.tick() => self.commit().await,
            }
        }
        self.stop_all().await;
        self.commit().await;
        self.membership.leave(&self.target).await;
        self.stopping.close();
        self.stopping.wait().await;
        self.fetcher.shut_down().await;
    }

    /// Takes every event already queued (a reconcile reads the current state, so they need no handling of their
    /// own); true when the bus closed.
    fn drain_events(&mut self) -> bool {
        loop {
            match self.events.try_recv() {
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(broadcast::error::TryRecvError::Empty) => return false,
                Err(broadcast::error::TryRecvError::Closed) => return true,
            }
        }
    }

    /// Membership, then the lanes to match topic set ∩ assignment.
    async fn refresh(&mut self) {
        let set = self.topics.borrow().clone();
        if !set.discovered {
            return;
        }
        if self.initial_topics.is_none() {
            self.initial_topics = Some(set.topics.iter().map(|(name, m)| (name.clone(), m.partitions)).collect());
        }
        let targets = set.topics.values().map(|m| m.target.clone()).collect();
        self.membership.refresh(&self.target, targets).await;
        if let Some((done, version)) = &self.reconciled
            && Arc::ptr_eq(done, &set)
            && *version == self.membership.version()
        {
            return;
        }
        self.reconcile(&set);
        self.reconciled = Some((set, self.membership.version()));
    }

    /// Starts and stops lanes to match topic set ∩ assignment.
    fn reconcile(&mut self, set: &TopicSet) {
        let by_target: BTreeMap<&str, &MirroredTopic> = set.topics.values().map(|m| (m.target.as_str(), m)).collect();
        let mut wanted: BTreeMap<SourceTp, (&MirroredTopic, TargetTp)> = BTreeMap::new();
        for t in self.membership.assignment() {
            if let Some(m) = by_target.get(t.topic())
                && t.partition < m.partitions
            {
                wanted.insert(SourceTp::new(m.source.as_str(), t.partition), (m, t.clone()));
            }
        }
        let gone: Vec<SourceTp> = self.lanes.keys().filter(|tp| !wanted.contains_key(*tp)).cloned().collect();
        for tp in gone {
            self.remove(&tp);
        }
        let count = wanted.len();
        let (cap, request) = caps(&self.settings, count);
        for (tp, (m, target)) in wanted {
            if self.lanes.contains_key(&tp) {
                continue;
            }
            self.add(tp, target, m, cap, request);
        }
        for lane in self.lanes.values() {
            if lane.link.budget.cap() != cap || lane.link.budget.request() != request {
                lane.link.budget.resize(cap, request);
                lane.link.set_request_limit(request);
            }
        }
    }

    fn add(&mut self, tp: SourceTp, target: TargetTp, m: &MirroredTopic, cap: u64, request: u64) {
        let first_run_latest = self.settings.first_run_latest && initially_present(self.initial_topics.as_ref(), &tp);
        let config = CoreConfig {
            tp: tp.clone(),
            target: target.clone(),
            topic_id: m.source_id.clone(),
            on_divergence: self.settings.on_divergence,
            first_run_latest,
            target_max_batch: self.settings.target_max_batch,
            decode_limit: crate::reshape::decode_limit(self.settings.queue_bytes, self.settings.target_max_batch),
            source_kind: self.settings.source_kind,
            replicated_source: m.replicated_source,
        };
        let status = Arc::new(PartitionStatus::new(tp.topic(), target.topic(), tp.partition));
        self.ctx.shared.partitions.insert(tp.clone(), Arc::clone(&status));
        let link =
            LaneLink::new(tp.clone(), Budget::new(cap, request), self.fetcher.changed_for(&tp), Arc::clone(&status));
        self.links.insert(tp.clone(), Arc::clone(&link));
        self.fetcher.assign(Arc::clone(&link));
        let paused = self.ctx.shared.is_paused(tp.topic());
        let drain = self.settings.shutdown_timeout / 2;
        let owner = Owner { kill: self.lanes_token.child_token(), id: self.next_lane_id, ended: self.ended.0.clone() };
        self.next_lane_id += 1;
        let lane = Lane::spawn(config, self.ctx.clone(), link, status, paused, drain, owner);
        self.lanes.insert(tp, lane);
    }

    fn remove(&mut self, tp: &SourceTp) {
        self.fetcher.unassign(tp);
        self.links.remove(tp);
        self.ctx.shared.partitions.remove(tp);
        if let Some(lane) = self.lanes.remove(tp) {
            // The lane drains its in-flight append in the background; a hard stop follows the budget.
            self.stopping.spawn(lane.shut_down(self.settings.shutdown_timeout));
        }
    }

    /// Restarts lanes that ended on their own (they only end on stop; a panic is logged and the partition restarts
    /// at the next reconcile).
    fn reap(&mut self) {
        // Only the lanes that said their task ended are looked at: with thousands of lanes, asking each on every
        // heartbeat was most of what an idle manager did.
        while let Ok(ended) = self.ended.1.try_recv() {
            self.ending.push(ended);
        }
        if self.ending.is_empty() {
            return;
        }
        let mut dead = Vec::new();
        let lanes = &self.lanes;
        self.ending.retain(|(tp, id)| match lanes.get(tp).filter(|l| l.id == *id) {
            // Removed, perhaps replaced by a newer lane: it was stopped on purpose.
            None => false,
            Some(l) if l.is_finished() => {
                dead.push(tp.clone());
                false
            }
            // Said so and not yet finished (the task is completing): looked at again.
            Some(_) => true,
        });
        for tp in dead {
            tracing::error!(%tp, "partition lane ended unexpectedly; restarting it");
            self.remove(&tp);
            self.reconciled = None;
        }
    }

    /// Commits the cache offsets of owned partitions that moved.
    async fn commit(&mut self) {
        let mut offsets = Vec::new();
        let mut statuses = Vec::new();
        // The owned partitions' statuses (kept through a shutdown, so the final commit covers them all).
        for entry in self.ctx.shared.partitions.iter() {
            let (tp, s) = (entry.key(), entry.value());
            let cache = s.cache_offset();
            if cache != s.commit_offset() && s.state() != PartitionState::Starting {
                offsets.push(pb::CommittedOffset {
                    topic: tp.topic().to_owned(),
                    partition: tp.partition,
                    offset: cache,
                    metadata: String::new(),
                });
                statuses.push((Arc::clone(s), cache));
            }
        }
        if offsets.is_empty() {
            return;
        }
        let group = &self.ctx.io.source_group;
        let source = Arc::clone(&self.ctx.io.egress.active().cluster);
        match source.commit(group, offsets).await {
            Ok(()) => {
                for (s, cache) in statuses {
                    s.set_commit(cache);
                }
            }
            Err(e) => tracing::warn!(%group, error = %e, "cannot commit cache offsets to the source group"),
        }
    }

    /// Graceful stop of every lane: stop fetching, drain in-flight appends within the budget, then kill. Their
    /// statuses stay listed: the final commit covers exactly the partitions this process owned.
    async fn stop_all(&mut self) {
        for lane in self.lanes.values() {
            lane.stop();
        }
        let budget = self.settings.shutdown_timeout;
        let lanes = std::mem::take(&mut self.lanes);
        futures::future::join_all(lanes.into_values().map(|l| l.shut_down(budget))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SyncSettings {
        SyncSettings {
            mirror_name: "m".into(),
            commit_interval: Duration::from_secs(5),
            queue_bytes: 8 << 20,
            max_memory: 64 << 20,
            max_request_bytes: 4 << 20,
            session_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            first_run_latest: false,
            on_divergence: OnDivergence::Halt,
            target_max_batch: 1 << 20,
            source_kind: SourceKind::Ferry,
        }
    }

    #[test]
    fn caps_split_max_memory_less_the_links_and_requests_leave_room_to_fetch_ahead() {
        let s = settings();
        assert_eq!(caps(&s, 4), (8 << 20, 1 << 20), "queue_bytes bounds each partition");
        assert_eq!(caps(&s, 32), ((2 << 20) - LINK_OVERHEAD_BYTES, ((2 << 20) - LINK_OVERHEAD_BYTES) / 8));
        let small = SyncSettings { max_request_bytes: 128 << 10, ..settings() };
        assert_eq!(caps(&small, 4), (8 << 20, 128 << 10), "max_request_bytes bounds requests");
        let b = Budget::new(8 << 20, 1 << 20);
        assert_eq!(b.window(), 4 << 20);
    }

    #[test]
    fn latest_applies_only_to_partitions_present_at_the_first_discovery() {
        let initial: BTreeMap<String, u32> = [("orders".to_owned(), 4)].into();
        assert!(initially_present(Some(&initial), &SourceTp::new("orders", 3)));
        assert!(!initially_present(Some(&initial), &SourceTp::new("orders", 4)), "a partition added later");
        assert!(!initially_present(Some(&initial), &SourceTp::new("payments", 0)), "a topic added later");
        assert!(!initially_present(None, &SourceTp::new("orders", 0)), "before the first discovery");
    }
}
