//! Writing batches: [`BatchBuilder`] adds records one at a time, [`encode_records`] encodes decoded ones.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};

use crate::compression::{Compression, compress_zstd};
use crate::crc::compute_crc;
use crate::layout::{HEADER_LEN, LOG_OVERHEAD, MAGIC, OFF_CRC};
use crate::record::{Header, Record};

/// Idempotence fields of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerInfo {
    /// Producer id (non-negative), or -1.
    pub producer_id: i64,
    /// Producer epoch, or -1.
    pub producer_epoch: i16,
    /// Sequence of the first record, or -1.
    pub base_sequence: i32,
}

impl ProducerInfo {
    /// No idempotence.
    pub const NONE: ProducerInfo = ProducerInfo { producer_id: -1, producer_epoch: -1, base_sequence: -1 };
}

impl Default for ProducerInfo {
    fn default() -> Self {
        Self::NONE
    }
}

/// Builds one batch. Records are added with their offset relative to the batch's base; the base offset and epoch
/// are stamped when the batch is built (or later by the broker, with [`set_base_offset`] and [`set_epoch`]).
///
/// [`set_base_offset`]: crate::set_base_offset
/// [`set_epoch`]: crate::set_epoch
#[derive(Debug, Default)]
pub struct BatchBuilder {
    compression: Compression,
    producer: ProducerInfo,
    records: Vec<u8>,
    count: u32,
    first_timestamp: Option<i64>,
    max_timestamp: i64,
    last_offset_delta: u32,
    scratch: Vec<u8>,
}

impl BatchBuilder {
    /// An empty builder.
    pub fn new(compression: Compression, producer: ProducerInfo) -> Self {
        BatchBuilder { compression, producer, max_timestamp: i64::MIN, ..Default::default() }
    }

    /// Number of records added.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Size the batch would have without compression.
    pub fn estimated_size(&self) -> usize {
        HEADER_LEN + self.records.len()
    }

    /// The size one more record of these parts would add, before compression.
    pub fn record_size(key: Option<&[u8]>, value: Option<&[u8]>, headers: &[Header]) -> usize {
        // Upper bound: 10-byte varints everywhere.
        let mut n = 1 + 10 + 10 + 10 + 10 + 10 + 10;
        n += key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
        for h in headers {
            n += 20 + h.key.len() + h.value.as_ref().map_or(0, Bytes::len);
        }
        n
    }

    /// Adds the next record, at `offset_delta` from the base offset (strictly increasing, starting at 0 for
    /// batches built by producers).
    pub fn push(
        &mut self,
        offset_delta: u32,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) {
        let first = *self.first_timestamp.get_or_insert(timestamp);
        self.max_timestamp = self.max_timestamp.max(timestamp);
        let body = &mut self.scratch;
        body.clear();
        body.push(0);
        put_zigzag(body, timestamp.wrapping_sub(first));
        put_uvarint(body, u64::from(offset_delta));
        put_nullable(body, key);
        put_nullable(body, value);
        put_uvarint(body, headers.len() as u64);
        for h in headers {
            put_uvarint(body, h.key.len() as u64);
            body.extend_from_slice(h.key.as_bytes());
            put_nullable(body, h.value.as_deref());
        }
        put_uvarint(&mut self.records, body.len() as u64);
        self.records.extend_from_slice(body);
        self.count += 1;
        self.last_offset_delta = offset_delta;
    }

    /// Adds a decoded record, keeping its offset relative to `base_offset`.
    pub fn push_record(&mut self, base_offset: u64, record: &Record) {
        let delta = u32::try_from(record.offset.saturating_sub(base_offset)).unwrap_or(u32::MAX);
        self.push(delta, record.timestamp, record.key.as_deref(), record.value.as_deref(), &record.headers);
    }

