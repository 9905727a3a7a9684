//! The fetch path: sessions that carry many partitions from the source to their lanes, and the one restart
//! protocol every kind of session shares.
//!
//! - A [`PartitionSet`] is what one session serves: the lanes' links, written only by the SyncManager. Each lane
//!   publishes its seat (where it wants to be fetched from, and the tag its data must carry) in its link.
//! - A [`FetchSession`] is one connection to one source broker (a Ferry `Subscribe` stream) or one Kafka consumer.
//!   It starts each seated partition at the lane's fetch position, grants credit from the lane's budget, delivers
//!   data, positions and errors into the link, and follows seat changes and set changes as they come.
//! - The [`Fetcher`] keeps one session per source broker. When a session ends (a failure, a route switch), it
//!   reports the failure to the Egress, backs off under the retry policy, and starts a new one over the active
//!   route, where every partition resumes at its lane's fetch position. Nothing waits for the lanes: what a lane
//!   still holds from the old session is filtered by its seat and offsets, so a stuck lane delays only itself.
//!   A partition whose broker changes moves from one session's set to the other's the same way.

pub mod ferry;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_client::RetryPolicy;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::egress::{ActiveRoute, EgressHandle};
use crate::lane::link::LaneLink;
use crate::tp::SourceTp;

/// Moves a partition to the session of another source broker: `(partition, leader broker id)`, 0 for the route's
/// listed brokers.
pub type Relocate = Arc<dyn Fn(&SourceTp, u32) + Send + Sync>;

/// The partitions one session serves.
#[derive(Clone, Default)]
pub struct PartitionSet {
    inner: Arc<SetInner>,
}

impl std::fmt::Debug for PartitionSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionSet").field("leader", &self.inner.leader).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct SetInner {
    lanes: Mutex<BTreeMap<SourceTp, Arc<LaneLink>>>,
    version: AtomicU64,
    changed: Arc<Notify>,
    /// The source broker this set's session fetches from: 0 for the route's listed brokers (a single broker, or
    /// a cluster's partitions whose leader is not known yet), else a cluster member's id.
    leader: u32,
    relocate: Option<Relocate>,
}

impl PartitionSet {
    /// The set of the partitions led by broker `leader` (0: the route's listed brokers), whose session moves a
    /// partition to another leader's set through `relocate`.
    pub fn for_leader(leader: u32, relocate: Relocate) -> PartitionSet {
        PartitionSet { inner: Arc::new(SetInner { leader, relocate: Some(relocate), ..SetInner::default() }) }
    }

    /// The source broker this set's session fetches from (0: the route's listed brokers).
    pub fn leader(&self) -> u32 {
        self.inner.leader
    }

    /// Moves `tp` to the session of broker `leader` (0: the route's listed brokers), as a NOT_LEADER answer or a
    /// failed connection says.
    pub fn relocate(&self, tp: &SourceTp, leader: u32) {
        if let Some(r) = &self.inner.relocate {
            r(tp, leader);
        }
    }

