//! The small files beside the segments: the epoch checkpoint, the gaps record and the clean-shutdown marker.
//!
//! Checkpoints are short text files (an operator can read them), replaced atomically: written to `NAME.tmp`,
//! fsynced, renamed over `NAME`, then the directory is fsynced. A reader therefore sees the old or the new file,
//! never a torn one; a malformed file is a [`StorageError::BadFile`], never guessed at.

use std::path::{Path, PathBuf};

use crate::fs::FileSystem;
use crate::types::EpochEnd;
use crate::{Result, StorageError};

/// File holding the current epoch and the epoch history.
pub(crate) const EPOCH_FILE: &str = "epoch.checkpoint";
/// File holding the offset ranges skipped by gap appends.
pub(crate) const GAPS_FILE: &str = "gaps.checkpoint";
/// File holding the recovery point: every segment based below it was fsynced whole.
pub(crate) const RECOVERY_FILE: &str = "recovery-point.checkpoint";
/// Present only between a clean `close()` and the next `open()`.
pub(crate) const CLEAN_MARKER: &str = "clean-shutdown";
/// The leader-epoch checkpoint a replicated partition's broker keeps beside the segments (the log leaves it be).
pub const LEADER_EPOCH_FILE: &str = "leader-epoch.checkpoint";
/// Suffix of files being replaced atomically; leftovers are removed on open.
pub(crate) const TMP_SUFFIX: &str = crate::fs::TMP_SUFFIX;

const EPOCH_MAGIC: &str = "ferry-epochs v1";
const GAPS_MAGIC: &str = "ferry-gaps v1";
const RECOVERY_MAGIC: &str = "ferry-recovery-point v1";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.to_path_buf(), source }
}

/// fsyncs a directory so that creations, renames and removals inside it are durable.
pub(crate) fn sync_dir(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    fs.sync_dir(dir).map_err(io_err(dir))
}

/// Replaces `dir/name` with `contents` atomically and durably.
pub(crate) fn write_atomic(fs: &dyn FileSystem, dir: &Path, name: &str, contents: &[u8]) -> Result<()> {
    let path = dir.join(name);
    crate::fs::write_atomic(fs, &path, contents).map_err(io_err(&path))
}

fn read_optional(fs: &dyn FileSystem, path: &Path) -> Result<Option<String>> {
    match crate::fs::read_optional(fs, path).map_err(io_err(path))? {
        Some(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| StorageError::BadFile { path: path.to_path_buf(), reason: "not UTF-8 text".into() }),
        None => Ok(None),
    }
}

fn parse_pair<A: std::str::FromStr, B: std::str::FromStr>(line: &str) -> Option<(A, B)> {
    let mut parts = line.split_ascii_whitespace();
    let a = parts.next()?.parse().ok()?;
    let b = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((a, b))
}

/// The partition epoch and its history: `(epoch, first offset written in it)`, epochs strictly ascending.
///
/// Invariant: every history entry starts below the log end offset (entries are added when the first batch of an
/// epoch is appended, and dropped when truncation or recovery removes that batch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EpochState {
    /// The epoch bumped on unclean opens. New local appends use [`EpochState::latest`].
    pub current: u32,
    /// Epoch history, ascending by epoch and by start offset.
    pub history: Vec<(u32, u64)>,
}

impl EpochState {
    /// max(current, last history epoch): the epoch new local appends are stamped with.
    pub fn latest(&self) -> u32 {
        self.history.last().map_or(self.current, |&(e, _)| e.max(self.current))
    }

    /// Epoch of the last history entry, if any.
    pub fn last_history_epoch(&self) -> Option<u32> {
        self.history.last().map(|&(e, _)| e)
    }

    /// Whether appending a batch of `epoch` adds a history entry.
    pub fn starts_new_epoch(&self, epoch: u32) -> bool {
        self.last_history_epoch().is_none_or(|last| epoch > last)
    }

    /// `EpochEnd(epoch)` for a log whose end offset is `log_end`.
    pub fn epoch_end(&self, epoch: u32, log_end: u64) -> Option<EpochEnd> {
        let idx = self.history.partition_point(|&(e, _)| e <= epoch);
        let (found, _) = *self.history.get(idx.checked_sub(1)?)?;
        let end_offset = self.history.get(idx).map_or(log_end, |&(_, start)| start);
        Some(EpochEnd { epoch: found, end_offset })
    }

    /// Drops history entries starting at or after `log_end`. Returns whether anything changed.
    pub fn truncate_to(&mut self, log_end: u64) -> bool {
        let before = self.history.len();
        self.history.retain(|&(_, start)| start < log_end);
        self.history.len() != before
    }

