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

use ferry_client::RetryPolicy;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::egress::{ActiveRoute, EgressHandle};
use crate::lane::link::LaneLink;
use crate::tp::SourceTp;

/// The partitions one session serves.
#[derive(Debug, Clone, Default)]
pub struct PartitionSet {
    inner: Arc<SetInner>,
}

#[derive(Debug, Default)]
struct SetInner {
    lanes: Mutex<BTreeMap<SourceTp, Arc<LaneLink>>>,
    version: AtomicU64,
    changed: Arc<Notify>,
}

impl PartitionSet {
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
}

/// One fetch session over one route.
#[async_trait::async_trait]
pub trait FetchSession: Send {
    /// Fetches the set's partitions over `route` until it fails or `stop`. A route switch drops the future.
    async fn run(&mut self, route: Arc<ActiveRoute>, set: &PartitionSet, stop: &CancellationToken) -> SessionEnd;
}

/// Builds a session for a route.
pub type SessionFactory = Box<dyn Fn() -> Box<dyn FetchSession> + Send + Sync>;

/// One session per source broker, restarted under the retry policy.
pub struct Fetcher {
    sets: BTreeMap<String, PartitionSet>,
    egress: EgressHandle,
    retry: RetryPolicy,
    factory: Arc<SessionFactory>,
    tasks: tokio_util::task::TaskTracker,
    stop: CancellationToken,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher").field("sessions", &self.sets.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

/// The key of the session that serves every partition while the source is one broker per route (a cluster
/// source keys each partition by its leader).
const SINGLE: &str = "route";

impl Fetcher {
    /// A fetcher whose sessions come from `factory`, stopped by `stop`.
    pub fn new(egress: EgressHandle, retry: RetryPolicy, factory: SessionFactory, stop: CancellationToken) -> Fetcher {
        Fetcher {
            sets: BTreeMap::new(),
            egress,
            retry,
            factory: Arc::new(factory),
            tasks: tokio_util::task::TaskTracker::new(),
            stop,
        }
    }

    /// The set that serves `tp`, with its session started if it is new.
    fn set_for(&mut self, _tp: &SourceTp) -> &PartitionSet {
        if !self.sets.contains_key(SINGLE) {
            let set = PartitionSet::default();
            let fetch = FetchLoop {
                set: set.clone(),
                egress: self.egress.clone(),
                retry: self.retry,
                factory: Arc::clone(&self.factory),
            };
            self.tasks.spawn(fetch.run(self.stop.clone()));
            self.sets.insert(SINGLE.to_owned(), set);
        }
        &self.sets[SINGLE]
    }

    /// The signal lanes raise when they re-seat: the one of the set that serves `tp`.
    pub fn changed_for(&mut self, tp: &SourceTp) -> Arc<Notify> {
        self.set_for(tp).changed()
    }

    /// Starts fetching a lane's partition (from when the lane seats itself).
    pub fn assign(&mut self, link: Arc<LaneLink>) {
        let tp = link.tp.clone();
        self.set_for(&tp).insert(link);
    }

    /// Stops fetching a partition.
    pub fn unassign(&mut self, tp: &SourceTp) {
        for set in self.sets.values() {
            set.remove(tp);
        }
    }

    /// Stops every session and waits for them.
    pub async fn shut_down(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
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
        let mut attempt = 0u32;
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
                    _ = tokio::time::sleep(self.retry.delay(attempt)) => {}
                    _ = routes.changed() => {}
                }
                attempt = attempt.saturating_add(1);
                continue;
            }
            let end = tokio::select! {
                end = session.run(Arc::clone(&route), &self.set, &stop) => end,
                changed = routes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tracing::info!(from = %route.name, to = %routes.borrow().name, "route changed; restarting the fetch session");
                    attempt = 0;
                    continue;
                }
            };
            match end {
                SessionEnd::Shutdown => return,
                SessionEnd::Failed(reason) => {
                    tracing::warn!(route = %route.name, %reason, "source fetch session failed");
                    self.egress.report_failure(&route.name, &reason);
                    route.cluster.reconnect();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(self.retry.delay(attempt)) => {}
                        _ = routes.changed() => {}
                    }
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }
}
