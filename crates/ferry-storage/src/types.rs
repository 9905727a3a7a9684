//! Plain data shared by the log's parts: the public result types of [`Log`](crate::Log) and [`BatchMeta`].
//! This module depends on nothing else in the crate, so every other module may use it.

use bytes::Bytes;
use ferry_batch::{BatchError, BatchHeader};

/// Who appends, which decides two things: whether the log makes the CRC pass over each batch itself, and whether
/// the async policy's byte-threshold fsync runs inside the append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Any caller (`Log::append`, `append_all`, `append_with_offsets`): each batch verified whole, CRC included,
    /// and the append that crosses the byte threshold fsyncs before it returns.
    Plain,
    /// The broker (`Log::append_all_verified`, `append_with_offsets_verified`): it verified the CRCs of these very
    /// bytes, so every other check is made but not the CRC pass again; and it runs the byte-threshold fsync itself
    /// (`Log::flush_over_threshold`), so that an append is not held up by the fsync of earlier ones.
    Verified,
}

impl Caller {
    /// The checks of one batch.
    pub(crate) fn check(self, batch: &[u8]) -> Result<BatchHeader, BatchError> {
        match self {
            Caller::Plain => ferry_batch::verify(batch),
            Caller::Verified => ferry_batch::verify_header(batch),
        }
    }
}

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

/// Result of [`Log::append_with_offsets`](crate::Log::append_with_offsets) when nothing was refused.
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

/// Where and what one batch is, as found by a walk or written by the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMeta {
    /// Byte position in the segment file.
    pub pos: u64,
    /// Total bytes.
    pub len: u64,
    /// First offset.
    pub base: u64,
    /// Last offset.
    pub last: u64,
    /// Largest record timestamp.
    pub max_timestamp: i64,
    /// Epoch stamped on the batch.
    pub epoch: u32,
}

impl BatchMeta {
    /// The metadata of a parsed header found at `pos`.
    pub fn from_header(pos: u64, header: &BatchHeader) -> Self {
        BatchMeta {
            pos,
            len: header.total_len() as u64,
            base: header.base_offset,
            last: header.last_offset(),
            max_timestamp: header.max_timestamp,
            epoch: header.epoch,
        }
    }
}

/// How a log came back when it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// Its clean-shutdown marker was there.
    pub clean_shutdown: bool,
    /// It did not exist yet (no segment, no epoch checkpoint).
    pub fresh: bool,
    /// Recovery cut anything (a torn or lost tail).
    pub cut: bool,
}

impl OpenReport {
    /// Whether everything it held before is known to be there: a clean shutdown, and nothing cut.
    pub fn intact(&self) -> bool {
        self.clean_shutdown && !self.cut
    }
}
