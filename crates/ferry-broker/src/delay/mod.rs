//! Delayed delivery and the broker's durable timer.
//!
//! **The timer** ([`Delays`]) is an internal API any broker feature can use: [`Delays::schedule`] stores entries
//! (a handler kind, a stream key, a due time, a payload) durably in the internal topic `__ferry_delay`;
//! when they fall due, the broker that owns their partition calls the kind's [`Fire`] handler, registered with
//! [`Delays::register`]. Entries of one stream fire in the order they were scheduled within a second (an entry
//! waits for the earlier ones of its stream, so ordering costs at most the rest of that second), never before their
//! due time, and [`Delays::cancel`] withdraws one that has not fired. Delayed produce is kind
//! [`produce::KIND`]; a queue group's retry backoff would be another kind keyed by its group and partition.
//!
//! **Exactly once.** Before a handler runs, the owner writes an *intent* record naming the entries and their
//! numbers within the stream (`first_seq`..), and waits until the in-sync replicas hold it; only then does it call
//! the handler, and afterwards it writes a *fired* record. A new owner (after a crash, a restart or a leader
//! change) calls the handler again for every intent without a fired record, with the same entries and numbers, so a
//! handler that is idempotent on (stream, number) performs each entry once. At most one firing per stream is in
//! flight, so a retry is always the stream's latest.
//!
//! **Memory** is O(slots + streams): the pending entries live in the log and in the on-disk wheel
//! (`wheel`); only the entries of the slots that have come round (one second's worth) are held while they fire.
//!
//! Ownership and replication follow `crate::state`: on a single broker every partition is owned here; on a cluster
//! the leader of each `__ferry_delay` partition owns it.

pub mod codec;
mod compact;
pub mod core;
pub mod gauges;
mod mover;
pub mod partition;
pub mod produce;
pub mod wheel;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use self::codec::{RecordOrigin, StoreRecord, encode};
use self::core::origin::{LastBatch, Origin, OriginDecision, decide_origin};
use self::core::{DelayId, slot_of};
use self::partition::{PartState, Rebuild, Stream, StreamStats, read_ids};
use self::wheel::Wheel;
use crate::error::{BrokerError, Result};
use crate::node::registry::now_ms;
use crate::state::{Entry, Owned, StateLogs};

pub use crate::node::internal::DELAY_TOPIC;

/// One entry handed to a handler.
#[derive(Debug, Clone)]
pub struct FiredEntry {
    /// Its id.
    pub id: DelayId,
    /// When it was due.
    pub due_ms: i64,
    /// Its payload, as scheduled.
    pub payload: Bytes,
}

/// Entries of one stream firing together.
#[derive(Debug, Clone)]
pub struct Firing {
    /// The handler kind.
    pub kind: u8,
    /// The stream's key.
    pub key: Bytes,
    /// The number of the first entry within the stream; the others follow it.
    pub first_seq: u64,
    /// The entries, in order.
    pub entries: Vec<FiredEntry>,
}

/// What [`Delays::schedule_from`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// The entries' ids, in order.
    pub ids: Vec<DelayId>,
    /// When they fall due (for a duplicate, as the first attempt stored them).
    pub due_ms: i64,
    /// Whether this was the retry of the producer's last batch, answered without storing anything.
    pub duplicate: bool,
}

/// A boxed future of a handler.
pub type FireFuture<'a> = Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;

/// What performs the entries of one kind when they fall due.
pub trait Fire: Send + Sync + 'static {
    /// Performs `firing`. Called again with the same firing after a crash or an error, so it must be idempotent
    /// on (`key`, `first_seq`); an error is retried on the next tick.
    fn fire<'a>(&'a self, firing: &'a Firing) -> FireFuture<'a>;
}

/// Pending entries of one stream, for describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// The stream's key.
    pub key: Bytes,
    /// Entries pending.
    pub pending: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Start of the second the earliest is due in, ms.
    pub earliest_ms: i64,
    /// End of the second the latest is due in, ms.
    pub latest_ms: i64,
}

type Slot = Arc<tokio::sync::Mutex<Option<PartState>>>;

/// The broker's timer over `__ferry_delay`.
pub struct Delays {
    logs: Arc<StateLogs>,
    dir: PathBuf,
    parts: Mutex<HashMap<u32, Slot>>,
    handlers: RwLock<HashMap<u8, Arc<dyn Fire>>>,
    /// The largest delay accepted, ms (`delay.max_delay`).
    pub max_delay_ms: u64,
    stats: mover::MoverStats,
    gauges: Mutex<gauges::Gauges>,
}

