//! Opening a log: finding its segments, checking them, and recovering from an unclean shutdown.
//!
//! - Segment files are found by name; a name that looks like a segment file but is malformed is `BadFile`. Files
//!   that are not ours are left alone (with a warning); leftover `*.tmp` files and orphan indexes are removed.
//! - Every sealed segment's chain of headers is walked (one pread per batch): each batch must parse, be whole and
//!   follow the previous one's offsets. A sealed segment was fsynced when it was sealed, so a break there is real
//!   corruption: `CorruptSegment` naming the file, position and offset, never skipped. CRCs of sealed segments
//!   are checked by every read instead.
//! - The active segment of an uncleanly closed log is read through with every CRC checked; at the first torn,
//!   corrupt or zero-filled batch the file is cut, so the log recovers to exactly its last good batch. After a
//!   clean close, its header chain is walked like a sealed segment's, and a break is recovered the same way.
//! - Each index is checked entry by entry against the batches found and rebuilt when wrong; a valid index that
//!   misses its tail (entries not yet written at a crash) is extended.
//! - Without the clean-shutdown marker, or when anything was cut, the epoch is bumped and persisted: offsets
//!   handed out from here on may repeat offsets of records lost in the crash, and the new epoch tells them apart.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Mutex, RwLock};

use crate::checkpoint::{self, EpochState};
use crate::clock::Clock;
use crate::index;
use crate::log::{Log, State, Writer};
use crate::segment::{self, FileKind, Segment, walk_headers, walk_verified};
use crate::{LogConfig, Result, StorageError};

/// The segment files present in a partition directory.
fn list_segments(dir: &Path) -> Result<BTreeSet<u64>> {
    let mut logs = BTreeSet::new();
    let mut indexes = BTreeSet::new();
    let entries = fs::read_dir(dir).map_err(Log::io_error(dir))?;
    for entry in entries {
        let entry = entry.map_err(Log::io_error(dir))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            tracing::warn!(path = %path.display(), "ignoring a file with a non-UTF-8 name in a partition directory");
            continue;
        };
        if name.ends_with(checkpoint::TMP_SUFFIX) {
            // An atomic replace that never reached its rename.
            fs::remove_file(&path).map_err(Log::io_error(&path))?;
            continue;
        }
        match segment::parse_file_name(&name) {
            Some(Ok(FileKind::Log(base))) => {
                logs.insert(base);
            }
            Some(Ok(FileKind::Index(base))) => {
                indexes.insert(base);
            }
            Some(Err(reason)) => return Err(StorageError::BadFile { path, reason }),
            None if [checkpoint::EPOCH_FILE, checkpoint::GAPS_FILE, checkpoint::CLEAN_MARKER]
                .contains(&name.as_str()) => {}
            None => tracing::warn!(path = %path.display(), "ignoring an unexpected file in a partition directory"),
        }
    }
    for base in indexes.difference(&logs) {
        let path = dir.join(segment::index_file_name(*base));
        tracing::warn!(path = %path.display(), "removing an index without a segment");
        fs::remove_file(&path).map_err(Log::io_error(&path))?;
    }
    Ok(logs)
}

/// Opens one existing segment, checks or recovers it, and loads (or rebuilds) its index. Returns the segment and
/// whether bytes were cut from it.
fn open_segment(
    dir: &Path,
    base: u64,
    active: bool,
    clean: bool,
    config: &LogConfig,
    now_ms: i64,
) -> Result<(Segment, bool)> {
    let log_path = dir.join(segment::log_file_name(base));
    let index_path = dir.join(segment::index_file_name(base));
    let file = OpenOptions::new().read(true).append(true).open(&log_path).map_err(Log::io_error(&log_path))?;
    let metadata = file.metadata().map_err(Log::io_error(&log_path))?;
    let size = metadata.len();
    if size > u64::from(u32::MAX) {
        return Err(StorageError::BadFile {
            path: log_path,
            reason: format!("segment is {size} bytes; positions past 4 GiB cannot be indexed"),
        });
    }
    let (batches, stop) = if active && !clean {
        walk_verified(&file, &log_path, base, size)?
    } else {
        walk_headers(&file, &log_path, base, size)?
    };
    let (batches, end) = match stop {
        None => (batches, size),
        Some(stop) if !active => return Err(stop.into_error(&log_path)),
        Some(stop) => {
            // The tail of the active segment: find the last good batch (with CRCs, if not done yet) and cut there.
            let (batches, stop) =
                if clean { walk_verified(&file, &log_path, base, size)? } else { (batches, Some(stop)) };
            let cut = stop.as_ref().map_or(size, |s| s.pos);
            tracing::warn!(
                file = %log_path.display(),
                position = cut,
                lost_bytes = size - cut,
                reason = %stop.map_or_else(String::new, |s| s.error.to_string()),
                "recovering the log: cutting a torn or corrupt tail"
            );
            file.set_len(cut).and_then(|()| file.sync_all()).map_err(Log::io_error(&log_path))?;
            (batches, cut)
        }
    };
    let cut = end < size;

    let on_disk = index::read_file(&index_path)?;
    let loaded = on_disk.as_deref().and_then(index::decode).filter(|e| index::is_valid(e, base, &batches));
    let entries = match loaded {
        Some(valid) => {
            let known = valid.len();
            let entries = index::extend(valid, base, &batches, config.index_interval_bytes);
            if entries.len() > known {
                use std::io::Write;
                let mut f = index::open_append(&index_path)?;
                f.write_all(&index::encode_all(&entries[known..])).map_err(Log::io_error(&index_path))?;
            }
            entries
        }
        None => {
            if on_disk.is_some() {
                tracing::warn!(file = %index_path.display(), "index does not match its segment; rebuilding it");
            }
            let entries = index::extend(Vec::new(), base, &batches, config.index_interval_bytes);
            checkpoint::write_atomic(dir, &segment::index_file_name(base), &index::encode_all(&entries))?;
            entries
        }
    };
    // Segment age counts from the file's creation where the file system records it.
    let created_ms = (!batches.is_empty()).then(|| {
        metadata
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .map_or(now_ms, |c| c.min(now_ms))
    });
    let segment = Segment {
        base,
        log_path,
        index_path,
        file: Arc::new(file),
        size: end,
        next_offset: batches.last().map_or(base, |b| b.last + 1),
        max_timestamp: batches.iter().map(|b| b.max_timestamp).max().unwrap_or(i64::MIN),
        index: entries,
        created_ms,
    };
    Ok((segment, cut))
}

