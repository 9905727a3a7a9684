//! A cluster member's replication manager. Every beat (a tenth of the lease TTL, 100 ms to 1 s) it reads the
//! catalog from etcd at one revision and acts on it:
//! - it creates this broker's replicas of the replicated topics placed on it;
//! - a partition etcd says this broker leads becomes (or stays) its leader at etcd's leader epoch; one it follows
//!   gets a fetcher for its leader at that epoch (a leader deposed meanwhile becomes a follower and truncates
//!   what its new leader never had);
//! - as leader it takes lagging followers out of the in-sync set, and caught-up ones back in, by compare-and-swap
//!   at its own leader epoch; the local ISR changes only once etcd accepted it;
//! - the controller duty (see [`crate::cluster::controller`]).
//!
//! While etcd is unreachable a leader acknowledges only within its lease or a failsafe grant (`cluster::serving`),
//! and no ISR shrinks; once etcd answers, the controller waits one lease TTL before it acts on missing brokers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::Client;
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::catalog::{self, PartitionState, Snapshot};
use crate::cluster::controller::Controller;
use crate::cluster::core::controller as core_controller;
use crate::cluster::core::isr;
use crate::cluster::follower::{self, Follow};
use crate::cluster::peers::{PeerClient, PeerLinks};
use crate::cluster::serving::{self, Serving};
use crate::config::ClusterSection;
use crate::error::{BrokerError, Result};
use crate::events::{Event, Events};
use crate::groups::GroupCoordinator;
use crate::node::partition::Partition;
use crate::node::registry::BrokerCore;
use crate::node::replica::Role;
use crate::node::topic::TopicMeta;

mod failover;
mod failsafe;
mod operations;
mod topics;

/// The manager's settings, from `[cluster]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This broker's id.
    pub me: u32,
    /// The membership lease TTL.
    pub ttl: Duration,
    /// How often the catalog is read.
    pub beat: Duration,
    /// `cluster.replica_lag_max`.
    pub replica_lag: Duration,
    /// `cluster.ack_timeout`.
    pub ack_timeout: Duration,
    /// `cluster.peer_addrs`.
    pub peer_addrs: BTreeMap<u32, String>,
    /// Largest gRPC message between brokers.
    pub max_message: usize,
    /// How the other members are dialled.
    pub links: PeerLinks,
}

impl Settings {
    /// The settings of `section` for a broker of messages up to `max_message` bytes, dialling peers through `links`.
    pub fn of(section: &ClusterSection, max_message: usize, links: PeerLinks) -> Settings {
        Settings {
            me: section.broker_id.unwrap_or(0),
            ttl: section.lease_ttl,
            beat: (section.lease_ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            replica_lag: section.replica_lag_max,
            ack_timeout: section.ack_timeout,
            peer_addrs: section.peer_overrides(),
            max_message,
            links,
        }
    }
}

struct Fetcher {
    leader: u32,
    epoch: u32,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The replication manager of a cluster member.
pub struct Replication {
    s: Settings,
    core: Arc<BrokerCore>,
    groups: Arc<GroupCoordinator>,
    etcd: Client,
    snap: RwLock<Snapshot>,
    etcd_ok: AtomicBool,
    controller: tokio::sync::Mutex<Controller>,
    peers: Mutex<HashMap<u32, (String, PeerClient)>>,
    fetchers: tokio::sync::Mutex<HashMap<(String, u32), Fetcher>>,
    kick: tokio::sync::Notify,
    events: Arc<Events>,
    serving: Serving,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication").field("me", &self.s.me).finish_non_exhaustive()
    }
}

impl Replication {
    /// A manager over `core` (and `groups`, whose committed offsets of a deleted topic go with it), over `etcd`.
    pub fn new(
        s: Settings,
        core: Arc<BrokerCore>,
        groups: Arc<GroupCoordinator>,
        etcd: Client,
        serving: Serving,
        lease_id: Arc<std::sync::atomic::AtomicI64>,
    ) -> Arc<Replication> {
        Arc::new(Replication {
            s,
            core,
            groups,
            etcd,
            snap: RwLock::new(Snapshot::default()),
            etcd_ok: AtomicBool::new(true),
            controller: tokio::sync::Mutex::new(Controller::new(lease_id)),
            peers: Mutex::new(HashMap::new()),
            fetchers: tokio::sync::Mutex::new(HashMap::new()),
            kick: tokio::sync::Notify::new(),
            events: Arc::new(Events::default()),
            serving,
        })
    }

