//! The record batch: Ferry's unit on disk and on the wire. The broker stores and serves these bytes as they are,
//! the client builds and decodes them, and the mirror copies them between clusters, so this crate is the one
//! definition of the format. It depends on nothing of Ferry's and does no I/O.
//!
//! A batch is a fixed 61-byte header followed by the records. All integers in the header are big-endian.
//!
//! ```text
//! offset  size  field
//!      0     8  base_offset        first offset of the batch
//!      8     4  batch_length       bytes after this field (total length = 12 + batch_length)
//!     12     4  partition_epoch    epoch the batch was written in
//!     16     1  magic              format version, 1
//!     17     4  crc                CRC-32C (Castagnoli) of every byte from offset 21 to the end
//!     21     2  attributes         bits 0-2: compression of the records section (0 none, 1 zstd)
//!     23     4  last_offset_delta  offset of the last record minus base_offset
//!     27     8  first_timestamp    ms since the Unix epoch
//!     35     8  max_timestamp      ms since the Unix epoch
//!     43     8  producer_id        -1 when not idempotent
//!     51     2  producer_epoch     -1 when not idempotent
//!     53     4  base_sequence      -1 when not idempotent
//!     57     4  record_count
//!     61     …  records (compressed as one block when the attributes say so)
//! ```
//!
//! The base offset and the epoch sit outside the CRC (as in Kafka's v2 batch), so the broker stamps them on append
//! without recomputing it. Each record is:
//!
//! ```text
//! length           uvarint   bytes of the record after this field
//! attributes       u8        0
//! timestamp_delta  zigzag    timestamp - first_timestamp
//! offset_delta     uvarint   offset - base_offset
//! key_len          zigzag    -1 for a null key
//! key              bytes
//! value_len        zigzag    -1 for a null value
//! value            bytes
//! header_count     uvarint
//!   key_len        uvarint, key (UTF-8)
//!   value_len      zigzag (-1 null), value
//! ```
//!
//! Headers are an ordered list and keys may repeat. Decoding never panics on hostile input: every length is
//! checked against what is left, and a malformed batch is a [`BatchError`].
//!
//! # Parts
//!
//! - [`BatchHeader`] parses the fixed header of a byte slice; [`verify`] checks one whole batch and its CRC.
//! - [`Batch`] is one checked batch as a value: its header parsed once, its bytes a zero-copy [`Bytes`].
//! - [`Batches`] walks a [`Bytes`] buffer of back-to-back batches and yields [`Batch`] slices of it;
//!   [`BatchIter`] does the same over a `&[u8]`, yielding headers and sub-slices.
//! - [`BatchBuilder`] and [`encode_records`] write batches; [`decode_records`] reads their records.
//!
//! [`Bytes`]: bytes::Bytes

#![deny(missing_docs)]

mod batch;
mod builder;
mod compression;
mod crc;
mod decode;
mod error;
mod header;
mod iter;
mod layout;
mod record;

pub use batch::Batch;
pub use builder::{BatchBuilder, ProducerInfo, encode_records};
pub use compression::{Compression, MIN_DECODE_LIMIT, decode_limit};
pub use crc::{compute_crc, crc32c};
pub use decode::{decode_records, decode_records_bounded, decode_records_shared};
pub use error::BatchError;
pub use header::{BatchHeader, set_base_offset, set_epoch, verify, verify_header};
pub use iter::{BatchIter, Batches, split_verified};
pub use layout::{CRC_START, HEADER_LEN, LOG_OVERHEAD, MAGIC, MAX_DECOMPRESSED_BYTES};
pub use record::{Header, Record};