impl std::fmt::Debug for Delays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delays").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Delays {
    /// A timer over `logs`, with its index under `data_dir/delay-index`.
    pub fn new(logs: Arc<StateLogs>, data_dir: PathBuf, max_delay_ms: u64) -> Delays {
        Delays {
            logs,
            dir: data_dir.join("delay-index"),
            parts: Mutex::new(HashMap::new()),
            handlers: RwLock::new(HashMap::new()),
            max_delay_ms,
            stats: mover::MoverStats::default(),
            gauges: Mutex::new(gauges::Gauges::new()),
        }
    }

    /// Registers the handler of `kind`.
    pub fn register(&self, kind: u8, handler: Arc<dyn Fire>) {
        self.handlers.write().insert(kind, handler);
    }

    fn slot(&self, k: u32) -> Slot {
        Arc::clone(self.parts.lock().entry(k).or_default())
    }

    /// Locks partition `k`'s state, rebuilding it when this broker owns the partition at an epoch not loaded.
    async fn lock(&self, k: u32) -> Result<(Owned, tokio::sync::OwnedMutexGuard<Option<PartState>>)> {
        let owned = self.logs.own(&DELAY_TOPIC, k)?;
        let mut guard = self.slot(k).lock_owned().await;
        if guard.as_ref().map(|s| s.loaded_at) != Some(owned.epoch) {
            *guard = None;
            let dir = self.dir.join(k.to_string());
            let wheel = tokio::task::spawn_blocking(move || Wheel::create(&dir))
                .await
                .map_err(|e| BrokerError::Internal(format!("the delay index task failed: {e}")))?
                .map_err(|e| BrokerError::Internal(format!("creating the delay index failed: {e}")))?;
            let log_start = owned.part.log().log_start_offset();
            let (rebuilt, end) = self.logs.replay(&owned, Rebuild::new(wheel, owned.epoch, log_start)).await?;
            let state = tokio::task::spawn_blocking(move || rebuilt.finish())
                .await
                .map_err(|e| BrokerError::Internal(format!("the delay index task failed: {e}")))??;
            tracing::info!(partition = k, epoch = owned.epoch, end, pending = state.totals().0, "delay store loaded");
            *guard = Some(state);
        }
        Ok((owned, guard))
    }

    /// Stores `payloads` as entries of stream (`kind`, `key`) due at `due_ms`, acknowledged by the in-sync
    /// replicas. Returns their ids, in order.
    pub async fn schedule(&self, kind: u8, key: Bytes, due_ms: i64, payloads: &[Bytes]) -> Result<Vec<DelayId>> {
        Ok(self.schedule_from(kind, key, due_ms, payloads, None).await?.ids)
    }

    /// As [`Delays::schedule`], for a producer's request: the retry of the producer's last batch for this stream
    /// (same epoch and sequences) is answered with the first attempt's ids and stores nothing (`core::origin`).
    pub async fn schedule_from(
        &self,
        kind: u8,
        key: Bytes,
        due_ms: i64,
        payloads: &[Bytes],
        origin: Option<Origin>,
    ) -> Result<Scheduled> {
        let k = DELAY_TOPIC.partition_of(&key);
        let (owned, mut guard) = self.lock(k).await?;
        let state = guard.as_mut().ok_or_else(|| BrokerError::Internal("the delay state is not loaded".into()))?;
        if let Some(o) = &origin {
            let last = state.origins.get(&((kind, key.clone()), o.producer_id));
            match decide_origin(last, o) {
                OriginDecision::Store => {}
                OriginDecision::Refuse(why) => return Err(BrokerError::InvalidArgument(why)),
                OriginDecision::Duplicate { first_id, count } => {
                    let part = Arc::clone(&owned.part);
                    let found = tokio::task::spawn_blocking(move || read_ids(&part, &[first_id]))
                        .await
                        .map_err(|e| BrokerError::Internal(format!("the delay read task failed: {e}")))??;
                    let due_ms = match found.first() {
                        Some((_, StoreRecord::Schedule { due_ms, .. })) => *due_ms,
                        _ => due_ms,
                    };
                    let ids = (first_id..first_id + u64::from(count)).map(|offset| DelayId { partition: k, offset });
                    return Ok(Scheduled { ids: ids.collect(), due_ms, duplicate: true });
                }
            }
        }
        let entries: Vec<Entry> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let origin = origin.map(|o| RecordOrigin {
                    producer_id: o.producer_id,
                    epoch: o.epoch,
                    base_seq: o.base_seq,
                    index: i as u32,
                    count: payloads.len() as u32,
                });
                let record = StoreRecord::Schedule { due_ms, kind, key: key.clone(), payload: p.clone(), origin };
                Entry { key: key.clone(), value: encode(&record) }
            })
            .collect();
        let written = self.logs.append(&owned, &entries).await.inspect_err(|_| *guard = None)?;
        let state = guard.as_mut().ok_or_else(|| BrokerError::Internal("the delay state is not loaded".into()))?;
        let ids: Vec<u64> = written.iter().flat_map(|p| p.base_offset..=p.last_offset).collect();
        for (id, p) in ids.iter().zip(payloads) {
            state.scheduled(*id, due_ms, (kind, key.clone()), p.len() as u32).map_err(index_error)?;
        }
        if let (Some(o), Some(first)) = (origin, ids.first()) {
            let last =
                LastBatch { epoch: o.epoch, base_seq: o.base_seq, count: payloads.len() as u32, first_id: *first };
            state.originated((kind, key), o.producer_id, last);
        }
        Ok(Scheduled {
            ids: ids.into_iter().map(|offset| DelayId { partition: k, offset }).collect(),
            due_ms,
            duplicate: false,
        })
    }

    /// Cancels entry `id` when it is still pending and `check` accepts its stream (kind, key). Returns its
    /// stream key and due time.
    pub async fn cancel(&self, id: DelayId, check: impl Fn(u8, &Bytes) -> Result<()>) -> Result<(Bytes, i64)> {
        if id.partition >= DELAY_TOPIC.partitions {
            return Err(BrokerError::InvalidArgument(format!("{id} names no delay-store partition")));
        }
        let (owned, mut guard) = self.lock(id.partition).await?;
        let log = owned.part.log();
        if id.offset < log.log_start_offset() {
            // A compaction freed it: it was delivered or cancelled (nothing pending is ever freed).
            return Err(BrokerError::DelayNotPending(format!(
                "delayed record {id} is no longer pending: it has been delivered, or it was cancelled before (the \
                 delay store has freed it)"
            )));
        }
        let part = Arc::clone(&owned.part);
        let found = tokio::task::spawn_blocking(move || read_ids(&part, &[id.offset]))
            .await
            .map_err(|e| BrokerError::Internal(format!("the delay read task failed: {e}")))??;
        let Some((_, StoreRecord::Schedule { due_ms, kind, key, payload, .. })) = found.into_iter().next() else {
            return Err(BrokerError::InvalidArgument(format!("{id} is not a delayed record")));
        };
        check(kind, &key)?;
        let state = guard.as_mut().ok_or_else(|| BrokerError::Internal("the delay state is not loaded".into()))?;
        if state.wheel.is_done(id.offset).map_err(index_error)? {
            return Err(BrokerError::DelayNotPending(format!(
                "delayed record {id} is no longer pending: it was due at {due_ms} ms and has been delivered, or it \
                 was cancelled before"
            )));
        }
        let bytes = payload.len() as u32;
        let cancel = StoreRecord::Cancel { id: id.offset, due_ms, bytes, kind, key: key.clone() };
        let entry = Entry { key: key.clone(), value: encode(&cancel) };
        if let Err(e) = self.logs.append(&owned, &[entry]).await {
            *guard = None;
            return Err(e);
        }
        let state = guard.as_mut().ok_or_else(|| BrokerError::Internal("the delay state is not loaded".into()))?;
        state.finished(id.offset, due_ms, &(kind, key.clone()), u64::from(bytes)).map_err(index_error)?;
        state.current.retain(|l| l.entry.id != id.offset);
        Ok((key, due_ms))
    }

    /// The pending entries of every stream of `kind` whose key passes `filter`, over the partitions owned here.
    pub async fn describe(&self, kind: u8, filter: impl Fn(&Bytes) -> bool) -> Result<Vec<StreamSummary>> {
        let mut out = Vec::new();
        for owned in self.logs.owned(&DELAY_TOPIC) {
            let (_, guard) = self.lock(owned.k).await?;
            let Some(state) = guard.as_ref() else { continue };
            for ((kd, key), s) in &state.streams {
                if *kd == kind && filter(key) {
                    out.push(summary(key, s));
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

fn summary(key: &Bytes, s: &StreamStats) -> StreamSummary {
    let first = s.slots.keys().next().copied().unwrap_or_default();
    let last = s.slots.keys().next_back().copied().unwrap_or_default();
    StreamSummary {
        key: key.clone(),
        pending: s.pending,
        bytes: s.bytes,
        earliest_ms: first * core::SLOT_MS,
        latest_ms: last * core::SLOT_MS + core::SLOT_MS - 1,
    }
}

fn index_error(e: std::io::Error) -> BrokerError {
    BrokerError::Internal(format!("the delay index failed: {e}"))
}

/// Starts the timer over `logs` (refusing delays past `max_delay`, waking every `tick`) with delayed produce
/// registered, tracked by `tasks` until `stop`.
pub fn start(
    logs: &Arc<StateLogs>,
    max_delay: std::time::Duration,
    tick: std::time::Duration,
    tasks: &tokio_util::task::TaskTracker,
    stop: tokio_util::sync::CancellationToken,
) -> Arc<Delays> {
    let max_delay_ms = u64::try_from(max_delay.as_millis()).unwrap_or(u64::MAX);
    let delays = Arc::new(Delays::new(Arc::clone(logs), logs.core().data_dir().to_owned(), max_delay_ms));
    delays.register(produce::KIND, Arc::new(produce::ProduceMover::new(Arc::clone(logs))));
    tasks.spawn(Arc::clone(&delays).run(tick, stop));
    delays
}

/// The time now and its slot.
fn now_slot() -> (i64, i64) {
    let now = now_ms();
    (now, slot_of(now))
}

/// A stream's key, for logs.
fn show(stream: &Stream) -> String {
    format!("{}:{}", stream.0, String::from_utf8_lossy(&stream.1))
}

#[cfg(test)]
mod tests;
