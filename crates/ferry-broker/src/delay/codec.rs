//! The records of the delay store (`__ferry_delay`), one kind per leading tag byte, all integers little-endian:
//!
//! - `1` **schedule**: due ms (i64), kind (u8), key length (u16), key, payload. Its offset is the entry's id.
//! - `2` **cancel**: id (u64), due ms (i64), payload bytes (u32), kind (u8), key length (u16), key.
//! - `3` **intent** (as written before `7`): kind (u8), key length (u16), key, first sequence (u64), payload bytes
//!   (u64), count (u32), then id (u64) and due ms (i64) for each. Read, no longer written.
//! - `7` **intent**: as `3`, with each entry's payload bytes (u32) after its due time: these entries fire now, as
//!   one firing numbered `first_seq` within their key. Written and acknowledged before the firing is performed, so a
//!   new owner performs it again with the same numbers.
//! - `4` **fired**: the intent's offset (u64): the firing was performed.
//! - `5` **schedule from a producer**: as `1`, with the producer after the key: id (i64), epoch (i16), the request's
//!   first sequence (i32), the record's index in the request (u32) and the request's record count (u32), so a
//!   replay rebuilds each producer's last batch (`core::origin`).
//! - `6` **snapshot**: what a compaction must carry past the segments it deletes: count (u32) of stream numbers,
//!   each kind (u8), key length (u16), key, next firing number (u64); then count (u32) of producers' last batches,
//!   each kind, key length, key, producer id (i64), epoch (i16), first sequence (i32), count (u32), first id (u64).

use bytes::{BufMut, Bytes, BytesMut};

use super::core::origin::LastBatch;

/// One decoded delay-store record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreRecord {
    /// An entry scheduled to fire at `due_ms`.
    Schedule {
        /// When it falls due.
        due_ms: i64,
        /// Which handler fires it.
        kind: u8,
        /// Its ordered stream (for delayed produce: the target partition).
        key: Bytes,
        /// What the handler needs.
        payload: Bytes,
        /// The producer of a delayed produce's record, when its batch named one.
        origin: Option<RecordOrigin>,
    },
    /// An entry cancelled before it fell due.
    Cancel {
        /// Its id (offset).
        id: u64,
        /// When it was due.
        due_ms: i64,
        /// Its payload's size.
        bytes: u32,
        /// Its handler kind.
        kind: u8,
        /// Its stream's key.
        key: Bytes,
    },
    /// Entries about to fire together.
    Intent(Intent),
    /// An intent performed.
    Fired {
        /// The intent's offset.
        intent: u64,
    },
    /// What a compaction carries past the segments it deletes.
    Snapshot(Snapshot),
}

/// The producer of a scheduled record: the request's producer and the record's place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOrigin {
    /// The producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub epoch: i16,
    /// The sequence of the request's first record.
    pub base_seq: i32,
    /// This record's index in the request.
    pub index: u32,
    /// The request's record count.
    pub count: u32,
}

/// The state a replay cannot rebuild once earlier segments are deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Each stream's next firing number.
    pub seqs: Vec<(u8, Bytes, u64)>,
    /// Each (stream, producer id)'s last stored batch.
    pub origins: Vec<(u8, Bytes, i64, LastBatch)>,
}

/// A firing decided and recorded, maybe not yet performed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Which handler fires it.
    pub kind: u8,
    /// The stream.
    pub key: Bytes,
    /// The number of the first entry within the stream (entries are numbered from 0, in firing order).
    pub first_seq: u64,
    /// Payload bytes of the entries.
    pub bytes: u64,
    /// The entries' ids, due times and payload bytes (0 in an intent written before they were recorded), in
    /// firing order.
    pub ids: Vec<(u64, i64, u32)>,
}

fn put_key(b: &mut BytesMut, kind: u8, key: &[u8]) {
    b.put_u8(kind);
    b.put_u16_le(key.len() as u16);
    b.put_slice(key);
}

