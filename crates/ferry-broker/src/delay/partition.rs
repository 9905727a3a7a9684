//! One delay-store partition's state on its owner: the on-disk wheel, the entries whose slot has come round, the
//! next firing number of each stream, the firings recorded but not yet performed, and per-stream counts. Rebuilt
//! from the partition's log by [`Rebuild`] whenever this broker owns it at a leader epoch it has not loaded.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use ferry_batch::Record;

use super::codec::{Intent, Snapshot, StoreRecord, decode};
use super::core::origin::{LastBatch, MAX_PRODUCERS};
use super::core::slot_of;
use super::wheel::{SlotEntry, Wheel};
use crate::error::{BrokerError, Result};
use crate::node::partition::Partition;
use crate::state::Replayed;

/// A stream of entries that fire in order: a handler kind and its key.
pub type Stream = (u8, Bytes);

/// Counts of one stream's pending entries.
#[derive(Debug, Default, Clone)]
pub struct StreamStats {
    /// Entries pending.
    pub pending: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Pending entries per slot, for the earliest and latest due times.
    pub slots: BTreeMap<i64, u32>,
}

impl StreamStats {
    fn add(&mut self, due_ms: i64, bytes: u64) {
        self.pending += 1;
        self.bytes += bytes;
        *self.slots.entry(slot_of(due_ms)).or_default() += 1;
    }

    fn remove(&mut self, due_ms: i64, bytes: u64) {
        self.pending = self.pending.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
        let slot = slot_of(due_ms);
        if let Some(n) = self.slots.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.slots.remove(&slot);
            }
        }
    }
}

/// An entry whose slot has come round, with what its schedule record holds.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// Its slot entry.
    pub entry: SlotEntry,
    /// Its stream.
    pub stream: Stream,
    /// Its payload.
    pub payload: Bytes,
}

/// One partition's state.
#[derive(Debug)]
pub struct PartState {
    /// The leader epoch it was loaded at.
    pub loaded_at: u32,
    /// The index of the entries whose slot has not come round.
    pub wheel: Wheel,
    /// Entries whose slot has come round, in firing order, not fired yet.
    pub current: Vec<Loaded>,
    /// The next firing number of each stream.
    pub seqs: HashMap<Stream, u64>,
    /// Firings recorded (intent offset) but not known to be performed.
    pub unfinished: BTreeMap<u64, Intent>,
    /// Per-stream counts.
    pub streams: HashMap<Stream, StreamStats>,
    /// Each (stream, producer id)'s last stored batch, for deduplicating a retried delayed produce.
    pub origins: HashMap<(Stream, i64), LastBatch>,
    /// The log's first offset when loaded or last compacted: ids below it are gone, and none was pending.
    pub log_start: u64,
    /// When the owner last looked for segments to free, ms.
    pub compact_checked_ms: i64,
}

impl PartState {
    /// Notes a scheduled entry.
    pub fn scheduled(&mut self, id: u64, due_ms: i64, stream: Stream, bytes: u32) -> io::Result<()> {
        self.wheel.add(SlotEntry { id, due_ms, bytes })?;
        self.streams.entry(stream).or_default().add(due_ms, u64::from(bytes));
        Ok(())
    }

    /// Notes an entry no longer pending (cancelled or part of an intent).
    pub fn finished(&mut self, id: u64, due_ms: i64, stream: &Stream, bytes: u64) -> io::Result<()> {
        self.wheel.set_done(id)?;
        if let Some(s) = self.streams.get_mut(stream) {
            s.remove(due_ms, bytes);
            if s.pending == 0 {
                self.streams.remove(stream);
            }
        }
        Ok(())
    }

    /// Notes an intent recorded at `offset`: its entries are no longer pending, and its stream's numbers move on.
    /// Entries below the log start (their schedule records deleted by a compaction) were never counted.
    pub fn intended(&mut self, offset: u64, intent: Intent) -> io::Result<()> {
        let stream = (intent.kind, intent.key.clone());
        let legacy = intent.ids.iter().all(|(_, _, bytes)| *bytes == 0);
        for (id, due, bytes) in &intent.ids {
            if *id >= self.log_start {
                self.finished(*id, *due, &stream, u64::from(*bytes))?;
            }
        }
        if legacy && let Some(s) = self.streams.get_mut(&stream) {
            s.bytes = s.bytes.saturating_sub(intent.bytes);
        }
        let next = intent.first_seq + intent.ids.len() as u64;
        let seq = self.seqs.entry(stream).or_default();
        *seq = (*seq).max(next);
        self.unfinished.insert(offset, intent);
        Ok(())
    }

    /// Notes a producer's stored batch, forgetting the half stored longest ago past [`MAX_PRODUCERS`].
    pub fn originated(&mut self, stream: Stream, producer_id: i64, last: LastBatch) {
        let key = (stream, producer_id);
        if self.origins.get(&key).is_some_and(|known| known.first_id > last.first_id) {
            return;
        }
        self.origins.insert(key, last);
        if self.origins.len() > MAX_PRODUCERS {
            let mut ids: Vec<u64> = self.origins.values().map(|l| l.first_id).collect();
            ids.sort_unstable();
            let cut = ids[ids.len() / 2];
            self.origins.retain(|_, l| l.first_id >= cut);
        }
    }

