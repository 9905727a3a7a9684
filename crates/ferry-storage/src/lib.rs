//! Ferry's storage engine: the segmented, append-only log behind every partition.
//!
//! - The record-batch format, shared by disk and wire, is the `ferry-batch` crate (the client encodes and
//!   decodes it too); this crate stores and serves batches as bytes and uses its headers, CRC checks and
//!   iterators. Signatures here that take or give batch types (`ferry_batch::BatchHeader`,
//!   `ferry_batch::BatchError`) use that crate's types: import them from `ferry_batch`.
//! - [`Log`] is one partition's log: a directory of segments named by base offset, each with a sparse index;
//!   append (assigning offsets), append with caller-supplied offsets (the mirror's path), reads, timestamp lookup,
//!   epochs and `EpochEnd`, truncation, retention, the flush policy, and exact recovery after a crash.
//!
//! No networking lives here. One writer and many readers may use a [`Log`] at once; a reader never observes a
//! partly written batch.
//!
//! # On-disk format
//!
//! A partition directory holds:
//!
//! ```text
//! 00000000000000000000.log     segment: whole batches back to back (format in `ferry_batch`), nothing else
//! 00000000000000000000.index   its sparse index: 8-byte entries, relative offset u32 BE | file position u32 BE
//! 00000000000000004711.log     the next segment; its name is the base offset of its first batch, 20 digits
//! 00000000000000004711.index
//! epoch.checkpoint             current epoch and epoch history (text, see below)
//! gaps.checkpoint              offset ranges skipped by gap appends (text, see below)
//! recovery-point.checkpoint    every segment based below this offset is fsynced whole (text: magic, offset)
//! clean-shutdown               present only between a clean close and the next open
//! ```
//!
//! - **Segments.** Offsets within a segment are contiguous from batch to batch (each batch starts at the previous
//!   one's last offset + 1); the first batch starts at the segment's base. The last segment is the active one;
//!   the others are sealed. A sealed segment is fsynced (with its index) by the flush that follows its sealing
//!   (at once under the sync policy), and then the recovery point moves past it. A segment rolls before an
//!   append that would take it past `segment_bytes`, once its first append is `segment_ms` old, or before
//!   relative offsets or positions would leave `u32`. The active segment is never deleted, so an emptied log
//!   keeps its log end offset (an empty active segment's name is the log end).
//! - **Index.** One entry for a batch starting at least `index_interval_bytes` after the previous entry. The index
//!   is a cache: it is checked against the segment on open and rebuilt when missing or wrong.
//! - **Gaps.** A gap append (mirrored source retention) starts a new segment at the batch's base offset, so gaps
//!   are exactly the places where a segment starts above the end of the one before it. `gaps.checkpoint` records
//!   them (`ferry-gaps v1`, then one `start end` line per `[start, end)` range) and is rewritten from the layout
//!   on open if a crash left it behind.
//! - **Epochs.** `epoch.checkpoint` is `ferry-epochs v1`, `current N`, then one `epoch start_offset` line per
//!   history entry, ascending. An entry is added (durably, before the batch is written) when the first batch of
//!   a newer epoch is appended; an open without the clean-shutdown marker bumps `current` to one past the
//!   largest epoch seen. Checkpoints are replaced atomically (temp file, fsync, rename, directory fsync).
//!
//! # Durability
//!
//! Under [`FlushPolicy::Sync`] an append is fsynced before it returns (and before readers can see it). Under
//! [`FlushPolicy::Async`] the log fsyncs once `bytes` are unflushed, and [`Log::flush_if_due`], which the caller
//! runs periodically, fsyncs once `interval` has passed; segments sealed since the last flush (and the directory
//! entries of new segments) are fsynced by that same flush, so a roll never stalls the writer. A crash may then
//! lose an unflushed tail, possibly reaching back into a segment sealed after the recovery point; recovery
//! checks those segments batch by batch, cuts the log at the last whole, CRC-valid batch and bumps the epoch.
//! A clean `close()` flushes everything and leaves the clean-shutdown marker.
//!
//! # Reading
//!
//! Reads return whole batches exactly as stored, every one CRC-checked (a bad one is
//! [`StorageError::CorruptSegment`], never skipped), and see only batches whose write completed. They hold the
//! log's lock only to find the segment and position, then `pread` without it.

mod append;
mod checkpoint;
mod clock;
mod config;
mod error;
pub mod fs;
mod index;
mod log;
mod maintenance;
mod offsets;
mod open_files;
mod read;
mod recent;
mod recovery;
mod segment;
mod state;
mod types;

pub use checkpoint::LEADER_EPOCH_FILE;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{DEFAULT_FLUSH_BYTES, FlushPolicy, LogConfig, MAX_OFFSET, MIN_SEGMENT_MS};
pub use error::{Result, StorageError};
pub use log::Log;
pub use types::{AppendInfo, EpochEnd, LogStats, OffsetAppendOutcome, OpenReport, ReadResult};
