//! Broker-side state kept as records: a feature's state (queue progress, delayed records, transactions) lives in an
//! internal state topic (`node::internal`), and the broker that owns one of its partitions holds that partition's
//! state in memory, rebuilt by replaying the partition's log.
//!
//! - **Ownership.** On a single broker every partition is owned here. On a cluster the partition's leader owns it,
//!   while it may act as leader (its lease, or the failsafe): the same rule as any write. Anyone else answers
//!   NOT_LEADER naming the leader of that internal partition.
//! - **Loading.** [`Owners::lock`] replays a partition's log into a fresh state when this broker owns it at a leader
//!   epoch it has not loaded yet, so a new owner starts from every record its predecessor wrote (the leader's log
//!   holds every acknowledged record).
//! - **Writing.** A change is decided on the state under the partition's lock, written as records, and applied to
//!   the state once the in-sync replicas hold it ([`OwnerGuard::write`]): the same `apply` the replay runs, so the
//!   memory never holds what a replay would not rebuild. A failed write marks the state stale; the next lock
//!   replays it.
//! - **Compaction.** [`OwnerGuard::compact`] writes the whole state again and then drops the segments before it.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use ferry_batch::{BatchBuilder, Compression, ProducerInfo, Record};
use parking_lot::Mutex;

use crate::cluster::manager::Replication;
use crate::error::{BrokerError, Result};
use crate::node::internal::InternalTopic;
use crate::node::partition::{Partition, Produced};
use crate::node::registry::{BrokerCore, now_ms};

/// Most record bytes in one written batch.
const BATCH_BYTES: usize = 256 * 1024;
/// Most bytes read per step of a replay.
const REPLAY_STEP: u64 = 4 << 20;

/// A state that a partition's records rebuild (an [`Owners`] state also needs `Default`; a state built over
/// resources, such as the delay timer's on-disk index, is handed to [`StateLogs::replay`] ready-made).
pub trait Replayed: Send + 'static {
    /// Applies the record at `offset` (written by this feature's [`OwnerGuard::write`] or a compaction).
    fn apply(&mut self, offset: u64, record: &Record);
}

/// One record to write: a key and a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Which part of the state the record is about (compaction and retention are per key).
    pub key: Bytes,
    /// The change.
    pub value: Bytes,
}

/// An internal partition this broker owns, at a leader epoch (0 on a single broker).
#[derive(Debug, Clone)]
pub struct Owned {
    /// The partition.
    pub part: Arc<Partition>,
    /// Its index.
    pub k: u32,
    /// The leader epoch it is owned at.
    pub epoch: u32,
}

/// Writes and reads internal state topics, on a single broker or through a cluster member's serving side.
#[derive(Debug)]
pub struct StateLogs {
    core: Arc<BrokerCore>,
    replication: Option<Arc<Replication>>,
}

impl StateLogs {
    /// Over `core`, with a cluster member's `replication`.
    pub fn new(core: Arc<BrokerCore>, replication: Option<Arc<Replication>>) -> StateLogs {
        StateLogs { core, replication }
    }

    /// The broker's topics.
    pub fn core(&self) -> &Arc<BrokerCore> {
        &self.core
    }

    /// A cluster member's replication manager.
    pub fn replication(&self) -> Option<&Arc<Replication>> {
        self.replication.as_ref()
    }

    /// Writes `batch` to `part` (any partition: a feature's effect on a user topic, such as a delayed record
    /// falling due) and waits until its in-sync replicas hold it; on a cluster only its leader may.
    pub async fn produce_to(&self, part: &Partition, batch: Bytes) -> Result<Produced> {
        let produced = match &self.replication {
            Some(r) => r.serving().produce(part, batch).await?,
            None => part.produce(batch).await?,
        };
        if let Some(r) = &self.replication {
            r.serving().await_ack(part, &produced, r.ack_timeout()).await?;
        }
        Ok(produced)
    }

