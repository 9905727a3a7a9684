//! The sparse offset index of one segment.
//!
//! The `.index` file is a flat array of 8-byte entries, each `relative offset (u32 BE) | file position (u32 BE)`:
//! the batch whose base offset is `segment base + relative offset` starts at that byte of the `.log` file. Entries
//! ascend strictly in both fields. A batch gets an entry when it starts at least `index_interval_bytes` past the
//! previous entry (the first batch, at position 0, needs none: a lookup below every entry starts at 0).
//!
//! The index is a cache of the log: it is held in memory, written in blocks, fsynced when the segment is sealed or
//! the log closed, and on open checked entry by entry against the batches found in the log; a missing, wrongly
//! sized, unordered or wrong index is rebuilt from the log.

use std::path::Path;

use crate::fs::{FileRef, FileSystem, OpenMode};
use crate::types::BatchMeta;
use crate::{Result, StorageError};

/// Bytes per index entry.
pub(crate) const ENTRY_LEN: usize = 8;

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    /// Base offset of the batch minus the segment's base offset.
    pub rel: u32,
    /// Byte position of the batch in the `.log` file.
    pub pos: u32,
}

impl IndexEntry {
    /// The on-disk form.
    pub fn encode(self) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        out[..4].copy_from_slice(&self.rel.to_be_bytes());
        out[4..].copy_from_slice(&self.pos.to_be_bytes());
        out
    }
}

/// Whether a batch starting at `pos` gets an entry, given the position of the last entry (0 when none).
pub(crate) fn should_index(last_entry_pos: u64, pos: u64, interval: u64) -> bool {
    pos > 0 && pos - last_entry_pos >= interval.max(1)
}

/// Position of the batch to start scanning at for `offset`: the last entry at or below it, else 0.
pub(crate) fn lookup(entries: &[IndexEntry], segment_base: u64, offset: u64) -> u64 {
    let Some(rel) = offset.checked_sub(segment_base) else { return 0 };
    let idx = entries.partition_point(|e| u64::from(e.rel) <= rel);
    idx.checked_sub(1).map_or(0, |i| u64::from(entries[i].pos))
}

/// Decodes an index file's bytes; `None` when its size is not a whole number of entries.
pub(crate) fn decode(bytes: &[u8]) -> Option<Vec<IndexEntry>> {
    if bytes.len() % ENTRY_LEN != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(ENTRY_LEN)
            .map(|c| IndexEntry {
                rel: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                pos: u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect(),
    )
}

/// Encodes entries for the file.
pub(crate) fn encode_all(entries: &[IndexEntry]) -> Vec<u8> {
    entries.iter().flat_map(|e| e.encode()).collect()
}

/// Entry for `batch` in a segment based at `segment_base`, if it fits the format.
pub(crate) fn entry_for(segment_base: u64, batch: &BatchMeta) -> Option<IndexEntry> {
    let rel = u32::try_from(batch.base.checked_sub(segment_base)?).ok()?;
    let pos = u32::try_from(batch.pos).ok()?;
    Some(IndexEntry { rel, pos })
}

/// Builds the entries the interval rule gives for `batches`, continuing after `existing` (which must be valid).
pub(crate) fn extend(
    existing: Vec<IndexEntry>,
    segment_base: u64,
    batches: &[BatchMeta],
    interval: u64,
) -> Vec<IndexEntry> {
    let mut entries = existing;
    let start_pos = entries.last().map_or(0, |e| u64::from(e.pos));
    let mut last_pos = start_pos;
    for batch in batches.iter().filter(|b| b.pos > start_pos) {
        if should_index(last_pos, batch.pos, interval)
            && let Some(entry) = entry_for(segment_base, batch)
        {
            entries.push(entry);
            last_pos = batch.pos;
        }
    }
    entries
}

/// Whether every entry points at the start of a batch with the matching offset, in strictly ascending order.
pub(crate) fn is_valid(entries: &[IndexEntry], segment_base: u64, batches: &[BatchMeta]) -> bool {
    let mut next_batch = 0;
    let mut prev: Option<IndexEntry> = None;
    for entry in entries {
        if prev.is_some_and(|p| entry.rel <= p.rel || entry.pos <= p.pos) {
            return false;
        }
        prev = Some(*entry);
        // Both sequences ascend by position: advance the batch cursor to this entry's position.
        let pos = u64::from(entry.pos);
        while next_batch < batches.len() && batches[next_batch].pos < pos {
            next_batch += 1;
        }
        match batches.get(next_batch) {
            Some(b) if b.pos == pos && b.base.checked_sub(segment_base) == Some(u64::from(entry.rel)) => {}
            _ => return false,
        }
    }
    true
}

/// Reads an index file; a missing file reads as `None` (to be rebuilt).
pub(crate) fn read_file(fs: &dyn FileSystem, path: &Path) -> Result<Option<Vec<u8>>> {
    crate::fs::read_optional(fs, path).map_err(|source| StorageError::Io { path: path.to_path_buf(), source })
}

/// Opens an index file for appending entries.
pub(crate) fn open_append(fs: &dyn FileSystem, path: &Path) -> Result<FileRef> {
    fs.open(path, OpenMode::Create).map_err(|source| StorageError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pos: u64, base: u64) -> BatchMeta {
        BatchMeta { pos, len: 100, base, last: base + 9, max_timestamp: 0, epoch: 0 }
    }

    #[test]
    fn lookup_finds_the_last_entry_at_or_below() {
        let entries = vec![IndexEntry { rel: 10, pos: 500 }, IndexEntry { rel: 20, pos: 1000 }];
        assert_eq!(lookup(&entries, 100, 50), 0);
        assert_eq!(lookup(&entries, 100, 105), 0);
        assert_eq!(lookup(&entries, 100, 110), 500);
        assert_eq!(lookup(&entries, 100, 119), 500);
        assert_eq!(lookup(&entries, 100, 120), 1000);
        assert_eq!(lookup(&entries, 100, u64::MAX), 1000);
        assert_eq!(lookup(&[], 100, 150), 0);
    }

    #[test]
    fn extend_and_validate_agree() {
        let batches: Vec<_> = (0..10).map(|i| meta(i * 100, 1000 + i * 10)).collect();
        let full = extend(Vec::new(), 1000, &batches, 250);
        assert_eq!(
            full,
            vec![IndexEntry { rel: 30, pos: 300 }, IndexEntry { rel: 60, pos: 600 }, IndexEntry { rel: 90, pos: 900 }]
        );
        assert!(is_valid(&full, 1000, &batches));
        // A partial index (tail lost in a crash) is valid and extends to the same thing.
        assert_eq!(extend(full[..1].to_vec(), 1000, &batches, 250), full);
        // Wrong offset, wrong position, unordered: invalid.
        assert!(!is_valid(&[IndexEntry { rel: 31, pos: 300 }], 1000, &batches));
        assert!(!is_valid(&[IndexEntry { rel: 30, pos: 301 }], 1000, &batches));
        assert!(!is_valid(&[full[1], full[0]], 1000, &batches));
        assert!(!is_valid(&[IndexEntry { rel: 200, pos: 5000 }], 1000, &batches));
        assert_eq!(decode(&encode_all(&full)), Some(full));
        assert_eq!(decode(&[0u8; 7]), None);
    }
}
