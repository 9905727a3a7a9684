//! Building the service (its parts, set once at start-up) and the helpers every call shares: where a partition is,
//! how a write is acknowledged, and the timestamp lookup's bounded decodes.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::BrokerService;
use crate::cluster::manager::Replication;
use crate::error::BrokerError;
use crate::groups::GroupCoordinator;
use crate::node::partition::{Partition, Produced};
use crate::node::registry::{BrokerCore, Topic};
use crate::state::StateLogs;

impl BrokerService {
    /// A service over `core` and `groups`.
    pub fn new(
        core: Arc<BrokerCore>,
        groups: Arc<GroupCoordinator>,
        advertised: String,
        max_fetch_wait: Duration,
        decode_concurrency: usize,
        shutdown: CancellationToken,
    ) -> BrokerService {
        let max_batch_bytes = core.defaults().max_batch_bytes;
        let state = Arc::new(StateLogs::new(Arc::clone(&core), None));
        let txn_settings = crate::txn::Settings::of(&crate::config::TransactionsSection::default(), max_batch_bytes);
        let txns = Arc::new(crate::txn::Transactions::new(Arc::clone(&state), Arc::clone(&core), None, txn_settings));
        BrokerService {
            core,
            groups,
            advertised,
            max_batch_bytes,
            max_fetch_wait,
            round_robin: Arc::new(AtomicU32::new(0)),
            fetch_turns: Arc::new(AtomicU32::new(0)),
            decodes: Arc::new(Semaphore::new(decode_concurrency.max(1))),
            shutdown,
            state,
            jobs: Arc::new(crate::state::Owners::new(&crate::jobs::JOBS_TOPIC)),
            txns,
            delays: None,
            shares: Arc::new(crate::share::shares()),
            redrives: Arc::default(),
            share_gauges: Default::default(),
            replication: None,
            coordinator_loads: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Serves a cluster member's replicated topics through `replication`.
    pub fn with_replication(mut self, replication: Arc<Replication>) -> BrokerService {
        self.replication = Some(replication);
        self
    }

    /// Keeps the internal state topics through `state` (built over the same core and replication).
    pub fn with_state(mut self, state: Arc<StateLogs>) -> BrokerService {
        self.state = state;
        self
    }

    /// Keeps transactional messages through `txns` (built over the same state logs).
    pub fn with_transactions(mut self, txns: Arc<crate::txn::Transactions>) -> BrokerService {
        self.txns = txns;
        self
    }

    /// Reports the message-model groups owned here in `gauges`.
    pub fn with_share_gauges(mut self, gauges: crate::share::gauges::ShareGauges) -> BrokerService {
        self.share_gauges = gauges;
        self
    }

    /// Serves delayed delivery through `delays`.
    pub fn with_delays(mut self, delays: Arc<crate::delay::Delays>) -> BrokerService {
        self.delays = Some(delays);
        self
    }

    /// Looks up a topic for produce: one this broker holds no replica of, but the catalog has, is NOT_LEADER.
    pub(super) fn local_topic(&self, name: &str, partition: Option<u32>) -> Result<Arc<Topic>, BrokerError> {
        self.core
            .topic(name)
            .map_err(|e| self.replication.as_ref().and_then(|r| r.not_here(name, partition.unwrap_or(0))).unwrap_or(e))
    }

    /// Partition `p` of `topic` for a call that only its leader may answer: a replicated partition this member
    /// holds no replica of is NOT_LEADER naming the leader the catalog names (rather than no one).
    pub(super) fn placed(&self, topic: &Topic, p: u32) -> Result<Arc<Partition>, BrokerError> {
        topic.partition(p).map_err(|e| match e {
            BrokerError::NotLeader { leader: 0, ref topic, partition, .. } => {
                let named = self.replication.as_ref().and_then(|r| r.not_here(topic, partition));
                named.filter(|n| matches!(n, BrokerError::NotLeader { leader, .. } if *leader != 0)).unwrap_or(e)
            }
            e => e,
        })
    }

    /// The serving side of a cluster member.
    pub(super) fn serving(&self) -> Option<&crate::cluster::serving::Serving> {
        self.replication.as_ref().map(|r| r.serving())
    }

    /// A produce to `part`, through the serving side on a cluster member.
    pub(super) async fn produce_to(&self, part: &Partition, batches: bytes::Bytes) -> Result<Produced, BrokerError> {
        match self.serving() {
            Some(s) => s.produce(part, batches).await,
            None => part.produce(batches).await,
        }
    }

    /// Waits until `produced` is acknowledged by `part`'s in-sync set (at once on a single broker).
    pub(super) async fn acknowledged(&self, part: &Partition, produced: &Produced) -> Result<(), BrokerError> {
        match &self.replication {
            Some(r) => r.serving().await_ack(part, produced, r.ack_timeout()).await,
            None => Ok(()),
        }
    }

    pub(super) fn replication(&self) -> Result<&Arc<Replication>, BrokerError> {
        self.replication.as_ref().ok_or_else(|| {
            BrokerError::Cluster(
                "this broker runs alone: replicated topics need a cluster member (start it with --etcd and \
                 --broker-id)"
                    .into(),
            )
        })
    }

    /// `offset_for_timestamp` may decode record bodies: it runs on the blocking pool, at most
    /// `decode_concurrency` at once, so a hostile batch can neither stall the async workers nor multiply its
    /// (bounded) decode memory by the number of callers.
    pub(super) async fn lookup_timestamp(&self, p: &Partition, ts: i64) -> Result<Option<u64>, BrokerError> {
        let _permit =
            self.decodes.acquire().await.map_err(|_| BrokerError::Internal("the decode limiter is closed".into()))?;
        let log = Arc::clone(p.log());
        tokio::task::spawn_blocking(move || log.offset_for_timestamp(ts))
            .await
            .map_err(|e| BrokerError::Internal(format!("timestamp lookup task failed: {e}")))?
            .map_err(|e| BrokerError::storage(p.topic(), p.index(), e))
    }
}