    /// The serving side: the rules applied to client calls and follower fetches.
    pub fn serving(&self) -> &Serving {
        &self.serving
    }

    /// The cluster event counters.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Whether this broker holds the controller key (as of its last beat).
    pub fn is_controller(&self) -> bool {
        self.snap.read().controller == self.s.me
    }

    /// This broker's id.
    pub fn broker_id(&self) -> u32 {
        self.s.me
    }

    /// `cluster.ack_timeout`.
    pub fn ack_timeout(&self) -> Duration {
        self.s.ack_timeout
    }

    /// The catalog as last read.
    pub fn snapshot(&self) -> Snapshot {
        self.snap.read().clone()
    }

    /// Whether the last read of etcd succeeded.
    pub fn etcd_reachable(&self) -> bool {
        self.etcd_ok.load(Ordering::Relaxed)
    }

    /// Runs the beats until `stop`; then stops every fetcher and resigns the controller key. The failsafe runs
    /// beside them on its own beat, so that a hanging read of etcd does not hold it up.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let failsafe = tokio::spawn(Arc::clone(&self).failsafe(stop.clone()));
        let mut quiet_until: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(self.s.beat) => {}
                _ = self.kick.notified() => {}
            }
            let mut etcd = self.etcd.clone();
            // The lease mark before the read: a lease granted again while it is under way needs the next read.
            let (asked, mark) = (Instant::now(), self.serving.lease().read_mark());
            let snap = match catalog::snapshot(&mut etcd).await {
                Ok(s) => {
                    self.serving.etcd_answered(asked);
                    s
                }
                Err(e) => {
                    if self.etcd_ok.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            event = "etcd_unreachable",
                            error = %e,
                            "cannot read the catalog from etcd; leaders go on with their in-sync sets, no election \
                             or ISR change until it answers"
                        );
                    }
                    continue;
                }
            };
            if !self.etcd_ok.swap(true, Ordering::Relaxed) {
                tracing::info!(event = "etcd_reachable", "etcd answers again");
                quiet_until = Some(Instant::now() + self.s.ttl);
            }
            *self.snap.write() = snap.clone();
            let mut stages = Stages::new(asked);
            self.sync_topics(&snap).await;
            stages.done("topics");
            self.apply_roles(&snap).await;
            self.serving.lease().catalog_read(mark);
            stages.done("roles");
            self.maintain_isr(&mut etcd).await;
            stages.done("isr");
            let act = quiet_until.is_none_or(|t| Instant::now() >= t);
            let mut controller = self.controller.lock().await;
            let may_act = self.serving.lease().valid(Instant::now());
            if controller.keep(&mut etcd, self.s.me, &snap, may_act).await && act {
                let asks = core_controller::step(&snap, &BTreeMap::new(), true);
                let reports = self.gather_reports(&asks, &snap, 0).await;
                stages.done("reports");
                let actions = core_controller::step(&snap, &reports, true);
                if let Err(e) = controller.apply(&mut etcd, &actions, &self.events).await {
                    tracing::warn!(error = %e, "controller beat failed; will retry");
                }
                self.ensure_internal_topics(&mut etcd, &snap).await;
                stages.done("controller");
            }
            stages.report(self.s.ttl);
        }
        let _ = failsafe.await;
        let fetchers: Vec<Fetcher> = self.fetchers.lock().await.drain().map(|(_, f)| f).collect();
        for f in fetchers {
            f.stop.cancel();
            let _ = f.task.await;
        }
        let mut etcd = self.etcd.clone();
        self.controller.lock().await.resign(&mut etcd).await;
    }

    /// Makes every local replica's role what etcd says; a replica moved off this broker is retired.
    async fn apply_roles(&self, snap: &Snapshot) {
        for ((topic, p), v) in &snap.partitions {
            if !v.state.replicas.contains(&self.s.me) {
                self.retire(topic, *p, snap).await;
                continue;
            }
            let Some(record) = snap.topics.get(topic) else { continue };
            let part = match self.local_replica(topic, *p, record).await {
                Ok(part) => part,
                Err(e) => {
                    tracing::warn!(topic, partition = p, error = %e, "cannot open this broker's replica");
                    continue;
                }
            };
            if let Err(e) = self.apply_role(&part, record, &v.state, v.revision, snap).await {
                tracing::warn!(topic, partition = p, error = %e, "cannot take the role etcd gives this replica");
            }
        }
    }

    /// Retires this broker's replica of `topic`/`p`, which a move took elsewhere (or was never placed here): its
    /// fetcher stops, it steps down, and it is closed and removed with its data. When no partition of the topic is
    /// placed here any more, the local topic goes whole.
    async fn retire(&self, topic: &str, p: u32, snap: &Snapshot) {
        let Ok(part) = self.core.partition(topic, p) else { return };
        let Some(replica) = part.replica() else { return };
        let record = snap.topics.get(topic);
        if record.is_none_or(|r| part_of_other_topic(&self.core, topic, &r.topic_id)) {
            return;
        }
        let key = (topic.to_owned(), p);
        self.stop_fetcher(&key).await;
        replica.step_down();
        if let Err(e) = self.core.remove_replica(topic, p).await {
            tracing::warn!(topic, partition = p, error = %e, "cannot remove a replica moved off this broker");
        }
        tracing::info!(
            event = "replica_retired",
            topic,
            partition = p,
            "replica moved off this broker; its data is dropped"
        );
        let placed_here = snap.partitions.iter().any(|((t, _), v)| t == topic && v.state.replicas.contains(&self.s.me));
        if !placed_here && let Err(e) = self.core.delete_topic(topic, Box::new(|| Ok(()))).await {
            tracing::warn!(topic, error = %e, "cannot remove a topic none of whose replicas is placed here");
        }
    }

    async fn local_replica(&self, topic: &str, p: u32, record: &TopicMeta) -> Result<Arc<Partition>> {
        let t = match self.core.topic(topic) {
            Ok(t) => t,
            Err(_) => self.core.ensure_replicas(topic, record).await?,
        };
        if t.id() != record.topic_id || t.meta().replication.is_single() {
            return Err(BrokerError::Cluster(format!(
                "a local topic \"{topic}\" (id {}) is in the way of the cluster's replicated topic of id {}",
                t.id(),
                record.topic_id
            )));
        }
        self.core.open_replica(topic, p).await
    }

    async fn apply_role(
        &self,
        part: &Arc<Partition>,
        record: &TopicMeta,
        state: &PartitionState,
        revision: i64,
        snap: &Snapshot,
    ) -> Result<()> {
        let Some(replica) = part.replica() else { return Ok(()) };
        let key = (part.topic().to_owned(), part.index());
        let role = replica.role();
        replica.learn_leader(state.leader_epoch, state.leader);
        if state.leader == self.s.me {
            let was = matches!(&role, Role::Leader(l) if l.epoch == state.leader_epoch);
            if !was && !self.serving.may_begin(replica, state.leader_epoch) {
                // A failsafe promise to the old leader runs: it may still act until then, so this one waits.
                if !matches!(role, Role::Idle) {
                    self.stop_fetcher(&key).await;
                    replica.step_down();
                }
                tracing::info!(
                    topic = part.topic(),
                    partition = part.index(),
                    leader_epoch = state.leader_epoch,
                    "elected, but a failsafe promise to the previous leader still runs; leading once it ends"
                );
                return Ok(());
            }
            if !was {
                self.stop_fetcher(&key).await;
            }
            part.become_leader(state, revision).await?;
            serving::advance(part);
            if !was {
                self.events.note(Event::LeaderChange);
                tracing::info!(
                    event = "leader_change",
                    topic = part.topic(),
                    partition = part.index(),
                    leader = self.s.me,
                    leader_epoch = state.leader_epoch,
                    isr = ?state.isr,
                    log_end_offset = part.log().log_end_offset(),
                    "this broker leads the partition"
                );
            }
            return Ok(());
        }
        if state.leader == 0 {
            if !matches!(role, Role::Idle) {
                self.stop_fetcher(&key).await;
                replica.step_down();
            }
            return Ok(());
        }
        let same = matches!(&role, Role::Follower { leader, epoch, .. } if *leader == state.leader && *epoch == state.leader_epoch);
        let running = self
            .fetchers
            .lock()
            .await
            .get(&key)
            .is_some_and(|f| f.leader == state.leader && f.epoch == state.leader_epoch && !f.task.is_finished());
        if same && running {
            return Ok(());
        }
        let Some(client) = self.peer(state.leader, snap) else { return Ok(()) };
        self.stop_fetcher(&key).await;
        let address = snap.brokers.get(&state.leader).cloned().unwrap_or_default();
        if matches!(role, Role::Leader(_)) {
            self.events.note(Event::Fenced);
            tracing::info!(
                event = "fenced",
                topic = part.topic(),
                partition = part.index(),
                leader = state.leader,
                leader_epoch = state.leader_epoch,
                "deposed: another broker leads at a newer epoch; following it"
            );
        }
        part.become_follower(state.leader, state.leader_epoch, address).await;
        let follow = Follow {
            me: self.s.me,
            leader: state.leader,
            epoch: state.leader_epoch,
            topic_id: record.topic_id.clone(),
            max_bytes: (self.s.max_message as u64 / 2).max(64 * 1024),
            max_wait: Duration::from_millis(500),
            retry: self.s.beat,
            events: Arc::clone(&self.events),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(follower::run(Arc::clone(part), client, follow, stop.clone()));
        self.fetchers.lock().await.insert(key, Fetcher { leader: state.leader, epoch: state.leader_epoch, stop, task });
        Ok(())
    }

    async fn stop_fetcher(&self, key: &(String, u32)) {
        let fetcher = self.fetchers.lock().await.remove(key);
        if let Some(f) = fetcher {
            f.stop.cancel();
            let _ = f.task.await;
        }
    }

    /// A client of broker `id`, dialled at its `peer_addrs` override or its registered address.
    pub(crate) fn peer(&self, id: u32, snap: &Snapshot) -> Option<PeerClient> {
        let address = self.s.peer_addrs.get(&id).or_else(|| snap.brokers.get(&id))?.clone();
        let mut peers = self.peers.lock();
        if let Some((a, c)) = peers.get(&id)
            && *a == address
        {
            return Some(c.clone());
        }
        let client = self.s.links.client(&address, self.s.ttl, self.s.max_message)?;
        peers.insert(id, (address, client.clone()));
        Some(client)
    }

    /// As leader: lagging followers out of the ISR, caught-up ones in (`core::isr::change`), each by
    /// compare-and-swap at this leader's epoch. A follower being added counts for the HW from the proposal on; one
    /// being removed until etcd accepted its removal.
    async fn maintain_isr(&self, etcd: &mut Client) {
        let now = Instant::now();
        for topic in self.core.topics() {
            for part in topic.partitions() {
                let Some(replica) = part.replica() else { continue };
                let hw = replica.hw();
                let decided = replica.with_leading(|l| {
                    let input = isr::IsrInput {
                        me: self.s.me,
                        isr: &l.isr,
                        replicas: &l.replicas,
                        followers: &l.followers,
                        hw,
                        epoch_start: l.epoch_start,
                        lag: self.s.replica_lag,
                        now,
                    };
                    let proposal = isr::change(&input)?;
                    l.proposed = proposal.added.clone();
                    Some((l.epoch, l.revision, l.isr.len(), l.with_isr(proposal.isr.clone()), proposal))
                });
                let Ok(Some((epoch, revision, before, state, proposal))) = decided else { continue };
                serving::advance(&part);
                match catalog::swap_partition(etcd, part.topic(), part.index(), revision, &state, None).await {
                    Ok(Some(revision)) => {
                        let taken = replica.with_leading(|l| {
                            if l.epoch != epoch {
                                return false;
                            }
                            for id in &state.isr {
                                if let Some(p) = l.followers.get_mut(id).filter(|p| p.verified) {
                                    p.unverified_seen = false;
                                }
                            }
                            l.isr = state.isr.clone();
                            l.state.isr = state.isr.clone();
                            l.revision = revision;
                            l.proposed.clear();
                            true
                        });
                        if taken == Ok(true) {
                            serving::advance(&part);
                            replica.notify();
                            self.note_risk(&part, before, state.isr.len());
                            let event = if proposal.removed.is_empty() { Event::IsrExpand } else { Event::IsrShrink };
                            self.events.note(event);
                            tracing::info!(
                                event = event.name(),
                                topic = part.topic(),
                                partition = part.index(),
                                leader_epoch = epoch,
                                removed = ?proposal.removed,
                                added = ?proposal.added,
                                isr = ?state.isr,
                                high_watermark = replica.hw(),
                                "in-sync set changed"
                            );
                        }
                    }
                    outcome => {
                        let _ = replica.with_leading(|l| l.proposed.clear());
                        match outcome {
                            Ok(_) => tracing::info!(
                                event = "isr_change_refused",
                                topic = part.topic(),
                                partition = part.index(),
                                leader_epoch = epoch,
                                "etcd refused the in-sync set change: the partition's state moved on"
                            ),
                            Err(e) => tracing::debug!(error = %e, "ISR change failed; retried next beat"),
                        }
                    }
                }
            }
        }
    }

    /// A double_write partition in the risk phase (writes acknowledged with one replica) enters it when its
    /// in-sync set shrinks to the leader alone, and leaves it when a second replica is back in sync: an event each.
    fn note_risk(&self, part: &Partition, before: usize, after: usize) {
        if part.replica().is_none_or(|r| r.min_insync() >= 2) || (before < 2) == (after < 2) {
            return;
        }
        let (event, what) = if after < 2 {
            (
                Event::RiskPhaseEntered,
                "risk phase: writes are acknowledged by the leader alone until a second replica is in sync",
            )
        } else {
            (Event::RiskPhaseLeft, "risk phase over: two replicas are in sync again")
        };
        self.events.note(event);
        tracing::warn!(event = event.name(), topic = part.topic(), partition = part.index(), "{what}");
    }

    /// The mirror's truncation of `part`, which this broker leads: the partition's state in etcd moves to the
    /// next leader epoch (same leader, same ISR) before the log is cut, so every follower truncates to the new
    /// log end when it reconciles with that epoch. Returns the new log end offset.
    pub async fn truncate_leading(&self, part: &Partition, offset: u64) -> Result<u64> {
        let mut etcd = self.etcd.clone();
        let (topic, index) = (part.topic().to_owned(), part.index());
        let leo = part
            .truncate_leading(offset, |l| async move {
                let epoch = l.epoch + 1;
                let state = PartitionState { leader_epoch: epoch, ..l.state };
                match catalog::swap_partition(&mut etcd, &topic, index, l.revision, &state, None).await {
                    Ok(Some(revision)) => Ok((epoch, revision)),
                    Ok(None) => Err(BrokerError::Cluster(format!(
                        "{topic}/{index}: the partition's state in etcd moved on (a leader or ISR change); try again"
                    ))),
                    Err(e) => Err(BrokerError::Cluster(format!("cannot reach etcd: {e}"))),
                }
            })
            .await?;
        self.events.note(Event::LeaderChange);
        tracing::info!(
            event = "leader_change",
            topic = part.topic(),
            partition = part.index(),
            leader = self.s.me,
            leader_epoch = part.replica().map_or(0, |r| r.leader_epoch()),
            log_end_offset = leo,
            "truncated by the mirror: a new leader epoch starts at the new log end"
        );
        self.kick.notify_one();
        Ok(leo)
    }

    /// The NOT_LEADER error for a partition this broker holds no replica of, from the catalog; `None` when the
    /// catalog does not have it either.
    pub fn not_here(&self, topic: &str, p: u32) -> Option<BrokerError> {
        let snap = self.snap.read();
        let v = snap.partitions.get(&(topic.to_owned(), p))?;
        Some(BrokerError::NotLeader {
            topic: topic.to_owned(),
            partition: p,
            leader: v.state.leader,
            address: snap.brokers.get(&v.state.leader).cloned().unwrap_or_default(),
            epoch: v.state.leader_epoch,
        })
    }
}

/// How long each stage of one beat took, to name a beat that ran long (a stage waiting on a lock or a peer).
struct Stages {
    started: Instant,
    last: Instant,
    took: Vec<(&'static str, Duration)>,
}

impl Stages {
    fn new(started: Instant) -> Stages {
        Stages { started, last: Instant::now(), took: vec![("catalog", Instant::now() - started)] }
    }

    fn done(&mut self, stage: &'static str) {
        let now = Instant::now();
        self.took.push((stage, now - self.last));
        self.last = now;
    }

    /// Logs the stages when the beat took longer than `limit`.
    fn report(&self, limit: Duration) {
        let total = self.started.elapsed();
        if total > limit {
            tracing::warn!(event = "slow_beat", ?total, stages = ?self.took, "a beat of the replication manager ran long");
        }
    }
}

/// Whether the local topic `name` is another topic than the catalog's of id `topic_id` (one in the way, or none).
fn part_of_other_topic(core: &BrokerCore, name: &str, topic_id: &str) -> bool {
    core.topic(name).map_or(true, |t| t.id() != topic_id || t.meta().replication.is_single())
}
