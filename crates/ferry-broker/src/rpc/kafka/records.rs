//! Kafka's v2 record batch against Ferry's batch (docs/kafka.md, "How a batch maps").
//!
//! The two fixed headers have the same 61-byte layout, field for field; the CRC-32C covers the same bytes (from
//! the attributes to the end). What differs:
//! - the magic: Kafka 2, Ferry 1;
//! - the compression codes in attributes bits 0-2: Kafka 1 gzip, 2 snappy, 3 lz4, 4 zstd; Ferry 1 zstd;
//! - the record encoding: Kafka writes the record length, offset delta, header count and header key length as
//!   zigzag varints, Ferry as unsigned varints (the other fields are encoded alike);
//! - the epoch slot: Kafka's partition leader epoch, Ferry's partition epoch.
//!
//! So a record section never has the same bytes in both formats, and both directions re-encode the records: a
//! produced Kafka batch becomes a Ferry batch with the same producer id, epoch, base sequence, timestamps, offset
//! deltas, keys, values and ordered headers ([`to_ferry`]); a stored Ferry batch is served as a Kafka batch with
//! its header fields copied and the records re-encoded ([`to_kafka`]).
//!
//! Hostile input never panics: every length is checked against what is left, and a compressed section may
//! inflate to at most the limit the caller gives.

use std::io::Read;

use bytes::{BufMut, Bytes, BytesMut};
use ferry_batch::{BatchBuilder, Compression, Header, ProducerInfo};

/// Kafka's current record batch version.
pub const KAFKA_MAGIC: u8 = 2;
const HEADER_LEN: usize = ferry_batch::HEADER_LEN;
const ATTR_TRANSACTIONAL: u16 = 1 << 4;
const ATTR_CONTROL: u16 = 1 << 5;

/// Why a produced Kafka batch was refused; the Kafka error code it is answered with comes from the kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    /// Bytes that are not a record batch (lengths, varints, magic).
    #[error("malformed record batch: {0}")]
    Corrupt(String),
    /// A CRC that does not match.
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc {
        /// In the batch.
        stored: u32,
        /// Over its bytes.
        computed: u32,
    },
    /// A compression code this broker does not read.
    #[error("compression code {0} is not one of none, gzip, snappy, lz4, zstd")]
    Compression(u16),
    /// Something the batch asks for that Ferry does not do (transactions, control batches, old magic).
    #[error("{0}")]
    Unsupported(String),
    /// Records that inflate past the limit.
    #[error("the records inflate past {0} bytes")]
    TooLarge(usize),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn uvarint(&mut self) -> Result<u64, RecordsError> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else { return Err(corrupt("a varint runs past the end")) };
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(corrupt("a varint is longer than 10 bytes"))
    }

    fn varint(&mut self) -> Result<i64, RecordsError> {
        let u = self.uvarint()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], RecordsError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| corrupt("a length runs past the end"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn nullable(&mut self) -> Result<Option<&'a [u8]>, RecordsError> {
        match self.varint()? {
            -1 => Ok(None),
            n if n < 0 => Err(corrupt("a negative length")),
            n => Ok(Some(self.bytes(usize::try_from(n).map_err(|_| corrupt("a length too large"))?)?)),
        }
    }
}

fn corrupt(what: &str) -> RecordsError {
    RecordsError::Corrupt(what.to_owned())
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Splits a produce request's records into whole Kafka batches, checking each one's length and magic.
pub fn split_kafka(records: &[u8]) -> Result<Vec<&[u8]>, RecordsError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let rest = &records[at..];
        if rest.len() < HEADER_LEN {
            return Err(corrupt("a batch shorter than its 61-byte header"));
        }
        let total = 12 + be_u32(rest, 8) as usize;
        if total < HEADER_LEN || total > rest.len() {
            return Err(corrupt("a batch length that does not fit the request"));
        }
        if rest[16] != KAFKA_MAGIC {
            return Err(RecordsError::Unsupported(format!(
                "record batch magic {} is not supported: only v2 batches (magic 2) are",
                rest[16]
            )));
        }
        out.push(&rest[..total]);
        at += total;
    }
    if out.is_empty() {
        return Err(corrupt("no record batch"));
    }
    Ok(out)
}