    /// Partition `k` of `t`, when this broker owns it now; otherwise NOT_LEADER naming its leader (or a cluster
    /// error while the controller has not created the topic yet).
    pub fn own(&self, t: &InternalTopic, k: u32) -> Result<Owned> {
        let part = match self.core.partition(t.name, k) {
            Ok(part) => part,
            Err(e) => {
                return Err(match self.replication.as_ref().and_then(|r| r.not_here(t.name, k)) {
                    Some(not_here) => not_here,
                    None if self.replication.is_some() => BrokerError::Cluster(format!(
                        "the internal topic {} does not exist yet: the controller creates it once three brokers \
                         are live; retry",
                        t.name
                    )),
                    None => e,
                });
            }
        };
        let epoch = match &self.replication {
            Some(r) => r.serving().check_leading(&part, None)?,
            None => 0,
        };
        Ok(Owned { part, k, epoch })
    }

    /// The partitions of `t` this broker owns now (for a feature's background work, such as timers).
    pub fn owned(&self, t: &InternalTopic) -> Vec<Owned> {
        (0..t.partitions).filter_map(|k| self.own(t, k).ok()).collect()
    }

    /// Writes `entries` to `owned` and waits until its in-sync replicas hold them. Refused when the partition's
    /// leader epoch moved on since it was owned.
    pub async fn append(&self, owned: &Owned, entries: &[Entry]) -> Result<Vec<Produced>> {
        let mut written = Vec::new();
        for batch in encode(entries) {
            let produced = match &self.replication {
                Some(r) => r.serving().produce(&owned.part, batch).await?,
                None => owned.part.produce(batch).await?,
            };
            if produced.leader_epoch != owned.epoch {
                return Err(BrokerError::Cluster(format!(
                    "{}/{} changed leader epoch ({} -> {}) while its state was written; retry",
                    owned.part.topic(),
                    owned.k,
                    owned.epoch,
                    produced.leader_epoch
                )));
            }
            written.push(produced);
        }
        if let Some(r) = &self.replication {
            for produced in &written {
                r.serving().await_ack(&owned.part, produced, r.ack_timeout()).await?;
            }
        }
        Ok(written)
    }

    /// Replays `owned`'s log from its start to its end into `state`, on the blocking pool. Returns the offset
    /// after the last record.
    pub async fn replay<S: Replayed>(&self, owned: &Owned, mut state: S) -> Result<(S, u64)> {
        let part = Arc::clone(&owned.part);
        tokio::task::spawn_blocking(move || -> Result<(S, u64)> {
            let log = part.log();
            let mut offset = log.log_start_offset();
            loop {
                let read = part.read_log(offset, REPLAY_STEP)?;
                if read.batches.is_empty() {
                    return Ok((state, offset));
                }
                let bad = |e: ferry_batch::BatchError| {
                    BrokerError::Internal(format!(
                        "{}/{}: a state batch at or after {offset} does not decode: {e}",
                        part.topic(),
                        part.index()
                    ))
                };
                for (_, bytes) in ferry_batch::split_verified(&read.batches).map_err(bad)? {
                    for r in ferry_batch::decode_records(&bytes).map_err(bad)?.iter().filter(|r| r.offset >= offset) {
                        state.apply(r.offset, r);
                    }
                }
                if read.next_offset <= offset {
                    return Ok((state, offset));
                }
                offset = read.next_offset;
            }
        })
        .await
        .map_err(|e| BrokerError::Internal(format!("replaying a state partition failed: {e}")))?
    }
}

/// Encodes `entries` into batches of at most [`BATCH_BYTES`] of records each.
fn encode(entries: &[Entry]) -> Vec<Bytes> {
    let ts = now_ms();
    let mut batches = Vec::new();
    let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
    for e in entries {
        builder.push(builder.len(), ts, Some(&e.key), Some(&e.value), &[]);
        if builder.estimated_size() >= BATCH_BYTES {
            batches.push(builder.build(0, 0));
            builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        }
    }
    if !builder.is_empty() {
        batches.push(builder.build(0, 0));
    }
    batches
}

/// One partition's state and the epoch it was loaded at.
#[derive(Debug, Default)]
struct Slot<S> {
    /// `None` until loaded, or once stale.
    loaded_at: Option<u32>,
    state: S,
}

/// The states of the partitions of one internal topic this broker owns.
pub struct Owners<S: Replayed + Default> {
    topic: &'static InternalTopic,
    slots: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<Slot<S>>>>>,
}

impl<S: Replayed + Default> std::fmt::Debug for Owners<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owners").field("topic", &self.topic.name).finish_non_exhaustive()
    }
}

