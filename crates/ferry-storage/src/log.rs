//! One partition's log: the public [`Log`] handle, its result types, and the state shared by its parts.
//!
//! The work is split by responsibility: `append` (plain appends, rolling, flushing), `offsets` (appends with
//! caller-supplied offsets), `read` (reads, timestamp lookup, header scans), `maintenance` (truncation, retention)
//! and `recovery` (open). This file holds what they share and the public entry points.
//!
//! Concurrency: one `writer` mutex serialises every operation that changes the log; the segment list and
//! positions live in `state` behind a read-write lock that is held only to snapshot or publish, never across file
//! I/O. Readers pread on shared file handles they cloned under the lock, and see bytes only up to the committed
//! size, published after a batch is completely written. Operations that shrink or delete files (truncation,
//! retention) bump `generation`, so a reader that raced one retries instead of returning stale bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::checkpoint::{self, EpochState};
use crate::clock::{Clock, SystemClock};
use crate::fs::{FileRef, FsRef};
use crate::segment::Segment;
use crate::{LogConfig, Result, StorageError};
use ferry_batch::BatchHeader;

/// What a plain append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset given to the first record.
    pub base_offset: u64,
    /// Offset given to the last record.
    pub last_offset: u64,
    /// Epoch stamped on the batch.
    pub epoch: u32,
    /// Log end offset after the append.
    pub log_end_offset: u64,
}

/// Result of [`Log::append_with_offsets`] when nothing was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetAppendOutcome {
    /// Every offered batch is now in the log: `written` were appended, `present` were already there.
    Appended {
        /// Batches written.
        written: u32,
        /// Batches found already present (same base offset, last offset, CRC and epoch).
        present: u32,
        /// Log end offset after the call.
        log_end_offset: u64,
    },
    /// An offered batch below the log end differs from what is stored. Batches before it were handled; nothing
    /// at or after it was written.
    Diverged {
        /// The first offset at which stored and offered data differ.
        at: u64,
        /// Batches written before the divergent one.
        written: u32,
        /// Batches found present before the divergent one.
        present: u32,
        /// Log end offset after the call.
        log_end_offset: u64,
    },
}

/// The answer to `EpochEnd(epoch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEnd {
    /// The largest epoch in the log's history that is <= the requested epoch.
    pub epoch: u32,
    /// The first offset after that epoch: the start offset of the next epoch in the history, or the log end
    /// offset when it is the latest.
    pub end_offset: u64,
}

/// The result of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// Whole batches back to back. The first is the batch that contains the requested offset, so it may start
    /// before it. Empty when the offset equals the log end.
    pub batches: Bytes,
    /// Offset to read next: one past the last returned batch, or the requested offset when nothing was returned.
    pub next_offset: u64,
    /// Log start offset at the time of the read.
    pub log_start_offset: u64,
    /// Log end offset at the time of the read.
    pub log_end_offset: u64,
    /// Current epoch at the time of the read.
    pub epoch: u32,
}

/// A snapshot of the log's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStats {
    /// First offset held.
    pub log_start_offset: u64,
    /// One past the last offset held.
    pub log_end_offset: u64,
    /// Current epoch.
    pub epoch: u32,
    /// Bytes of all segment files.
    pub size_bytes: u64,
    /// Number of segments.
    pub segments: u32,
    /// Offset ranges [start, end) skipped by gap appends (mirrored source retention).
    pub gaps: Vec<(u64, u64)>,
}

/// One partition's segmented log. `Send + Sync`: one writer and many readers may call it concurrently; all
/// methods take `&self`.
pub struct Log {
    pub(crate) dir: PathBuf,
    /// Every file the log touches is reached through this.
    pub(crate) fs: FsRef,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) state: RwLock<State>,
    /// Bumped whenever bytes a reader may have located are removed or rewritten.
    pub(crate) generation: AtomicU64,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.read();
        f.debug_struct("Log")
            .field("dir", &self.dir)
            .field("log_start", &st.log_start())
            .field("log_end", &st.log_end())
            .field("segments", &st.segments.len())
            .field("closed", &st.closed)
            .finish()
    }
}