/// Encodes `r`. Keys longer than 65535 bytes are the caller's bug (delayed produce keys are topic names).
pub fn encode(r: &StoreRecord) -> Bytes {
    let mut b = BytesMut::new();
    match r {
        StoreRecord::Schedule { due_ms, kind, key, payload, origin } => {
            b.put_u8(if origin.is_some() { 5 } else { 1 });
            b.put_i64_le(*due_ms);
            put_key(&mut b, *kind, key);
            if let Some(o) = origin {
                b.put_i64_le(o.producer_id);
                b.put_i16_le(o.epoch);
                b.put_i32_le(o.base_seq);
                b.put_u32_le(o.index);
                b.put_u32_le(o.count);
            }
            b.put_slice(payload);
        }
        StoreRecord::Cancel { id, due_ms, bytes, kind, key } => {
            b.put_u8(2);
            b.put_u64_le(*id);
            b.put_i64_le(*due_ms);
            b.put_u32_le(*bytes);
            put_key(&mut b, *kind, key);
        }
        StoreRecord::Intent(i) => {
            b.put_u8(7);
            put_key(&mut b, i.kind, &i.key);
            b.put_u64_le(i.first_seq);
            b.put_u64_le(i.bytes);
            b.put_u32_le(i.ids.len() as u32);
            for (id, due, bytes) in &i.ids {
                b.put_u64_le(*id);
                b.put_i64_le(*due);
                b.put_u32_le(*bytes);
            }
        }
        StoreRecord::Fired { intent } => {
            b.put_u8(4);
            b.put_u64_le(*intent);
        }
        StoreRecord::Snapshot(snap) => {
            b.put_u8(6);
            b.put_u32_le(snap.seqs.len() as u32);
            for (kind, key, next) in &snap.seqs {
                put_key(&mut b, *kind, key);
                b.put_u64_le(*next);
            }
            b.put_u32_le(snap.origins.len() as u32);
            for (kind, key, pid, last) in &snap.origins {
                put_key(&mut b, *kind, key);
                b.put_i64_le(*pid);
                b.put_i16_le(last.epoch);
                b.put_i32_le(last.base_seq);
                b.put_u32_le(last.count);
                b.put_u64_le(last.first_id);
            }
        }
    }
    b.freeze()
}

/// A cursor over a record's bytes; every read is checked.
struct Reader {
    b: Bytes,
}

impl Reader {
    fn take(&mut self, n: usize) -> Option<Bytes> {
        (self.b.len() >= n).then(|| self.b.split_to(n))
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b[..].try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b[..].try_into().unwrap_or_default()))
    }
    fn key(&mut self) -> Option<(u8, Bytes)> {
        let kind = self.u8()?;
        let len = self.u16()? as usize;
        Some((kind, self.take(len)?))
    }
}

