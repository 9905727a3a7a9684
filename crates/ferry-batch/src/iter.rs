//! Walking a buffer of batches laid back to back: [`BatchIter`] over a `&[u8]`, [`Batches`] over a [`Bytes`]
//! (yielding zero-copy [`Batch`] values), and [`split_verified`].
//!
//! Both iterators stop after the first error: a batch cut short or with an impossible header is reported once,
//! and nothing after it is read (its length cannot be trusted to find the next batch).

use bytes::Bytes;

use crate::batch::Batch;
use crate::error::BatchError;
use crate::header::BatchHeader;

/// Iterates over whole batches laid back to back in a buffer. Each item is the batch's header and its bytes.
/// Iteration stops with an error at the first batch that is cut short or has an impossible header; CRCs are
/// not checked here (use [`verify`](crate::verify)).
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> BatchIter<'a> {
    /// Iterates over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        BatchIter { buf, pos: 0, failed: false }
    }

    /// Byte position of the next batch within the buffer.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = Result<(BatchHeader, &'a [u8]), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        let header = match BatchHeader::parse(rest) {
            Ok(h) => h,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        let total = header.total_len();
        if rest.len() < total {
            self.failed = true;
            return Some(Err(BatchError::Truncated { needed: total, available: rest.len() }));
        }
        self.pos += total;
        Some(Ok((header, &rest[..total])))
    }
}

/// Iterates over whole batches laid back to back in a [`Bytes`] buffer, yielding each as a [`Batch`] that is a
/// zero-copy slice of it. Every item has passed [`Batch::parse`]'s header checks (so, unlike [`BatchIter`], a
/// batch without records is an error here), and with [`Batches::verified`] [`Batch::verify`]'s CRC pass too.
#[derive(Debug, Clone)]
pub struct Batches {
    buf: Bytes,
    pos: usize,
    with_crc: bool,
    failed: bool,
}

impl Batches {
    /// Iterates over `buf`, checking each batch's header but not its CRC.
    pub fn new(buf: Bytes) -> Self {
        Batches { buf, pos: 0, with_crc: false, failed: false }
    }

    /// Iterates over `buf`, checking each batch's header and CRC.
    pub fn verified(buf: Bytes) -> Self {
        Batches { buf, pos: 0, with_crc: true, failed: false }
    }

    /// Byte position of the next batch within the buffer.
    pub fn position(&self) -> usize {
        self.pos
    }

    fn step(&mut self) -> Result<Batch, BatchError> {
        let rest = &self.buf[self.pos..];
        let total = BatchHeader::parse(rest)?.total_len();
        if rest.len() < total {
            return Err(BatchError::Truncated { needed: total, available: rest.len() });
        }
        let bytes = self.buf.slice(self.pos..self.pos + total);
        let batch = if self.with_crc { Batch::verify(bytes)? } else { Batch::parse(bytes)? };
        self.pos += total;
        Ok(batch)
    }
}

impl Iterator for Batches {
    type Item = Result<Batch, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let item = self.step();
        self.failed = item.is_err();
        Some(item)
    }
}