    /// The signal of every change: a partition added or removed, or one of its lanes re-seated.
    pub fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.inner.changed)
    }

    /// Adds a lane.
    pub fn insert(&self, link: Arc<LaneLink>) {
        self.inner.lanes.lock().insert(link.tp.clone(), link);
        self.bump();
    }

    /// Removes a lane.
    pub fn remove(&self, tp: &SourceTp) {
        if self.inner.lanes.lock().remove(tp).is_some() {
            self.bump();
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.lanes.lock().is_empty()
    }

    /// The lanes now, with the set's version.
    pub fn snapshot(&self) -> (u64, Vec<Arc<LaneLink>>) {
        let lanes = self.inner.lanes.lock();
        (self.inner.version.load(Ordering::Acquire), lanes.values().cloned().collect())
    }

    fn bump(&self) {
        self.inner.version.fetch_add(1, Ordering::AcqRel);
        self.inner.changed.notify_one();
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The process is stopping.
    Shutdown,
    /// The session failed; the reason counts as a failure of the route.
    Failed(String),
    /// Every partition moved to another broker's session: nothing is left to fetch here (not a failure).
    Drained,
}

/// One fetch session over one route.
#[async_trait::async_trait]
pub trait FetchSession: Send {
    /// Fetches the set's partitions over `route` until it fails or `stop`. A route switch drops the future.
    async fn run(&mut self, route: Arc<ActiveRoute>, set: &PartitionSet, stop: &CancellationToken) -> SessionEnd;
}

/// Builds a session for a route.
pub type SessionFactory = Box<dyn Fn() -> Box<dyn FetchSession> + Send + Sync>;

/// One session per source broker, restarted under the retry policy. A single-broker source (and a cluster's
/// partitions whose leader is not known yet) is served by one session over the route's listed brokers; a cluster's
/// partition moves to its leader's session as the NOT_LEADER answers name it, and back when that session fails.
pub struct Fetcher {
    inner: Arc<FetcherInner>,
}

struct FetcherInner {
    /// Sessions by source broker id (0: the route's listed brokers).
    sets: Mutex<BTreeMap<u32, PartitionSet>>,
    /// Each partition's link and the broker whose session serves it.
    links: Mutex<BTreeMap<SourceTp, (u32, Arc<LaneLink>)>>,
    egress: EgressHandle,
    retry: RetryPolicy,
    factory: Arc<SessionFactory>,
    tasks: tokio_util::task::TaskTracker,
    stop: CancellationToken,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sessions: Vec<u32> = self.inner.sets.lock().keys().copied().collect();
        f.debug_struct("Fetcher").field("sessions", &sessions).finish_non_exhaustive()
    }
}

/// The session of the route's listed brokers.
const ROUTE: u32 = 0;
/// The longest wait before the partitions of a failed leader session go back to the route's brokers.
const LEADER_RETRY_MAX: Duration = Duration::from_secs(1);

impl Fetcher {
    /// A fetcher whose sessions come from `factory`, stopped by `stop`.
    pub fn new(egress: EgressHandle, retry: RetryPolicy, factory: SessionFactory, stop: CancellationToken) -> Fetcher {
        Fetcher {
            inner: Arc::new(FetcherInner {
                sets: Mutex::new(BTreeMap::new()),
                links: Mutex::new(BTreeMap::new()),
                egress,
                retry,
                factory: Arc::new(factory),
                tasks: tokio_util::task::TaskTracker::new(),
                stop,
            }),
        }
    }

    /// The signal lanes raise when they re-seat: the one of the set that serves `tp` (the route's, at first).
    pub fn changed_for(&mut self, tp: &SourceTp) -> Arc<Notify> {
        let leader = self.inner.links.lock().get(tp).map_or(ROUTE, |(l, _)| *l);
        FetcherInner::set_for(&self.inner, leader).changed()
    }

    /// Starts fetching a lane's partition (from when the lane seats itself).
    pub fn assign(&mut self, link: Arc<LaneLink>) {
        let set = FetcherInner::set_for(&self.inner, ROUTE);
        link.serve_from(set.changed());
        self.inner.links.lock().insert(link.tp.clone(), (ROUTE, Arc::clone(&link)));
        set.insert(link);
    }

    /// Stops fetching a partition.
    pub fn unassign(&mut self, tp: &SourceTp) {
        if let Some((leader, _)) = self.inner.links.lock().remove(tp)
            && let Some(set) = self.inner.sets.lock().get(&leader)
        {
            set.remove(tp);
        }
    }