    /// What a compaction writes so that a replay from after it rebuilds the numbers and producers.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            seqs: self.seqs.iter().map(|((kind, key), next)| (*kind, key.clone(), *next)).collect(),
            origins: self.origins.iter().map(|(((kind, key), pid), last)| (*kind, key.clone(), *pid, *last)).collect(),
        }
    }

    /// Applies a snapshot read back: numbers only move on, and a producer's later batch wins.
    pub fn restore(&mut self, snap: Snapshot) {
        for (kind, key, next) in snap.seqs {
            let seq = self.seqs.entry((kind, key)).or_default();
            *seq = (*seq).max(next);
        }
        for (kind, key, pid, last) in snap.origins {
            self.originated((kind, key), pid, last);
        }
    }

    /// The lowest offset the partition still needs (`end` when it needs nothing below it): its pending entries'
    /// (a cancelled one on the wheel counts until its slot comes round) and its unfinished firings' records.
    pub fn floor(&self, end: u64) -> u64 {
        let mut floor = end.min(self.wheel.min_id().unwrap_or(u64::MAX));
        for l in &self.current {
            floor = floor.min(l.entry.id);
        }
        for (offset, intent) in &self.unfinished {
            floor = floor.min(*offset);
            for (id, _, _) in &intent.ids {
                floor = floor.min(*id);
            }
        }
        floor
    }

    /// Pending entries and bytes over every stream.
    pub fn totals(&self) -> (u64, u64) {
        self.streams.values().fold((0, 0), |(n, b), s| (n + s.pending, b + s.bytes))
    }
}

/// Replays a partition's log into a fresh [`PartState`].
#[derive(Debug)]
pub struct Rebuild {
    /// The state being rebuilt.
    pub state: PartState,
    /// The first error the index met.
    pub error: Option<io::Error>,
}

impl Rebuild {
    /// A rebuild into a new wheel, of a log starting at `log_start`.
    pub fn new(wheel: Wheel, epoch: u32, log_start: u64) -> Rebuild {
        let state = PartState {
            loaded_at: epoch,
            wheel,
            current: Vec::new(),
            seqs: HashMap::new(),
            unfinished: BTreeMap::new(),
            streams: HashMap::new(),
            origins: HashMap::new(),
            log_start,
            compact_checked_ms: 0,
        };
        Rebuild { state, error: None }
    }

    fn step(&mut self, offset: u64, record: &Record) -> io::Result<()> {
        let Some(value) = &record.value else { return Ok(()) };
        let s = &mut self.state;
        match decode(value) {
            Some(StoreRecord::Schedule { due_ms, kind, key, payload, origin }) => {
                let bytes = payload.len() as u32;
                if let Some(o) = origin
                    && o.index == 0
                {
                    let last = LastBatch { epoch: o.epoch, base_seq: o.base_seq, count: o.count, first_id: offset };
                    s.originated((kind, key.clone()), o.producer_id, last);
                }
                s.scheduled(offset, due_ms, (kind, key), bytes)?;
            }
            Some(StoreRecord::Cancel { id, due_ms, bytes, kind, key }) if id >= s.log_start => {
                s.finished(id, due_ms, &(kind, key), u64::from(bytes))?;
            }
            Some(StoreRecord::Cancel { .. }) => {}
            Some(StoreRecord::Intent(intent)) => s.intended(offset, intent)?,
            Some(StoreRecord::Fired { intent }) => {
                s.unfinished.remove(&intent);
            }
            Some(StoreRecord::Snapshot(snap)) => s.restore(snap),
            None => {}
        }
        Ok(())
    }

    /// The rebuilt state, once the index is written out.
    pub fn finish(mut self) -> Result<PartState> {
        if let Some(e) = self.error.take() {
            return Err(BrokerError::Internal(format!("rebuilding the delay index failed: {e}")));
        }
        self.state.wheel.flush().map_err(|e| BrokerError::Internal(format!("writing the delay index failed: {e}")))?;
        Ok(self.state)
    }
}

impl Replayed for Rebuild {
    fn apply(&mut self, offset: u64, record: &Record) {
        if self.error.is_none()
            && let Err(e) = self.step(offset, record)
        {
            self.error = Some(e);
        }
    }
}

/// Reads the records at `ids` (ascending) from `part`'s log, on the calling (blocking) thread. Ids the log no
/// longer holds are left out.
pub fn read_ids(part: &Arc<Partition>, ids: &[u64]) -> Result<Vec<(u64, StoreRecord)>> {
    let mut out = Vec::with_capacity(ids.len());
    let mut i = 0;
    while i < ids.len() {
        let read = part.read_log(ids[i], 1 << 20)?;
        if read.batches.is_empty() || read.next_offset <= ids[i] {
            break;
        }
        let bad = |e: ferry_batch::BatchError| {
            BrokerError::Internal(format!(
                "{}/{}: a delay-store batch does not decode: {e}",
                part.topic(),
                part.index()
            ))
        };
        for (_, bytes) in ferry_batch::split_verified(&read.batches).map_err(bad)? {
            for r in ferry_batch::decode_records(&bytes).map_err(bad)? {
                while i < ids.len() && ids[i] < r.offset {
                    i += 1;
                }
                if i < ids.len() && ids[i] == r.offset {
                    if let Some(rec) = r.value.as_ref().and_then(decode) {
                        out.push((r.offset, rec));
                    }
                    i += 1;
                }
            }
        }
        // Ids inside what was read but not found are gone; the next read starts past them.
        while i < ids.len() && ids[i] < read.next_offset {
            i += 1;
        }
    }
    Ok(out)
}
