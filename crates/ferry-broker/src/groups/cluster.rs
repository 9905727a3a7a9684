//! Committed offsets on a cluster: the replicated internal topic [`CLUSTER_OFFSETS_TOPIC`] (raft3, created by the
//! controller), whose partition a group's name hashes to; the leader of that partition is the group's
//! coordinator. The coordinator keeps the offsets of the groups of each partition it leads in memory, replayed
//! from the partition's log when it takes the leadership, and writes each commit through the partition, answering
//! only once the in-sync replicas hold it; a new coordinator replays a log that holds every acknowledged commit.
//!
//! Each offset records the id of the topic it was committed to: an offset of a topic deleted since (and perhaps
//! created again under the name) is not returned, so a re-created topic starts from offset 0.
//!
//! Commits take effect in memory in *log order*, as a replay would see them: each commit's batches are written
//! under the partition's write order ([`ClusterOffsets::write_order`]) and registered at their offsets, and once
//! acknowledged every registered commit below the high watermark is applied, lowest offset first. A compaction
//! writes memory back only when no written commit is waiting to be applied, under the same order, so it never drops
//! a commit that was written but not yet applied.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_proto as pb;
use ferry_storage::Log;
use parking_lot::Mutex;

use super::offsets::{Key, Slot, SlotMap, Value, encode_key};
use crate::error::{BrokerError, Result};

/// The replicated internal topic holding a cluster's committed offsets.
pub const CLUSTER_OFFSETS_TOPIC: &str = "__ferry_cluster_offsets";

/// Most record bytes in one batch of commits.
const BATCH_BYTES: usize = 256 * 1024;
/// An offsets partition is compacted (its offsets written again, the segments before them deleted) once it holds
/// this many bytes and twice what it held after its last compaction.
pub const COMPACT_MIN_BYTES: u64 = 64 << 20;

/// (offset, metadata, topic id).
type Committed = (u64, String, String);
/// Offsets written to an offsets partition: each `None` a tombstone (the offset deleted).
type Entries = Vec<(Slot, Option<Committed>)>;

/// The offsets of one partition's groups, loaded at one leader epoch.
#[derive(Debug, Default)]
struct Loaded {
    epoch: u32,
    map: SlotMap<Committed>,
    /// The partition's size after its last compaction, or when it was loaded.
    base_size: u64,
    /// Commits (and, `None`, deletions) written and not applied yet, by the last offset of the batch that holds them.
    pending: std::collections::BTreeMap<u64, Entries>,
}

/// The offsets of the groups this broker coordinates, per offsets partition.
#[derive(Debug)]
pub struct ClusterOffsets {
    partitions: u32,
    loaded: Mutex<HashMap<u32, Loaded>>,
    /// Per offsets partition: taken while a commit's batches are written and registered, so registration follows
    /// log order; and while a compaction writes.
    orders: Mutex<HashMap<u32, std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

/// One commit's records, as batches to write to the offsets partition, each with the offsets it holds (`None`: a
/// tombstone, the offset deleted).
pub struct CommitBatches {
    /// The encoded batches and their entries.
    pub batches: Vec<(Bytes, Entries)>,
}

impl ClusterOffsets {
    /// The store of a cluster whose offsets topic has `partitions` partitions.
    pub fn new(partitions: u32) -> ClusterOffsets {
        ClusterOffsets {
            partitions: partitions.max(1),
            loaded: Mutex::new(HashMap::new()),
            orders: Mutex::new(HashMap::new()),
        }
    }

    /// The offsets partition `group` hashes to.
    pub fn partition_of(&self, group: &str) -> u32 {
        ferry_proto::partition_for_key(group.as_bytes(), self.partitions)
    }

    /// The partitions of the offsets topic.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The leader epoch partition `k` was loaded at, if it is.
    pub fn loaded_epoch(&self, k: u32) -> Option<u32> {
        self.loaded.lock().get(&k).map(|l| l.epoch)
    }