    /// The bump that follows an unclean shutdown (or a recovery that cut data).
    pub fn bump(&mut self) {
        self.current = self.latest().saturating_add(1);
    }

    /// Makes the next local append's epoch at least `floor` and above every epoch in the history. Returns whether
    /// anything changed.
    pub fn raise_to(&mut self, floor: u32) -> bool {
        let want = floor.max(self.last_history_epoch().map_or(0, |e| e.saturating_add(1)));
        if self.current >= want {
            return false;
        }
        self.current = want;
        true
    }

    fn encode(&self) -> String {
        let mut out = format!("{EPOCH_MAGIC}\ncurrent {}\n", self.current);
        for (epoch, start) in &self.history {
            out.push_str(&format!("{epoch} {start}\n"));
        }
        out
    }

    fn decode(path: &Path, text: &str) -> Result<EpochState> {
        let bad = |reason: String| StorageError::BadFile { path: path.to_path_buf(), reason };
        let mut lines = text.lines();
        if lines.next() != Some(EPOCH_MAGIC) {
            return Err(bad(format!("first line is not \"{EPOCH_MAGIC}\"")));
        }
        let current = lines
            .next()
            .and_then(|l| l.strip_prefix("current "))
            .and_then(|n| n.trim().parse::<u32>().ok())
            .ok_or_else(|| bad("second line is not \"current <epoch>\"".into()))?;
        let mut history: Vec<(u32, u64)> = Vec::new();
        for (n, line) in lines.enumerate() {
            let (epoch, start): (u32, u64) =
                parse_pair(line).ok_or_else(|| bad(format!("line {} is not \"<epoch> <start offset>\"", n + 3)))?;
            if let Some(&(prev_epoch, prev_start)) = history.last()
                && (epoch <= prev_epoch || start < prev_start)
            {
                return Err(bad(format!(
                    "line {}: history must ascend, ({epoch}, {start}) follows ({prev_epoch}, {prev_start})",
                    n + 3
                )));
            }
            history.push((epoch, start));
        }
        Ok(EpochState { current, history })
    }

    /// Loads the checkpoint from `dir`; a missing file is a fresh log (epoch 0, no history).
    pub fn load(fs: &dyn FileSystem, dir: &Path) -> Result<EpochState> {
        let path = dir.join(EPOCH_FILE);
        match read_optional(fs, &path)? {
            None => Ok(EpochState::default()),
            Some(text) => EpochState::decode(&path, &text),
        }
    }

    /// Persists the checkpoint atomically.
    pub fn store(&self, fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        write_atomic(fs, dir, EPOCH_FILE, self.encode().as_bytes())
    }
}

/// Loads the gaps record, `[start, end)` ranges ascending; a missing file means no gaps.
pub(crate) fn load_gaps(fs: &dyn FileSystem, dir: &Path) -> Result<Vec<(u64, u64)>> {
    let path = dir.join(GAPS_FILE);
    let Some(text) = read_optional(fs, &path)? else { return Ok(Vec::new()) };
    let bad = |reason: String| StorageError::BadFile { path: path.clone(), reason };
    let mut lines = text.lines();
    if lines.next() != Some(GAPS_MAGIC) {
        return Err(bad(format!("first line is not \"{GAPS_MAGIC}\"")));
    }
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    for (n, line) in lines.enumerate() {
        let (start, end): (u64, u64) =
            parse_pair(line).ok_or_else(|| bad(format!("line {} is not \"<start> <end>\"", n + 2)))?;
        if start >= end || gaps.last().is_some_and(|&(_, prev_end)| start < prev_end) {
            return Err(bad(format!("line {}: gap [{start}, {end}) is empty or out of order", n + 2)));
        }
        gaps.push((start, end));
    }
    Ok(gaps)
}

/// Persists the gaps record atomically.
pub(crate) fn store_gaps(fs: &dyn FileSystem, dir: &Path, gaps: &[(u64, u64)]) -> Result<()> {
    let mut out = format!("{GAPS_MAGIC}\n");
    for (start, end) in gaps {
        out.push_str(&format!("{start} {end}\n"));
    }
    write_atomic(fs, dir, GAPS_FILE, out.as_bytes())
}

