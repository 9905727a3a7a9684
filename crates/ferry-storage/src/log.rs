//! One partition's log: the public [`Log`] handle and its entry points.
//!
//! `Log` is a facade over a [`LogCore`] (module `state`): the work is split by responsibility into `append`
//! (plain appends, rolling, flushing), `offsets` (appends with caller-supplied offsets), `read` (reads, timestamp
//! lookup, header scans), `maintenance` (truncation, retention) and `recovery` (open), each working on the core.
//! This module depends on them; none of them depends on it. The concurrency rules are in `state`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_batch::BatchHeader;

use crate::checkpoint;
use crate::clock::{Clock, SystemClock};
use crate::fs::FsRef;
use crate::state::LogCore;
use crate::types::{AppendInfo, Caller, EpochEnd, LogStats, OffsetAppendOutcome, OpenReport, ReadResult};
use crate::{FlushPolicy, LogConfig, Result, StorageError};

/// One partition's segmented log. `Send + Sync`: one writer and many readers may call it concurrently; all
/// methods take `&self`.
pub struct Log {
    core: LogCore,
    opened: OpenReport,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.core.state.read();
        f.debug_struct("Log")
            .field("dir", &self.core.dir)
            .field("log_start", &st.log_start())
            .field("log_end", &st.log_end())
            .field("segments", &st.segments.len())
            .field("closed", &st.closed)
            .finish()
    }
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, recovering from an unclean shutdown when the clean-shutdown
    /// marker is absent.
    pub fn open(dir: impl Into<PathBuf>, config: LogConfig) -> Result<Log> {
        Log::open_with_clock(dir, config, Arc::new(SystemClock))
    }

    /// [`Log::open`] with a given clock (tests drive segment age and the flush interval with a manual clock).
    pub fn open_with_clock(dir: impl Into<PathBuf>, config: LogConfig, clock: Arc<dyn Clock>) -> Result<Log> {
        let (core, opened) = crate::recovery::open(crate::fs::os(), dir.into(), config, clock)?;
        Ok(Log { core, opened })
    }

    /// [`Log::open_with_clock`] on a given file layer (tests use [`crate::fs::SimFs`] to simulate power loss).
    pub fn open_on(fs: FsRef, dir: impl Into<PathBuf>, config: LogConfig, clock: Arc<dyn Clock>) -> Result<Log> {
        let (core, opened) = crate::recovery::open(fs, dir.into(), config, clock)?;
        Ok(Log { core, opened })
    }

    /// How the log came back when it was opened: whether its shutdown was clean and recovery cut nothing.
    pub fn opened(&self) -> OpenReport {
        self.opened
    }

    /// The file layer the log runs on.
    pub fn file_system(&self) -> &FsRef {
        &self.core.fs
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// The current configuration.
    pub fn config(&self) -> LogConfig {
        self.core.state.read().config.clone()
    }

    /// Replaces the configuration (topic config changes). Takes effect for the next append, roll and retention.
    pub fn set_config(&self, config: LogConfig) {
        let _w = self.core.writer.lock();
        self.core.files.set_capacity(config.max_open_segments);
        self.core.state.write().config = config;
    }

    /// Appends one whole batch, assigning offsets from the log end and stamping the current epoch. The batch's
    /// CRC and size are checked first; a bad batch writes nothing. Honours the flush policy before returning.
    pub fn append(&self, batch: &[u8]) -> Result<AppendInfo> {
        self.core.append_batch(batch)
    }

    /// Appends several batches as [`Log::append`] does each, all or nothing: every batch is checked and given its
    /// offsets first, then all of them are written with one write and published together, so a reader never sees
    /// some of them without the others, and a write that fails part-way (a full disk) is taken back whole. One
    /// [`AppendInfo`] per batch, in order.
    pub fn append_all(&self, batches: &[&[u8]]) -> Result<Vec<AppendInfo>> {
        self.core.append_batches(batches, Caller::Plain)
    }

    /// [`Log::append_all`] for batches whose CRCs the caller has just verified (`ferry_batch::verify` on these very
    /// bytes, in this process): every other check is made, the CRC pass is not made twice. The broker verifies a
    /// request once, before it plans it, and appends with this. Under the async flush policy the byte threshold is
    /// the caller's: this append never fsyncs for it, and the caller runs [`Log::flush_over_threshold`].
    pub fn append_all_verified(&self, batches: &[&[u8]]) -> Result<Vec<AppendInfo>> {
        self.core.append_batches(batches, Caller::Verified)
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
    /// - a batch starting above the LEO is written only when `LEO < source_log_start == base`: the range
    ///   `[LEO, base)` was removed by the source's retention. A new segment starts at `base` and the gap is
    ///   recorded (an empty log just moves its log start). With no batches at all, `LEO < source_log_start`
    ///   moves the log end to `source_log_start` the same way;
    /// - a batch straddling the LEO is refused, as is a batch lying below the log start (nothing to compare).
    pub fn append_with_offsets(&self, batches: &[u8], source_log_start: u64) -> Result<OffsetAppendOutcome> {
        self.core.append_offsets(batches, source_log_start, Caller::Plain)
    }

    /// [`Log::append_with_offsets`] for batches whose CRCs the caller has just verified, leaving the async byte
    /// threshold to the caller (as [`Log::append_all_verified`]).
    pub fn append_with_offsets_verified(&self, batches: &[u8], source_log_start: u64) -> Result<OffsetAppendOutcome> {
        self.core.append_offsets(batches, source_log_start, Caller::Verified)
    }

    /// Reads whole batches starting with the one that contains `offset`, up to `max_bytes` (at least one whole
    /// batch when any exists at or after `offset`). After a gap, reading starts at the first batch above it.
    /// Every returned batch's CRC is checked; a bad one is `CorruptSegment`, never skipped.
    pub fn read(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        self.core.read_batches(offset, max_bytes)
    }

    /// [`Log::read`] for readers that ask the same question moments apart (a replicated partition's followers): the
    /// answer is kept, and the next `read_shared` asking the same is handed it from memory, once, when a fresh read
    /// would return exactly the same batches (the bytes the first read checked). [`Log::read`] never is, so a
    /// consumer or a verification always reads and checks the file.
    pub fn read_shared(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        self.core.read_batches_shared(offset, max_bytes)
    }

    /// First offset held.
    pub fn log_start_offset(&self) -> u64 {
        self.core.state.read().log_start()
    }

    /// One past the last offset held.
    pub fn log_end_offset(&self) -> u64 {
        self.core.state.read().log_end()
    }

    /// The epoch new local appends are stamped with (at least the latest epoch in the history).
    pub fn epoch(&self) -> u32 {
        self.core.state.read().epochs.latest()
    }

    /// Starts a new partition epoch (as an unclean open does): the next local append is stamped with it, and the
    /// history gains its entry with that batch. Durable before it returns. Returns the new epoch.
    pub fn bump_epoch(&self) -> Result<u32> {
        let _w = self.core.writer.lock();
        let mut epochs = self.core.state.read().epochs.clone();
        epochs.bump();
        epochs.store(&*self.core.fs, &self.core.dir)?;
        let epoch = epochs.latest();
        self.core.state.write().epochs = epochs;
        Ok(epoch)
    }

    /// Makes the epoch of the next local append at least `floor` and above every epoch in the history (a promoted
    /// mirror topic's first write after its promotion), durably, unless it already is. Returns the epoch.
    pub fn raise_epoch(&self, floor: u32) -> Result<u32> {
        let _w = self.core.writer.lock();
        let mut epochs = self.core.state.read().epochs.clone();
        if epochs.raise_to(floor) {
            epochs.store(&*self.core.fs, &self.core.dir)?;
            self.core.state.write().epochs = epochs;
        }
        Ok(self.core.state.read().epochs.latest())
    }

    /// `EpochEnd(epoch)`, or `None` when the history holds no epoch <= `epoch`. A log that never had a batch
    /// appended has an empty history and answers `None` for every epoch, even its current one.
    pub fn epoch_end(&self, epoch: u32) -> Option<EpochEnd> {
        let st = self.core.state.read();
        st.epochs.epoch_end(epoch, st.log_end())
    }

    /// The epoch history: (epoch, first offset written in it), ascending.
    pub fn epoch_history(&self) -> Vec<(u32, u64)> {
        self.core.state.read().epochs.history.clone()
    }

    /// The first offset whose batch's max timestamp is >= `timestamp_ms` (the first record in that batch at or
    /// after the timestamp), or `None` when there is none.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> Result<Option<u64>> {
        self.core.lookup_timestamp(timestamp_ms)
    }

    /// Removes every batch at or after the batch boundary <= `offset`, returning the new log end offset.
    ///
    /// The boundary is the start of the batch containing `offset`, or `offset` itself when a batch starts there;
    /// inside a gap it is the end of the data below the gap. `offset >= LEO` changes nothing. `offset <= log
    /// start` empties the log, which then starts (and ends) at `offset`. Epoch history entries and gaps at or
    /// above the new log end are dropped.
    pub fn truncate_to(&self, offset: u64) -> Result<u64> {
        self.core.truncate(offset)
    }

    /// Deletes whole sealed segments past the retention limits, returning how many were deleted.
    ///
    /// By bytes: the oldest sealed segments go while the log is larger than `retention_bytes`. By time: the
    /// oldest sealed segments go while their newest record is older than `now_ms - retention_ms`. The active
    /// segment always stays; the log start becomes the base offset of the first remaining segment.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        self.core.retain(now_ms)
    }

    /// Seals the active segment, when it holds anything, and starts a new one at the log end; the sealed segment
    /// is made durable before this returns (so recovery trusts it from then on). Returns whether it rolled.
    pub fn roll(&self) -> Result<bool> {
        self.core.roll_now()
    }

    /// Deletes the whole sealed segments that end at or before `offset` (every offset they hold is below it),
    /// returning how many were deleted; the log start becomes the base of the first remaining segment. The
    /// active segment always stays, as does a segment holding `offset`. For a partition whose owner has rewritten
    /// everything it still needs at or above `offset` (the broker's group offsets partition).
    pub fn delete_segments_before(&self, offset: u64) -> Result<usize> {
        self.core.delete_before(offset)
    }

    /// fsyncs everything appended so far.
    pub fn flush(&self) -> Result<()> {
        let mut w = self.core.writer.lock();
        if self.core.state.read().closed {
            return Err(self.core.closed_error());
        }
        self.core.flush_locked(&mut w)
    }

    /// Under the async flush policy, fsyncs when the interval has passed since the last flush. Returns whether it
    /// flushed. Appends are not held up by the fsync: it runs without the log's write lock (what they append
    /// meanwhile is left for the next flush).
    pub fn flush_if_due(&self) -> Result<bool> {
        let w = self.core.writer.lock();
        let interval = {
            let st = self.core.state.read();
            if st.closed {
                return Err(self.core.closed_error());
            }
            match st.config.flush {
                FlushPolicy::Sync => return Ok(false),
                FlushPolicy::Async { interval, .. } => interval,
            }
        };
        let due_at = w.last_flush_ms.saturating_add(i64::try_from(interval.as_millis()).unwrap_or(i64::MAX));
        if w.unflushed == 0 || self.core.clock.now_ms() < due_at {
            return Ok(false);
        }
        drop(w);
        self.core.flush_concurrently()?;
        Ok(true)
    }

    /// Under the async flush policy, fsyncs when `bytes` or more are unflushed, as [`Log::flush_if_due`] does
    /// (appends go on meanwhile). For the callers of [`Log::append_all_verified`] and
    /// [`Log::append_with_offsets_verified`], whose appends leave the byte threshold to them: the broker runs it
    /// right after such an append, without making that append's answer wait for it. Returns whether it flushed.
    pub fn flush_over_threshold(&self) -> Result<bool> {
        if !self.over_flush_threshold() {
            return Ok(false);
        }
        self.core.flush_concurrently()?;
        Ok(true)
    }

    /// Whether the async policy's byte threshold is reached (what [`Log::flush_over_threshold`] would flush).
    pub fn over_flush_threshold(&self) -> bool {
        let w = self.core.writer.lock();
        let st = self.core.state.read();
        matches!(st.config.flush, FlushPolicy::Async { bytes, .. } if !st.closed && w.unflushed >= bytes)
    }

    /// Calls `f` with the header of every batch whose last offset is >= `from_offset`, in order (reads headers
    /// only). Used to rebuild producer state after a restart.
    pub fn for_each_batch_header(&self, from_offset: u64, f: &mut dyn FnMut(&BatchHeader)) -> Result<()> {
        self.core.scan_headers(from_offset, f)
    }

    /// Base offsets of the segments, ascending.
    pub fn segment_base_offsets(&self) -> Vec<u64> {
        self.core.state.read().segments.iter().map(|s| s.base).collect()
    }

    /// The bytes the log holds from `offset` to its end: how far a reader at `offset` is behind, in bytes. Exact
    /// to within one index interval (`index_interval_bytes`): the count starts at the index entry at or below
    /// `offset`. 0 at or past the log end.
    pub fn bytes_from(&self, offset: u64) -> u64 {
        let st = self.core.state.read();
        let idx = st.segments.partition_point(|s| s.next_offset <= offset);
        let Some(first) = st.segments.get(idx) else { return 0 };
        let within = first.size.saturating_sub(first.scan_start(offset));
        within + st.segments[idx + 1..].iter().map(|s| s.size).sum::<u64>()
    }

    /// A snapshot of the log's shape. `size_bytes` counts the `.log` files (what retention measures).
    pub fn stats(&self) -> LogStats {
        let st = self.core.state.read();
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
        let mut w = self.core.writer.lock();
        if self.core.state.read().closed {
            return Ok(());
        }
        self.core.flush_locked(&mut w)?;
        if let Some(index) = &w.index_file {
            let path = self.core.state.read().segments.last().map(|s| s.index_path.clone()).unwrap_or_default();
            index.sync_all().map_err(LogCore::io_error(&path))?;
        }
        checkpoint::write_marker(&*self.core.fs, &self.core.dir)?;
        w.index_file = None;
        let mut st = self.core.state.write();
        st.closed_range = (st.log_start(), st.log_end());
        st.closed = true;
        st.segments.clear();
        self.core.files.clear();
        Ok(())
    }

    /// Closes the log and removes its directory (topic deletion).
    pub fn delete(&self) -> Result<()> {
        self.close()?;
        let _w = self.core.writer.lock();
        match self.core.fs.remove_dir_all(&self.core.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StorageError::Io { path: self.core.dir.clone(), source }),
        }
    }
}