/// Decompresses a Kafka records section, holding at most `limit` bytes of output.
fn inflate(code: u16, section: &[u8], limit: usize) -> Result<Vec<u8>, RecordsError> {
    let bounded = |mut r: Box<dyn Read + '_>| -> Result<Vec<u8>, RecordsError> {
        let mut out = Vec::new();
        let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
        r.as_mut()
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|e| RecordsError::Corrupt(format!("cannot decompress: {e}")))?;
        if out.len() > limit {
            return Err(RecordsError::TooLarge(limit));
        }
        Ok(out)
    };
    match code {
        1 => bounded(Box::new(flate2::read::GzDecoder::new(section))),
        2 => snappy(section, limit),
        3 => {
            let d = lz4::Decoder::new(section).map_err(|e| RecordsError::Corrupt(format!("bad lz4 frame: {e}")))?;
            bounded(Box::new(d))
        }
        4 => {
            let d = zstd::stream::read::Decoder::new(section)
                .map_err(|e| RecordsError::Corrupt(format!("bad zstd frame: {e}")))?;
            bounded(Box::new(d))
        }
        other => Err(RecordsError::Compression(other)),
    }
}

/// Snappy as Kafka clients write it: Java's framing (a magic header, then length-prefixed raw blocks), or one raw
/// block. Each block's stated length is checked against the limit before it is decompressed.
fn snappy(section: &[u8], limit: usize) -> Result<Vec<u8>, RecordsError> {
    const MAGIC: &[u8] = b"\x82SNAPPY\x00";
    let blocks: Vec<&[u8]> = if section.starts_with(MAGIC) {
        let mut r = Reader { buf: section, pos: 16.min(section.len()) };
        let mut v = Vec::new();
        while r.pos < section.len() {
            let len = be_u32(r.bytes(4)?, 0) as usize;
            v.push(r.bytes(len)?);
        }
        v
    } else {
        vec![section]
    };
    let mut out = Vec::new();
    for b in blocks {
        let n = snap::raw::decompress_len(b).map_err(|e| RecordsError::Corrupt(format!("bad snappy block: {e}")))?;
        if out.len() + n > limit {
            return Err(RecordsError::TooLarge(limit));
        }
        let at = out.len();
        out.resize(at + n, 0);
        snap::raw::Decoder::new()
            .decompress(b, &mut out[at..])
            .map_err(|e| RecordsError::Corrupt(format!("bad snappy block: {e}")))?;
    }
    Ok(out)
}

/// One produced Kafka batch as a Ferry batch (base offset 0, epoch 0: the broker stamps both). A compressed Kafka
/// batch is stored zstd-compressed, an uncompressed one uncompressed. `limit` bounds the decompressed records.
pub fn to_ferry(batch: &[u8], limit: usize) -> Result<Bytes, RecordsError> {
    let computed = ferry_batch::compute_crc(batch);
    let stored = be_u32(batch, 17);
    if computed != stored {
        return Err(RecordsError::Crc { stored, computed });
    }
    let attributes = u16::from_be_bytes([batch[21], batch[22]]);
    if attributes & ATTR_CONTROL != 0 || attributes & ATTR_TRANSACTIONAL != 0 {
        return Err(RecordsError::Unsupported(
            "transactional and control batches are not supported: Ferry's Kafka listener has no transactions".into(),
        ));
    }
    let first_ts = i64::from_be_bytes(batch[27..35].try_into().map_err(|_| corrupt("header"))?);
    let producer = ProducerInfo {
        producer_id: i64::from_be_bytes(batch[43..51].try_into().map_err(|_| corrupt("header"))?),
        producer_epoch: i16::from_be_bytes([batch[51], batch[52]]),
        base_sequence: i32::from_be_bytes(batch[53..57].try_into().map_err(|_| corrupt("header"))?),
    };
    let count = be_u32(batch, 57) as usize;
    let code = attributes & 0b111;
    let inflated;
    let section: &[u8] = if code == 0 {
        &batch[HEADER_LEN..]
    } else {
        inflated = inflate(code, &batch[HEADER_LEN..], limit)?;
        &inflated
    };
    // Each record takes at least 7 bytes: a count the section cannot hold is refused before anything is built.
    if count == 0 || count > section.len() / 7 {
        return Err(corrupt("a record count the records section cannot hold"));
    }
    let mut builder = BatchBuilder::new(if code == 0 { Compression::None } else { Compression::Zstd }, producer);
    let mut r = Reader { buf: section, pos: 0 };
    let mut headers = Vec::new();
    let mut last_delta: Option<u32> = None;
    for _ in 0..count {
        let len = r.varint()?;
        let len = usize::try_from(len).map_err(|_| corrupt("a negative record length"))?;
        let body = r.bytes(len)?;
        let mut b = Reader { buf: body, pos: 0 };
        b.bytes(1)?; // attributes, unused
        let ts = first_ts.wrapping_add(b.varint()?);
        let delta = u32::try_from(b.varint()?).map_err(|_| corrupt("an offset delta outside 0..2^32"))?;
        if last_delta.is_some_and(|d| delta <= d) {
            return Err(corrupt("offset deltas that do not increase"));
        }
        last_delta = Some(delta);
        let key = b.nullable()?;
        let value = b.nullable()?;
        let n = b.varint()?;
        if n < 0 || n as usize > body.len() {
            return Err(corrupt("a header count the record cannot hold"));
        }
        headers.clear();
        for _ in 0..n {
            let k = b.nullable()?.ok_or_else(|| corrupt("a null header key"))?;
            let key = std::str::from_utf8(k).map_err(|_| corrupt("a header key that is not UTF-8"))?;
            let v = b.nullable()?;
            headers.push(Header { key: key.to_owned(), value: v.map(Bytes::copy_from_slice) });
        }
        builder.push(delta, ts, key, value, &headers);
    }
    if r.pos != section.len() {
        return Err(corrupt("bytes after the last record"));
    }
    Ok(builder.build(0, 0))
}

