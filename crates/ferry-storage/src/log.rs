//! One partition's log. (API skeleton: the implementation fills in these bodies.)

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::batch::BatchHeader;
use crate::{LogConfig, Result};

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

/// One partition's segmented log. `Send + Sync`: one writer and many readers may call it concurrently.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, recovering from an unclean shutdown when the clean-shutdown
    /// marker is absent.
    pub fn open(dir: impl Into<PathBuf>, config: LogConfig) -> Result<Log> {
        let _ = config;
        todo!("open {:?}", dir.into())
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current configuration.
    pub fn config(&self) -> LogConfig {
        todo!()
    }

    /// Replaces the configuration (topic config changes). Takes effect for the next append, roll and retention.
    pub fn set_config(&self, config: LogConfig) {
        let _ = config;
        todo!()
    }

    /// Appends one whole batch, assigning offsets from the log end and stamping the current epoch. The batch's
    /// CRC and size are checked first; a bad batch writes nothing. Honours the flush policy before returning.
    pub fn append(&self, batch: &[u8]) -> Result<AppendInfo> {
        let _ = batch;
        todo!()
    }

    /// Appends batches that already carry offsets and epochs (the mirror's path, design §3).
    pub fn append_with_offsets(&self, batches: &[u8], source_log_start: u64) -> Result<OffsetAppendOutcome> {
        let _ = (batches, source_log_start);
        todo!()
    }

    /// Reads whole batches starting with the one that contains `offset`, up to `max_bytes` (at least one whole
    /// batch when any exists at or after `offset`).
    pub fn read(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        let _ = (offset, max_bytes);
        todo!()
    }

    /// First offset held.
    pub fn log_start_offset(&self) -> u64 {
        todo!()
    }

    /// One past the last offset held.
    pub fn log_end_offset(&self) -> u64 {
        todo!()
    }

    /// The epoch new local appends are stamped with (at least the latest epoch in the history).
    pub fn epoch(&self) -> u32 {
        todo!()
    }

    /// `EpochEnd(epoch)`, or `None` when the history holds no epoch <= `epoch`.
    pub fn epoch_end(&self, epoch: u32) -> Option<EpochEnd> {
        let _ = epoch;
        todo!()
    }

    /// The epoch history: (epoch, first offset written in it), ascending.
    pub fn epoch_history(&self) -> Vec<(u32, u64)> {
        todo!()
    }

    /// The first offset whose batch's max timestamp is >= `timestamp_ms` (the first record in that batch at or
    /// after the timestamp), or `None` when there is none.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> Result<Option<u64>> {
        let _ = timestamp_ms;
        todo!()
    }

    /// Removes every batch at or after the batch boundary <= `offset`, returning the new log end offset.
    pub fn truncate_to(&self, offset: u64) -> Result<u64> {
        let _ = offset;
        todo!()
    }

    /// Deletes whole sealed segments past the retention limits, returning how many were deleted.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        let _ = now_ms;
        todo!()
    }

    /// fsyncs everything appended so far.
    pub fn flush(&self) -> Result<()> {
        todo!()
    }

    /// Under the async flush policy, fsyncs when the interval has passed since the last flush. Returns whether it
    /// flushed.
    pub fn flush_if_due(&self) -> Result<bool> {
        todo!()
    }

    /// Calls `f` with the header of every batch whose last offset is >= `from_offset`, in order (reads headers
    /// only). Used to rebuild producer state after a restart.
    pub fn for_each_batch_header(&self, from_offset: u64, f: &mut dyn FnMut(&BatchHeader)) -> Result<()> {
        let _ = (from_offset, f);
        todo!()
    }

    /// Base offsets of the segments, ascending.
    pub fn segment_base_offsets(&self) -> Vec<u64> {
        todo!()
    }

    /// A snapshot of the log's shape.
    pub fn stats(&self) -> LogStats {
        todo!()
    }

    /// Flushes, writes the clean-shutdown marker and closes the files. Later calls fail with `Closed`.
    pub fn close(&self) -> Result<()> {
        todo!()
    }

    /// Closes the log and removes its directory (topic deletion).
    pub fn delete(&self) -> Result<()> {
        todo!()
    }
}
