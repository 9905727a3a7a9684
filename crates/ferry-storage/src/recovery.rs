//! Opening a log: finding its segments, checking them, and recovering from an unclean shutdown.
//!
//! - Segment files are found by name; a name that looks like a segment file but is malformed is `BadFile`. Files
//!   that are not ours are left alone (with a warning); leftover `*.tmp` files and orphan indexes are removed.
//! - A segment sealed below the recovery point (or any sealed segment after a clean close) is known whole and
//!   durable: its chain of headers is walked (one pread per batch), and each batch must parse, be whole and
//!   follow the previous one's offsets. A break there is real corruption: `CorruptSegment` naming the file,
//!   position and offset, never skipped. CRCs of such segments are checked by every read instead.
//! - After an unclean shutdown, the active segment and any segment sealed at or above the recovery point (whose
//!   fsync may not have happened under the async policy) are read through with every CRC checked; at the first
//!   torn, corrupt or zero-filled batch the file is cut, so the log recovers to exactly its last good batch. A
//!   sealed segment cut this way takes the segments after it along (they would follow a hole). After a clean
//!   close, the active segment's header chain is walked, and a break is recovered the same way.
//! - Each index is checked entry by entry against the batches found and rebuilt when wrong; a valid index that
//!   misses its tail (entries not yet written at a crash) is extended.
//! - Without the clean-shutdown marker, or when anything was cut, the epoch is bumped and persisted: offsets
//!   handed out from here on may repeat offsets of records lost in the crash, and the new epoch tells them apart.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::{self, EpochState};
use crate::clock::Clock;
use crate::fs::{FileSystem, FsRef, OpenMode};
use crate::index;
use crate::open_files::{OpenFiles, SegmentFile};
use crate::segment::{self, FileKind, Segment, walk_headers, walk_verified};
use crate::state::{CoreParts, LogCore, State, Writer};
use crate::{LogConfig, Result, StorageError};

/// The segment files present in a partition directory.
fn list_segments(fs: &dyn FileSystem, dir: &Path) -> Result<BTreeSet<u64>> {
    let mut logs = BTreeSet::new();
    let mut indexes = BTreeSet::new();
    let mut names = fs.read_dir(dir).map_err(LogCore::io_error(dir))?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if name.ends_with(checkpoint::TMP_SUFFIX) {
            // An atomic replace that never reached its rename.
            fs.remove_file(&path).map_err(LogCore::io_error(&path))?;
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
            None if [
                checkpoint::EPOCH_FILE,
                checkpoint::GAPS_FILE,
                checkpoint::RECOVERY_FILE,
                checkpoint::CLEAN_MARKER,
                checkpoint::LEADER_EPOCH_FILE,
            ]
            .contains(&name.as_str()) => {}
            None => tracing::warn!(path = %path.display(), "ignoring an unexpected file in a partition directory"),
        }
    }
    for base in indexes.difference(&logs) {
        let path = dir.join(segment::index_file_name(*base));
        tracing::warn!(path = %path.display(), "removing an index without a segment");
        fs.remove_file(&path).map_err(LogCore::io_error(&path))?;
    }
    Ok(logs)
}

/// How a segment is checked on open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Known durable and whole (sealed below the recovery point, or any sealed segment after a clean close):
    /// walk the headers; a break is corruption.
    Trusted,
    /// The active segment after a clean close: walk the headers; on a break, find the last good batch with CRCs
    /// and cut there.
    CleanTail,
    /// May have lost a tail in a crash (the active segment, or a segment sealed after the recovery point): check
    /// every CRC and cut at the first bad batch.
    Suspect,
}