/// What readers snapshot and the writer publishes.
#[derive(Debug)]
pub(crate) struct State {
    /// Set by `close()`/`delete()`.
    pub closed: bool,
    /// Current configuration.
    pub config: LogConfig,
    /// Segments ascending by base offset; the last is the active one. Never empty while open.
    pub segments: Vec<Segment>,
    /// Current epoch and history (persisted in the epoch checkpoint).
    pub epochs: EpochState,
    /// Offset ranges skipped by gap appends (persisted in the gaps record).
    pub gaps: Vec<(u64, u64)>,
    /// (log start, log end) as they were at close, so getters keep answering.
    pub closed_range: (u64, u64),
}

impl State {
    /// First offset held.
    pub fn log_start(&self) -> u64 {
        self.segments.first().map_or(self.closed_range.0, |s| s.base)
    }

    /// One past the last offset held.
    pub fn log_end(&self) -> u64 {
        self.segments.last().map_or(self.closed_range.1, |s| s.next_offset)
    }

    /// Gaps as the segment layout shows them: where a segment starts above the end of the one before it.
    pub fn layout_gaps(&self) -> Vec<(u64, u64)> {
        self.segments
            .windows(2)
            .filter(|w| w[1].base > w[0].next_offset)
            .map(|w| (w[0].next_offset, w[1].base))
            .collect()
    }
}

/// State only the writer touches (guarded by the writer mutex).
#[derive(Debug)]
pub(crate) struct Writer {
    /// The active segment's index file, opened for appending; `None` once closed.
    pub index_file: Option<FileRef>,
    /// Encoded index entries not yet written to `index_file`.
    pub index_pending: Vec<u8>,
    /// Position of the active segment's last index entry (0 when none).
    pub last_index_pos: u64,
    /// Bytes appended since the last fsync.
    pub unflushed: u64,
    /// Clock time of the last fsync.
    pub last_flush_ms: i64,
    /// Set when a failed append could not be undone; appends are refused until the log is reopened.
    pub poisoned: Option<String>,
    /// Segments sealed under the async policy and not fsynced yet (the next flush does it).
    pub sealed_unflushed: Vec<SealedFiles>,
    /// The persisted recovery point: every segment based below it is durable.
    pub recovery_point: u64,
    /// A segment file was created under the async policy and the directory not fsynced yet (the next flush does).
    pub dir_unsynced: bool,
}

/// The files of a sealed segment awaiting its fsync.
#[derive(Debug)]
pub(crate) struct SealedFiles {
    /// The `.log` file.
    pub log: FileRef,
    /// Its path.
    pub log_path: PathBuf,
    /// The `.index` file.
    pub index: Option<FileRef>,
    /// Its path.
    pub index_path: PathBuf,
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, recovering from an unclean shutdown when the clean-shutdown
    /// marker is absent.
    pub fn open(dir: impl Into<PathBuf>, config: LogConfig) -> Result<Log> {
        Log::open_with_clock(dir, config, Arc::new(SystemClock))
    }

    /// [`Log::open`] with a given clock (tests drive segment age and the flush interval with a manual clock).
    pub fn open_with_clock(dir: impl Into<PathBuf>, config: LogConfig, clock: Arc<dyn Clock>) -> Result<Log> {
        crate::recovery::open(crate::fs::os(), dir.into(), config, clock)
    }

    /// [`Log::open_with_clock`] on a given file layer (tests use [`crate::fs::SimFs`] to simulate power loss).
    pub fn open_on(fs: FsRef, dir: impl Into<PathBuf>, config: LogConfig, clock: Arc<dyn Clock>) -> Result<Log> {
        crate::recovery::open(fs, dir.into(), config, clock)
    }

