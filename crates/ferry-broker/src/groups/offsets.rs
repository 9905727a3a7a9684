//! Committed offsets, kept in the broker's reserved internal partition `__ferry_offsets/0`: a `ferry-storage`
//! [`Log`] like any partition's (CRC per batch, exact recovery), written with the sync flush policy so a commit is
//! on disk before it is acknowledged. The in-memory map is rebuilt on open by replaying the partition (last write
//! wins); see docs/broker.md ("Committed offsets") for the record format, the snapshots that bound the
//! partition's size, and what a corrupt batch costs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_proto as pb;
use ferry_storage::fs::{FileSystem, FsRef};
use ferry_storage::{FlushPolicy, Log, LogConfig, StorageError, SystemClock};
use serde::{Deserialize, Serialize};

use crate::error::{BrokerError, Result};
use crate::node::registry::{META_DIR, now_ms};

/// The reserved internal topic holding committed offsets (one partition, `0`).
pub const OFFSETS_TOPIC: &str = "__ferry_offsets";
/// The journal file of earlier versions, inside the meta directory: imported once, then removed.
pub const OFFSETS_FILE: &str = "group-offsets.jsonl";

/// Record key: group, topic, partition (JSON with short keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Key {
    pub(super) g: String,
    pub(super) t: String,
    pub(super) p: u32,
}

/// Record value: offset and metadata, and (in a cluster's offsets partitions) the id of the topic the offset was
/// committed to. A null value (tombstone) forgets the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Value {
    pub(super) o: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) m: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) i: String,
}

/// A line of the old journal: a key and a value.
#[derive(Debug, Deserialize)]
struct JournalLine {
    #[serde(flatten)]
    key: Key,
    #[serde(flatten)]
    value: Value,
}

/// (group, topic, partition).
pub(super) type Slot = (String, String, u32);
/// A record to write: a slot and its (offset, metadata), or `None` for a tombstone.
type Entry = (Slot, Option<(u64, String)>);
type Map = SlotMap<(u64, String)>;

/// Committed offsets by slot, with how many each group holds (the groups listed, and counted for
/// `groups.max_groups`). Read through `Deref`; written only by [`SlotMap::insert`] and [`SlotMap::remove`], which
/// keep the counts.
#[derive(Debug)]
pub(super) struct SlotMap<V> {
    map: BTreeMap<Slot, V>,
    per_group: BTreeMap<String, usize>,
}

impl<V> Default for SlotMap<V> {
    fn default() -> Self {
        SlotMap { map: BTreeMap::new(), per_group: BTreeMap::new() }
    }
}

impl<V> std::ops::Deref for SlotMap<V> {
    type Target = BTreeMap<Slot, V>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<V> SlotMap<V> {
    pub(super) fn insert(&mut self, k: Slot, v: V) {
        let group = k.0.clone();
        if self.map.insert(k, v).is_none() {
            *self.per_group.entry(group).or_default() += 1;
        }
    }

    pub(super) fn remove(&mut self, k: &Slot) {
        if self.map.remove(k).is_some()
            && let Some(n) = self.per_group.get_mut(&k.0)
        {
            *n -= 1;
            if *n == 0 {
                self.per_group.remove(&k.0);
            }
        }
    }

    /// The groups with committed offsets.
    pub(super) fn groups(&self) -> impl Iterator<Item = &String> {
        self.per_group.keys()
    }

    /// Whether `group` has committed offsets.
    pub(super) fn has_group(&self, group: &str) -> bool {
        self.per_group.contains_key(group)
    }

    /// How many groups have committed offsets.
    pub(super) fn group_count(&self) -> usize {
        self.per_group.len()
    }
}

/// Sizes of the offsets partition.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tuning {
    /// Segment roll size.
    pub segment_bytes: u64,
    /// A snapshot is written once the partition holds this many bytes and twice what it held after the last one.
    pub snapshot_min_bytes: u64,
    /// Most record bytes put in one batch (a commit larger than this spans batches).
    pub batch_bytes: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { segment_bytes: 4 << 20, snapshot_min_bytes: 64 << 20, batch_bytes: 1 << 20 }
    }
}

/// Committed offsets over the internal partition.
#[derive(Debug)]
pub(super) struct OffsetStore {
    log: Log,
    map: Map,
    tuning: Tuning,
    /// Partition size after the last snapshot (or the open).
    base_size: u64,
    /// Offset ranges of batches that failed their CRC check on open and were skipped.
    skipped: Vec<(u64, u64)>,
}

fn storage(source: StorageError) -> BrokerError {
    BrokerError::storage(OFFSETS_TOPIC, 0, source)
}

pub(super) fn encode_key(group: &str, topic: &str, partition: u32) -> Vec<u8> {
    serde_json::to_vec(&Key { g: group.to_owned(), t: topic.to_owned(), p: partition }).unwrap_or_default()
}

