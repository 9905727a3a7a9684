//! Decoding a batch's records section into [`Record`]s. Every length is checked against what is left, so hostile
//! bytes give a [`BatchError`], never a panic or an unbounded allocation.

use bytes::Bytes;

use crate::compression::{Compression, decompress_zstd};
use crate::error::BatchError;
use crate::header::{BatchHeader, verify};
use crate::layout::HEADER_LEN;
use crate::layout::MAX_DECOMPRESSED_BYTES;
use crate::record::{Header, Record};

/// The fewest bytes one encoded record takes: length, attributes, timestamp delta, offset delta, key length,
/// value length and header count, one byte each.
const MIN_RECORD_BYTES: usize = 7;

/// Decodes every record of one whole batch. Verifies the CRC first. A compressed section may inflate to at most
/// [`MAX_DECOMPRESSED_BYTES`]; where the largest batch is known, use [`decode_records_bounded`].
pub fn decode_records(batch: &[u8]) -> Result<Vec<Record>, BatchError> {
    decode_records_bounded(batch, MAX_DECOMPRESSED_BYTES)
}

/// [`decode_records`] holding at most `max_decompressed` bytes of decompressed records (see
/// [`decode_limit`](crate::decode_limit)). Decompression streams and stops at the limit; the header's record
/// count is checked against what the body can hold before any record is decoded, and decoding stops at the
/// first inconsistency.
pub fn decode_records_bounded(batch: &[u8], max_decompressed: usize) -> Result<Vec<Record>, BatchError> {
    decode(batch, None, max_decompressed)
}

/// [`decode_records_bounded`] without copying: every key and value (record and header) is a slice of `batch`,
/// or of the decompressed section, and keeps that buffer alive while it lives. For a consumer handing out the
/// records of a fetch it received as one buffer.
pub fn decode_records_shared(batch: &Bytes, max_decompressed: usize) -> Result<Vec<Record>, BatchError> {
    decode(batch, Some(batch), max_decompressed)
}

/// Decodes `batch`; with an `owner` (the batch's own bytes), values are slices of it instead of copies.
fn decode(batch: &[u8], owner: Option<&Bytes>, max_decompressed: usize) -> Result<Vec<Record>, BatchError> {
    let header = verify(batch)?;
    let section = &batch[HEADER_LEN..];
    let decompressed: Bytes;
    let (records, owner): (&[u8], Option<&Bytes>) = match header.compression()? {
        Compression::None => (section, owner),
        Compression::Zstd => {
            decompressed = Bytes::from(decompress_zstd(section, max_decompressed)?);
            (&decompressed, owner.map(|_| &decompressed))
        }
    };
    // The count comes from an untrusted header: a body too short for it is refused before decoding anything.
    if header.record_count as usize > records.len() / MIN_RECORD_BYTES {
        return Err(BatchError::Malformed {
            what: "record count larger than the records section can hold",
            position: records.len(),
        });
    }
    let mut reader = Reader { buf: records, pos: 0, owner };
    let mut out = Vec::with_capacity(header.record_count as usize);
    for _ in 0..header.record_count {
        let at = reader.pos;
        let record = reader.record(&header)?;
        // Offsets are strictly increasing within a partition, so within a batch too (found by fuzzing: without
        // this, a batch could decode into records whose offsets go backwards).
        if out.last().is_some_and(|prev: &Record| record.offset <= prev.offset) {
            return Err(BatchError::Malformed { what: "record offsets do not increase", position: at });
        }
        out.push(record);
    }
    if reader.pos != records.len() {
        return Err(BatchError::Malformed { what: "trailing bytes after the last record", position: reader.pos });
    }
    Ok(out)
}

/// A cursor over a records section; with an `owner` (the buffer `buf` lies in), values are slices of it.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    owner: Option<&'a Bytes>,
}