/// Splits a buffer of back-to-back batches into zero-copy `Bytes` slices, verifying each one fully.
pub fn split_verified(buf: &Bytes) -> Result<Vec<(BatchHeader, Bytes)>, BatchError> {
    Batches::verified(buf.clone()).map(|item| item.map(Batch::into_parts)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{BatchBuilder, ProducerInfo};
    use crate::compression::Compression;
    use crate::layout::{OFF_CRC, OFF_MAGIC, OFF_RECORD_COUNT};
    use proptest::prelude::*;

    /// One batch of `count` records based at `base`.
    fn batch(base: u64, count: u32, value: &[u8]) -> Bytes {
        let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        for i in 0..count {
            b.push(i, 1, None, Some(value), &[]);
        }
        b.build(base, 0)
    }

    fn concat(parts: &[&Bytes]) -> Bytes {
        Bytes::from(parts.iter().flat_map(|p| p.iter().copied()).collect::<Vec<u8>>())
    }

    #[test]
    fn iterator_stops_at_a_torn_batch() {
        let a = batch(0, 1, b"a");
        let b = batch(1, 1, b"b");
        let mut buf = a.to_vec();
        buf.extend_from_slice(&b[..b.len() - 3]);
        let items: Vec<_> = BatchIter::new(&buf).collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], Ok((BatchHeader::parse(&a).unwrap(), &a[..])));
        assert_eq!(items[1], Err(BatchError::Truncated { needed: b.len(), available: b.len() - 3 }));
    }

    #[test]
    fn batches_yields_zero_copy_slices_in_order() {
        let (a, b, c) = (batch(0, 2, b"a"), batch(2, 1, b"bb"), batch(3, 3, b"ccc"));
        let buf = concat(&[&a, &b, &c]);
        let mut iter = Batches::new(buf.clone());
        let mut starts = Vec::new();
        let mut got = Vec::new();
        while let Some(item) = {
            starts.push(iter.position());
            iter.next()
        } {
            got.push(item.unwrap());
        }
        assert_eq!(starts, [0, a.len(), a.len() + b.len(), buf.len()]);
        assert_eq!(got.iter().map(Batch::base_offset).collect::<Vec<_>>(), [0, 2, 3]);
        assert_eq!(got.iter().map(Batch::next_offset).collect::<Vec<_>>(), [2, 3, 6]);
        assert_eq!([got[0].bytes(), got[1].bytes(), got[2].bytes()], [&a, &b, &c]);
        for (batch, start) in got.iter().zip(starts) {
            assert_eq!(batch.bytes().as_ptr(), buf[start..].as_ptr(), "a slice of the buffer, not a copy");
        }
        assert_eq!(Batches::new(Bytes::new()).count(), 0);
    }

    #[test]
    fn batches_stops_after_the_first_error() {
        let (a, b) = (batch(0, 1, b"a"), batch(1, 1, b"b"));
        // A bad batch in the middle: the good one after it is not reached.
        let mut bad = b.to_vec();
        bad[OFF_MAGIC] = 9;
        let items: Vec<_> = Batches::new(concat(&[&a, &Bytes::from(bad), &a])).collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].as_ref().unwrap().bytes(), &a);
        assert_eq!(items[1], Err(BatchError::BadMagic(9)));
        // A torn batch at the end.
        let items: Vec<_> = Batches::new(concat(&[&a, &b.slice(..b.len() - 3)])).collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1], Err(BatchError::Truncated { needed: b.len(), available: b.len() - 3 }));
    }

    #[test]
    fn batches_checks_crcs_only_when_verified() {
        let (a, b) = (batch(0, 1, b"a"), batch(1, 1, b"b"));
        let mut bad = b.to_vec();
        bad[OFF_CRC] ^= 0x01;
        let buf = concat(&[&a, &Bytes::from(bad), &a]);
        assert_eq!(Batches::new(buf.clone()).filter(Result::is_ok).count(), 3);
        let verified: Vec<_> = Batches::verified(buf.clone()).collect();
        assert_eq!(verified.len(), 2);
        assert!(verified[0].is_ok());
        assert!(matches!(verified[1], Err(BatchError::CrcMismatch { .. })));
        assert!(matches!(split_verified(&buf), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn batches_refuses_a_batch_without_records_that_batch_iter_passes() {
        let mut empty = batch(0, 1, b"a").to_vec();
        empty[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&0u32.to_be_bytes());
        assert!(BatchIter::new(&empty).all(|item| item.is_ok()));
        assert_eq!(Batches::new(Bytes::from(empty)).collect::<Vec<_>>(), [Err(BatchError::Empty)]);
    }

    #[test]
    fn split_verified_gives_headers_and_slices() {
        let (a, b) = (batch(10, 2, b"a"), batch(12, 1, b"b"));
        let buf = concat(&[&a, &b]);
        let split = split_verified(&buf).unwrap();
        assert_eq!(
            split,
            vec![(BatchHeader::parse(&a).unwrap(), a.clone()), (BatchHeader::parse(&b).unwrap(), b.clone())]
        );
        assert_eq!(split[1].1.as_ptr(), buf[a.len()..].as_ptr());
    }

    proptest! {
        #[test]
        fn garbage_never_panics_and_both_iterators_agree_on_where_batches_are(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let buf = Bytes::from(bytes);
            let plain: Vec<usize> = BatchIter::new(&buf).map_while(Result::ok).map(|(h, _)| h.total_len()).collect();
            let typed: Vec<usize> = Batches::new(buf.clone()).map_while(Result::ok).map(|b| b.len()).collect();
            // Batches checks more than BatchIter, so it may stop earlier, never later, and agrees until then.
            prop_assert!(typed.len() <= plain.len());
            prop_assert_eq!(&plain[..typed.len()], &typed[..]);
            let _ = split_verified(&buf);
        }
    }
}