/// Decodes a record value; `None` when it is not one this module wrote.
pub fn decode(value: &Bytes) -> Option<StoreRecord> {
    let mut r = Reader { b: value.clone() };
    Some(match r.u8()? {
        tag @ (1 | 5) => {
            let due_ms = r.u64()? as i64;
            let (kind, key) = r.key()?;
            let origin = if tag == 5 {
                Some(RecordOrigin {
                    producer_id: r.u64()? as i64,
                    epoch: r.u16()? as i16,
                    base_seq: r.u32()? as i32,
                    index: r.u32()?,
                    count: r.u32()?,
                })
            } else {
                None
            };
            StoreRecord::Schedule { due_ms, kind, key, payload: r.b, origin }
        }
        2 => {
            let (id, due_ms, bytes) = (r.u64()?, r.u64()? as i64, r.u32()?);
            let (kind, key) = r.key()?;
            StoreRecord::Cancel { id, due_ms, bytes, kind, key }
        }
        tag @ (3 | 7) => {
            let (kind, key) = r.key()?;
            let first_seq = r.u64()?;
            let bytes = r.u64()?;
            let n = r.u32()? as usize;
            let mut ids = Vec::with_capacity(n.min(r.b.len() / 16));
            for _ in 0..n {
                let (id, due) = (r.u64()?, r.u64()? as i64);
                ids.push((id, due, if tag == 7 { r.u32()? } else { 0 }));
            }
            StoreRecord::Intent(Intent { kind, key, first_seq, bytes, ids })
        }
        4 => StoreRecord::Fired { intent: r.u64()? },
        6 => {
            let n = r.u32()? as usize;
            let mut seqs = Vec::with_capacity(n.min(r.b.len() / 11));
            for _ in 0..n {
                let (kind, key) = r.key()?;
                seqs.push((kind, key, r.u64()?));
            }
            let n = r.u32()? as usize;
            let mut origins = Vec::with_capacity(n.min(r.b.len() / 29));
            for _ in 0..n {
                let (kind, key) = r.key()?;
                let pid = r.u64()? as i64;
                let last = LastBatch {
                    epoch: r.u16()? as i16,
                    base_seq: r.u32()? as i32,
                    count: r.u32()?,
                    first_id: r.u64()?,
                };
                origins.push((kind, key, pid, last));
            }
            StoreRecord::Snapshot(Snapshot { seqs, origins })
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_round_trips_and_truncations_are_refused() {
        let all = [
            StoreRecord::Schedule {
                due_ms: 1_700_000_000_123,
                kind: 1,
                key: Bytes::from_static(b"orders\x003"),
                payload: Bytes::from_static(b"batch"),
                origin: None,
            },
            StoreRecord::Schedule {
                due_ms: 1_700_000_000_123,
                kind: 1,
                key: Bytes::from_static(b"orders\x003"),
                payload: Bytes::from_static(b"batch"),
                origin: Some(RecordOrigin { producer_id: 42, epoch: 3, base_seq: 7, index: 1, count: 2 }),
            },
            StoreRecord::Cancel { id: 77, due_ms: 1_700_000_000_000, bytes: 5, kind: 1, key: Bytes::from_static(b"k") },
            StoreRecord::Intent(Intent {
                kind: 1,
                key: Bytes::from_static(b"k"),
                first_seq: 9,
                bytes: 10,
                ids: vec![(3, 10, 4), (4, 11, 3), (8, 9, 3)],
            }),
            StoreRecord::Fired { intent: 12 },
            StoreRecord::Snapshot(Snapshot::default()),
            StoreRecord::Snapshot(Snapshot {
                seqs: vec![(1, Bytes::from_static(b"k"), 9)],
                origins: vec![(
                    1,
                    Bytes::from_static(b"k"),
                    42,
                    LastBatch { epoch: 1, base_seq: 4, count: 2, first_id: 77 },
                )],
            }),
        ];
        for r in all {
            let bytes = encode(&r);
            assert_eq!(decode(&bytes), Some(r.clone()));
            if !matches!(r, StoreRecord::Schedule { .. }) {
                assert_eq!(decode(&bytes.slice(..bytes.len() - 1)), None, "{r:?} cut short");
            }
        }
        // An intent written before the entries' sizes were recorded still reads, with sizes 0.
        let mut legacy = BytesMut::new();
        legacy.put_u8(3);
        put_key(&mut legacy, 1, b"k");
        legacy.put_u64_le(9);
        legacy.put_u64_le(10);
        legacy.put_u32_le(1);
        legacy.put_u64_le(3);
        legacy.put_i64_le(10);
        let want = Intent { kind: 1, key: Bytes::from_static(b"k"), first_seq: 9, bytes: 10, ids: vec![(3, 10, 0)] };
        assert_eq!(decode(&legacy.freeze()), Some(StoreRecord::Intent(want)));
        assert_eq!(decode(&Bytes::from_static(b"\x09")), None);
        assert_eq!(decode(&Bytes::new()), None);
    }
}
