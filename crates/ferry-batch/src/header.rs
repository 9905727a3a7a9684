//! The fixed header: [`BatchHeader`] parsing, whole-batch checks ([`verify`]) and stamping the fields that sit
//! outside the CRC ([`set_base_offset`], [`set_epoch`]).

use crate::compression::Compression;
use crate::crc::compute_crc;
use crate::error::BatchError;
use crate::layout::{
    COMPRESSION_MASK, HEADER_LEN, LOG_OVERHEAD, MAGIC, OFF_ATTRIBUTES, OFF_BASE_OFFSET, OFF_BASE_SEQUENCE, OFF_CRC,
    OFF_EPOCH, OFF_FIRST_TS, OFF_LAST_OFFSET_DELTA, OFF_LENGTH, OFF_MAGIC, OFF_MAX_TS, OFF_PRODUCER_EPOCH,
    OFF_PRODUCER_ID, OFF_RECORD_COUNT,
};

/// The decoded fixed header of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// First offset of the batch.
    pub base_offset: u64,
    /// Bytes after the length field.
    pub batch_length: u32,
    /// Partition epoch the batch was written in.
    pub epoch: u32,
    /// Format version.
    pub magic: u8,
    /// Stored CRC-32C.
    pub crc: u32,
    /// Attribute bits.
    pub attributes: u16,
    /// Offset of the last record minus the base offset.
    pub last_offset_delta: u32,
    /// Timestamp of the first record, ms.
    pub first_timestamp: i64,
    /// Largest record timestamp, ms.
    pub max_timestamp: i64,
    /// Idempotent producer id, or -1.
    pub producer_id: i64,
    /// Idempotent producer epoch, or -1.
    pub producer_epoch: i16,
    /// Sequence number of the first record, or -1.
    pub base_sequence: i32,
    /// Number of records.
    pub record_count: u32,
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

impl BatchHeader {
    /// Parses the fixed header from the start of `buf`. Checks the magic and that the length is plausible, but
    /// not that the whole batch is present nor the CRC (see [`verify`]).
    pub fn parse(buf: &[u8]) -> Result<Self, BatchError> {
        if buf.len() < HEADER_LEN {
            return Err(BatchError::Truncated { needed: HEADER_LEN, available: buf.len() });
        }
        let batch_length = be_u32(buf, OFF_LENGTH);
        let total = LOG_OVERHEAD as u64 + u64::from(batch_length);
        if total < HEADER_LEN as u64 {
            return Err(BatchError::BadLength { length: total as usize });
        }
        let magic = buf[OFF_MAGIC];
        if magic != MAGIC {
            return Err(BatchError::BadMagic(magic));
        }
        Ok(BatchHeader {
            base_offset: be_u64(buf, OFF_BASE_OFFSET),
            batch_length,
            epoch: be_u32(buf, OFF_EPOCH),
            magic,
            crc: be_u32(buf, OFF_CRC),
            attributes: be_u16(buf, OFF_ATTRIBUTES),
            last_offset_delta: be_u32(buf, OFF_LAST_OFFSET_DELTA),
            first_timestamp: be_u64(buf, OFF_FIRST_TS) as i64,
            max_timestamp: be_u64(buf, OFF_MAX_TS) as i64,
            producer_id: be_u64(buf, OFF_PRODUCER_ID) as i64,
            producer_epoch: be_u16(buf, OFF_PRODUCER_EPOCH) as i16,
            base_sequence: be_u32(buf, OFF_BASE_SEQUENCE) as i32,
            record_count: be_u32(buf, OFF_RECORD_COUNT),
        })
    }

    /// Total bytes of the batch, header included.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + self.batch_length as usize
    }

    /// Offset of the last record.
    pub fn last_offset(&self) -> u64 {
        self.base_offset.saturating_add(u64::from(self.last_offset_delta))
    }

    /// One past the last record: where the next batch starts.
    pub fn next_offset(&self) -> u64 {
        self.last_offset().saturating_add(1)
    }

    /// Compression of the records section.
    pub fn compression(&self) -> Result<Compression, BatchError> {
        Compression::from_code(self.attributes & COMPRESSION_MASK)
    }

    /// Checks that the batch is dense, as ordinary produce requires: `last_offset_delta == record_count - 1`, so
    /// the batch takes exactly one offset per record. (Sparse batches, from a compacted source, come only through
    /// append-with-offsets.)
    pub fn check_dense(&self) -> Result<(), BatchError> {
        if u64::from(self.last_offset_delta) + 1 == u64::from(self.record_count) {
            Ok(())
        } else {
            Err(BatchError::NotDense { record_count: self.record_count, last_offset_delta: self.last_offset_delta })
        }
    }

    /// Whether the batch was written by an idempotent producer.
    pub fn is_idempotent(&self) -> bool {
        self.producer_id >= 0
    }
}

/// Checks that `batch` is exactly one whole batch with a good header, a consistent record count and a good CRC.
pub fn verify(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    check(batch, true)
}

/// Every check of [`verify`] but the CRC pass: for bytes whose CRC this process has already verified (the broker
/// verifies a request's batches once, before its storage writes them, and tells the log so). Never for bytes
/// that came from elsewhere.
pub fn verify_header(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    check(batch, false)
}