    /// The file layer the log runs on.
    pub fn file_system(&self) -> &FsRef {
        &self.fs
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn closed_error(&self) -> StorageError {
        StorageError::Closed { dir: self.dir.clone() }
    }

    pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
        move |source| StorageError::Io { path: path.to_path_buf(), source }
    }

    pub(crate) fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn current_generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The current configuration.
    pub fn config(&self) -> LogConfig {
        self.state.read().config.clone()
    }

    /// Replaces the configuration (topic config changes). Takes effect for the next append, roll and retention.
    pub fn set_config(&self, config: LogConfig) {
        let _w = self.writer.lock();
        self.state.write().config = config;
    }

    /// Appends one whole batch, assigning offsets from the log end and stamping the current epoch. The batch's
    /// CRC and size are checked first; a bad batch writes nothing. Honours the flush policy before returning.
    pub fn append(&self, batch: &[u8]) -> Result<AppendInfo> {
        self.append_batch(batch)
    }

    /// Appends batches that already carry offsets and epochs (the mirror's path, design §3).
    ///
    /// Every batch is checked (whole, CRC, size, offsets strictly increasing across the batches) and the whole
    /// call is planned before anything is written, so a refused call writes nothing. Against the log end
    /// offset (LEO), in order:
    /// - a batch ending below the LEO whose stored twin (same base and last offset, CRC and epoch) is there is
    ///   "present"; any other batch ending below the LEO makes the call stop with `Diverged { at }`, `at` being
    ///   the first offset where the records differ (or the batch's base offset when only epochs or boundaries
    ///   differ);
    /// - a batch starting at the LEO is written as is (its epoch and producer fields are kept); its epoch must not
    ///   be below the latest epoch in the history;
    /// - a batch starting above the LEO is written only when `LEO < source_log_start <= base`: the range
    ///   `[LEO, base)` was removed by the source's retention. A new segment starts at `base` and the gap is
    ///   recorded (an empty log just moves its log start). With no batches at all, `LEO < source_log_start`
    ///   moves the log end to `source_log_start` the same way;
    /// - a batch straddling the LEO is refused, as is a batch lying below the log start (nothing to compare).
    pub fn append_with_offsets(&self, batches: &[u8], source_log_start: u64) -> Result<OffsetAppendOutcome> {
        self.append_offsets(batches, source_log_start)
    }

    /// Reads whole batches starting with the one that contains `offset`, up to `max_bytes` (at least one whole
    /// batch when any exists at or after `offset`). After a gap, reading starts at the first batch above it.
    /// Every returned batch's CRC is checked; a bad one is `CorruptSegment`, never skipped.
    pub fn read(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        self.read_batches(offset, max_bytes)
    }

    /// First offset held.
    pub fn log_start_offset(&self) -> u64 {
        self.state.read().log_start()
    }

    /// One past the last offset held.
    pub fn log_end_offset(&self) -> u64 {
        self.state.read().log_end()
    }

    /// The epoch new local appends are stamped with (at least the latest epoch in the history).
    pub fn epoch(&self) -> u32 {
        self.state.read().epochs.latest()
    }

    /// `EpochEnd(epoch)`, or `None` when the history holds no epoch <= `epoch`. A log that never had a batch
    /// appended has an empty history and answers `None` for every epoch, even its current one.
    pub fn epoch_end(&self, epoch: u32) -> Option<EpochEnd> {
        let st = self.state.read();
        st.epochs.epoch_end(epoch, st.log_end())
    }

    /// The epoch history: (epoch, first offset written in it), ascending.
    pub fn epoch_history(&self) -> Vec<(u32, u64)> {
        self.state.read().epochs.history.clone()
    }