    /// Replays partition `k`'s `log` (every batch it holds) as loaded at leader epoch `epoch`. Blocking.
    pub fn load(&self, k: u32, epoch: u32, log: &Log) -> Result<()> {
        let mut loaded = Loaded { epoch, base_size: log.stats().size_bytes, ..Loaded::default() };
        let name = format!("{CLUSTER_OFFSETS_TOPIC}/{k}");
        let storage = |e| BrokerError::storage(CLUSTER_OFFSETS_TOPIC, k, e);
        let mut offset = log.log_start_offset();
        while offset < log.log_end_offset() {
            let read = log.read(offset, 1 << 20).map_err(storage)?;
            if read.next_offset <= offset {
                break;
            }
            let bad = |e: ferry_batch::BatchError| {
                BrokerError::Internal(format!("{name}: a batch at or after {offset} does not decode: {e}"))
            };
            let mut records = Vec::new();
            for (_, bytes) in ferry_batch::split_verified(&read.batches).map_err(bad)? {
                records.extend(ferry_batch::decode_records(&bytes).map_err(bad)?);
            }
            for r in records {
                let key = r.key.as_deref().and_then(|k| serde_json::from_slice::<Key>(k).ok());
                let Some(key) = key else {
                    return Err(BrokerError::Internal(format!(
                        "{name}: record at offset {} has no valid key",
                        r.offset
                    )));
                };
                let slot = (key.g, key.t, key.p);
                match r.value.as_deref().map(serde_json::from_slice::<Value>) {
                    None => loaded.map.remove(&slot),
                    Some(Ok(v)) => loaded.map.insert(slot, (v.o, v.m, v.i)),
                    Some(Err(e)) => {
                        return Err(BrokerError::Internal(format!(
                            "{name}: record at offset {} has an invalid value: {e}",
                            r.offset
                        )));
                    }
                }
            }
            offset = read.next_offset;
        }
        tracing::info!(
            partition = %name,
            leader_epoch = epoch,
            offsets = loaded.map.len(),
            groups = loaded.map.group_count(),
            "coordinating the groups of this offsets partition"
        );
        self.loaded.lock().insert(k, loaded);
        Ok(())
    }

    /// Forgets partition `k` (this broker no longer leads it).
    pub fn unload(&self, k: u32) -> bool {
        self.loaded.lock().remove(&k).is_some()
    }

    /// The batches of a commit of `offsets` by `group`, each offset with its topic's id.
    pub fn encode(
        &self,
        group: &str,
        offsets: &[pb::CommittedOffset],
        topic_id: &dyn Fn(&str) -> String,
    ) -> CommitBatches {
        let entries: Vec<(Slot, Committed)> = offsets
            .iter()
            .map(|o| {
                ((group.to_owned(), o.topic.clone(), o.partition), (o.offset, o.metadata.clone(), topic_id(&o.topic)))
            })
            .collect();
        let batches = encode_entries(&entries)
            .into_iter()
            .map(|(b, held)| (b, held.into_iter().map(|(slot, v)| (slot, Some(v))).collect()))
            .collect();
        CommitBatches { batches }
    }

    /// The tombstones deleting every offset `group` has here (none when this broker does not hold its partition).
    pub fn tombstones(&self, group: &str) -> CommitBatches {
        let slots: Vec<Slot> = {
            let loaded = self.loaded.lock();
            let Some(l) = loaded.get(&self.partition_of(group)) else { return CommitBatches { batches: Vec::new() } };
            l.map
                .range((group.to_owned(), String::new(), 0)..)
                .take_while(|((g, _, _), _)| g == group)
                .map(|(k, _)| k.clone())
                .collect()
        };
        let ts = crate::node::registry::now_ms();
        let mut batches = Vec::new();
        for chunk in slots.chunks(4096) {
            let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
            for (i, (g, t, p)) in chunk.iter().enumerate() {
                builder.push(i as u32, ts, Some(&encode_key(g, t, *p)), None, &[]);
            }
            batches.push((builder.build(0, 0), chunk.iter().map(|slot| (slot.clone(), None)).collect()));
        }
        CommitBatches { batches }
    }

    /// The write order of offsets partition `k` (see the module docs).
    pub fn write_order(&self, k: u32) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        std::sync::Arc::clone(self.orders.lock().entry(k).or_default())
    }

    /// Registers a written batch's entries at its last offset `last`, if `k` is still loaded at `epoch`. The
    /// caller holds the write order.
    pub fn register(&self, k: u32, epoch: u32, last: u64, entries: Entries) {
        if let Some(l) = self.loaded.lock().get_mut(&k).filter(|l| l.epoch == epoch) {
            l.pending.insert(last, entries);
        }
    }

