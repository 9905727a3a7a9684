//! Re-encoding a source batch when it cannot go to the target as is, keeping every record's offset, timestamp,
//! key, value and headers, the batch's epoch and its producer fields:
//!
//! - it starts before the next offset the target expects (a batch the target already holds in part, e.g. after a
//!   crash in the middle of a split batch, or after a truncation): the records below are dropped;
//! - it starts after the expected offset (a gap inside the source log, e.g. a compacted or promoted topic): the
//!   new batch starts at the expected offset and its first record keeps its own offset;
//! - it is larger than the target's `max_batch_bytes`: it is split into pieces that each fit, contiguous in
//!   offsets, deterministically (the same input gives the same pieces).
//!
//! A single record larger than the limit cannot be mirrored: that is an error the caller halts on.

use bytes::Bytes;
use ferry_batch::{self as batch, BatchBuilder, BatchHeader, ProducerInfo, Record};

/// Why a batch could not be reshaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReshapeError {
    /// The batch does not decode.
    #[error("source batch at offset {offset} does not decode: {reason}")]
    Corrupt {
        /// Base offset.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// One record alone is over the target's limit.
    #[error(
        "record at offset {offset} is {size} bytes, over the target's max_batch_bytes ({max}); raise the target limit"
    )]
    RecordTooLarge {
        /// Record offset.
        offset: u64,
        /// Its encoded size.
        size: usize,
        /// The limit.
        max: u64,
    },
}

/// The most decompressed bytes the mirror lets one batch inflate to when it decodes it (to split or cut it for the
/// target, to check a tail on resume, to write it to a Kafka target): `max(2 x max(sync.queue_bytes, target
/// max_batch_bytes), 4 MiB)`. A batch past it (a decompression bomb a producer slipped into the source) is an error
/// at its offset, not an allocation; a real batch is built from at most its broker's `max_batch_bytes` of records,
/// and the mirror holds at most `sync.queue_bytes` of a partition's batches anyway.
pub fn decode_limit(queue_bytes: u64, target_max_batch_bytes: u64) -> usize {
    batch::decode_limit(queue_bytes.max(target_max_batch_bytes))
}

/// Whether a batch must be reshaped to be appended at `expected` under `max_batch_bytes`.
pub fn needs_reshape(header: &BatchHeader, len: usize, expected: u64, max_batch_bytes: u64) -> bool {
    header.base_offset != expected || len as u64 > max_batch_bytes
}

