//! Delayed produce: the records of a delayed produce request are entries of the stream of their target partition
//! (kind [`KIND`]); when due, they are appended to that partition as one batch per firing under an internal
//! idempotent producer id of the stream, whose sequence is the firing's number within the stream. A firing
//! performed again after a crash is then a duplicate the partition acknowledges without writing (the partition's
//! idempotent-producer state, `node::producer_state`), so each record appears once.
//!
//! A moved record keeps its key, value and headers; its timestamp becomes its due time (so time retention and
//! producer expiry count from when it became readable). It does not keep its producer's id, epoch and sequence in
//! its batch header: a firing is one batch of records from any number of producers, and it must be written under
//! the stream's own id and firing number for a re-performed firing to be recognised as a duplicate; under the
//! producer's own id its sequence would also collide with the producer's plain produces to the partition (refused
//! as out of order, or dropped as a duplicate). Instead a record whose batch named a producer carries the header
//! [`PRODUCER_HEADER`], `ID:EPOCH:SEQUENCE` as the producer sent it (any header of that name the client set is
//! replaced).

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use ferry_batch::{BatchBuilder, Compression, Header, ProducerInfo, Record};

use super::core::origin::Origin;
use super::{Fire, FireFuture, Firing};
use crate::error::{BrokerError, Result};
use crate::state::StateLogs;

/// The timer kind of delayed produce.
pub const KIND: u8 = 1;

/// The header naming the producer of a delayed record: `ID:EPOCH:SEQUENCE`.
pub const PRODUCER_HEADER: &str = "ferry-delay-producer";

/// The stream key of a target partition.
pub fn stream_key(topic: &str, partition: u32) -> Bytes {
    Bytes::from(format!("{topic}\u{0}{partition}"))
}

/// The target partition of a stream key.
pub fn parse_key(key: &[u8]) -> Option<(String, u32)> {
    let text = std::str::from_utf8(key).ok()?;
    let (topic, p) = text.rsplit_once('\u{0}')?;
    Some((topic.to_owned(), p.parse().ok()?))
}

/// The internal producer id of a stream: a hash of its key, in the upper half of the positive ids.
pub fn producer_id(key: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"ferry-delay\0".iter().chain(key) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    ((h >> 2) | (1 << 61)) as i64
}

/// One record as a payload: timestamp (i64), key, value (each a length as i32, -1 for null, then the bytes),
/// header count (u16), then each header's key (u16 length) and value (as the value). Compact, as a million
/// pending records each keep one.
pub fn encode_record(r: &Record) -> Bytes {
    fn put_opt(b: &mut BytesMut, v: Option<&[u8]>) {
        match v {
            Some(v) => {
                b.put_i32_le(v.len() as i32);
                b.put_slice(v);
            }
            None => b.put_i32_le(-1),
        }
    }
    let mut b = BytesMut::new();
    b.put_i64_le(r.timestamp);
    put_opt(&mut b, r.key.as_deref());
    put_opt(&mut b, r.value.as_deref());
    b.put_u16_le(r.headers.len() as u16);
    for h in &r.headers {
        b.put_u16_le(h.key.len() as u16);
        b.put_slice(h.key.as_bytes());
        put_opt(&mut b, h.value.as_deref());
    }
    b.freeze()
}

/// The record a payload holds (offset 0); `None` when it is not one [`encode_record`] wrote.
pub fn decode_record(payload: &Bytes) -> Option<Record> {
    let mut b = payload.clone();
    fn take(b: &mut Bytes, n: usize) -> Option<Bytes> {
        (b.len() >= n).then(|| b.split_to(n))
    }
    fn opt(b: &mut Bytes) -> Option<Option<Bytes>> {
        let len = i32::from_le_bytes(take(b, 4)?[..].try_into().ok()?);
        if len < 0 { Some(None) } else { take(b, len as usize).map(Some) }
    }
    let timestamp = i64::from_le_bytes(take(&mut b, 8)?[..].try_into().ok()?);
    let key = opt(&mut b)?;
    let value = opt(&mut b)?;
    let n = u16::from_le_bytes(take(&mut b, 2)?[..].try_into().ok()?);
    let mut headers = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let klen = u16::from_le_bytes(take(&mut b, 2)?[..].try_into().ok()?);
        let key = String::from_utf8(take(&mut b, klen as usize)?.to_vec()).ok()?;
        headers.push(Header { key, value: opt(&mut b)? });
    }
    Some(Record { offset: 0, timestamp, key, value, headers })
}

