//! The records of the delay store (`__ferry_delay`), one kind per leading tag byte, all integers little-endian:
//!
//! - `1` **schedule**: due ms (i64), kind (u8), key length (u16), key, payload. Its offset is the entry's id.
//! - `2` **cancel**: id (u64), due ms (i64), payload bytes (u32), kind (u8), key length (u16), key.
//! - `3` **intent**: kind (u8), key length (u16), key, first sequence (u64), payload bytes (u64), count (u32), then
//!   id (u64) and due ms (i64) for each: these entries fire now, as one firing numbered `first_seq` within their key. Written and
//!   acknowledged before the firing is performed, so a new owner performs it again with the same numbers.
//! - `4` **fired**: the intent's offset (u64): the firing was performed.

use bytes::{BufMut, Bytes, BytesMut};

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
    /// The entries' ids and due times, in firing order.
    pub ids: Vec<(u64, i64)>,
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
        StoreRecord::Schedule { due_ms, kind, key, payload } => {
            b.put_u8(1);
            b.put_i64_le(*due_ms);
            put_key(&mut b, *kind, key);
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
            b.put_u8(3);
            put_key(&mut b, i.kind, &i.key);
            b.put_u64_le(i.first_seq);
            b.put_u64_le(i.bytes);
            b.put_u32_le(i.ids.len() as u32);
            for (id, due) in &i.ids {
                b.put_u64_le(*id);
                b.put_i64_le(*due);
            }
        }
        StoreRecord::Fired { intent } => {
            b.put_u8(4);
            b.put_u64_le(*intent);
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
        1 => {
            let due_ms = r.u64()? as i64;
            let (kind, key) = r.key()?;
            StoreRecord::Schedule { due_ms, kind, key, payload: r.b }
        }
        2 => {
            let (id, due_ms, bytes) = (r.u64()?, r.u64()? as i64, r.u32()?);
            let (kind, key) = r.key()?;
            StoreRecord::Cancel { id, due_ms, bytes, kind, key }
        }
        3 => {
            let (kind, key) = r.key()?;
            let first_seq = r.u64()?;
            let bytes = r.u64()?;
            let n = r.u32()? as usize;
            let ids = (0..n).map(|_| Some((r.u64()?, r.u64()? as i64))).collect::<Option<Vec<_>>>()?;
            StoreRecord::Intent(Intent { kind, key, first_seq, bytes, ids })
        }
        4 => StoreRecord::Fired { intent: r.u64()? },
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
            },
            StoreRecord::Cancel { id: 77, due_ms: 1_700_000_000_000, bytes: 5, kind: 1, key: Bytes::from_static(b"k") },
            StoreRecord::Intent(Intent {
                kind: 1,
                key: Bytes::from_static(b"k"),
                first_seq: 9,
                bytes: 10,
                ids: vec![(3, 10), (4, 11), (8, 9)],
            }),
            StoreRecord::Fired { intent: 12 },
        ];
        for r in all {
            let bytes = encode(&r);
            assert_eq!(decode(&bytes), Some(r.clone()));
            if !matches!(r, StoreRecord::Schedule { .. }) {
                assert_eq!(decode(&bytes.slice(..bytes.len() - 1)), None, "{r:?} cut short");
            }
        }
        assert_eq!(decode(&Bytes::from_static(b"\x09")), None);
        assert_eq!(decode(&Bytes::new()), None);
    }
}