impl OffsetStore {
    /// Opens (creating) the partition under `data_dir`, replays it, and imports an old journal. Blocking.
    pub(super) fn open(fs: FsRef, data_dir: &Path, tuning: Tuning) -> Result<OffsetStore> {
        let config = LogConfig {
            segment_bytes: tuning.segment_bytes,
            max_batch_bytes: (tuning.batch_bytes as u64).saturating_mul(2).max(1 << 20),
            flush: FlushPolicy::Sync,
            // Every commit is fsynced: a bad batch with good ones after it is damage, which `replay` skips, not a
            // torn write to cut with every later commit.
            keep_corrupt_batches_followed_by_valid_ones: true,
            ..LogConfig::default()
        };
        let dir = data_dir.join(OFFSETS_TOPIC).join("0");
        let log = Log::open_on(fs.clone(), dir, config, Arc::new(SystemClock)).map_err(storage)?;
        let mut store = OffsetStore { log, map: Map::default(), tuning, base_size: 0, skipped: Vec::new() };
        store.replay()?;
        store.import_journal(&*fs, &data_dir.join(META_DIR))?;
        store.base_size = store.log.stats().size_bytes;
        if !store.skipped.is_empty() {
            // Rewrite what was read around the corrupt batches and drop the segments holding them at once: left in
            // the active segment, a corrupt batch would make the next unclean open cut the log there, taking every
            // commit after it along.
            store.rewrite("dropping corrupt batches");
        }
        Ok(store)
    }