/// Splits a produce request's batches into one payload per record ([`encode_record`]), each naming its producer
/// in [`PRODUCER_HEADER`] when its batch named one, and the request's producer for deduplication: `Some` when the
/// batches name a producer (>= 0), which they must all name, with consecutive sequences.
pub fn payloads_of(topic: &str, partition: u32, batches: &Bytes) -> Result<(Vec<Bytes>, Option<Origin>)> {
    let bad = |e: ferry_batch::BatchError| BrokerError::MalformedBatch {
        topic: topic.to_owned(),
        partition,
        reason: format!("a delayed produce's batch does not decode: {e}"),
    };
    let mut out = Vec::new();
    let mut origin: Option<Origin> = None;
    for (i, (header, bytes)) in ferry_batch::split_verified(batches).map_err(bad)?.into_iter().enumerate() {
        let named = header.producer_id >= 0;
        let consistent = match &origin {
            None => !named || i == 0,
            Some(o) => {
                named
                    && o.producer_id == header.producer_id
                    && o.epoch == header.producer_epoch
                    && i64::from(o.base_seq) + i64::from(o.count) == i64::from(header.base_sequence)
            }
        };
        if !consistent {
            return Err(BrokerError::InvalidArgument(format!(
                "a delayed produce to {topic}/{partition} mixes batches of different producers or sequences: send \
                 one producer's consecutive batches per request"
            )));
        }
        if named && origin.is_none() {
            origin = Some(Origin {
                producer_id: header.producer_id,
                epoch: header.producer_epoch,
                base_seq: header.base_sequence,
                count: 0,
            });
        }
        for (n, mut r) in ferry_batch::decode_records(&bytes).map_err(bad)?.into_iter().enumerate() {
            if let Some(o) = &mut origin {
                let seq = i64::from(header.base_sequence) + n as i64;
                r.headers.retain(|h| h.key != PRODUCER_HEADER);
                let value = format!("{}:{}:{seq}", o.producer_id, o.epoch);
                r.headers.push(Header { key: PRODUCER_HEADER.into(), value: Some(Bytes::from(value)) });
                o.count += 1;
            }
            out.push(encode_record(&r));
        }
    }
    if out.is_empty() {
        return Err(BrokerError::InvalidArgument(format!("a delayed produce to {topic}/{partition} has no records")));
    }
    Ok((out, origin))
}

/// The request's batches as one batch without a producer id, for a delayed produce whose time has passed: written
/// at once as a plain produce, its producer's delayed sequences must not reach the partition's idempotent state
/// (they are a space of their own). `None` when no batch names a producer.
pub fn without_producer(topic: &str, partition: u32, batches: &Bytes) -> Result<Option<Bytes>> {
    let bad = |e: ferry_batch::BatchError| BrokerError::MalformedBatch {
        topic: topic.to_owned(),
        partition,
        reason: format!("a delayed produce's batch does not decode: {e}"),
    };
    let split = ferry_batch::split_verified(batches).map_err(bad)?;
    if split.iter().all(|(h, _)| h.producer_id < 0) {
        return Ok(None);
    }
    let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
    for (_, bytes) in split {
        for r in ferry_batch::decode_records(&bytes).map_err(bad)? {
            b.push(b.len(), r.timestamp, r.key.as_deref(), r.value.as_deref(), &r.headers);
        }
    }
    Ok(Some(b.build(0, 0)))
}

/// Appends due records to their partitions.
#[derive(Debug)]
pub struct ProduceMover {
    logs: Arc<StateLogs>,
}

impl ProduceMover {
    /// A mover writing through `logs`.
    pub fn new(logs: Arc<StateLogs>) -> ProduceMover {
        ProduceMover { logs }
    }

