//! Ferry's storage engine: the segmented, append-only log behind every partition.
//!
//! - [`batch`] is the record-batch format, shared by disk and wire (the client encodes and decodes it too).
//! - [`Log`] is one partition's log: a directory of segments named by base offset, each with a sparse index;
//!   append (assigning offsets), append with caller-supplied offsets (the mirror's path), reads, timestamp lookup,
//!   epochs and `EpochEnd`, truncation, retention, the flush policy, and exact recovery after a crash.
//!
//! No networking lives here. One writer and many readers may use a [`Log`] at once; a reader never observes a
//! partly written batch.

pub mod batch;
mod config;
mod error;
mod log;

pub use config::{FlushPolicy, LogConfig};
pub use error::{Result, StorageError};
pub use log::{AppendInfo, EpochEnd, Log, LogStats, OffsetAppendOutcome, ReadResult};
