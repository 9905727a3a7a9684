//! [`Batch`]: one whole batch as a value, its header parsed once and its bytes shared, not copied.

use bytes::Bytes;

use crate::error::BatchError;
use crate::header::{self, BatchHeader};

/// One whole batch: its bytes exactly (no more, no less) and its header, parsed once when the value was made.
///
/// A `Batch` has passed every header check of [`verify`](crate::verify): a known format version, a length that
/// matches the bytes, at least one record, a record count within the offset span and a known compression.
/// [`Batch::verify`] has also checked the CRC; [`Batch::parse`] has not (call [`Batch::verify_crc`] later, or
/// decode the records, which checks it). Cloning is cheap: the bytes are reference-counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    header: BatchHeader,
    bytes: Bytes,
}

impl Batch {
    /// Takes `bytes` as one whole batch after the header checks, without the CRC pass.
    pub fn parse(bytes: Bytes) -> Result<Batch, BatchError> {
        let header = header::check(&bytes, false)?;
        Ok(Batch { header, bytes })
    }

    /// Takes `bytes` as one whole batch after the header checks and the CRC pass (as [`verify`](crate::verify)).
    pub fn verify(bytes: Bytes) -> Result<Batch, BatchError> {
        let header = header::verify(&bytes)?;
        Ok(Batch { header, bytes })
    }

    /// Checks the CRC of a batch made by [`Batch::parse`].
    pub fn verify_crc(&self) -> Result<(), BatchError> {
        header::verify(&self.bytes).map(|_| ())
    }

    /// The parsed header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The batch's bytes, header included.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Total bytes of the batch, header included.
    // A batch is never empty (it holds at least its header), so there is no `is_empty`.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The batch's bytes, giving up the value.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The header and the bytes, giving up the value.
    pub fn into_parts(self) -> (BatchHeader, Bytes) {
        (self.header, self.bytes)
    }

    /// First offset of the batch.
    pub fn base_offset(&self) -> u64 {
        self.header.base_offset
    }

    /// Offset of the last record.
    pub fn last_offset(&self) -> u64 {
        self.header.last_offset()
    }

    /// One past the last record: where the next batch starts.
    pub fn next_offset(&self) -> u64 {
        self.header.next_offset()
    }

    /// Partition epoch the batch was written in.
    pub fn epoch(&self) -> u32 {
        self.header.epoch
    }

    /// Number of records.
    pub fn record_count(&self) -> u32 {
        self.header.record_count
    }

    /// Largest record timestamp, ms since the Unix epoch.
    pub fn max_timestamp(&self) -> i64 {
        self.header.max_timestamp
    }
}

impl AsRef<[u8]> for Batch {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{BatchBuilder, ProducerInfo};
    use crate::compression::Compression;
    use crate::layout::{HEADER_LEN, OFF_CRC, OFF_MAGIC, OFF_RECORD_COUNT};

    /// Three records at deltas 0, 2 and 5 with timestamps 30, 10 and 20.
    fn sample(base: u64, epoch: u32) -> Bytes {
        let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        b.push(0, 30, Some(b"a"), Some(b"1"), &[]);
        b.push(2, 10, Some(b"b"), Some(b"2"), &[]);
        b.push(5, 20, None, Some(b"3"), &[]);
        b.build(base, epoch)
    }

    #[test]
    fn parse_reads_the_header_once_and_keeps_the_bytes() {
        let bytes = sample(1000, 4);
        let batch = Batch::parse(bytes.clone()).unwrap();
        assert_eq!(*batch.header(), header::verify(&bytes).unwrap());
        assert_eq!(batch.bytes(), &bytes);
        assert_eq!(batch.bytes().as_ptr(), bytes.as_ptr(), "zero-copy: the same buffer");
        assert_eq!(batch.len(), bytes.len());
        assert_eq!(batch.as_ref(), &bytes[..]);
        assert_eq!(
            (batch.base_offset(), batch.last_offset(), batch.next_offset(), batch.epoch()),
            (1000, 1005, 1006, 4)
        );
        assert_eq!((batch.record_count(), batch.max_timestamp()), (3, 30));
        assert_eq!(batch.clone().into_parts(), (header::verify(&bytes).unwrap(), bytes.clone()));
        assert_eq!(batch.into_bytes(), bytes);
    }

    #[test]
    fn parse_skips_the_crc_and_verify_does_not() {
        let mut bad = sample(0, 0).to_vec();
        bad[OFF_CRC] ^= 0xff;
        let bad = Bytes::from(bad);
        let parsed = Batch::parse(bad.clone()).expect("parse does no CRC pass");
        assert!(matches!(parsed.verify_crc(), Err(BatchError::CrcMismatch { .. })));
        assert!(matches!(Batch::verify(bad), Err(BatchError::CrcMismatch { .. })));
        let good = Batch::verify(sample(0, 0)).unwrap();
        assert_eq!(good.verify_crc(), Ok(()));
    }

    #[test]
    fn parse_makes_the_header_checks_and_wants_exactly_one_batch() {
        let bytes = sample(0, 0);
        let total = bytes.len();
        assert_eq!(
            Batch::parse(bytes.slice(..total - 1)),
            Err(BatchError::Truncated { needed: total, available: total - 1 })
        );
        let mut two = bytes.to_vec();
        two.extend_from_slice(&bytes);
        assert_eq!(Batch::parse(Bytes::from(two)), Err(BatchError::BadLength { length: 2 * total }));
        assert_eq!(Batch::parse(bytes.slice(..20)), Err(BatchError::Truncated { needed: HEADER_LEN, available: 20 }));
        let mut magic = bytes.to_vec();
        magic[OFF_MAGIC] = 0;
        assert_eq!(Batch::parse(Bytes::from(magic)), Err(BatchError::BadMagic(0)));
        let mut empty = bytes.to_vec();
        empty[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(Batch::parse(Bytes::from(empty)), Err(BatchError::Empty));
    }
}