/// Opens one existing segment, checks or recovers it, and loads (or rebuilds) its index. Returns the segment and
/// whether bytes were cut from it.
fn open_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    base: u64,
    check: Check,
    config: &LogConfig,
    files: &Arc<OpenFiles>,
    now_ms: i64,
) -> Result<(Segment, bool)> {
    let log_path = dir.join(segment::log_file_name(base));
    let index_path = dir.join(segment::index_file_name(base));
    let walk = if config.keep_corrupt_batches_followed_by_valid_ones {
        segment::walk_verified_past_corruption
    } else {
        walk_verified
    };
    let file = fs.open(&log_path, OpenMode::Existing).map_err(LogCore::io_error(&log_path))?;
    let size = file.len().map_err(LogCore::io_error(&log_path))?;
    if size > u64::from(u32::MAX) {
        return Err(StorageError::BadFile {
            path: log_path,
            reason: format!("segment is {size} bytes; positions past 4 GiB cannot be indexed"),
        });
    }
    let (batches, stop) = if check == Check::Suspect {
        walk(&*file, &log_path, base, size)?
    } else {
        walk_headers(&*file, &log_path, base, size)?
    };
    let (batches, end) = match stop {
        None => (batches, size),
        Some(stop) if check == Check::Trusted => return Err(stop.into_error(&log_path)),
        Some(stop) => {
            // A tail lost in a crash: find the last good batch (with CRCs, if not done yet) and cut there.
            let (batches, stop) =
                if check == Check::CleanTail { walk(&*file, &log_path, base, size)? } else { (batches, Some(stop)) };
            let cut = stop.as_ref().map_or(size, |s| s.pos);
            tracing::warn!(
                file = %log_path.display(),
                position = cut,
                lost_bytes = size - cut,
                reason = %stop.map_or_else(String::new, |s| s.error.to_string()),
                "recovering the log: cutting a torn or corrupt tail"
            );
            file.set_len(cut).and_then(|()| file.sync_all()).map_err(LogCore::io_error(&log_path))?;
            (batches, cut)
        }
    };
    let cut = end < size;

    let on_disk = index::read_file(fs, &index_path)?;
    let loaded = on_disk.as_deref().and_then(index::decode).filter(|e| index::is_valid(e, base, &batches));
    let entries = match loaded {
        Some(valid) => {
            let known = valid.len();
            let entries = index::extend(valid, base, &batches, config.index_interval_bytes);
            if entries.len() > known {
                let f = index::open_append(fs, &index_path)?;
                f.append(&[&index::encode_all(&entries[known..])]).map_err(LogCore::io_error(&index_path))?;
            }
            entries
        }
        None => {
            if on_disk.is_some() {
                tracing::warn!(file = %index_path.display(), "index does not match its segment; rebuilding it");
            }
            let entries = index::extend(Vec::new(), base, &batches, config.index_interval_bytes);
            checkpoint::write_atomic(fs, dir, &segment::index_file_name(base), &index::encode_all(&entries))?;
            entries
        }
    };
    // Segment age counts from the file's creation where the file system records it.
    let created_ms = (!batches.is_empty()).then(|| file.created_ms().map_or(now_ms, |c| c.min(now_ms)));
    let appended_ms = (!batches.is_empty()).then(|| file.modified_ms().map_or(now_ms, |m| m.min(now_ms)));
    let segment = Segment {
        base,
        file: SegmentFile::pinned(log_path.clone(), file, files),
        log_path,
        index_path,
        size: end,
        next_offset: batches.last().map_or(base, |b| b.last + 1),
        max_timestamp: batches.iter().map(|b| b.max_timestamp).max().unwrap_or(i64::MIN),
        index: entries,
        created_ms,
        appended_ms,
    };
    Ok((segment, cut))
}