/// The checks of [`verify`], in its order, with the CRC pass done only when `with_crc` is set.
pub(crate) fn check(batch: &[u8], with_crc: bool) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(batch)?;
    let total = header.total_len();
    if batch.len() < total {
        return Err(BatchError::Truncated { needed: total, available: batch.len() });
    }
    if batch.len() > total {
        return Err(BatchError::BadLength { length: batch.len() });
    }
    if with_crc {
        let computed = compute_crc(batch);
        if computed != header.crc {
            return Err(BatchError::CrcMismatch { stored: header.crc, computed });
        }
    }
    if header.record_count == 0 {
        return Err(BatchError::Empty);
    }
    if u64::from(header.last_offset_delta) + 1 < u64::from(header.record_count) {
        return Err(BatchError::Malformed { what: "record count exceeds the offset span", position: OFF_RECORD_COUNT });
    }
    header.compression()?;
    Ok(header)
}

/// Writes the base offset into an encoded batch (outside the CRC).
pub fn set_base_offset(batch: &mut [u8], base_offset: u64) {
    batch[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Writes the partition epoch into an encoded batch (outside the CRC).
pub fn set_epoch(batch: &mut [u8], epoch: u32) {
    batch[OFF_EPOCH..OFF_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{BatchBuilder, ProducerInfo, encode_records};
    use crate::layout::CRC_START;
    use crate::record::{Header, Record};
    use bytes::Bytes;

    fn one(value: &str) -> Bytes {
        let record = Record {
            offset: 0,
            timestamp: 1,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"v")) }],
        };
        encode_records(&[record], 0, Compression::None, ProducerInfo::NONE)
    }

    fn fix_crc(batch: &mut [u8]) {
        let crc = compute_crc(batch);
        batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn base_offset_and_epoch_are_outside_the_crc() {
        let batch = one("v");
        let mut stamped = batch.to_vec();
        set_base_offset(&mut stamped, 42);
        set_epoch(&mut stamped, 9);
        let header = verify(&stamped).unwrap();
        assert_eq!((header.base_offset, header.epoch, header.crc), (42, 9, verify(&batch).unwrap().crc));
    }

    #[test]
    fn every_single_byte_flip_in_the_covered_range_is_caught() {
        let batch = one("value");
        for i in CRC_START..batch.len() {
            let mut bad = batch.to_vec();
            bad[i] ^= 0x01;
            assert!(verify(&bad).is_err(), "flip at byte {i} went unnoticed");
        }
        let mut bad = batch.to_vec();
        bad[OFF_CRC] ^= 0x80;
        assert!(matches!(verify(&bad), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn verify_refuses_each_inconsistent_header_with_its_own_error() {
        let batch = one("v");
        let total = batch.len();
        assert_eq!(BatchHeader::parse(&batch[..10]), Err(BatchError::Truncated { needed: HEADER_LEN, available: 10 }));
        assert_eq!(verify(&batch[..total - 1]), Err(BatchError::Truncated { needed: total, available: total - 1 }));
        let mut longer = batch.to_vec();
        longer.push(0);
        assert_eq!(verify(&longer), Err(BatchError::BadLength { length: total + 1 }));

        let mut short_length = batch.to_vec();
        short_length[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&48u32.to_be_bytes());
        assert_eq!(BatchHeader::parse(&short_length), Err(BatchError::BadLength { length: 60 }));

        let mut magic = batch.to_vec();
        magic[OFF_MAGIC] = 2;
        assert_eq!(verify(&magic), Err(BatchError::BadMagic(2)));

        let mut empty = batch.to_vec();
        empty[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&0u32.to_be_bytes());
        fix_crc(&mut empty);
        assert_eq!(verify(&empty), Err(BatchError::Empty));

        let mut too_many = batch.to_vec();
        too_many[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&2u32.to_be_bytes());
        fix_crc(&mut too_many);
        assert_eq!(
            verify(&too_many),
            Err(BatchError::Malformed { what: "record count exceeds the offset span", position: OFF_RECORD_COUNT })
        );

        let mut compression = batch.to_vec();
        compression[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&5u16.to_be_bytes());
        fix_crc(&mut compression);
        assert_eq!(verify(&compression), Err(BatchError::BadCompression(5)));
    }

    #[test]
    fn check_without_crc_skips_only_the_crc() {
        let mut bad_crc = one("v").to_vec();
        bad_crc[OFF_CRC] ^= 0xff;
        assert!(matches!(check(&bad_crc, true), Err(BatchError::CrcMismatch { .. })));
        assert_eq!(check(&bad_crc, false).unwrap(), BatchHeader::parse(&bad_crc).unwrap());
        bad_crc[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(check(&bad_crc, false), Err(BatchError::Empty));
    }

    #[test]
    fn offsets_and_idempotence_come_from_the_header() {
        let mut builder =
            BatchBuilder::new(Compression::None, ProducerInfo { producer_id: 7, producer_epoch: 2, base_sequence: 30 });
        builder.push(0, 5, None, Some(b"a"), &[]);
        builder.push(3, 6, None, Some(b"b"), &[]);
        let header = verify(&builder.build(u64::MAX - 1, 0)).unwrap();
        assert_eq!(header.last_offset(), u64::MAX, "saturates instead of wrapping");
        assert_eq!(header.next_offset(), u64::MAX);
        assert!(header.is_idempotent());
        let plain = verify(&one("v")).unwrap();
        assert!(!plain.is_idempotent());
        assert_eq!(plain.check_dense(), Ok(()));
        let sparse = BatchHeader { last_offset_delta: u32::MAX, ..plain };
        let err = sparse.check_dense().unwrap_err();
        assert_eq!(err, BatchError::NotDense { record_count: 1, last_offset_delta: u32::MAX });
        assert_eq!(
            err.to_string(),
            "batch claims last_offset_delta 4294967295 for 1 records; a produced batch must have last_offset_delta = \
             record_count - 1 (0): build it with offset deltas 0, 1, 2, ..."
        );
        assert_eq!((plain.last_offset(), plain.next_offset(), plain.total_len()), (0, 1, one("v").len()));
    }
}