    /// The first offset whose batch's max timestamp is >= `timestamp_ms` (the first record in that batch at or
    /// after the timestamp), or `None` when there is none.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> Result<Option<u64>> {
        self.lookup_timestamp(timestamp_ms)
    }

    /// Removes every batch at or after the batch boundary <= `offset`, returning the new log end offset.
    ///
    /// The boundary is the start of the batch containing `offset`, or `offset` itself when a batch starts there;
    /// inside a gap it is the end of the data below the gap. `offset >= LEO` changes nothing. `offset <= log
    /// start` empties the log, which then starts (and ends) at `offset`. Epoch history entries and gaps at or
    /// above the new log end are dropped.
    pub fn truncate_to(&self, offset: u64) -> Result<u64> {
        self.truncate(offset)
    }

    /// Deletes whole sealed segments past the retention limits, returning how many were deleted.
    ///
    /// By bytes: the oldest sealed segments go while the log is larger than `retention_bytes`. By time: the
    /// oldest sealed segments go while their newest record is older than `now_ms - retention_ms`. The active
    /// segment always stays; the log start becomes the base offset of the first remaining segment.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        self.retain(now_ms)
    }

    /// fsyncs everything appended so far.
    pub fn flush(&self) -> Result<()> {
        let mut w = self.writer.lock();
        if self.state.read().closed {
            return Err(self.closed_error());
        }
        self.flush_locked(&mut w)
    }

    /// Under the async flush policy, fsyncs when the interval has passed since the last flush. Returns whether it
    /// flushed.
    pub fn flush_if_due(&self) -> Result<bool> {
        let mut w = self.writer.lock();
        let interval = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            match st.config.flush {
                crate::FlushPolicy::Sync => return Ok(false),
                crate::FlushPolicy::Async { interval, .. } => interval,
            }
        };
        let due_at = w.last_flush_ms.saturating_add(i64::try_from(interval.as_millis()).unwrap_or(i64::MAX));
        if w.unflushed == 0 || self.clock.now_ms() < due_at {
            return Ok(false);
        }
        self.flush_locked(&mut w)?;
        Ok(true)
    }

    /// Calls `f` with the header of every batch whose last offset is >= `from_offset`, in order (reads headers
    /// only). Used to rebuild producer state after a restart.
    pub fn for_each_batch_header(&self, from_offset: u64, f: &mut dyn FnMut(&BatchHeader)) -> Result<()> {
        self.scan_headers(from_offset, f)
    }

    /// Base offsets of the segments, ascending.
    pub fn segment_base_offsets(&self) -> Vec<u64> {
        self.state.read().segments.iter().map(|s| s.base).collect()
    }

    /// A snapshot of the log's shape. `size_bytes` counts the `.log` files (what retention measures).
    pub fn stats(&self) -> LogStats {
        let st = self.state.read();
        LogStats {
            log_start_offset: st.log_start(),
            log_end_offset: st.log_end(),
            epoch: st.epochs.latest(),
            size_bytes: st.segments.iter().map(|s| s.size).sum(),
            segments: u32::try_from(st.segments.len()).unwrap_or(u32::MAX),
            gaps: st.gaps.clone(),
        }
    }

    /// Flushes, writes the clean-shutdown marker and closes the files. Later calls fail with `Closed`; closing
    /// again is a no-op.
    pub fn close(&self) -> Result<()> {
        let mut w = self.writer.lock();
        if self.state.read().closed {
            return Ok(());
        }
        self.flush_locked(&mut w)?;
        if let Some(index) = &w.index_file {
            let path = self.state.read().segments.last().map(|s| s.index_path.clone()).unwrap_or_default();
            index.sync_all().map_err(Log::io_error(&path))?;
        }
        checkpoint::write_marker(&*self.fs, &self.dir)?;
        w.index_file = None;
        let mut st = self.state.write();
        st.closed_range = (st.log_start(), st.log_end());
        st.closed = true;
        st.segments.clear();
        Ok(())
    }

    /// Closes the log and removes its directory (topic deletion).
    pub fn delete(&self) -> Result<()> {
        self.close()?;
        let _w = self.writer.lock();
        match self.fs.remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StorageError::Io { path: self.dir.clone(), source }),
        }
    }
}
