//! Kafka records of one partition into Ferry record batches that keep every record's source offset.
//!
//! Invariant: each batch's base offset is the next offset the partition expects (one past the previous record, or
//! the fetch position), and each record sits at its own offset's delta from it. Kafka leaves offsets without a
//! visible record (compacted records, transaction markers, aborted transactions): such a gap is absorbed inside
//! the next batch instead of showing up as a batch starting above the expected offset, so the target's log end
//! always moves contiguously batch after batch.

use bytes::Bytes;
use ferry_batch::{BatchBuilder, Compression, Header, ProducerInfo};

/// What [`PartitionBatcher::push`] did with a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// The record is below the expected offset (already delivered, or fetched before a re-seat): dropped.
    Stale,
    /// Added to the open batch.
    Added,
    /// The open batch was full: it is returned (bytes, records) and the record started the next one.
    Completed(Bytes, u64),
}

/// Builds one partition's batches.
#[derive(Debug)]
pub struct PartitionBatcher {
    expected: u64,
    base: u64,
    builder: BatchBuilder,
    compression: Compression,
    max_batch_bytes: usize,
}

impl PartitionBatcher {
    /// A batcher whose first batch starts at `expected`; batches stay below `max_batch_bytes` (uncompressed) unless
    /// a single record is larger.
    pub fn new(expected: u64, max_batch_bytes: usize, compression: Compression) -> PartitionBatcher {
        PartitionBatcher {
            expected,
            base: expected,
            builder: BatchBuilder::new(compression, ProducerInfo::NONE),
            compression,
            max_batch_bytes,
        }
    }

    /// The next offset the partition expects.
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Whether records wait in the open batch.
    pub fn has_pending(&self) -> bool {
        !self.builder.is_empty()
    }

    /// Bytes in the open batch (uncompressed).
    pub fn pending_bytes(&self) -> u64 {
        if self.builder.is_empty() { 0 } else { self.builder.estimated_size() as u64 }
    }

    /// Drops the open batch and expects `offset` next (a re-seat or a restart).
    pub fn reset(&mut self, offset: u64) {
        self.builder = BatchBuilder::new(self.compression, ProducerInfo::NONE);
        self.expected = offset;
        self.base = offset;
    }

    /// Adds the record at `offset`.
    pub fn push(
        &mut self,
        offset: u64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Pushed {
        if offset < self.expected {
            return Pushed::Stale;
        }
        let mut completed = None;
        let size = BatchBuilder::record_size(key, value, headers);
        if !self.builder.is_empty() && self.builder.estimated_size() + size > self.max_batch_bytes {
            completed = self.flush();
        }
        if self.builder.is_empty() {
            self.base = self.expected;
        }
        // A gap wider than a batch can span (4 billion offsets) starts the batch at the record itself.
        let delta = match u32::try_from(offset - self.base) {
            Ok(d) => d,
            Err(_) => {
                if let Some(done) = self.flush() {
                    completed = Some(done);
                }
                self.base = offset;
                0
            }
        };
        self.builder.push(delta, timestamp, key, value, headers);
        self.expected = offset.saturating_add(1);
        match completed {
            Some((bytes, records)) => Pushed::Completed(bytes, records),
            None => Pushed::Added,
        }
    }

    /// Closes the open batch: its bytes and record count, or `None` when it is empty.
    pub fn flush(&mut self) -> Option<(Bytes, u64)> {
        if self.builder.is_empty() {
            return None;
        }
        let records = u64::from(self.builder.len());
        let bytes = self.builder.build(self.base, 0);
        self.builder = BatchBuilder::new(self.compression, ProducerInfo::NONE);
        self.base = self.expected;
        Some((bytes, records))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{BatchHeader, decode_records};

    fn h(k: &str, v: Option<&str>) -> Header {
        Header { key: k.to_owned(), value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())) }
    }

    #[test]
    fn gaps_are_absorbed_and_every_offset_is_kept() {
        let mut b = PartitionBatcher::new(10, 1 << 20, Compression::None);
        assert_eq!(b.push(9, 1, None, Some(b"old"), &[]), Pushed::Stale);
        // Offsets 10..12 are compacted away / transaction markers: the batch still starts at 10.
        assert_eq!(b.push(12, 1000, Some(b"k1"), Some(b"v1"), &[h("a", Some("1")), h("b", None)]), Pushed::Added);
        assert_eq!(b.push(13, 999, None, None, &[h("a", Some("2")), h("a", Some("3"))]), Pushed::Added);
        assert_eq!(b.push(20, 1005, Some(b"k3"), Some(b""), &[]), Pushed::Added);
        assert_eq!(b.expected(), 21);
        let (bytes, records) = b.flush().unwrap();
        assert_eq!(records, 3);
        let header = BatchHeader::parse(&bytes).unwrap();
        assert_eq!((header.base_offset, header.last_offset(), header.epoch), (10, 20, 0));
        let recs = decode_records(&bytes).unwrap();
        assert_eq!(recs.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![12, 13, 20]);
        assert_eq!(recs[0].timestamp, 1000);
        assert_eq!(recs[1].timestamp, 999);
        assert_eq!(recs[0].headers, vec![h("a", Some("1")), h("b", None)]);
        assert_eq!(recs[1].headers, vec![h("a", Some("2")), h("a", Some("3"))]);
        assert_eq!((recs[1].key.clone(), recs[1].value.clone()), (None, None));
        assert_eq!(recs[2].value.as_deref(), Some(&b""[..]));
        // The next batch starts right after the last record.
        b.push(25, 1, None, Some(b"x"), &[]);
        let (bytes, _) = b.flush().unwrap();
        assert_eq!(BatchHeader::parse(&bytes).unwrap().base_offset, 21);
        assert_eq!(decode_records(&bytes).unwrap()[0].offset, 25);
    }

    #[test]
    fn full_batches_are_completed_and_contiguous() {
        let mut b = PartitionBatcher::new(0, 400, Compression::None);
        let value = vec![b'x'; 100];
        let mut batches = Vec::new();
        for offset in 0..20 {
            if let Pushed::Completed(bytes, n) = b.push(offset, 7, None, Some(&value), &[]) {
                batches.push((bytes, n));
            }
        }
        batches.extend(b.flush());
        assert!(batches.len() > 2);
        let mut next = 0;
        let mut total = 0;
        for (bytes, n) in &batches {
            let header = BatchHeader::parse(bytes).unwrap();
            assert_eq!(header.base_offset, next);
            next = header.next_offset();
            total += n;
        }
        assert_eq!((next, total), (20, 20));
    }

    #[test]
    fn reset_drops_the_open_batch() {
        let mut b = PartitionBatcher::new(0, 1 << 20, Compression::None);
        b.push(0, 1, None, Some(b"a"), &[]);
        b.reset(5);
        assert!(!b.has_pending());
        assert_eq!(b.push(4, 1, None, Some(b"stale"), &[]), Pushed::Stale);
        b.push(5, 1, None, Some(b"b"), &[]);
        let (bytes, n) = b.flush().unwrap();
        assert_eq!((BatchHeader::parse(&bytes).unwrap().base_offset, n), (5, 1));
    }
}