    /// Stops every session and waits for them.
    pub async fn shut_down(self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl FetcherInner {
    /// The set of broker `leader`, with its session started if it is new.
    fn set_for(this: &Arc<FetcherInner>, leader: u32) -> PartitionSet {
        let mut sets = this.sets.lock();
        if let Some(set) = sets.get(&leader) {
            return set.clone();
        }
        let weak = Arc::downgrade(this);
        let relocate: Relocate = Arc::new(move |tp: &SourceTp, to: u32| {
            if let Some(inner) = weak.upgrade() {
                FetcherInner::relocate(&inner, tp, to);
            }
        });
        let set = PartitionSet::for_leader(leader, relocate);
        let fetch = FetchLoop {
            set: set.clone(),
            egress: this.egress.clone(),
            retry: this.retry,
            factory: Arc::clone(&this.factory),
        };
        this.tasks.spawn(fetch.run(this.stop.clone()));
        sets.insert(leader, set.clone());
        set
    }

    /// Moves `tp` to broker `to`'s session. A move to where it is already restarts its subscription there after
    /// the retry delay (a broker that knew no leader is asked again).
    fn relocate(this: &Arc<FetcherInner>, tp: &SourceTp, to: u32) {
        let (from, link) = {
            let mut links = this.links.lock();
            let Some((from, link)) = links.get_mut(tp) else { return };
            let before = *from;
            *from = to;
            (before, Arc::clone(link))
        };
        let Some(old) = this.sets.lock().get(&from).cloned() else { return };
        if from == to {
            let (this, tp) = (Arc::clone(this), tp.clone());
            let delay = this.retry.initial_backoff;
            this.tasks.clone().spawn(async move {
                tokio::select! {
                    _ = this.stop.cancelled() => {}
                    _ = tokio::time::sleep(delay) => {
                        let set = this.sets.lock().get(&to).cloned();
                        let current = this.links.lock().get(&tp).map(|(l, link)| (*l, Arc::clone(link)));
                        if let (Some(set), Some((leader, link))) = (set, current) && leader == to {
                            set.remove(&tp);
                            set.insert(link);
                        }
                    }
                }
            });
            return;
        }
        tracing::debug!(partition = %tp, from, to, "the partition's fetch moves to its leader's session");
        old.remove(tp);
        let new = FetcherInner::set_for(this, to);
        link.serve_from(new.changed());
        new.insert(link);
    }
}

/// The restart protocol of one broker's session.
struct FetchLoop {
    set: PartitionSet,
    egress: EgressHandle,
    retry: RetryPolicy,
    factory: Arc<SessionFactory>,
}

impl FetchLoop {
    async fn run(self, stop: CancellationToken) {
        let mut routes: watch::Receiver<Arc<ActiveRoute>> = self.egress.subscribe();
        let mut session = (self.factory)();
        let changed = self.set.changed();
        let mut backoff = self.retry.backoff();
        loop {
            // Without partitions there is nothing to fetch: wait for work.
            while self.set.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = changed.notified() => {}
                }
            }
            let route = routes.borrow_and_update().clone();
            // A route into another cluster is never fetched from, pinned or not.
            if let Some(reason) = self.egress.leads_elsewhere(&route.name) {
                tracing::error!(route = %route.name, %reason, "not fetching over a route into another cluster");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next().unwrap_or_default()) => {}
                    _ = routes.changed() => {}
                }
                continue;
            }
            let started = tokio::time::Instant::now();
            let end = tokio::select! {
                end = session.run(Arc::clone(&route), &self.set, &stop) => end,
                changed = routes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tracing::info!(from = %route.name, to = %routes.borrow().name, "route changed; restarting the fetch session");
                    backoff = self.retry.backoff();
                    continue;
                }
            };
            match end {
                SessionEnd::Shutdown => return,
                SessionEnd::Drained => backoff = self.retry.backoff(),
                SessionEnd::Failed(reason) if self.set.leader() != ROUTE => {
                    // A leader's session failed (it died, or leads elsewhere now): its partitions go back to the
                    // route's brokers, whose answers name the new leaders. The route itself is judged by its own.
                    tracing::info!(route = %route.name, leader = self.set.leader(), %reason, "a source leader's fetch session failed; asking the route's brokers");
                    // Not at once: until the cluster elects another leader the route's brokers still name this one,
                    // and each round trip to a dead broker would be immediate. A session that ran a while resets the
                    // backoff; the wait stays short, for a failover not to wait on it.
                    if started.elapsed() > LEADER_RETRY_MAX {
                        backoff = self.retry.backoff();
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next().unwrap_or_default().min(LEADER_RETRY_MAX)) => {}
                    }
                    let (_, lanes) = self.set.snapshot();
                    for link in lanes {
                        self.set.relocate(&link.tp, ROUTE);
                    }
                }
                SessionEnd::Failed(reason) => {
                    tracing::warn!(route = %route.name, %reason, "source fetch session failed");
                    self.egress.report_failure(&route.name, &reason);
                    route.cluster.reconnect();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next().unwrap_or_default()) => {}
                        _ = routes.changed() => {}
                    }
                }
            }
        }
    }
}
