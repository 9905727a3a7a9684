//! [`BatchError`]: why bytes are not a good batch.

use crate::layout::{HEADER_LEN, MAGIC};

/// Why a batch could not be decoded. Positions are byte offsets within the batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The buffer ends before the batch does.
    #[error("batch truncated: needs {needed} bytes, {available} available")]
    Truncated {
        /// Bytes the batch claims to need.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// The batch length field is impossible (smaller than a header).
    #[error("batch length {length} is invalid (a batch is at least {HEADER_LEN} bytes)")]
    BadLength {
        /// The claimed total length.
        length: usize,
    },
    /// Unknown format version.
    #[error("unknown batch format version {0} (expected {MAGIC})")]
    BadMagic(u8),
    /// The stored CRC does not match the bytes.
    #[error("batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC in the header.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// Unknown compression code in the attributes.
    #[error("unknown compression code {0}")]
    BadCompression(u16),
    /// The records section could not be decompressed.
    #[error("records section could not be decompressed: {0}")]
    Decompress(String),
    /// A record or field inside the batch is malformed.
    #[error("malformed batch: {what} at byte {position}")]
    Malformed {
        /// What was wrong.
        what: &'static str,
        /// Byte position inside the (decompressed) records section.
        position: usize,
    },
    /// The batch holds no records.
    #[error("batch holds no records")]
    Empty,
    /// The records section inflates past the decoder's limit (a decompression bomb, or a batch larger than the
    /// broker's `max_batch_bytes` allows). Decompression stopped at the limit.
    #[error(
        "records section inflates past the {limit}-byte decode limit (max(2 x max_batch_bytes, 4 MiB)); \
         decompression stopped there"
    )]
    InflatesPastLimit {
        /// The limit, in decompressed bytes.
        limit: usize,
    },
    /// A batch offered to ordinary produce whose offset span is not its record count: a produced batch is dense
    /// (offset deltas 0..record_count), only append-with-offsets takes the sparse batches of a compacted source.
    #[error(
        "batch claims last_offset_delta {last_offset_delta} for {record_count} records; a produced batch must have \
         last_offset_delta = record_count - 1 ({}): build it with offset deltas 0, 1, 2, ...",
        u64::from(*record_count).saturating_sub(1)
    )]
    NotDense {
        /// Records the header claims.
        record_count: u32,
        /// The header's offset span.
        last_offset_delta: u32,
    },
}