    /// Encodes the batch with the given base offset and epoch.
    pub fn build(&self, base_offset: u64, epoch: u32) -> Bytes {
        let section: Cow<'_, [u8]> = match self.compression {
            Compression::None => Cow::Borrowed(&self.records),
            Compression::Zstd => match compress_zstd(&self.records) {
                Ok(c) => Cow::Owned(c),
                // Compression of an in-memory buffer cannot fail short of allocation failure; store plain then.
                Err(_) => return self.clone_plain().build(base_offset, epoch),
            },
        };
        let compression = if matches!(section, Cow::Borrowed(_)) { Compression::None } else { self.compression };
        let total = HEADER_LEN + section.len();
        let mut buf = BytesMut::with_capacity(total);
        buf.put_u64(base_offset);
        buf.put_u32((total - LOG_OVERHEAD) as u32);
        buf.put_u32(epoch);
        buf.put_u8(MAGIC);
        buf.put_u32(0); // CRC, filled below
        buf.put_u16(compression.code());
        buf.put_u32(self.last_offset_delta);
        let first = self.first_timestamp.unwrap_or(0);
        buf.put_i64(first);
        buf.put_i64(if self.count == 0 { first } else { self.max_timestamp });
        buf.put_i64(self.producer.producer_id);
        buf.put_i16(self.producer.producer_epoch);
        buf.put_i32(self.producer.base_sequence);
        buf.put_u32(self.count);
        buf.extend_from_slice(&section);
        let crc = compute_crc(&buf);
        buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        buf.freeze()
    }

    fn clone_plain(&self) -> BatchBuilder {
        BatchBuilder {
            compression: Compression::None,
            producer: self.producer,
            records: self.records.clone(),
            count: self.count,
            first_timestamp: self.first_timestamp,
            max_timestamp: self.max_timestamp,
            last_offset_delta: self.last_offset_delta,
            scratch: Vec::new(),
        }
    }
}

/// Encodes `records` (absolute offsets, strictly increasing) as one batch whose base offset is the first record's
/// offset.
pub fn encode_records(records: &[Record], epoch: u32, compression: Compression, producer: ProducerInfo) -> Bytes {
    let base = records.first().map_or(0, |r| r.offset);
    let mut builder = BatchBuilder::new(compression, producer);
    for r in records {
        builder.push_record(base, r);
    }
    builder.build(base, epoch)
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_nullable(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => put_zigzag(out, -1),
        Some(b) => {
            put_zigzag(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_base_128_and_zigzag_folds_the_sign() {
        let enc = |v: u64| {
            let mut out = Vec::new();
            put_uvarint(&mut out, v);
            out
        };
        assert_eq!(enc(0), [0x00]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(300), [0xac, 0x02]);
        assert_eq!(enc(u64::MAX), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let zig = |v: i64| {
            let mut out = Vec::new();
            put_zigzag(&mut out, v);
            out
        };
        assert_eq!((zig(0), zig(-1), zig(1), zig(-2), zig(2)), (vec![0], vec![1], vec![2], vec![3], vec![4]));
        let mut null = Vec::new();
        put_nullable(&mut null, None);
        assert_eq!(null, [0x01]);
        let mut some = Vec::new();
        put_nullable(&mut some, Some(b"ab"));
        assert_eq!(some, [0x04, b'a', b'b']);
    }

    #[test]
    fn builder_counts_sizes_and_timestamps() {
        let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        assert!(b.is_empty());
        assert_eq!(b.estimated_size(), HEADER_LEN);
        b.push(0, 50, Some(b"k"), Some(b"v"), &[]);
        b.push(1, 20, None, None, &[]);
        assert_eq!(b.len(), 2);
        assert!(!b.is_empty());
        let built = b.build(7, 3);
        assert_eq!(built.len(), b.estimated_size(), "uncompressed: the estimate is exact");
        // first_timestamp is the first pushed, max_timestamp the largest, at their positions in the header.
        assert_eq!(i64::from_be_bytes(built[27..35].try_into().unwrap()), 50);
        assert_eq!(i64::from_be_bytes(built[35..43].try_into().unwrap()), 50);
        // The records section, byte for byte: length, attributes, timestamp delta (zigzag), offset delta, key,
        // value, header count.
        let first = [8, 0, 0, 0, 2, b'k', 2, b'v', 0];
        let second = [6, 0, 59 /* zigzag(20 - 50) */, 1, 1 /* null key */, 1 /* null value */, 0];
        assert_eq!(&built[HEADER_LEN..], [&first[..], &second[..]].concat());
        // The size bound assumes 10-byte varints: 1 + 6 x 10 plus the key and value bytes.
        assert_eq!(BatchBuilder::record_size(Some(b"k"), Some(b"v"), &[]), 63);
        let header = [Header { key: "ab".into(), value: Some(Bytes::from_static(b"xyz")) }];
        assert_eq!(BatchBuilder::record_size(None, None, &header), 61 + 20 + 2 + 3);
    }

    #[test]
    fn an_empty_batch_has_equal_timestamps_and_no_records() {
        let built = BatchBuilder::new(Compression::Zstd, ProducerInfo::NONE).build(0, 0);
        assert_eq!(i64::from_be_bytes(built[27..35].try_into().unwrap()), 0);
        assert_eq!(i64::from_be_bytes(built[35..43].try_into().unwrap()), 0);
        assert_eq!(u32::from_be_bytes(built[57..61].try_into().unwrap()), 0);
    }
}
