//! SyncManager: the arranger. It owns the pipeline of this process: which partitions it mirrors (the topic set from
//! the TopicAndOffsetManager, intersected with this process's share in the scale-out group), one TargetDcProducer
//! task per owned partition, the SourceDcConsumer's partition list, memory caps, commits of cache offsets to the
//! source group, and operator controls (pause, resume).
//!
//! **Scale-out.** Every process with the same `mirror.name` joins the group `ferry-mirror.{mirror.name}` on the
//! *target* cluster (local, so WAN blips cause no rebalances) and mirrors the partitions the group assigns it. When
//! a process dies, the group expels it after its session timeout and the survivors take its partitions over by the
//! resume rule. Correctness never depends on this: append-with-offsets makes a second writer harmless.
//!
//! **Commits.** Every `commit_interval` and on shutdown, cache offsets are committed to the source group
//! `ferry-mirror.{mirror.name}`, so source-side tools see the mirror's progress.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dashmap::DashMap;
use ferry_client::proto as pb;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::source::{ConsumerCmd, PartitionFlow, PartitionSink};
use crate::state::PartitionStatus;
use crate::target::{PartitionCtl, PartitionSpec, PipelineCtx, TargetDcProducer};
use crate::topics::TopicSet;

type Tp = (String, u32);

struct Task {
    stop: CancellationToken,
    kill: CancellationToken,
    join: JoinHandle<()>,
    flow: Arc<PartitionFlow>,
}

/// Per-partition control senders, shared with the monitor (pause/resume).
pub type Controls = Arc<DashMap<Tp, mpsc::UnboundedSender<PartitionCtl>>>;

/// Tuning the SyncManager needs.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    /// `mirror.name`.
    pub mirror_name: String,
    /// Cache-offset commit period.
    pub commit_interval: Duration,
    /// Bytes fetched ahead per partition.
    pub queue_bytes: u64,
    /// Bytes fetched ahead overall.
    pub max_memory: u64,
    /// Scale-out group session timeout.
    pub session_timeout: Duration,
    /// Graceful stop budget.
    pub shutdown_timeout: Duration,
    /// `start_position = latest` on the mirror's very first run.
    pub first_run_latest: bool,
}

/// Per-partition memory cap and largest append request for `partitions` owned partitions.
fn caps(settings: &SyncSettings, max_request_bytes: u64, partitions: usize) -> (u64, u64) {
    let n = partitions.max(1) as u64;
    let cap = (settings.max_memory / n).min(settings.queue_bytes).max(64 * 1024);
    (cap, (cap / 8).min(max_request_bytes))
}

/// Whether a partition was present at the mirror's first discovery (so `start_position = latest` applies to it).
fn initially_present(initial: Option<&BTreeMap<String, u32>>, (topic, partition): &Tp) -> bool {
    initial.and_then(|t| t.get(topic)).is_some_and(|count| partition < count)
}

/// The SyncManager.
pub struct SyncManager {
    settings: SyncSettings,
    ctx: PipelineCtx,
    topics: watch::Receiver<Arc<TopicSet>>,
    consumer: mpsc::UnboundedSender<ConsumerCmd>,
    controls: Controls,
    tasks: BTreeMap<Tp, Task>,
    /// Source topics and their partition counts at the first discovery: only those partitions may start at
    /// `latest`; partitions added later start at the earliest offset like new topics.
    initial_topics: Option<BTreeMap<String, u32>>,
    member: Option<(String, u64)>,
    assignment: BTreeSet<Tp>,
    joined_topics: BTreeSet<String>,
}

impl SyncManager {
    /// A manager over the pipeline context.
    pub fn new(
        settings: SyncSettings,
        ctx: PipelineCtx,
        topics: watch::Receiver<Arc<TopicSet>>,
        consumer: mpsc::UnboundedSender<ConsumerCmd>,
        controls: Controls,
    ) -> SyncManager {
        SyncManager {
            settings,
            ctx,
            topics,
            consumer,
            controls,
            tasks: BTreeMap::new(),
            initial_topics: None,
            member: None,
            assignment: BTreeSet::new(),
            joined_topics: BTreeSet::new(),
        }
    }

    fn group(&self) -> String {
        format!("ferry-mirror.{}", self.settings.mirror_name)
    }