    /// Rebuilds the map from the partition. A batch whose CRC check fails is skipped (and said so): the batches
    /// before and after it still count, so only the commits inside it are lost.
    fn replay(&mut self) -> Result<()> {
        let mut batches = Vec::new();
        self.log
            .for_each_batch_header(self.log.log_start_offset(), &mut |h| batches.push((h.base_offset, h.last_offset())))
            .map_err(storage)?;
        for (base, last) in batches {
            let read = match self.log.read(base, 1) {
                Ok(read) => read,
                Err(e @ StorageError::CorruptSegment { .. }) => {
                    tracing::error!(
                        partition = %format!("{OFFSETS_TOPIC}/0"),
                        offsets = %format!("{base}..={last}"),
                        error = %e,
                        "a batch of committed offsets is corrupt and was skipped: the commits in it are lost, \
                         everything before and after it is kept"
                    );
                    self.skipped.push((base, last));
                    continue;
                }
                Err(e) => return Err(storage(e)),
            };
            let records = ferry_batch::decode_records(&read.batches).map_err(|e| {
                BrokerError::Internal(format!("{OFFSETS_TOPIC}/0: batch at offset {base} does not decode: {e}"))
            })?;
            for r in records.iter().filter(|r| r.offset >= base && r.offset <= last) {
                let key = r.key.as_deref().and_then(|k| serde_json::from_slice::<Key>(k).ok());
                let Some(key) = key else {
                    return Err(BrokerError::Internal(format!(
                        "{OFFSETS_TOPIC}/0: record at offset {} has no valid key",
                        r.offset
                    )));
                };
                let k = (key.g, key.t, key.p);
                match r.value.as_deref().map(serde_json::from_slice::<Value>) {
                    None => {
                        self.map.remove(&k);
                    }
                    Some(Ok(v)) => {
                        self.map.insert(k, (v.o, v.m));
                    }
                    Some(Err(e)) => {
                        return Err(BrokerError::Internal(format!(
                            "{OFFSETS_TOPIC}/0: record at offset {} has an invalid value: {e}",
                            r.offset
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Imports the journal of an earlier version (as far as it parses), then removes it.
    fn import_journal(&mut self, fs: &dyn FileSystem, meta_dir: &Path) -> Result<()> {
        let path = meta_dir.join(OFFSETS_FILE);
        let io = |source| BrokerError::Io { path: path.clone(), source };
        let Some(bytes) = ferry_storage::fs::read_optional(fs, &path).map_err(io)? else { return Ok(()) };
        let text = String::from_utf8_lossy(&bytes);
        let mut entries = BTreeMap::new();
        for line in text.lines() {
            match serde_json::from_str::<JournalLine>(line) {
                Ok(l) => {
                    entries.insert((l.key.g, l.key.t, l.key.p), (l.value.o, l.value.m));
                }
                Err(_) => {
                    tracing::warn!(path = %path.display(), "the old group offsets journal stops at a torn line");
                    break;
                }
            }
        }
        let count = entries.len();
        self.write(entries.into_iter().map(|(k, v)| (k, Some(v))).collect())?;
        ferry_storage::fs::remove_if_exists(fs, &path).map_err(io)?;
        fs.sync_dir(meta_dir).map_err(|source| BrokerError::Io { path: meta_dir.to_owned(), source })?;
        tracing::info!(offsets = count, "imported the old group offsets journal into {OFFSETS_TOPIC}");
        Ok(())
    }

    /// Appends records (a `None` value is a tombstone), as few batches as `batch_bytes` allows, and applies each
    /// written batch to the map. On error the batches written before it stay (they are durable and applied).
    fn write(&mut self, records: Vec<Entry>) -> Result<()> {
        let ts = now_ms();
        let mut pending: Vec<Entry> = Vec::new();
        let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        let count = records.len();
        for (i, (k, v)) in records.into_iter().enumerate() {
            let key = encode_key(&k.0, &k.1, k.2);
            let value = v
                .as_ref()
                .map(|(o, m)| serde_json::to_vec(&Value { o: *o, m: m.clone(), i: String::new() }).unwrap_or_default());
            builder.push(pending.len() as u32, ts, Some(&key), value.as_deref(), &[]);
            pending.push((k, v));
            if builder.estimated_size() >= self.tuning.batch_bytes || i + 1 == count {
                self.log.append(&builder.build(0, 0)).map_err(storage)?;
                for (k, v) in pending.drain(..) {
                    match v {
                        Some(v) => self.map.insert(k, v),
                        None => self.map.remove(&k),
                    }
                }
                builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
            }
        }
        Ok(())
    }

    pub(super) fn commit(&mut self, group: &str, offsets: &[pb::CommittedOffset]) -> Result<()> {
        let records = offsets
            .iter()
            .map(|o| ((group.to_owned(), o.topic.clone(), o.partition), Some((o.offset, o.metadata.clone()))))
            .collect();
        self.write(records)?;
        self.snapshot_if_due();
        Ok(())
    }

    /// Bounds the partition: once it has grown past `snapshot_min_bytes` and twice its size after the last
    /// snapshot, it is rewritten (see [`OffsetStore::rewrite`]). A failure here (a full disk) fails no commit: the
    /// rewrite is retried after the partition doubles again.
    fn snapshot_if_due(&mut self) {
        let size = self.log.stats().size_bytes;
        if size > self.tuning.snapshot_min_bytes.max(self.base_size.saturating_mul(2)) {
            self.rewrite("snapshot");
        }
    }

    /// Rolls a new segment, writes the whole map into it, and deletes every segment before it: replaying from the
    /// copy's start gives the same map, and nothing older is needed. Failures are logged; what was written stays
    /// harmless (copies of current values).
    fn rewrite(&mut self, why: &str) {
        let start = self.log.log_end_offset();
        let records = self.map.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
        let done = self
            .log
            .roll()
            .map_err(storage)
            .and_then(|_| self.write(records))
            .and_then(|()| self.log.delete_segments_before(start).map_err(storage));
        match done {
            Ok(deleted) => tracing::info!(
                offsets = self.map.len(),
                rewritten_at = start,
                deleted_segments = deleted,
                "rewrote the committed offsets partition ({why})"
            ),
            Err(e) => tracing::warn!(error = %e, "rewriting the committed offsets partition ({why}) failed"),
        }
        self.base_size = self.log.stats().size_bytes;
    }

    /// Drops the offsets of every topic `gone` says no longer exists, with tombstones. Returns how many.
    pub(super) fn forget(&mut self, gone: &dyn Fn(&str) -> bool) -> Result<usize> {
        let dropped: Vec<_> = self.map.keys().filter(|(_, topic, _)| gone(topic)).map(|k| (k.clone(), None)).collect();
        let count = dropped.len();
        if count > 0 {
            self.write(dropped)?;
            self.snapshot_if_due();
        }
        Ok(count)
    }

    /// Drops every committed offset of `group`, with tombstones. Returns how many.
    pub(super) fn delete_group(&mut self, group: &str) -> Result<usize> {
        let dropped: Vec<_> = self
            .map
            .range((group.to_owned(), String::new(), 0)..)
            .take_while(|((g, _, _), _)| g == group)
            .map(|(k, _)| (k.clone(), None))
            .collect();
        let count = dropped.len();
        if count > 0 {
            self.write(dropped)?;
            self.snapshot_if_due();
        }
        Ok(count)
    }

    pub(super) fn of_group(&self, group: &str) -> Vec<pb::CommittedOffset> {
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

    pub(super) fn groups(&self) -> BTreeSet<String> {
        self.map.groups().cloned().collect()
    }

    /// Whether `group` has committed offsets.
    pub(super) fn has_group(&self, group: &str) -> bool {
        self.map.has_group(group)
    }

    /// How many groups have committed offsets.
    pub(super) fn group_count(&self) -> usize {
        self.map.group_count()
    }

    /// Offset ranges of the corrupt batches skipped on open.
    pub(super) fn skipped(&self) -> &[(u64, u64)] {
        &self.skipped
    }

    /// The partition's log (tests look at its shape).
    #[cfg(test)]
    pub(super) fn log(&self) -> &Log {
        &self.log
    }

    /// Flushes and closes the partition (a clean shutdown).
    pub(super) fn close(&self) -> Result<()> {
        self.log.close().map_err(storage)
    }
}