impl Reader<'_> {
    fn malformed(&self, what: &'static str) -> BatchError {
        BatchError::Malformed { what, position: self.pos }
    }

    fn uvarint(&mut self) -> Result<u64, BatchError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(self.malformed("varint runs past the end"));
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.malformed("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.malformed("varint longer than 10 bytes"))
    }

    fn zigzag(&mut self) -> Result<i64, BatchError> {
        let raw = self.uvarint()?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    fn bytes(&mut self, len: usize, what: &'static str) -> Result<&[u8], BatchError> {
        let end = self.pos.checked_add(len).filter(|&end| end <= self.buf.len()).ok_or_else(|| self.malformed(what))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn nullable(&mut self, what: &'static str) -> Result<Option<Bytes>, BatchError> {
        let len = self.zigzag()?;
        if len == -1 {
            return Ok(None);
        }
        if len < 0 {
            return Err(self.malformed(what));
        }
        let len = usize::try_from(len).map_err(|_| self.malformed(what))?;
        let owner = self.owner;
        let bytes = self.bytes(len, what)?;
        Ok(Some(match owner {
            Some(owner) => owner.slice_ref(bytes),
            None => Bytes::copy_from_slice(bytes),
        }))
    }

    fn record(&mut self, header: &BatchHeader) -> Result<Record, BatchError> {
        let len = usize::try_from(self.uvarint()?).map_err(|_| self.malformed("record length"))?;
        let start = self.pos;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.malformed("record length runs past the end"))?;
        let _attributes = self.bytes(1, "record attributes")?[0];
        let ts_delta = self.zigzag()?;
        let offset_delta = self.uvarint()?;
        if offset_delta > u64::from(header.last_offset_delta) {
            return Err(self.malformed("record offset delta beyond the batch's last offset"));
        }
        let key = self.nullable("record key")?;
        let value = self.nullable("record value")?;
        let header_count = usize::try_from(self.uvarint()?).map_err(|_| self.malformed("header count"))?;
        if header_count > end.saturating_sub(self.pos) {
            return Err(self.malformed("header count larger than the record"));
        }
        let mut headers = Vec::with_capacity(header_count);
        for _ in 0..header_count {
            let klen = usize::try_from(self.uvarint()?).map_err(|_| self.malformed("header key length"))?;
            let key_at = self.pos;
            let kbytes = self.bytes(klen, "header key")?;
            let key = std::str::from_utf8(kbytes)
                .map_err(|_| BatchError::Malformed { what: "header key is not UTF-8", position: key_at })?
                .to_owned();
            let value = self.nullable("header value")?;
            headers.push(Header { key, value });
        }
        if self.pos != end {
            return Err(self.malformed("record length does not match its fields"));
        }
        Ok(Record {
            offset: header.base_offset.saturating_add(offset_delta),
            timestamp: header.first_timestamp.wrapping_add(ts_delta),
            key,
            value,
            headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{BatchBuilder, ProducerInfo, encode_records};
    use crate::crc::compute_crc;
    use crate::header::{set_base_offset, set_epoch};
    use crate::iter::BatchIter;
    use crate::layout::{OFF_CRC, OFF_LAST_OFFSET_DELTA};
    use proptest::prelude::*;

    fn rec(offset: u64, ts: i64, key: Option<&str>, value: Option<&str>, headers: &[(&str, Option<&str>)]) -> Record {
        Record {
            offset,
            timestamp: ts,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: headers
                .iter()
                .map(|(k, v)| Header { key: (*k).to_owned(), value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())) })
                .collect(),
        }
    }

    fn fix_crc(batch: &mut [u8]) {
        let crc = compute_crc(batch);
        batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let records = vec![
            rec(100, 1_700_000_000_000, Some("k1"), Some("v1"), &[("a", Some("1")), ("a", Some("2")), ("n", None)]),
            rec(101, 1_699_999_999_000, None, Some("v2"), &[]),
            rec(105, 1_700_000_000_500, Some(""), None, &[("x", Some(""))]),
        ];
        let batch = encode_records(&records, 7, Compression::None, ProducerInfo::NONE);
        let header = verify(&batch).unwrap();
        assert_eq!(header.base_offset, 100);
        assert_eq!(header.last_offset(), 105);
        assert_eq!(header.epoch, 7);
        assert_eq!(header.record_count, 3);
        assert_eq!(header.first_timestamp, 1_700_000_000_000);
        assert_eq!(header.max_timestamp, 1_700_000_000_500);
        assert_eq!(decode_records(&batch).unwrap(), records);
    }

    #[test]
    fn zstd_round_trip() {
        let records: Vec<Record> =
            (0..200).map(|i| rec(i, 1000 + i as i64, Some("key"), Some("value value value"), &[])).collect();
        let batch = encode_records(&records, 0, Compression::Zstd, ProducerInfo::NONE);
        let plain = encode_records(&records, 0, Compression::None, ProducerInfo::NONE);
        assert!(batch.len() < plain.len() / 2, "zstd should shrink repetitive records");
        assert_eq!(verify(&batch).unwrap().compression().unwrap(), Compression::Zstd);
        assert_eq!(decode_records(&batch).unwrap(), records);
    }

    #[test]
    fn stamped_base_offset_moves_every_record() {
        let batch = encode_records(&[rec(0, 1, None, Some("v"), &[])], 0, Compression::None, ProducerInfo::NONE);
        let mut stamped = batch.to_vec();
        set_base_offset(&mut stamped, 42);
        set_epoch(&mut stamped, 9);
        assert_eq!(decode_records(&stamped).unwrap(), vec![rec(42, 1, None, Some("v"), &[])]);
    }

    #[test]
    fn hostile_lengths_do_not_panic() {
        let batch = encode_records(&[rec(0, 1, Some("k"), Some("v"), &[])], 0, Compression::None, ProducerInfo::NONE);
        let mut bad = batch.to_vec();
        // Claim a huge key length inside the record, then fix the CRC so decoding reaches it.
        bad[HEADER_LEN + 4] = 0xfe;
        fix_crc(&mut bad);
        assert!(decode_records(&bad).is_err());
        assert!(BatchHeader::parse(&[0u8; 10]).is_err());
    }

    #[test]
    fn records_whose_offsets_go_backwards_are_malformed() {
        // Found by the batch_decode fuzz target: a CRC-valid batch whose second record's offset delta is below
        // the first's decoded into offsets that decrease.
        let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        builder.push(5, 1, None, Some(b"a"), &[]);
        builder.push(2, 1, None, Some(b"b"), &[]);
        let mut batch = builder.build(100, 0).to_vec();
        // The builder records the last pushed delta; claim a span that covers both records, as the input did.
        batch[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&5u32.to_be_bytes());
        fix_crc(&mut batch);
        assert!(verify(&batch).is_ok(), "the header alone is consistent");
        assert!(matches!(
            decode_records(&batch),
            Err(BatchError::Malformed { what: "record offsets do not increase", .. })
        ));
        let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        builder.push(3, 1, None, Some(b"a"), &[]);
        builder.push(3, 1, None, Some(b"b"), &[]);
        assert!(matches!(
            decode_records(&builder.build(0, 0)),
            Err(BatchError::Malformed { what: "record offsets do not increase", .. })
        ));
    }

    /// (offset gap, timestamp, key, value, headers) of one generated record.
    type RecordParts = (u32, i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Option<Vec<u8>>)>);

    fn arb_record() -> impl Strategy<Value = RecordParts> {
        (
            1u32..5,
            -1_000_000i64..1_000_000,
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
            proptest::collection::vec(
                ("[a-z]{0,6}", proptest::option::of(proptest::collection::vec(any::<u8>(), 0..10))),
                0..4,
            ),
        )
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(base in 0u64..1u64 << 60, epoch in any::<u32>(), zstd in any::<bool>(),
                                     parts in proptest::collection::vec(arb_record(), 1..30)) {
            let mut offset = base;
            let mut records = Vec::new();
            for (i, (gap, ts, key, value, headers)) in parts.into_iter().enumerate() {
                if i > 0 { offset += u64::from(gap); }
                records.push(Record {
                    offset,
                    timestamp: 1_600_000_000_000 + ts,
                    key: key.map(Bytes::from),
                    value: value.map(Bytes::from),
                    headers: headers.into_iter().map(|(k, v)| Header { key: k, value: v.map(Bytes::from) }).collect(),
                });
            }
            let compression = if zstd { Compression::Zstd } else { Compression::None };
            let batch = encode_records(&records, epoch, compression, ProducerInfo { producer_id: 5, producer_epoch: 1, base_sequence: 10 });
            let header = verify(&batch).unwrap();
            prop_assert_eq!(header.epoch, epoch);
            prop_assert_eq!(header.record_count as usize, records.len());
            prop_assert_eq!(header.last_offset(), records.last().unwrap().offset);
            prop_assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence), (5, 1, 10));
            prop_assert_eq!(&decode_records(&batch).unwrap(), &records);
            // The shared decode gives the same records; uncompressed, every value lies inside the batch itself.
            let shared = decode_records_shared(&batch, MAX_DECOMPRESSED_BYTES).unwrap();
            prop_assert_eq!(&shared, &records);
            if !zstd {
                let inside = |b: &Bytes| b.is_empty() || batch.as_ptr_range().contains(&b.as_ptr());
                for r in &shared {
                    prop_assert!(r.key.iter().chain(&r.value).all(inside));
                    prop_assert!(r.headers.iter().filter_map(|h| h.value.as_ref()).all(inside));
                }
            }
        }

        #[test]
        fn the_shared_decode_refuses_what_the_copying_one_refuses(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let bytes = Bytes::from(bytes);
            prop_assert_eq!(decode_records_shared(&bytes, MAX_DECOMPRESSED_BYTES).err(), decode_records(&bytes).err());
        }

        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_records(&bytes);
            for item in BatchIter::new(&bytes) { let _ = item; }
        }
    }
}