fn put_varint(out: &mut BytesMut, v: i64) {
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    while u >= 0x80 {
        out.put_u8((u as u8) | 0x80);
        u >>= 7;
    }
    out.put_u8(u as u8);
}

fn put_nullable(out: &mut BytesMut, v: Option<&[u8]>) {
    match v {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.put_slice(b);
        }
    }
}

/// Stored Ferry batches (back to back, as a fetch returns them) as Kafka v2 batches: the header copied (the
/// leader epoch slot set to `leader_epoch`, -1 when unknown), the records re-encoded uncompressed. A batch that
/// does not decode ends the conversion there (the caller answers what came before it). `limit` bounds a
/// decompressed Ferry batch.
pub fn to_kafka(stored: &[u8], leader_epoch: i32, limit: usize, out: &mut BytesMut) -> Result<(), RecordsError> {
    for batch in ferry_batch::BatchIter::new(stored) {
        let (header, bytes) = batch.map_err(|e| RecordsError::Corrupt(e.to_string()))?;
        let records =
            ferry_batch::decode_records_bounded(bytes, limit).map_err(|e| RecordsError::Corrupt(e.to_string()))?;
        let start = out.len();
        out.put_slice(&bytes[..HEADER_LEN]);
        out[start + 12..start + 16].copy_from_slice(&leader_epoch.to_be_bytes());
        out[start + 16] = KAFKA_MAGIC;
        // Uncompressed, create time, not transactional.
        out[start + 21..start + 23].copy_from_slice(&0u16.to_be_bytes());
        let mut body = BytesMut::new();
        for rec in &records {
            body.clear();
            body.put_u8(0);
            put_varint(&mut body, rec.timestamp.wrapping_sub(header.first_timestamp));
            put_varint(&mut body, rec.offset.saturating_sub(header.base_offset) as i64);
            put_nullable(&mut body, rec.key.as_deref());
            put_nullable(&mut body, rec.value.as_deref());
            put_varint(&mut body, rec.headers.len() as i64);
            for h in &rec.headers {
                put_nullable(&mut body, Some(h.key.as_bytes()));
                put_nullable(&mut body, h.value.as_deref());
            }
            put_varint(out, body.len() as i64);
            out.put_slice(&body);
        }
        let len = u32::try_from(out.len() - start - 12).map_err(|_| corrupt("a batch over 4 GiB"))?;
        out[start + 8..start + 12].copy_from_slice(&len.to_be_bytes());
        let crc = ferry_batch::compute_crc(&out[start..]);
        out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