/// `Log::open_with_clock`.
pub(crate) fn open(
    fsr: FsRef,
    dir: PathBuf,
    config: LogConfig,
    clock: Arc<dyn Clock>,
) -> Result<(LogCore, crate::types::OpenReport)> {
    let fs = &*fsr;
    // The directory's own entry must be durable too, or a power loss could take the whole partition along.
    crate::fs::sync_new_dirs(fs, &dir).map_err(LogCore::io_error(&dir))?;
    let bases = list_segments(fs, &dir)?;
    // A brand-new log (no segments, no checkpoint) starts at epoch 0: there is nothing a crash could have lost.
    let fresh = bases.is_empty() && !fs.exists(&dir.join(checkpoint::EPOCH_FILE)).map_err(LogCore::io_error(&dir))?;
    let marker = checkpoint::take_marker(fs, &dir)?;
    let clean = marker || fresh;
    let mut epochs = EpochState::load(fs, &dir)?;
    let recorded_gaps = checkpoint::load_gaps(fs, &dir)?;
    let now_ms = clock.now_ms();

    let recovery_point = checkpoint::load_recovery_point(fs, &dir)?;
    let files = OpenFiles::new(fsr.clone(), config.max_open_segments);
    let bases: Vec<u64> = bases.into_iter().collect();
    let mut segments: Vec<Segment> = Vec::with_capacity(bases.len());
    let mut cut_any = false;
    for (i, &base) in bases.iter().enumerate() {
        let active = i + 1 == bases.len();
        let check = match (clean, active) {
            (true, false) => Check::Trusted,
            (true, true) => Check::CleanTail,
            (false, false) if base < recovery_point => Check::Trusted,
            (false, _) => Check::Suspect,
        };
        let (segment, mut cut) = open_segment(fs, &dir, base, check, &config, &files, now_ms)?;
        if let Some(&next) = bases.get(i + 1)
            && check == Check::Suspect
            && !cut
            && segment.next_offset != next
            && !recorded_gaps.contains(&(segment.next_offset, next))
        {
            // A sealed segment that ends below the next one, where no gap was recorded: it lost a tail that never
            // reached the disk (writeback of the two files came in another order). What follows lies beyond a hole.
            tracing::warn!(
                file = %segment.log_path.display(),
                end = segment.next_offset,
                next_segment = next,
                "recovering the log: a sealed segment lost its unsynced tail"
            );
            cut = true;
        }
        if check == Check::Suspect {
            // What was checked is what the log now holds: make it durable before trusting it.
            segment.file.get()?.sync_all().map_err(LogCore::io_error(&segment.log_path))?;
        }
        let mut segment = segment;
        if !active {
            // Sealed: closed now and opened on demand through the bounded cache, so a log of many segments
            // opens holding only its active segment's files.
            segment.file.close();
        }
        cut_any |= cut;
        segments.push(segment);
        if cut && !active {
            // A sealed segment lost its tail: the segments after it lie beyond a hole in the offsets and go too.
            for &later in &bases[i + 1..] {
                let path = dir.join(segment::log_file_name(later));
                tracing::warn!(file = %path.display(), "removing a segment that follows a segment cut by recovery");
                for p in [path, dir.join(segment::index_file_name(later))] {
                    crate::fs::remove_if_exists(fs, &p)
                        .map_err(|source| StorageError::Io { path: p.clone(), source })?;
                }
            }
            break;
        }
    }
    // An empty segment that is not the last is left by an interrupted gap jump or reset: it holds nothing.
    let count = segments.len();
    let mut kept = Vec::with_capacity(count);
    for (i, seg) in segments.into_iter().enumerate() {
        if seg.is_empty() && i + 1 < count {
            tracing::warn!(file = %seg.log_path.display(), "removing an empty segment left by an interrupted operation");
            seg.remove_files(fs)?;
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
        segments.push(Segment::create(fs, &files, &dir, 0)?);
    }
    if let Some(active) = segments.last_mut() {
        // The last segment is the active one, also when recovery cut the log back into a sealed one.
        active.file.pin()?;
    }
    checkpoint::sync_dir(fs, &dir)?;

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
        epochs.store(fs, &dir)?;
    }

    let Some(active) = segments.last() else {
        return Err(StorageError::Closed { dir });
    };
    let writer = Writer {
        index_file: Some(index::open_append(fs, &active.index_path)?),
        index_pending: Vec::new(),
        last_index_pos: active.index.last().map_or(0, |e| u64::from(e.pos)),
        unflushed: 0,
        last_flush_ms: now_ms,
        poisoned: None,
        sealed_unflushed: Vec::new(),
        recovery_point,
        dir_unsynced: false,
    };
    let state = State { closed: false, config, segments, epochs, gaps: recorded_gaps.clone(), closed_range: (0, 0) };
    let layout_gaps = state.layout_gaps();
    let log = LogCore::new(CoreParts { dir, fs: fsr.clone(), clock, files, writer, state });
    if layout_gaps != recorded_gaps {
        tracing::info!(dir = %log.dir.display(), ?recorded_gaps, ?layout_gaps, "gaps record updated from the segment layout");
    }
    log.refresh_gaps()?;
    // Every segment before the active one is now known whole and durable.
    let active_base = log.state.read().segments.last().map_or(0, |s| s.base);
    log.set_recovery_point(&mut log.writer.lock(), active_base)?;
    Ok((log, crate::types::OpenReport { clean_shutdown: marker, fresh, cut: cut_any }))
}