impl<S: Replayed + Default> Owners<S> {
    /// The states of `topic`'s partitions.
    pub fn new(topic: &'static InternalTopic) -> Owners<S> {
        Owners { topic, slots: Mutex::new(HashMap::new()) }
    }

    /// The internal topic.
    pub fn topic(&self) -> &'static InternalTopic {
        self.topic
    }

    /// Locks the state of the partition that owns `key`: see [`Owners::lock`].
    pub async fn lock_key<'a>(&self, logs: &'a StateLogs, key: &[u8]) -> Result<OwnerGuard<'a, S>> {
        self.lock(logs, self.topic.partition_of(key)).await
    }

    /// Locks partition `k`'s state, when this broker owns the partition: replayed first when this broker has not
    /// loaded it at the partition's current leader epoch. Writes to one partition are serialised by this lock.
    pub async fn lock<'a>(&self, logs: &'a StateLogs, k: u32) -> Result<OwnerGuard<'a, S>> {
        let owned = logs.own(self.topic, k)?;
        let slot = Arc::clone(self.slots.lock().entry(k).or_default());
        let mut guard = slot.lock_owned().await;
        if guard.loaded_at != Some(owned.epoch) {
            guard.loaded_at = None;
            let (state, end) = logs.replay(&owned, S::default()).await?;
            tracing::debug!(topic = self.topic.name, partition = k, epoch = owned.epoch, end, "state loaded");
            guard.state = state;
            guard.loaded_at = Some(owned.epoch);
        }
        Ok(OwnerGuard { logs, owned, slot: guard })
    }

    /// Forgets the states of partitions this broker no longer owns (they are replayed if it owns them again).
    pub fn forget_unowned(&self, logs: &StateLogs) {
        let owned: Vec<u32> = logs.owned(self.topic).iter().map(|o| o.k).collect();
        self.slots.lock().retain(|k, _| owned.contains(k));
    }
}

/// A locked, loaded partition state.
pub struct OwnerGuard<'a, S: Replayed> {
    logs: &'a StateLogs,
    owned: Owned,
    slot: tokio::sync::OwnedMutexGuard<Slot<S>>,
}

impl<S: Replayed> OwnerGuard<'_, S> {
    /// The state.
    pub fn state(&self) -> &S {
        &self.slot.state
    }

    /// The state, for changes kept in memory only (timers, in-flight requests): a replay does not rebuild them,
    /// so they must be things a new owner may start afresh.
    pub fn state_mut(&mut self) -> &mut S {
        &mut self.slot.state
    }

    /// The partition, as owned.
    pub fn owned(&self) -> &Owned {
        &self.owned
    }

    /// Writes `entries`, waits until the in-sync replicas hold them, then applies them to the state in order.
    /// On a failure the state is marked stale (replayed at the next lock), as the log may or may not hold them.
    pub async fn write(&mut self, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        match self.logs.append(&self.owned, entries).await {
            Ok(written) => {
                let mut at = written.iter().flat_map(|p| p.base_offset..=p.last_offset);
                for e in entries {
                    let offset = at.next().unwrap_or_default();
                    let record = Record {
                        offset,
                        timestamp: now_ms(),
                        key: Some(e.key.clone()),
                        value: Some(e.value.clone()),
                        headers: Vec::new(),
                    };
                    self.slot.state.apply(offset, &record);
                }
                Ok(())
            }
            Err(e) => {
                self.slot.loaded_at = None;
                Err(e)
            }
        }
    }

    /// Writes the whole state again (`snapshot`: records that rebuild it from nothing), and once the in-sync
    /// replicas hold them, deletes the segments before them. The state itself is unchanged.
    pub async fn compact(&mut self, snapshot: &[Entry]) -> Result<u64> {
        let start = self.owned.part.log().log_end_offset();
        if let Err(e) = self.logs.append(&self.owned, snapshot).await {
            self.slot.loaded_at = None;
            return Err(e);
        }
        let log = Arc::clone(self.owned.part.log());
        let deleted = tokio::task::spawn_blocking(move || log.delete_segments_before(start))
            .await
            .map_err(|e| BrokerError::Internal(format!("the compaction task failed: {e}")))?
            .map_err(|e| BrokerError::storage(self.owned.part.topic(), self.owned.k, e))?;
        Ok(deleted as u64)
    }
}

#[cfg(test)]
mod tests;