    /// Applies, lowest offset first, every registered commit of `k` below `hw` (the partition's high watermark),
    /// if `k` is still loaded at `epoch`.
    pub fn apply_through(&self, k: u32, epoch: u32, hw: u64) {
        let mut loaded = self.loaded.lock();
        let Some(l) = loaded.get_mut(&k).filter(|l| l.epoch == epoch) else { return };
        let later = l.pending.split_off(&hw);
        for (_, entries) in std::mem::replace(&mut l.pending, later) {
            for (slot, v) in entries {
                match v {
                    Some(v) => l.map.insert(slot, v),
                    None => l.map.remove(&slot),
                }
            }
        }
    }

    /// Whether every commit written to `k` has been applied (none waits for its acknowledgement).
    pub fn settled(&self, k: u32) -> bool {
        self.loaded.lock().get(&k).is_none_or(|l| l.pending.is_empty())
    }

    /// Whether partition `k`, now `size` bytes, is due a compaction; if so, the batches of every offset it holds
    /// (written, they make every segment before them unneeded). `None` too while a written commit waits to be
    /// applied: memory does not hold everything the log does yet. The caller holds the write order.
    pub fn compaction(&self, k: u32, size: u64) -> Option<Vec<Bytes>> {
        let loaded = self.loaded.lock();
        let l = loaded.get(&k)?;
        if size <= COMPACT_MIN_BYTES.max(l.base_size.saturating_mul(2)) || !l.pending.is_empty() {
            return None;
        }
        let entries: Vec<(Slot, Committed)> = l.map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Some(encode_entries(&entries).into_iter().map(|(b, _)| b).collect())
    }

    /// Notes partition `k`'s size after a compaction.
    pub fn compacted(&self, k: u32, size: u64) {
        if let Some(l) = self.loaded.lock().get_mut(&k) {
            l.base_size = size;
        }
    }

    /// A group's committed offsets whose topic id is the current one (`topic_id`: `None` for a topic that does not
    /// exist).
    pub fn of_group(&self, group: &str, topic_id: &dyn Fn(&str) -> Option<String>) -> Vec<pb::CommittedOffset> {
        let k = self.partition_of(group);
        let loaded = self.loaded.lock();
        let Some(l) = loaded.get(&k) else { return Vec::new() };
        l.map
            .range((group.to_owned(), String::new(), 0)..)
            .take_while(|((g, _, _), _)| g == group)
            .filter(|((_, t, _), (_, _, id))| topic_id(t).is_some_and(|current| current == *id))
            .map(|((_, t, p), (o, m, _))| pb::CommittedOffset {
                topic: t.clone(),
                partition: *p,
                offset: *o,
                metadata: m.clone(),
            })
            .collect()
    }

    /// Whether `group` has committed offsets here.
    pub fn has_group(&self, group: &str) -> bool {
        self.loaded.lock().get(&self.partition_of(group)).is_some_and(|l| l.map.has_group(group))
    }

    /// Groups with committed offsets here.
    pub fn groups(&self) -> BTreeSet<String> {
        self.loaded.lock().values().flat_map(|l| l.map.groups().cloned()).collect()
    }

    /// How many groups have committed offsets here.
    pub fn group_count(&self) -> usize {
        self.loaded.lock().values().map(|l| l.map.group_count()).sum()
    }
}

