//! A replica's leader-epoch history: for each leader epoch, the first offset written under it (Kafka's
//! leader-epoch checkpoint). It is kept apart from the batches' partition epochs, which on a mirror topic are the
//! source's. A follower truncates to the end of the last epoch it shares with its leader (KIP-101, KIP-279).
//!
//! The file `leader-epoch.checkpoint` lives beside the segments: a version line, then one `epoch start_offset`
//! line per entry, epochs and offsets increasing. Every change replaces it atomically and durably before the data
//! it describes is written.

use std::path::{Path, PathBuf};

use ferry_storage::LEADER_EPOCH_FILE;
use ferry_storage::fs::FileSystem;

use crate::error::{BrokerError, Result};

const VERSION: &str = "ferry-leader-epochs 1";

/// One entry: `epoch` began at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    /// The leader epoch.
    pub epoch: u32,
    /// Its first offset.
    pub start: u64,
}

/// The history, in memory and on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderEpochs {
    path: PathBuf,
    entries: Vec<EpochEntry>,
}

impl LeaderEpochs {
    /// Loads the history of the partition in `dir` (empty when the file does not exist).
    pub fn load(fs: &dyn FileSystem, dir: &Path) -> Result<LeaderEpochs> {
        let path = dir.join(LEADER_EPOCH_FILE);
        let io = |source| BrokerError::Io { path: path.clone(), source };
        let Some(bytes) = ferry_storage::fs::read_optional(fs, &path).map_err(io)? else {
            return Ok(LeaderEpochs { path, entries: Vec::new() });
        };
        let bad = |why: String| BrokerError::Internal(format!("{}: {why}", path.display()));
        let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
        let mut lines = text.lines();
        if lines.next() != Some(VERSION) {
            return Err(bad(format!("the first line is not {VERSION:?}")));
        }
        let mut entries: Vec<EpochEntry> = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let mut words = line.split(' ');
            let (Some(e), Some(s), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(format!("line {line:?} is not \"epoch start_offset\"")));
            };
            let entry = EpochEntry {
                epoch: e.parse().map_err(|_| bad(format!("bad epoch in {line:?}")))?,
                start: s.parse().map_err(|_| bad(format!("bad offset in {line:?}")))?,
            };
            if entries.last().is_some_and(|l| l.epoch >= entry.epoch || l.start > entry.start) {
                return Err(bad(format!("entry {line:?} does not follow the one before it")));
            }
            entries.push(entry);
        }
        Ok(LeaderEpochs { path, entries })
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The latest entry.
    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Records that `epoch` begins at `start`, durably, unless the history's latest epoch is `epoch` or newer.
    /// Entries that start at or past `start` (left by a truncated tail) are dropped first.
    pub fn assign(&mut self, fs: &dyn FileSystem, epoch: u32, start: u64) -> Result<()> {
        if self.latest().is_some_and(|l| l.epoch >= epoch) {
            return Ok(());
        }
        let mut next = self.entries.clone();
        next.retain(|e| e.start < start);
        if next.last().is_some_and(|l| l.epoch >= epoch) {
            return Ok(());
        }
        next.push(EpochEntry { epoch, start });
        self.store(fs, next)
    }

    /// Drops what a truncation to `leo` removed: entries starting at or past it.
    pub fn truncate(&mut self, fs: &dyn FileSystem, leo: u64) -> Result<()> {
        if self.entries.iter().all(|e| e.start < leo) {
            return Ok(());
        }
        let next = self.entries.iter().copied().filter(|e| e.start < leo).collect();
        self.store(fs, next)
    }

    /// The largest epoch at or below `epoch` and the first offset after it (`leo` when it is the latest): what a
    /// leader answers a follower's `LeaderEpochEnd`. `None` when every known epoch is newer.
    pub fn end_of(&self, epoch: u32, leo: u64) -> Option<(u32, u64)> {
        let i = self.entries.iter().rposition(|e| e.epoch <= epoch)?;
        let end = self.entries.get(i + 1).map_or(leo, |n| n.start);
        Some((self.entries[i].epoch, end))
    }

    /// The entries that matter to data in `[from, to]`: the one in force at `from` and those starting up to `to`.
    pub fn in_range(&self, from: u64, to: u64) -> Vec<EpochEntry> {
        let first = self.entries.iter().rposition(|e| e.start <= from).unwrap_or(0);
        self.entries.iter().skip(first).take_while(|e| e.start <= to).copied().collect()
    }

    fn store(&mut self, fs: &dyn FileSystem, entries: Vec<EpochEntry>) -> Result<()> {
        let mut text = format!("{VERSION}\n");
        for e in &entries {
            text.push_str(&format!("{} {}\n", e.epoch, e.start));
        }
        crate::node::topic::write_atomic(fs, &self.path, text.as_bytes())?;
        self.entries = entries;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_answers_epoch_ends_survives_reloads_and_follows_truncation() {
        let fs = ferry_storage::fs::os();
        let dir = tempfile::tempdir().unwrap();
        let mut h = LeaderEpochs::load(&*fs, dir.path()).unwrap();
        assert_eq!(h.end_of(3, 10), None);
        h.assign(&*fs, 1, 0).unwrap();
        h.assign(&*fs, 3, 40).unwrap();
        h.assign(&*fs, 2, 50).unwrap(); // older than the latest: ignored
        h.assign(&*fs, 5, 70).unwrap();
        let entries =
            [EpochEntry { epoch: 1, start: 0 }, EpochEntry { epoch: 3, start: 40 }, EpochEntry { epoch: 5, start: 70 }];
        assert_eq!(h.entries(), entries);
        assert_eq!(LeaderEpochs::load(&*fs, dir.path()).unwrap(), h);
        assert_eq!(h.end_of(0, 90), None);
        assert_eq!(h.end_of(1, 90), Some((1, 40)));
        assert_eq!(h.end_of(2, 90), Some((1, 40)));
        assert_eq!(h.end_of(4, 90), Some((3, 70)));
        assert_eq!(h.end_of(9, 90), Some((5, 90)));
        assert_eq!(h.in_range(45, 80), &entries[1..]);
        assert_eq!(h.in_range(10, 20), &entries[..1]);

        // A truncation to 55 drops epoch 5; a new epoch after it starts at the new end.
        h.truncate(&*fs, 55).unwrap();
        assert_eq!(h.entries(), &entries[..2]);
        h.assign(&*fs, 6, 55).unwrap();
        assert_eq!(LeaderEpochs::load(&*fs, dir.path()).unwrap().end_of(6, 60), Some((6, 60)));
        // Assigning at an offset below later entries replaces them (a tail that was truncated away).
        h.assign(&*fs, 7, 30).unwrap();
        assert_eq!(h.entries(), [EpochEntry { epoch: 1, start: 0 }, EpochEntry { epoch: 7, start: 30 }]);

        std::fs::write(dir.path().join(LEADER_EPOCH_FILE), "ferry-leader-epochs 1\n3 40\n2 50\n").unwrap();
        let err = LeaderEpochs::load(&*fs, dir.path()).unwrap_err().to_string();
        assert!(err.contains("does not follow the one before it"), "{err}");
    }
}
