//! Provenance of the records the mirror writes into a Kafka target, and the reader that finds it again.
//!
//! Every record written carries, after its own headers, `ferry.source.cluster`, `ferry.source.topic`,
//! `ferry.source.partition`, `ferry.source.offset` (decimal strings) and `ferry.source.topic_id`. When a record
//! already carries such headers (it was mirrored before), the last occurrence of each wins: those are the ones this
//! mirror appended.
//!
//! The [`Reader`] reads a target partition with `isolation.level = read_committed`, so aborted and still-open
//! transactions (a killed mirror's last append) are invisible: what it finds is what is durably there.

use ferry_batch::Header;
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedHeaders};

use crate::kafka::reader::Reader;
use crate::kafka::{
    HEADER_SOURCE_CLUSTER, HEADER_SOURCE_OFFSET, HEADER_SOURCE_PARTITION, HEADER_SOURCE_TOPIC, HEADER_SOURCE_TOPIC_ID,
};

/// Where a target record came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Provenance {
    pub(crate) cluster: String,
    pub(crate) topic: String,
    pub(crate) partition: u32,
    pub(crate) offset: u64,
    pub(crate) topic_id: Option<String>,
}

/// Which source partition a target partition's provenance must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) cluster: String,
    pub(crate) topic: String,
    pub(crate) partition: u32,
}

impl Origin {
    pub(crate) fn matches(&self, p: &Provenance) -> bool {
        p.partition == self.partition && p.topic == self.topic && p.cluster == self.cluster
    }
}

/// The provenance in `headers`, if it is complete.
pub(crate) fn parse<H: Headers>(headers: Option<&H>) -> Option<Provenance> {
    let headers = headers?;
    let (mut cluster, mut topic, mut partition, mut offset, mut topic_id) = (None, None, None, None, None);
    for h in headers.iter() {
        let Some(value) = h.value.and_then(|v| std::str::from_utf8(v).ok()) else { continue };
        match h.key {
            HEADER_SOURCE_CLUSTER => cluster = Some(value),
            HEADER_SOURCE_TOPIC => topic = Some(value),
            HEADER_SOURCE_PARTITION => partition = Some(value),
            HEADER_SOURCE_OFFSET => offset = Some(value),
            HEADER_SOURCE_TOPIC_ID => topic_id = Some(value),
            _ => {}
        }
    }
    Some(Provenance {
        cluster: cluster?.to_owned(),
        topic: topic?.to_owned(),
        partition: partition?.parse().ok()?,
        offset: offset?.parse().ok()?,
        topic_id: topic_id.map(str::to_owned),
    })
}

/// The record's own headers followed by its provenance.
pub(crate) fn headers_with_provenance(own: &[Header], origin: &Origin, offset: u64, topic_id: &str) -> OwnedHeaders {
    let mut out = OwnedHeaders::new_with_capacity(own.len() + 5);
    for h in own {
        out = out.insert(rdkafka::message::Header { key: &h.key, value: h.value.as_deref() });
    }
    let partition = origin.partition.to_string();
    let offset = offset.to_string();
    for (key, value) in [
        (HEADER_SOURCE_CLUSTER, origin.cluster.as_str()),
        (HEADER_SOURCE_TOPIC, origin.topic.as_str()),
        (HEADER_SOURCE_PARTITION, partition.as_str()),
        (HEADER_SOURCE_OFFSET, offset.as_str()),
        (HEADER_SOURCE_TOPIC_ID, topic_id),
    ] {
        out = out.insert(rdkafka::message::Header { key, value: Some(value) });
    }
    out
}

/// First tail window, in offsets; each further window is four times wider, up to [`MAX_WINDOW`].
const FIRST_WINDOW: i64 = 64;
const MAX_WINDOW: i64 = 1 << 16;

fn read(
    r: &Reader,
    topic: &str,
    partition: u32,
    from: i64,
    to: i64,
    max: usize,
) -> Result<Vec<(i64, Option<Provenance>)>, KafkaError> {
    r.read(topic, partition, from, to, max, |m| parse(m.headers()))
}

/// The last record of `origin` in the partition, reading backwards from its end in widening windows.
pub(crate) fn tail(r: &Reader, topic: &str, origin: &Origin) -> Result<Option<(i64, Provenance)>, KafkaError> {
    let (lo, hi) = r.bounds(topic, origin.partition)?;
    let (mut end, mut window) = (hi, FIRST_WINDOW);
    while end > lo {
        let start = (end - window).max(lo);
        let records = read(r, topic, origin.partition, start, end, usize::MAX)?;
        let found = records.into_iter().rev().find_map(|(o, p)| p.filter(|p| origin.matches(p)).map(|p| (o, p)));
        if found.is_some() {
            return Ok(found);
        }
        end = start;
        window = (window * 4).min(MAX_WINDOW);
    }
    Ok(None)
}