/// `Log::open_with_clock`.
pub(crate) fn open(dir: PathBuf, config: LogConfig, clock: Arc<dyn Clock>) -> Result<Log> {
    fs::create_dir_all(&dir).map_err(Log::io_error(&dir))?;
    let bases = list_segments(&dir)?;
    // A brand-new log (no segments, no checkpoint) starts at epoch 0: there is nothing a crash could have lost.
    let fresh = bases.is_empty() && !dir.join(checkpoint::EPOCH_FILE).exists();
    let clean = checkpoint::take_marker(&dir)? || fresh;
    let mut epochs = EpochState::load(&dir)?;
    let recorded_gaps = checkpoint::load_gaps(&dir)?;
    let now_ms = clock.now_ms();

    let mut segments: Vec<Segment> = Vec::with_capacity(bases.len());
    let mut cut_any = false;
    let last_base = bases.last().copied();
    for &base in &bases {
        let (segment, cut) = open_segment(&dir, base, Some(base) == last_base, clean, &config, now_ms)?;
        cut_any |= cut;
        segments.push(segment);
    }
    // An empty segment that is not the last is left by an interrupted gap jump or reset: it holds nothing.
    let count = segments.len();
    let mut kept = Vec::with_capacity(count);
    for (i, seg) in segments.into_iter().enumerate() {
        if seg.is_empty() && i + 1 < count {
            tracing::warn!(file = %seg.log_path.display(), "removing an empty segment left by an interrupted operation");
            seg.remove_files()?;
        } else {
            kept.push(seg);
        }
    }
    let mut segments = kept;
    for pair in segments.windows(2) {
        if pair[1].base < pair[0].next_offset {
            return Err(StorageError::BadFile {
                path: pair[1].log_path.clone(),
                reason: format!(
                    "segment starts at offset {} but the segment before it holds offsets up to {}",
                    pair[1].base,
                    pair[0].next_offset - 1
                ),
            });
        }
    }
    if segments.is_empty() {
        segments.push(Segment::create(&dir, 0)?);
    }
    checkpoint::sync_dir(&dir)?;

    let log_end = segments.last().map_or(0, |s| s.next_offset);
    let mut epochs_changed = epochs.truncate_to(log_end);
    if !clean || cut_any {
        epochs.bump();
        epochs_changed = true;
        tracing::warn!(
            dir = %dir.display(),
            epoch = epochs.current,
            clean_shutdown = clean,
            cut = cut_any,
            "opened after an unclean shutdown: epoch bumped"
        );
    }
    if epochs_changed {
        epochs.store(&dir)?;
    }

    let Some(active) = segments.last() else {
        return Err(StorageError::Closed { dir });
    };
    let writer = Writer {
        index_file: Some(index::open_append(&active.index_path)?),
        index_pending: Vec::new(),
        last_index_pos: active.index.last().map_or(0, |e| u64::from(e.pos)),
        unflushed: 0,
        last_flush_ms: now_ms,
        poisoned: None,
    };
    let state = State { closed: false, config, segments, epochs, gaps: recorded_gaps.clone(), closed_range: (0, 0) };
    let layout_gaps = state.layout_gaps();
    let log = Log { dir, clock, writer: Mutex::new(writer), state: RwLock::new(state), generation: AtomicU64::new(0) };
    if layout_gaps != recorded_gaps {
        tracing::info!(dir = %log.dir.display(), ?recorded_gaps, ?layout_gaps, "gaps record updated from the segment layout");
    }
    log.refresh_gaps()?;
    Ok(log)
}
