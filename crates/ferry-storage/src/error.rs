//! The storage error type. Every variant names the partition directory (and file and position where one applies)
//! so that an operator can find what is wrong.

use std::path::PathBuf;

use ferry_batch::BatchError;

/// Result alias for storage operations.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Everything that can go wrong in the log.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O call failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// File or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A read asked for an offset outside [log start, log end].
    #[error("offset {offset} is out of range for {dir}: the log holds [{log_start}, {log_end})")]
    OffsetOutOfRange {
        /// Partition directory.
        dir: PathBuf,
        /// Requested offset.
        offset: u64,
        /// First offset held.
        log_start: u64,
        /// Log end offset.
        log_end: u64,
    },
    /// A batch is larger than `max_batch_bytes`.
    #[error("batch of {size} bytes at offset {offset} for {dir} exceeds max_batch_bytes ({max})")]
    BatchTooLarge {
        /// Partition directory.
        dir: PathBuf,
        /// Offset the batch was to take.
        offset: u64,
        /// Batch size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A batch offered for append is malformed or fails its CRC.
    #[error("invalid batch for {dir} at offset {offset}: {source}")]
    InvalidBatch {
        /// Partition directory.
        dir: PathBuf,
        /// Offset of the batch (its base offset, or the log end for a plain append).
        offset: u64,
        /// What was wrong.
        #[source]
        source: BatchError,
    },
    /// A segment holds a corrupt batch (found on open in a sealed segment, or on read in any segment). Never
    /// skipped: the operator must act.
    #[error(
        "corrupt batch in segment {file} at byte {position}{}: {source}; restore the segment or truncate the partition below it",
        offset.map(|o| format!(" (batch offset {o})")).unwrap_or_default()
    )]
    CorruptSegment {
        /// The segment file.
        file: PathBuf,
        /// Byte position of the bad batch.
        position: u64,
        /// Base offset of the bad batch, when known (from the segment's chain of batches, or its header).
        offset: Option<u64>,
        /// What was wrong.
        #[source]
        source: BatchError,
    },
    /// An offset append was refused (gap not allowed, straddling the log end, epoch going backwards, or offsets
    /// not increasing).
    #[error("offset append refused for {dir} at offset {offset}: {reason}")]
    OffsetAppendRefused {
        /// Partition directory.
        dir: PathBuf,
        /// Base offset of the refused batch.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// Offsets would pass [`MAX_OFFSET`](crate::MAX_OFFSET) (2^63 - 2).
    #[error("offsets of a batch (or a log start) at {offset} for {dir} would pass the largest offset, 2^63 - 2")]
    OffsetOverflow {
        /// Partition directory.
        dir: PathBuf,
        /// Base offset of the batch.
        offset: u64,
    },
    /// A file in the partition directory is not what the log expects (bad name, bad checkpoint).
    #[error("unexpected content in {path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The log was closed or deleted.
    #[error("log {dir} is closed")]
    Closed {
        /// Partition directory.
        dir: PathBuf,
    },
}