/// The provenance of the last record mirrored from `cluster` among the partition's last [`FIRST_WINDOW`] offsets,
/// and whether the partition holds any record: `(None, true)` is a partition written by others at its tail.
pub(crate) fn tail_sample(
    r: &Reader,
    topic: &str,
    partition: u32,
    cluster: &str,
) -> Result<(Option<Provenance>, bool), KafkaError> {
    let (lo, hi) = r.bounds(topic, partition)?;
    if hi <= lo {
        return Ok((None, false));
    }
    let records = read(r, topic, partition, (hi - FIRST_WINDOW).max(lo), hi, usize::MAX)?;
    let any = !records.is_empty();
    Ok((records.into_iter().rev().find_map(|(_, p)| p.filter(|p| p.cluster == cluster)), any))
}

/// The first record of `origin` at or after target offset `from` and before `to` (`i64::MAX`: the end).
pub(crate) fn first_from(
    r: &Reader,
    topic: &str,
    origin: &Origin,
    from: i64,
    to: i64,
) -> Result<Option<(i64, Provenance)>, KafkaError> {
    let mut at = from;
    while at < to {
        let records = read(r, topic, origin.partition, at, to, FIRST_WINDOW as usize)?;
        let Some(last) = records.last().map(|(o, _)| *o) else { return Ok(None) };
        if let Some(found) = records.into_iter().find_map(|(o, p)| p.filter(|p| origin.matches(p)).map(|p| (o, p))) {
            return Ok(Some(found));
        }
        at = last + 1;
    }
    Ok(None)
}

/// The target offset of the first record of `origin` whose source offset is at least `source` (the log end when
/// there is none): binary search over the partition, source offsets growing with target offsets.
pub(crate) fn locate(r: &Reader, topic: &str, origin: &Origin, source: u64) -> Result<i64, KafkaError> {
    let (lo, hi) = r.bounds(topic, origin.partition)?;
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let mid = a + (b - a) / 2;
        match first_from(r, topic, origin, mid, b)? {
            Some((t, p)) if p.offset >= source => b = t,
            Some((t, _)) => a = t + 1,
            None => b = mid,
        }
    }
    // `a` may be a transaction marker or a foreign record just before the answer: name the record itself.
    Ok(first_from(r, topic, origin, a, hi)?.map_or(a, |(t, _)| t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn provenance_follows_the_record_headers_and_the_last_occurrence_wins() {
        let origin = Origin { cluster: "dc-a".into(), topic: "orders".into(), partition: 3 };
        // The record was mirrored before (from dc-0): its old provenance stays, ours comes last.
        let own = vec![
            Header { key: "trace".into(), value: Some(Bytes::from_static(b"abc")) },
            Header { key: "nul".into(), value: None },
            Header { key: HEADER_SOURCE_CLUSTER.into(), value: Some(Bytes::from_static(b"dc-0")) },
            Header { key: HEADER_SOURCE_OFFSET.into(), value: Some(Bytes::from_static(b"9")) },
        ];
        let headers = headers_with_provenance(&own, &origin, 42, "uuid-1");
        let all: Vec<(String, Option<Vec<u8>>)> =
            headers.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect();
        assert_eq!(all.len(), 9);
        assert_eq!(all[0], ("trace".into(), Some(b"abc".to_vec())));
        assert_eq!(all[1], ("nul".into(), None));
        assert_eq!(all[8], (HEADER_SOURCE_TOPIC_ID.into(), Some(b"uuid-1".to_vec())));
        let p = parse(Some(&headers)).unwrap();
        assert_eq!(
            p,
            Provenance {
                cluster: "dc-a".into(),
                topic: "orders".into(),
                partition: 3,
                offset: 42,
                topic_id: Some("uuid-1".into())
            }
        );
        assert!(origin.matches(&p));
        assert!(!Origin { partition: 4, ..origin }.matches(&p));
    }

    #[test]
    fn incomplete_provenance_is_none() {
        let h = OwnedHeaders::new().insert(rdkafka::message::Header { key: HEADER_SOURCE_OFFSET, value: Some("1") });
        assert_eq!(parse(Some(&h)), None);
        assert_eq!(parse::<OwnedHeaders>(None), None);
    }
}