    /// Runs until `shutdown`, then stops the partition tasks (draining in-flight appends), commits, and leaves the
    /// scale-out group.
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
                changed = self.topics.changed() => {
                    if changed.is_err() { break; }
                    self.membership().await;
                    self.reconcile();
                }
                _ = heartbeat.tick() => {
                    self.membership().await;
                    self.reconcile();
                    self.reap();
                }
                _ = commit.tick() => self.commit().await,
            }
        }
        self.stop_all().await;
        self.commit().await;
        if let Some((member, _)) = self.member.take() {
            let _ = self.ctx.target.leave(&self.group(), &member).await;
        }
    }

    /// Joins, heartbeats or re-joins the scale-out group; updates the assignment.
    async fn membership(&mut self) {
        let set = self.topics.borrow().clone();
        if !set.discovered {
            return;
        }
        if self.initial_topics.is_none() {
            self.initial_topics = Some(set.topics.iter().map(|(name, m)| (name.clone(), m.partitions)).collect());
        }
        let targets: BTreeSet<String> = set.topics.values().map(|m| m.target.clone()).collect();
        if targets.is_empty() {
            if let Some((member, _)) = self.member.take() {
                let _ = self.ctx.target.leave(&self.group(), &member).await;
            }
            self.assignment.clear();
            self.joined_topics.clear();
            return;
        }
        let target = Arc::clone(&self.ctx.target);
        let rejoin = self.member.is_none() || targets != self.joined_topics;
        if !rejoin {
            let (member, generation) = self.member.clone().expect("member");
            match target.heartbeat(&self.group(), &member, generation).await {
                Ok(Some(hb)) => {
                    if let Some(m) = self.member.as_mut() {
                        m.1 = hb.generation;
                    }
                    self.assignment = hb.assignment.into_iter().collect();
                    return;
                }
                Ok(None) => {
                    tracing::warn!(group = %self.group(), "this mirror process was expelled from the scale-out group; joining again")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "scale-out group heartbeat failed");
                    return;
                }
            }
        }
        let member_id = self.member.as_ref().map(|m| m.0.clone()).unwrap_or_default();
        let topics = targets.iter().cloned().collect();
        match target.join(&self.group(), &member_id, topics, self.settings.session_timeout).await {
            Ok(j) => {
                tracing::info!(group = %self.group(), member = %j.member_id, generation = j.generation, partitions = j.assignment.len(), members = j.members, "joined the scale-out group");
                self.member = Some((j.member_id, j.generation));
                self.joined_topics = targets;
                self.assignment = j.assignment.into_iter().collect();
            }
            Err(e) => tracing::warn!(error = %e, "cannot join the scale-out group on the target"),
        }
    }

    /// Starts and stops partition tasks to match topic set ∩ assignment.
    fn reconcile(&mut self) {
        let set = self.topics.borrow().clone();
        let by_target: BTreeMap<&str, &crate::topics::MirroredTopic> =
            set.topics.values().map(|m| (m.target.as_str(), m)).collect();
        let mut wanted: BTreeMap<Tp, (&crate::topics::MirroredTopic, u32)> = BTreeMap::new();
        for (target, p) in &self.assignment {
            if let Some(m) = by_target.get(target.as_str())
                && *p < m.partitions
            {
                wanted.insert((m.source.clone(), *p), (m, *p));
            }
        }
        let gone: Vec<Tp> = self.tasks.keys().filter(|tp| !wanted.contains_key(*tp)).cloned().collect();
        if !gone.is_empty() {
            let _ = self.consumer.send(ConsumerCmd::Remove(gone.clone()));
            for tp in gone {
                if let Some(task) = self.tasks.remove(&tp) {
                    task.stop.cancel();
                    // The task drains its in-flight append in the background; a hard kill follows the budget.
                    let kill = task.kill.clone();
                    let budget = self.settings.shutdown_timeout;
                    tokio::spawn(async move {
                        tokio::time::sleep(budget).await;
                        kill.cancel();
                    });
                }
                self.controls.remove(&tp);
                self.ctx.shared.partitions.remove(&tp);
            }
        }
        for (tp, (m, p)) in wanted {
            if self.tasks.contains_key(&tp) {
                continue;
            }
            let first_run_latest =
                self.settings.first_run_latest && initially_present(self.initial_topics.as_ref(), &tp);
            let spec = PartitionSpec {
                topic: m.source.clone(),
                topic_id: m.source_id.clone(),
                target_topic: m.target.clone(),
                partition: p,
                first_run_latest,
            };
            let status = Arc::new(PartitionStatus::new(&m.source, &m.target, p));
            self.ctx.shared.partitions.insert(tp.clone(), Arc::clone(&status));
            let flow = Arc::new(PartitionFlow::default());
            let (tx, rx) = mpsc::unbounded_channel();
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            self.controls.insert(tp.clone(), ctl_tx);
            let sink = PartitionSink { tx, flow: Arc::clone(&flow) };
            let producer = TargetDcProducer::new(spec, self.ctx.clone(), status, sink, rx, ctl_rx);
            let (stop, kill) = (CancellationToken::new(), CancellationToken::new());
            let drain = self.settings.shutdown_timeout / 2;
            let join = tokio::spawn(producer.run(stop.clone(), kill.clone(), drain));
            self.tasks.insert(tp, Task { stop, kill, join, flow });
        }
        // Each task adds itself to the consumer once it has resolved where to resume.
        self.set_caps();
    }

    /// Splits `sync.max_memory` over the owned partitions, at most `sync.queue_bytes` each. A partition's append
    /// requests are at most an eighth of its cap, so their copies in flight take at most a quarter of it (see
    /// [`PartitionFlow::window`]).
    fn set_caps(&self) {
        let (cap, request) = caps(&self.settings, self.ctx.max_request_bytes, self.tasks.len());
        for t in self.tasks.values() {
            t.flow.cap.store(cap, Ordering::Relaxed);
            t.flow.request.store(request, Ordering::Relaxed);
        }
    }

    /// Restarts tasks that ended on their own (they only end on stop; a panic is logged and the partition restarts).
    fn reap(&mut self) {
        let dead: Vec<Tp> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.join.is_finished() && !t.stop.is_cancelled())
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in dead {
            tracing::error!(topic = %tp.0, partition = tp.1, "partition task ended unexpectedly; restarting it");
            self.tasks.remove(&tp);
            let _ = self.consumer.send(ConsumerCmd::Remove(vec![tp]));
        }
        if !self.tasks.is_empty() {
            self.reconcile();
        }
    }

    /// Commits the cache offsets of owned partitions that moved.
    async fn commit(&mut self) {
        let mut offsets = Vec::new();
        let mut statuses = Vec::new();
        for tp in self.tasks.keys() {
            if let Some(s) = self.ctx.shared.partitions.get(tp) {
                let cache = s.cache_offset();
                if cache != s.commit_offset() && s.state() != crate::state::PartitionState::Starting {
                    offsets.push(pb::CommittedOffset {
                        topic: tp.0.clone(),
                        partition: tp.1,
                        offset: cache,
                        metadata: String::new(),
                    });
                    statuses.push((Arc::clone(s.value()), cache));
                }
            }
        }
        if offsets.is_empty() {
            return;
        }
        let source = Arc::clone(&self.ctx.egress.active().cluster);
        match source.commit(&self.ctx.source_group, offsets).await {
            Ok(()) => {
                for (s, cache) in statuses {
                    s.set_commit(cache);
                }
            }
            Err(e) => {
                tracing::warn!(group = %self.ctx.source_group, error = %e, "cannot commit cache offsets to the source group")
            }
        }
    }

    /// Graceful stop of every task: stop fetching, drain in-flight appends within the budget, then kill.
    async fn stop_all(&mut self) {
        let budget = self.settings.shutdown_timeout;
        for t in self.tasks.values() {
            t.stop.cancel();
        }
        let deadline = tokio::time::Instant::now() + budget;
        // The tasks stay listed: the final commit covers exactly the partitions this process owned.
        for (tp, t) in self.tasks.iter_mut() {
            if tokio::time::timeout_at(deadline, &mut t.join).await.is_err() {
                tracing::warn!(topic = %tp.0, partition = tp.1, "partition did not drain within shutdown_timeout; stopping it");
                t.kill.cancel();
                let _ = (&mut t.join).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_split_max_memory_and_requests_leave_room_to_fetch_ahead() {
        let settings = SyncSettings {
            mirror_name: "m".into(),
            commit_interval: Duration::from_secs(5),
            queue_bytes: 8 << 20,
            max_memory: 64 << 20,
            session_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            first_run_latest: false,
        };
        assert_eq!(caps(&settings, 4 << 20, 4), (8 << 20, 1 << 20), "queue_bytes bounds each partition");
        assert_eq!(caps(&settings, 4 << 20, 32), (2 << 20, 256 << 10), "max_memory is split");
        assert_eq!(caps(&settings, 128 << 10, 4), (8 << 20, 128 << 10), "max_request_bytes bounds requests");
        let flow = PartitionFlow::default();
        flow.cap.store(8 << 20, Ordering::Relaxed);
        flow.request.store(1 << 20, Ordering::Relaxed);
        assert_eq!(flow.window(), 4 << 20);
    }

    #[test]
    fn latest_applies_only_to_partitions_present_at_the_first_discovery() {
        let initial: BTreeMap<String, u32> = [("orders".to_owned(), 4)].into();
        assert!(initially_present(Some(&initial), &("orders".into(), 3)));
        assert!(!initially_present(Some(&initial), &("orders".into(), 4)), "a partition added later");
        assert!(!initially_present(Some(&initial), &("payments".into(), 0)), "a topic added later");
        assert!(!initially_present(None, &("orders".into(), 0)), "before the first discovery");
    }
}
