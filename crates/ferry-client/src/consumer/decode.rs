//! Turning one partition's fetched bytes into records at or after the consumer's position.
//!
//! A fetch may start with the whole batch that contains the requested offset, so records below the position
//! are dropped. The returned position is one past the last record returned, or the broker's `next_offset` when
//! that is further (a gap left by mirrored retention). A batch that cannot be decoded stops decoding there: the
//! records before it are kept, the position stays at the bad batch, and the error names its offset.
//!
//! A batch's records are decoded holding at most `max_decompressed` bytes (the broker's decode limit,
//! `max(2 x max_batch_bytes, 4 MiB)`, from its Metadata), so a small batch that claims to inflate to hundreds of MB
//! (a decompression bomb a producer slipped in) is an error at its offset, not an allocation.

use bytes::Bytes;
use ferry_batch::{self as batch, BatchIter};

use super::config::ConsumerRecord;
use crate::error::ClientError;

/// What one partition's fetched data yielded.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) records: Vec<ConsumerRecord>,
    pub(crate) position: u64,
    pub(crate) error: Option<ClientError>,
}

/// Decodes `batches` of `topic`/`partition` for a consumer at `position`.
pub(crate) fn decode_partition(
    topic: &str,
    partition: u32,
    batches: &Bytes,
    next_offset: u64,
    position: u64,
    max_decompressed: usize,
) -> Decoded {
    let mut records = Vec::new();
    let mut pos = position;
    let corrupt = |offset: u64, e: batch::BatchError| ClientError::Corrupt {
        topic: topic.to_owned(),
        partition,
        offset,
        message: e.to_string(),
    };
    for item in BatchIter::new(batches) {
        let (header, bytes) = match item {
            Ok(ok) => ok,
            Err(e) => return Decoded { records, position: pos, error: Some(corrupt(pos, e)) },
        };
        if header.next_offset() <= pos {
            continue;
        }
        // Keys and values are slices of the fetched buffer, not copies of it.
        let decoded = match batch::decode_records_shared(&batches.slice_ref(bytes), max_decompressed) {
            Ok(d) => d,
            Err(e) => return Decoded { records, position: pos, error: Some(corrupt(header.base_offset, e)) },
        };
        for r in decoded {
            if r.offset < pos {
                continue;
            }
            pos = r.offset.saturating_add(1);
            records.push(ConsumerRecord {
                topic: topic.to_owned(),
                partition,
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                value: r.value,
                headers: r.headers,
            });
        }
        pos = pos.max(header.next_offset());
    }
    Decoded { records, position: pos.max(next_offset), error: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{Compression, Header, ProducerInfo, Record, encode_records};

    const LIMIT: usize = 4 << 20;

    fn rec(offset: u64, value: &str) -> Record {
        Record {
            offset,
            timestamp: 1_700_000_000_000 + offset as i64,
            key: Some(Bytes::from(format!("k{offset}"))),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"x")) }],
        }
    }

    fn batches(groups: &[&[Record]]) -> Bytes {
        let mut out = Vec::new();
        for g in groups {
            out.extend_from_slice(&encode_records(g, 0, Compression::Zstd, ProducerInfo::NONE));
        }
        Bytes::from(out)
    }

    #[test]
    fn records_below_the_position_are_dropped() {
        let a = [rec(10, "a"), rec(11, "b"), rec(12, "c")];
        let b = [rec(13, "d"), rec(14, "e")];
        let data = batches(&[&a, &b]);
        let out = decode_partition("t", 1, &data, 15, 12, LIMIT);
        assert!(out.error.is_none());
        let got: Vec<(u64, &str)> =
            out.records.iter().map(|r| (r.offset, std::str::from_utf8(r.value.as_ref().unwrap()).unwrap())).collect();
        assert_eq!(got, vec![(12, "c"), (13, "d"), (14, "e")]);
        assert_eq!(out.position, 15);
        let first = &out.records[0];
        assert_eq!((first.topic.as_str(), first.partition, first.timestamp), ("t", 1, 1_700_000_000_012));
        assert_eq!(first.key.as_deref(), Some(&b"k12"[..]));
        assert_eq!(first.headers, vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"x")) }]);
    }

    #[test]
    fn whole_batches_below_the_position_are_skipped_and_gaps_followed() {
        let a = [rec(0, "a"), rec(1, "b")];
        let b = [rec(7, "c")];
        let out = decode_partition("t", 0, &batches(&[&a, &b]), 8, 2, LIMIT);
        assert_eq!(out.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![7]);
        assert_eq!(out.position, 8);
        // Empty data with a next offset past a gap moves on; an unset next offset (0) never moves back.
        assert_eq!(decode_partition("t", 0, &Bytes::new(), 20, 8, LIMIT).position, 20);
        assert_eq!(decode_partition("t", 0, &Bytes::new(), 0, 8, LIMIT).position, 8);
    }

    #[test]
    fn a_record_at_the_last_offset_decodes_without_overflow() {
        let top = [rec(u64::MAX - 1, "a"), rec(u64::MAX, "b")];
        let out = decode_partition("t", 0, &batches(&[&top]), 0, u64::MAX - 1, LIMIT);
        assert!(out.error.is_none(), "{:?}", out.error);
        assert_eq!(out.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![u64::MAX - 1, u64::MAX]);
        assert_eq!(out.position, u64::MAX, "the position saturates instead of wrapping to 0");
    }

    #[test]
    fn a_corrupt_batch_keeps_earlier_records_and_names_its_offset() {
        let a = [rec(0, "a")];
        let b = [rec(1, "b")];
        let mut data = batches(&[&a, &b]).to_vec();
        let last = data.len() - 1;
        data[last] ^= 0xff;
        let out = decode_partition("t", 3, &Bytes::from(data), 2, 0, LIMIT);
        assert_eq!(out.records.len(), 1);
        assert_eq!(out.position, 1);
        match out.error {
            Some(ClientError::Corrupt { topic, partition: 3, offset: 1, .. }) => assert_eq!(topic, "t"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_torn_tail_is_reported_not_skipped() {
        let a = [rec(5, "a")];
        let data = batches(&[&a]);
        let torn = data.slice(..data.len() - 4);
        let out = decode_partition("t", 0, &torn, 6, 5, LIMIT);
        assert!(out.records.is_empty());
        assert_eq!(out.position, 5);
        assert!(matches!(out.error, Some(ClientError::Corrupt { offset: 5, .. })));
    }

    #[test]
    fn a_batch_inflating_past_the_decode_limit_is_an_error_at_its_offset() {
        let a = [rec(0, "a")];
        // 8 MiB of zeros compresses to a few hundred bytes: past the 4 MiB limit once inflated.
        let bomb = Record { value: Some(Bytes::from(vec![0u8; 8 << 20])), ..rec(1, "") };
        let data = batches(&[&a, std::slice::from_ref(&bomb)]);
        assert!(data.len() < 64 << 10, "the bomb is small on the wire: {} bytes", data.len());
        let out = decode_partition("t", 2, &data, 2, 0, LIMIT);
        assert_eq!(out.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0]);
        assert_eq!(out.position, 1, "the position stays at the bad batch");
        match &out.error {
            Some(ClientError::Corrupt { partition: 2, offset: 1, message, .. }) => {
                assert!(message.contains(&format!("inflates past the {LIMIT}-byte decode limit")), "{message}")
            }
            other => panic!("unexpected {other:?}"),
        }
        // Under a limit that fits it, the same batch decodes.
        let fits = decode_partition("t", 2, &data, 2, 0, 16 << 20);
        assert!(fits.error.is_none(), "{:?}", fits.error);
        assert_eq!(fits.records.len(), 2);
        assert_eq!(fits.records[1].value, bomb.value);
    }
}