/// Loads the recovery point; a missing file is 0 (no segment is known to be flushed).
pub(crate) fn load_recovery_point(fs: &dyn FileSystem, dir: &Path) -> Result<u64> {
    let path = dir.join(RECOVERY_FILE);
    let Some(text) = read_optional(fs, &path)? else { return Ok(0) };
    let mut lines = text.lines();
    match (lines.next(), lines.next().and_then(|l| l.trim().parse::<u64>().ok()), lines.next()) {
        (Some(RECOVERY_MAGIC), Some(offset), None) => Ok(offset),
        _ => Err(StorageError::BadFile {
            path,
            reason: format!("expected \"{RECOVERY_MAGIC}\" and one offset on the next line"),
        }),
    }
}

/// Persists the recovery point atomically.
pub(crate) fn store_recovery_point(fs: &dyn FileSystem, dir: &Path, offset: u64) -> Result<()> {
    write_atomic(fs, dir, RECOVERY_FILE, format!("{RECOVERY_MAGIC}\n{offset}\n").as_bytes())
}

/// Path of the clean-shutdown marker.
pub(crate) fn marker_path(dir: &Path) -> PathBuf {
    dir.join(CLEAN_MARKER)
}

/// Writes the clean-shutdown marker durably.
pub(crate) fn write_marker(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    write_atomic(fs, dir, CLEAN_MARKER, b"clean\n")
}

/// Removes the marker if present (durably), returning whether it was there.
pub(crate) fn take_marker(fs: &dyn FileSystem, dir: &Path) -> Result<bool> {
    let path = marker_path(dir);
    match fs.remove_file(&path) {
        Ok(()) => {
            // The removal must be on disk before anything new is written, or a crash could pass for clean.
            sync_dir(fs, dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(StorageError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::OsFs;
    use std::fs;

    #[test]
    fn epoch_state_round_trips_and_answers_epoch_end() {
        let dir = tempfile::tempdir().unwrap();
        let state = EpochState { current: 4, history: vec![(0, 0), (2, 10), (3, 25)] };
        state.store(&OsFs, dir.path()).unwrap();
        assert_eq!(EpochState::load(&OsFs, dir.path()).unwrap(), state);
        assert_eq!(state.latest(), 4);
        assert_eq!(state.epoch_end(0, 40), Some(EpochEnd { epoch: 0, end_offset: 10 }));
        assert_eq!(state.epoch_end(1, 40), Some(EpochEnd { epoch: 0, end_offset: 10 }));
        assert_eq!(state.epoch_end(2, 40), Some(EpochEnd { epoch: 2, end_offset: 25 }));
        assert_eq!(state.epoch_end(3, 40), Some(EpochEnd { epoch: 3, end_offset: 40 }));
        assert_eq!(state.epoch_end(9, 40), Some(EpochEnd { epoch: 3, end_offset: 40 }));
        let later = EpochState { current: 0, history: vec![(5, 7)] };
        assert_eq!(later.epoch_end(4, 9), None);
        assert_eq!(EpochState::default().epoch_end(0, 0), None);
    }

    #[test]
    fn malformed_checkpoints_are_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        for text in ["nope\n", "ferry-epochs v1\ncurrent x\n", "ferry-epochs v1\ncurrent 1\n3 5\n2 9\n"] {
            fs::write(dir.path().join(EPOCH_FILE), text).unwrap();
            assert!(matches!(EpochState::load(&OsFs, dir.path()), Err(StorageError::BadFile { .. })), "{text:?}");
        }
        fs::write(dir.path().join(GAPS_FILE), "ferry-gaps v1\n9 3\n").unwrap();
        assert!(matches!(load_gaps(&OsFs, dir.path()), Err(StorageError::BadFile { .. })));
    }

    #[test]
    fn gaps_and_marker_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_gaps(&OsFs, dir.path()).unwrap(), vec![]);
        store_gaps(&OsFs, dir.path(), &[(3, 10), (12, 40)]).unwrap();
        assert_eq!(load_gaps(&OsFs, dir.path()).unwrap(), vec![(3, 10), (12, 40)]);
        assert_eq!(load_recovery_point(&OsFs, dir.path()).unwrap(), 0);
        store_recovery_point(&OsFs, dir.path(), 4711).unwrap();
        assert_eq!(load_recovery_point(&OsFs, dir.path()).unwrap(), 4711);
        fs::write(dir.path().join(RECOVERY_FILE), "ferry-recovery-point v1\nx\n").unwrap();
        assert!(matches!(load_recovery_point(&OsFs, dir.path()), Err(StorageError::BadFile { .. })));
        assert!(!take_marker(&OsFs, dir.path()).unwrap());
        write_marker(&OsFs, dir.path()).unwrap();
        assert!(take_marker(&OsFs, dir.path()).unwrap());
        assert!(!marker_path(dir.path()).exists());
    }
}