    async fn move_records(&self, firing: &Firing) -> Result<()> {
        let Some((topic, partition)) = parse_key(&firing.key) else {
            tracing::warn!(key = ?firing.key, "a delayed firing names no partition; dropped");
            return Ok(());
        };
        let producer = ProducerInfo {
            producer_id: producer_id(&firing.key),
            producer_epoch: 0,
            base_sequence: (firing.first_seq & 0x7fff_ffff) as i32,
        };
        let mut b = BatchBuilder::new(Compression::None, producer);
        for (i, e) in firing.entries.iter().enumerate() {
            let r = decode_record(&e.payload)
                .ok_or_else(|| BrokerError::Internal(format!("delayed record {} does not decode", e.id)))?;
            b.push(i as u32, e.due_ms, r.key.as_deref(), r.value.as_deref(), &r.headers);
        }
        let batch = b.build(0, 0);
        let leader = match self.logs.core().partition(&topic, partition) {
            Ok(part) => match self.logs.produce_to(&part, batch.clone()).await {
                Ok(produced) => {
                    tracing::debug!(
                        topic,
                        partition,
                        base = produced.base_offset,
                        duplicate = produced.duplicate,
                        "delayed records moved"
                    );
                    return Ok(());
                }
                Err(BrokerError::NotLeader { leader, .. }) if leader != 0 => leader,
                Err(e) => return Err(e),
            },
            Err(e) => match self.logs.replication().and_then(|r| r.not_here(&topic, partition)) {
                Some(BrokerError::NotLeader { leader, .. }) if leader != 0 => leader,
                Some(not_here) => return Err(not_here),
                None if matches!(e, BrokerError::UnknownTopic { .. } | BrokerError::UnknownPartition { .. }) => {
                    tracing::warn!(topic, partition, "delayed records for a deleted partition are dropped");
                    return Ok(());
                }
                None => return Err(e),
            },
        };
        // Another member leads the partition: it appends the batch (the same idempotent batch, so a retry there is
        // a duplicate too).
        let client = self.logs.replication().and_then(|r| r.member_client(leader)).ok_or_else(|| {
            BrokerError::Cluster(format!("no address for broker {leader}, leader of {topic}/{partition}"))
        })?;
        let request = ferry_proto::MoveDelayedRequest { topic: topic.clone(), partition, batches: batch };
        let mut client = client;
        client.move_delayed(request).await.map_err(|s| {
            BrokerError::Cluster(format!(
                "moving delayed records to {topic}/{partition} at broker {leader}: {}",
                s.message()
            ))
        })?;
        Ok(())
    }
}

impl Fire for ProduceMover {
    fn fire<'a>(&'a self, firing: &'a Firing) -> FireFuture<'a> {
        Box::pin(self.move_records(firing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys_round_trip_and_ids_are_stable_and_positive() {
        let key = stream_key("orders", 7);
        assert_eq!(parse_key(&key), Some(("orders".to_owned(), 7)));
        assert_eq!(parse_key(b"orders"), None);
        assert_eq!(producer_id(&key), producer_id(&stream_key("orders", 7)));
        assert_ne!(producer_id(&key), producer_id(&stream_key("orders", 8)));
        assert!(producer_id(&key) > 0);
    }

    #[test]
    fn payloads_keep_each_record_and_bad_batches_are_refused() {
        let mut b =
            BatchBuilder::new(Compression::None, ProducerInfo { producer_id: 5, producer_epoch: 0, base_sequence: 0 });
        let h = [ferry_batch::Header { key: "h".into(), value: Some(Bytes::from_static(b"v")) }];
        b.push(0, 10, Some(b"k1"), Some(b"v1"), &h);
        b.push(1, 11, None, Some(b"v2"), &[]);
        let (payloads, origin) = payloads_of("t", 0, &b.build(0, 0)).unwrap();
        assert_eq!(payloads.len(), 2);
        assert_eq!(origin, Some(Origin { producer_id: 5, epoch: 0, base_seq: 0, count: 2 }));
        let first = decode_record(&payloads[0]).unwrap();
        assert_eq!(
            (first.timestamp, first.key.as_deref(), first.value.as_deref()),
            (10, Some(&b"k1"[..]), Some(&b"v1"[..]))
        );
        let named = |seq: &str| Header { key: PRODUCER_HEADER.into(), value: Some(Bytes::from(format!("5:0:{seq}"))) };
        assert_eq!(first.headers, vec![h[0].clone(), named("0")]);
        let second = decode_record(&payloads[1]).unwrap();
        assert_eq!((second.key, second.value.as_deref(), second.headers), (None, Some(&b"v2"[..]), vec![named("1")]));
        // Without a producer: no header, no origin; mixed producers are refused.
        let mut plain = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        plain.push(0, 10, None, Some(b"v"), &[]);
        let plain = plain.build(0, 0);
        let (payloads, origin) = payloads_of("t", 0, &plain).unwrap();
        assert_eq!((decode_record(&payloads[0]).unwrap().headers.len(), origin), (0, None));
        let mut mixed = BytesMut::from(&b.build(0, 0)[..]);
        mixed.extend_from_slice(&plain);
        let e = payloads_of("t", 0, &mixed.freeze()).unwrap_err();
        assert!(e.to_string().contains("different producers"), "{e}");
        assert_eq!(decode_record(&payloads[0].slice(..payloads[0].len() - 1)), None);
        let e = payloads_of("t", 0, &Bytes::from_static(b"garbage")).unwrap_err();
        assert!(e.to_string().contains("does not decode"), "{e}");
    }
}