/// Offsets as batches of at most [`BATCH_BYTES`] of records, each with the entries it holds.
fn encode_entries(entries: &[(Slot, Committed)]) -> Vec<(Bytes, Vec<(Slot, Committed)>)> {
    let ts = crate::node::registry::now_ms();
    let mut batches = Vec::new();
    let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
    let mut held = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let ((g, t, p), (o, m, id)) = entry;
        let value = serde_json::to_vec(&Value { o: *o, m: m.clone(), i: id.clone() }).unwrap_or_default();
        builder.push(held.len() as u32, ts, Some(&encode_key(g, t, *p)), Some(&value), &[]);
        held.push(entry.clone());
        if builder.estimated_size() >= BATCH_BYTES || i + 1 == entries.len() {
            batches.push((builder.build(0, 0), std::mem::take(&mut held)));
            builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        }
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(topic: &str, partition: u32, offset: u64) -> pb::CommittedOffset {
        pb::CommittedOffset { topic: topic.into(), partition, offset, metadata: format!("m{offset}") }
    }

    #[test]
    fn case_7_commits_take_effect_in_log_order_whatever_order_they_are_acknowledged_in() {
        let store = ClusterOffsets::new(4);
        let k = store.partition_of("g");
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), ferry_storage::LogConfig::default()).unwrap();
        store.load(k, 1, &log).unwrap();
        let ids = |t: &str| format!("{t}-id");
        let current = |t: &str| Some(format!("{t}-id"));
        // Two commits of the same slot at offsets 10 and 11; the later is acknowledged first.
        let first = store.encode("g", &[offset("a", 0, 5)], &ids).batches.remove(0).1;
        let second = store.encode("g", &[offset("a", 0, 9)], &ids).batches.remove(0).1;
        store.register(k, 1, 10, first);
        store.register(k, 1, 11, second);
        assert!(!store.settled(k));
        store.apply_through(k, 1, 12);
        assert_eq!(store.of_group("g", &current), vec![offset("a", 0, 9)], "the later commit wins, as a replay");
        assert!(store.settled(k));
        // A compaction waits while a written commit is not applied yet.
        store.register(k, 1, 12, store.encode("g", &[offset("a", 0, 11)], &ids).batches.remove(0).1);
        assert!(store.compaction(k, 10 * COMPACT_MIN_BYTES).is_none(), "memory lacks a written commit");
        store.apply_through(k, 1, 13);
        assert!(store.compaction(k, 10 * COMPACT_MIN_BYTES).is_some());
    }

    #[test]
    fn commits_replay_from_the_log_and_offsets_of_a_recreated_topic_are_not_returned() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), ferry_storage::LogConfig::default()).unwrap();
        let store = ClusterOffsets::new(4);
        let k = store.partition_of("g");
        store.load(k, 1, &log).unwrap();
        let ids = |t: &str| format!("{t}-id-1");
        for (group, offsets) in [("g", vec![offset("a", 0, 5), offset("b", 1, 7)]), ("g", vec![offset("a", 0, 9)])] {
            let commit = store.encode(group, &offsets, &ids);
            for (b, entries) in commit.batches {
                let info = log.append(&b).unwrap();
                store.register(k, 1, info.last_offset, entries);
            }
            store.apply_through(k, 1, log.log_end_offset());
        }
        let current = |t: &str| Some(format!("{t}-id-1"));
        let expected = vec![offset("a", 0, 9), offset("b", 1, 7)];
        assert_eq!(store.of_group("g", &current), expected);
        assert!(store.has_group("g") && !store.has_group("h"));
        // A new coordinator replays the same.
        let other = ClusterOffsets::new(4);
        other.load(k, 2, &log).unwrap();
        assert_eq!(other.of_group("g", &current), expected);
        assert_eq!((other.loaded_epoch(k), other.group_count()), (Some(2), 1));
        // "b" was deleted and created again: its old offset is not returned; "a"'s is.
        let recreated = |t: &str| Some(if t == "b" { "b-id-2".to_owned() } else { format!("{t}-id-1") });
        assert_eq!(other.of_group("g", &recreated), vec![offset("a", 0, 9)]);
        // A commit registered at another epoch than the loaded one is not taken (the partition moved meanwhile).
        for (_, entries) in other.encode("g", &[offset("a", 0, 100)], &ids).batches {
            other.register(k, 1, 1_000, entries);
        }
        other.apply_through(k, 2, u64::MAX);
        assert_eq!(other.of_group("g", &current), expected);
        // Compaction is due once the partition passes its floor and doubles; its batches replay to the same map.
        assert!(other.compaction(k, COMPACT_MIN_BYTES).is_none());
        let rewrite = other.compaction(k, COMPACT_MIN_BYTES + 1).expect("due");
        let dir2 = tempfile::tempdir().unwrap();
        let compacted = Log::open(dir2.path(), ferry_storage::LogConfig::default()).unwrap();
        for b in &rewrite {
            compacted.append(b).unwrap();
        }
        let third = ClusterOffsets::new(4);
        third.load(k, 3, &compacted).unwrap();
        assert_eq!(third.of_group("g", &current), expected);
        other.compacted(k, 2 * COMPACT_MIN_BYTES);
        assert!(other.compaction(k, 3 * COMPACT_MIN_BYTES).is_none(), "not before it doubles again");
        assert!(other.compaction(k, 4 * COMPACT_MIN_BYTES + 1).is_some());
        assert!(other.unload(k) && other.of_group("g", &current).is_empty());
    }
}