/// Re-encodes `bytes` (one whole batch) into batches that start at `expected` (dropping records below it) and fit
/// `max_batch_bytes`. Returns no batch when every record is below `expected`. The records are decoded holding at
/// most `decode_limit` decompressed bytes (see [`decode_limit`]).
pub fn reshape(
    header: &BatchHeader,
    bytes: &[u8],
    expected: u64,
    max_batch_bytes: u64,
    decode_limit: usize,
) -> Result<Vec<Bytes>, ReshapeError> {
    let records = batch::decode_records_bounded(bytes, decode_limit)
        .map_err(|e| ReshapeError::Corrupt { offset: header.base_offset, reason: e.to_string() })?;
    let compression = header.compression().unwrap_or_default();
    let mut out = Vec::new();
    let mut base = expected;
    let mut piece: Vec<&Record> = Vec::new();
    let mut piece_size = batch::HEADER_LEN;
    let mut first_index = 0usize;
    let kept: Vec<(usize, &Record)> = records.iter().enumerate().filter(|(_, r)| r.offset >= expected).collect();
    let build = |piece: &[&Record], base: u64, first_index: usize| -> Bytes {
        let producer = if header.is_idempotent() {
            ProducerInfo {
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                base_sequence: header.base_sequence.wrapping_add(first_index as i32),
            }
        } else {
            ProducerInfo::NONE
        };
        let mut b = BatchBuilder::new(compression, producer);
        for r in piece {
            b.push_record(base, r);
        }
        b.build(base, header.epoch)
    };
    for (index, record) in kept {
        let size = BatchBuilder::record_size(record.key.as_deref(), record.value.as_deref(), &record.headers);
        if (batch::HEADER_LEN + size) as u64 > max_batch_bytes {
            return Err(ReshapeError::RecordTooLarge {
                offset: record.offset,
                size: batch::HEADER_LEN + size,
                max: max_batch_bytes,
            });
        }
        if !piece.is_empty() && (piece_size + size) as u64 > max_batch_bytes {
            let last = piece.last().map_or(base, |r| r.offset);
            out.push(build(&piece, base, first_index));
            base = last + 1;
            piece.clear();
            piece_size = batch::HEADER_LEN;
        }
        if piece.is_empty() {
            first_index = index;
        }
        piece.push(record);
        piece_size += size;
    }
    if !piece.is_empty() {
        out.push(build(&piece, base, first_index));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{Compression, Header, decode_records, encode_records, verify};

    const LIMIT: usize = 32 << 20;

    #[test]
    fn the_decode_limit_is_twice_the_larger_of_the_queue_and_the_target_batch_and_at_least_4_mib() {
        assert_eq!(decode_limit(16 << 20, 1 << 20), 32 << 20);
        assert_eq!(decode_limit(1 << 20, 8 << 20), 16 << 20);
        assert_eq!(decode_limit(64 << 10, 64 << 10), 4 << 20);
    }

    #[test]
    fn a_batch_inflating_past_the_decode_limit_is_refused_at_its_offset() {
        // One record of 8 MiB of zeros: a few hundred bytes compressed, past a 4 MiB limit once inflated.
        let bomb = Record {
            offset: 40,
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(vec![0u8; 8 << 20])),
            headers: vec![],
        };
        let src = encode_records(std::slice::from_ref(&bomb), 3, Compression::Zstd, ProducerInfo::NONE);
        assert!(src.len() < 64 << 10);
        let h = verify(&src).unwrap();
        match reshape(&h, &src, 40, 1 << 20, 4 << 20) {
            Err(ReshapeError::Corrupt { offset: 40, reason }) => {
                assert!(reason.contains("inflates past the 4194304-byte decode limit"), "{reason}")
            }
            other => panic!("expected a refusal at offset 40, got {other:?}"),
        }
        // Within a limit that holds it, the record is kept (and, over the target's 1 MiB, named as too large).
        assert!(matches!(reshape(&h, &src, 40, 1 << 20, LIMIT), Err(ReshapeError::RecordTooLarge { offset: 40, .. })));
        assert_eq!(
            reshape(&h, &src, 40, 16 << 20, LIMIT)
                .unwrap()
                .iter()
                .map(|p| decode_records(p).unwrap())
                .collect::<Vec<_>>(),
            vec![vec![bomb]]
        );
    }

    fn records(offsets: &[u64], value_len: usize) -> Vec<Record> {
        offsets
            .iter()
            .map(|&o| Record {
                offset: o,
                timestamp: 1_700_000_000_000 + o as i64,
                key: Some(Bytes::from(format!("k{o}"))),
                value: Some(Bytes::from(vec![b'v'; value_len])),
                headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"1")) }],
            })
            .collect()
    }

    fn all(pieces: &[Bytes]) -> Vec<Record> {
        pieces.iter().flat_map(|p| decode_records(p).unwrap()).collect()
    }

    #[test]
    fn split_keeps_every_record_and_offset_and_is_contiguous() {
        let recs = records(&(100..150).collect::<Vec<_>>(), 1000);
        let src = encode_records(
            &recs,
            3,
            Compression::None,
            ProducerInfo { producer_id: 9, producer_epoch: 1, base_sequence: 40 },
        );
        let h = verify(&src).unwrap();
        let pieces = reshape(&h, &src, 100, 8 * 1024, LIMIT).unwrap();
        assert!(pieces.len() > 5);
        assert_eq!(all(&pieces), recs);
        let mut next = 100;
        for p in &pieces {
            let ph = verify(p).unwrap();
            assert!(p.len() <= 8 * 1024);
            assert_eq!(ph.base_offset, next);
            assert_eq!(ph.epoch, 3);
            assert_eq!(ph.producer_id, 9);
            assert_eq!(ph.base_sequence, 40 + (ph.base_offset - 100) as i32);
            next = ph.last_offset() + 1;
        }
        assert_eq!(next, 150);
        // Deterministic.
        assert_eq!(reshape(&h, &src, 100, 8 * 1024, LIMIT).unwrap(), pieces);
    }

    #[test]
    fn records_below_expected_are_dropped_and_gaps_absorbed() {
        let recs = records(&[10, 11, 15, 16], 10);
        let src = encode_records(&recs, 0, Compression::Zstd, ProducerInfo::NONE);
        let h = verify(&src).unwrap();
        let pieces = reshape(&h, &src, 12, 1 << 20, LIMIT).unwrap();
        assert_eq!(pieces.len(), 1);
        let ph = verify(&pieces[0]).unwrap();
        assert_eq!(ph.base_offset, 12);
        assert_eq!(ph.last_offset(), 16);
        assert_eq!(all(&pieces), recs[2..].to_vec());
        assert!(reshape(&h, &src, 17, 1 << 20, LIMIT).unwrap().is_empty());
    }

    #[test]
    fn an_oversized_single_record_is_an_error() {
        let recs = records(&[0], 10_000);
        let src = encode_records(&recs, 0, Compression::None, ProducerInfo::NONE);
        let h = verify(&src).unwrap();
        assert!(matches!(reshape(&h, &src, 0, 4096, LIMIT), Err(ReshapeError::RecordTooLarge { offset: 0, .. })));
    }
}
