//! The comparison of one partition's source and target logs over an offset range, from two streams of batches as
//! stored (no network here, so every rule is unit-tested with built batches).
//!
//! Rules, walking both logs in offset order from `start` to `end`:
//! - batches with the same base and last offset are compared whole: each side's CRC is recomputed (a byte changed on
//!   disk is caught even when the stored CRC field was left alone), then the epoch, the stored CRC and the covered
//!   bytes. When they differ, the records are compared to name the first differing offset;
//! - where boundaries differ (the mirror splits oversized batches, or one side has a gap), the records of the two
//!   head batches are decoded and compared over their common offsets: offset, timestamp, key, value, headers and the
//!   epoch of the batch holding each record;
//! - a side that reports a corrupt batch (the broker's CORRUPT_BATCH) differs at that offset;
//! - an offset below `end` present on one side only is a difference.
//!
//! The first difference ends the comparison of the partition, and names the side at fault: the source only when its
//! own batch fails its CRC (or its broker reports one corrupt), the target for everything else (its copy differs
//! from the source, which is the truth, or is corrupt). Decoded records are kept for the head batch only, so memory
//! stays at about two batches per side. A byte budget lets a caller compare a long range in steps: the comparison
//! stops at the first batch boundary past the budget and says where it got to.

use std::collections::VecDeque;

use bytes::Bytes;
use ferry_batch::{self as batch, BatchHeader, CRC_START, Record};

/// One item of a side's stream, in offset order.
#[derive(Debug, Clone)]
pub enum Item {
    /// A whole batch as stored, with its parsed header.
    Batch(BatchHeader, Bytes),
    /// The broker refused to serve a corrupt batch at this offset; nothing follows.
    Corrupt {
        /// Base offset of the corrupt batch (or the read position when the broker could not tell).
        offset: u64,
        /// The broker's message.
        message: String,
    },
}

/// A side could not be read (a failed call, a log that moved under the reader): not a difference, the comparison of
/// the range is abandoned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReadError(pub String);

/// A source of batches for one side. Implemented over Fetch ([`super::FetchStream`]) and, in tests, over a list.
pub trait BatchStream {
    /// The next item, or `None` at the end of the range.
    fn next(&mut self) -> impl Future<Output = Result<Option<Item>, ReadError>> + Send;
}

/// Which side of the mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The source cluster.
    Source,
    /// The target cluster.
    Target,
}

impl Side {
    /// `source` or `target`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Target => "target",
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Source => Side::Target,
            Side::Target => Side::Source,
        }
    }
}

/// Where and why a partition differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The first differing offset, when there is one.
    pub offset: Option<u64>,
    /// The side at fault.
    pub side: Side,
    /// One sentence.
    pub reason: String,
}

impl Difference {
    /// A difference at an offset, the target at fault (its copy differs from the source).
    pub fn at(offset: u64, reason: impl Into<String>) -> Difference {
        Difference { offset: Some(offset), side: Side::Target, reason: reason.into() }
    }

    /// A difference at an offset, `side` at fault.
    pub fn on(side: Side, offset: u64, reason: impl Into<String>) -> Difference {
        Difference { offset: Some(offset), side, reason: reason.into() }
    }
}

/// The result of comparing one partition (or one step of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Records found equal on both sides.
    pub records: u64,
    /// Bytes of the source batches compared whole.
    pub bytes: u64,
    /// Every offset from the start below this was compared (past `end` when the last batch straddles it).
    pub verified_to: u64,
    /// The first difference, if any.
    pub difference: Option<Difference>,
}

struct Head {
    header: BatchHeader,
    bytes: Bytes,
    /// Decoded on first need (boundaries differ), then reused while the batch stays the head.
    records: Option<Vec<Record>>,
}

struct Cursor<S> {
    stream: S,
    queue: VecDeque<Head>,
    corrupt: Option<(u64, String)>,
    ended: bool,
}

impl<S: BatchStream> Cursor<S> {
    fn new(stream: S) -> Self {
        Cursor { stream, queue: VecDeque::new(), corrupt: None, ended: false }
    }

    /// Drops batches that end before `pos` and makes sure a head batch is loaded if the stream has one.
    async fn head(&mut self, pos: u64) -> Result<Option<&mut Head>, ReadError> {
        loop {
            while self.queue.front().is_some_and(|h| h.header.next_offset() <= pos) {
                self.queue.pop_front();
            }
            if !self.queue.is_empty() || self.ended {
                return Ok(self.queue.front_mut());
            }
            match self.stream.next().await? {
                Some(Item::Batch(header, bytes)) => self.queue.push_back(Head { header, bytes, records: None }),
                Some(Item::Corrupt { offset, message }) => {
                    self.corrupt = Some((offset, message));
                    self.ended = true;
                }
                None => self.ended = true,
            }
        }
    }
}

impl Head {
    /// The batch's records (verifying its CRC); a failure is the difference to report.
    fn records(&mut self, side: Side) -> Result<&[Record], Difference> {
        if self.records.is_none() {
            let decoded = batch::decode_records(&self.bytes).map_err(|e| bad_batch(side, &self.header, &e))?;
            self.records = Some(decoded);
        }
        Ok(self.records.as_deref().unwrap_or_default())
    }
}

fn bad_batch(side: Side, h: &BatchHeader, e: &batch::BatchError) -> Difference {
    let what = match e {
        batch::BatchError::CrcMismatch { .. } => "fails its CRC check",
        _ => "cannot be read",
    };
    Difference::on(
        side,
        h.base_offset,
        format!("the {} batch at offsets {}-{} {what} ({e})", side.name(), h.base_offset, h.last_offset()),
    )
}

/// Compares the two sides over `[start, end)`, calling `progress` with the records compared so far. It stops early,
/// at a batch boundary, once the source batches compared reach `budget` bytes (`u64::MAX`: no budget).
pub async fn compare<S: BatchStream, T: BatchStream>(
    source: S,
    target: T,
    start: u64,
    end: u64,
    budget: u64,
    progress: &mut impl FnMut(u64),
) -> Result<Outcome, ReadError> {
    let mut src = Cursor::new(source);
    let mut tgt = Cursor::new(target);
    let mut pos = start;
    let mut records = 0u64;
    let mut bytes = 0u64;
    let done = |records, bytes, verified_to, difference| Ok(Outcome { records, bytes, verified_to, difference });
    while pos < end && bytes < budget {
        let a = src.head(pos).await?.map(|h| (h.header, h.bytes.clone()));
        let b = tgt.head(pos).await?.map(|h| (h.header, h.bytes.clone()));
        let step = match (a, b) {
            // Both logs end here (a shared trailing gap): nothing more to compare.
            (None, None) => {
                let difference = first_corruption(&src, &tgt);
                return done(records, bytes, if difference.is_some() { pos } else { end }, difference);
            }
            (None, Some((h, _))) | (Some((h, _)), None) => {
                let (missing, present) =
                    if src.queue.is_empty() { (&src.corrupt, Side::Target) } else { (&tgt.corrupt, Side::Source) };
                let first = h.base_offset.max(pos);
                let difference = match missing {
                    Some((offset, message)) => Some(corrupt(present.other(), *offset, message)),
                    None if first >= end => None,
                    None => Some(one_sided(present, first)),
                };
                return done(records, bytes, if difference.is_some() { pos } else { end }, difference);
            }
            (Some((ha, _)), Some((hb, _))) if ha.base_offset >= end && hb.base_offset >= end => break,
            (Some((ha, ba)), Some((hb, bb)))
                if ha.base_offset == hb.base_offset && ha.last_offset() == hb.last_offset() =>
            {
                compare_batches(&ha, &ba, &hb, &bb)
                    .map(|()| (u64::from(ha.record_count), ha.next_offset(), ba.len() as u64))
            }
            (Some((ha, ba)), Some((hb, _))) => {
                let limit = ha.next_offset().min(hb.next_offset()).min(end);
                // The source batch counts once it is compared to its end.
                let whole = if limit == ha.next_offset() { ba.len() as u64 } else { 0 };
                by_records(&mut src, &mut tgt, (ha.epoch, hb.epoch), pos, limit).map(|n| (n, limit, whole))
            }
        };
        match step {
            Ok((n, next, b)) => {
                records += n;
                bytes += b;
                pos = next;
            }
            Err(d) => return done(records, bytes, pos, Some(d)),
        }
        progress(records);
    }
    done(records, bytes, if bytes < budget { pos.max(end) } else { pos }, None)
}

/// Compares the records of both head batches in `[from, to)` (boundaries differ).
fn by_records<S, T>(
    src: &mut Cursor<S>,
    tgt: &mut Cursor<T>,
    (epoch_a, epoch_b): (u32, u32),
    from: u64,
    to: u64,
) -> Result<u64, Difference> {
    let a = match src.queue.front_mut() {
        Some(h) => h.records(Side::Source)?,
        None => &[],
    };
    let b = match tgt.queue.front_mut() {
        Some(h) => h.records(Side::Target)?,
        None => &[],
    };
    compare_records(a, epoch_a, b, epoch_b, from, to)
}

fn first_corruption<S, T>(src: &Cursor<S>, tgt: &Cursor<T>) -> Option<Difference> {
    let s = src.corrupt.as_ref().map(|(o, m)| corrupt(Side::Source, *o, m));
    let t = tgt.corrupt.as_ref().map(|(o, m)| corrupt(Side::Target, *o, m));
    match (s, t) {
        (Some(s), Some(t)) => Some(if t.offset < s.offset { t } else { s }),
        (s, t) => s.or(t),
    }
}

fn corrupt(side: Side, offset: u64, message: &str) -> Difference {
    Difference::on(side, offset, format!("the {} broker reports a corrupt batch: {message}", side.name()))
}

fn one_sided(present: Side, offset: u64) -> Difference {
    Difference::at(
        offset,
        format!("offset {offset} is on the {} but not on the {}", present.name(), present.other().name()),
    )
}

/// Compares two batches with the same offsets.
fn compare_batches(ha: &BatchHeader, a: &Bytes, hb: &BatchHeader, b: &Bytes) -> Result<(), Difference> {
    // Recompute both CRCs first: a changed byte with the stored CRC left alone shows here.
    if let Err(e) = batch::verify(a) {
        return Err(bad_batch(Side::Source, ha, &e));
    }
    if let Err(e) = batch::verify(b) {
        return Err(bad_batch(Side::Target, hb, &e));
    }
    if ha.epoch != hb.epoch {
        return Err(Difference::at(
            ha.base_offset,
            format!(
                "the batch at offsets {}-{} has epoch {} on the source but {} on the target",
                ha.base_offset,
                ha.last_offset(),
                ha.epoch,
                hb.epoch
            ),
        ));
    }
    if ha.crc == hb.crc && a.get(CRC_START..) == b.get(CRC_START..) {
        return Ok(());
    }
    // Name the first differing record when the records differ; otherwise it is the batch header fields.
    let ra = batch::decode_records(a).unwrap_or_default();
    let rb = batch::decode_records(b).unwrap_or_default();
    if let Err(d) = compare_records(&ra, ha.epoch, &rb, hb.epoch, ha.base_offset, ha.next_offset()) {
        return Err(Difference {
            reason: format!("{} (batch CRC {:#010x} on the source, {:#010x} on the target)", d.reason, ha.crc, hb.crc),
            ..d
        });
    }
    Err(Difference::at(
        ha.base_offset,
        format!(
            "the batch at offsets {}-{} has CRC {:#010x} on the source but {:#010x} on the target while its records \
             are equal: a header field differs (timestamps, producer id, sequence or attributes)",
            ha.base_offset,
            ha.last_offset(),
            ha.crc,
            hb.crc
        ),
    ))
}

/// Compares the records of `a` and `b` with offsets in `[from, to)`. Returns how many matched.
fn compare_records(
    a: &[Record],
    epoch_a: u32,
    b: &[Record],
    epoch_b: u32,
    from: u64,
    to: u64,
) -> Result<u64, Difference> {
    let mut ia = a.iter().filter(|r| r.offset >= from && r.offset < to).peekable();
    let mut ib = b.iter().filter(|r| r.offset >= from && r.offset < to).peekable();
    let mut matched = 0u64;
    loop {
        match (ia.peek(), ib.peek()) {
            (None, None) => return Ok(matched),
            (Some(x), None) => return Err(one_sided(Side::Source, x.offset)),
            (None, Some(y)) => return Err(one_sided(Side::Target, y.offset)),
            (Some(x), Some(y)) if x.offset < y.offset => return Err(one_sided(Side::Source, x.offset)),
            (Some(x), Some(y)) if y.offset < x.offset => return Err(one_sided(Side::Target, y.offset)),
            (Some(x), Some(y)) => {
                let o = x.offset;
                let field = if x.timestamp != y.timestamp {
                    Some(format!("timestamp {} on the source but {} on the target", x.timestamp, y.timestamp))
                } else if x.key != y.key {
                    Some("the key differs".to_owned())
                } else if x.value != y.value {
                    Some("the value differs".to_owned())
                } else if x.headers != y.headers {
                    Some("the headers differ".to_owned())
                } else if epoch_a != epoch_b {
                    Some(format!("epoch {epoch_a} on the source but {epoch_b} on the target"))
                } else {
                    None
                };
                if let Some(field) = field {
                    return Err(Difference::at(o, format!("record {o}: {field}")));
                }
                matched += 1;
                ia.next();
                ib.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{BatchHeader, Compression, Header, ProducerInfo, encode_records};

    /// A stream over a fixed list.
    struct List(VecDeque<Item>);

    impl BatchStream for List {
        async fn next(&mut self) -> Result<Option<Item>, ReadError> {
            Ok(self.0.pop_front())
        }
    }

    fn record(offset: u64) -> Record {
        Record {
            offset,
            timestamp: 1_700_000_000_000 + offset as i64,
            key: Some(Bytes::from(format!("customer-{}", offset % 7))),
            value: Some(Bytes::from(format!("{{\"order\":{offset}}}"))),
            headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"v")) }],
        }
    }

    fn batch(offsets: std::ops::Range<u64>, epoch: u32) -> Bytes {
        let records: Vec<Record> = offsets.map(record).collect();
        encode_records(&records, epoch, Compression::None, ProducerInfo::NONE)
    }

    fn item(bytes: Bytes) -> Item {
        Item::Batch(BatchHeader::parse(&bytes).unwrap(), bytes)
    }

    fn list(batches: Vec<Bytes>) -> List {
        List(batches.into_iter().map(item).collect())
    }

    async fn run(src: Vec<Bytes>, tgt: Vec<Bytes>, start: u64, end: u64) -> Outcome {
        compare(list(src), list(tgt), start, end, u64::MAX, &mut |_| {}).await.unwrap()
    }

    /// Records and the range compared, ignoring the byte count.
    fn identical(records: u64) -> (u64, Option<Difference>) {
        (records, None)
    }

    fn found(o: Outcome) -> (u64, Option<Difference>) {
        (o.records, o.difference)
    }

    #[tokio::test]
    async fn equal_batches_are_identical_and_counted() {
        let src = vec![batch(0..10, 0), batch(10..25, 0), batch(25..30, 1)];
        assert_eq!(found(run(src.clone(), src, 0, 30).await), identical(30));
    }

    #[tokio::test]
    async fn split_batches_fall_back_to_records() {
        let src = vec![batch(0..10, 0), batch(10..30, 0)];
        let tgt = vec![batch(0..10, 0), batch(10..17, 0), batch(17..24, 0), batch(24..30, 0)];
        assert_eq!(found(run(src.clone(), tgt.clone(), 0, 30).await), identical(30));
        assert_eq!(found(run(tgt, src, 0, 30).await), identical(30));
    }

    #[tokio::test]
    async fn a_byte_changed_under_an_unchanged_crc_is_caught_at_its_batch() {
        let good = batch(10..20, 0);
        let mut bad = good.to_vec();
        let marker = b"{\"order\":15}";
        let at = bad.windows(marker.len()).position(|w| w == marker).unwrap() + marker.len() - 2;
        bad[at] ^= 0x01;
        let src = vec![batch(0..10, 0), good];
        let tgt = vec![batch(0..10, 0), Bytes::from(bad)];
        let out = run(src, tgt, 0, 20).await;
        assert_eq!(out.records, 10);
        let d = out.difference.unwrap();
        assert_eq!(d.offset, Some(10));
        assert!(d.reason.starts_with("the target batch at offsets 10-19 fails its CRC check"), "{}", d.reason);
    }

    #[tokio::test]
    async fn a_different_value_with_a_valid_crc_names_the_record() {
        let src = vec![batch(0..10, 0)];
        let mut records: Vec<Record> = (0..10).map(record).collect();
        records[6].value = Some(Bytes::from_static(b"other"));
        let tgt = vec![encode_records(&records, 0, Compression::None, ProducerInfo::NONE)];
        let d = run(src, tgt, 0, 10).await.difference.unwrap();
        assert_eq!(d.offset, Some(6));
        assert!(d.reason.starts_with("record 6: the value differs (batch CRC "), "{}", d.reason);
    }

    #[tokio::test]
    async fn epochs_are_compared_on_both_paths() {
        let d = run(vec![batch(0..5, 0)], vec![batch(0..5, 1)], 0, 5).await.difference.unwrap();
        assert_eq!(d.offset, Some(0));
        assert_eq!(d.reason, "the batch at offsets 0-4 has epoch 0 on the source but 1 on the target");
        let d = run(vec![batch(0..5, 0)], vec![batch(0..3, 0), batch(3..5, 2)], 0, 5).await.difference.unwrap();
        assert_eq!(d, Difference::at(3, "record 3: epoch 0 on the source but 2 on the target"));
    }

    #[tokio::test]
    async fn missing_offsets_are_named() {
        // A gap on the target inside the range.
        let d = run(vec![batch(0..5, 0), batch(5..10, 0)], vec![batch(0..5, 0), batch(7..10, 0)], 0, 10).await;
        assert_eq!(d.records, 5);
        assert_eq!(d.difference.unwrap(), Difference::at(5, "offset 5 is on the source but not on the target"));
        // The target stream ends early.
        let d = run(vec![batch(0..5, 0), batch(5..10, 0)], vec![batch(0..5, 0)], 0, 10).await;
        assert_eq!(d.difference.unwrap(), Difference::at(5, "offset 5 is on the source but not on the target"));
    }

    #[tokio::test]
    async fn the_range_bounds_the_comparison() {
        // Batches below start and at or past end are not compared; a batch straddling start is compared whole.
        let src = vec![batch(0..5, 0), batch(5..10, 0), batch(10..15, 0)];
        let tgt = vec![batch(5..10, 0)];
        assert_eq!(found(run(src.clone(), tgt, 5, 10).await), identical(5));
        // The source is ahead (lag): only the common range counts.
        assert_eq!(found(run(src, vec![batch(0..5, 0), batch(5..8, 0)], 0, 8).await), identical(8));
    }

    #[tokio::test]
    async fn a_corrupt_batch_reported_by_the_broker_is_a_difference_at_its_offset() {
        let src = list(vec![batch(0..5, 0), batch(5..10, 0)]);
        let mut tgt = list(vec![batch(0..5, 0)]);
        tgt.0.push_back(Item::Corrupt { offset: 5, message: "CRC mismatch".into() });
        let out = compare(src, tgt, 0, 10, u64::MAX, &mut |_| {}).await.unwrap();
        assert_eq!(out.records, 5);
        assert_eq!(
            out.difference.unwrap(),
            Difference::on(Side::Target, 5, "the target broker reports a corrupt batch: CRC mismatch")
        );
    }

    #[tokio::test]
    async fn a_byte_budget_stops_at_a_batch_boundary_and_says_where() {
        let src = vec![batch(0..10, 0), batch(10..20, 0), batch(20..30, 0)];
        let one = src[0].len() as u64;
        // A budget of one batch: the first batch is compared whole, then the step ends.
        let out = compare(list(src.clone()), list(src.clone()), 0, 30, one, &mut |_| {}).await.unwrap();
        assert_eq!((out.records, out.bytes, out.verified_to, out.difference), (10, one, 10, None));
        // The next step goes on from there to the end.
        let out = compare(list(src.clone()), list(src.clone()), 10, 30, u64::MAX, &mut |_| {}).await.unwrap();
        assert_eq!((out.records, out.verified_to), (20, 30));
        // A last batch that straddles the end is compared whole; the range verified reaches past the end.
        let out = compare(list(src.clone()), list(src), 0, 25, u64::MAX, &mut |_| {}).await.unwrap();
        assert_eq!((out.records, out.verified_to), (30, 30));
    }

    #[tokio::test]
    async fn the_side_at_fault_is_the_source_only_for_its_own_bad_batch() {
        let good = batch(0..10, 0);
        let mut bad = good.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0x01;
        let bad = Bytes::from(bad);
        let d = run(vec![bad.clone()], vec![good.clone()], 0, 10).await.difference.unwrap();
        assert_eq!((d.offset, d.side), (Some(0), Side::Source));
        let d = run(vec![good.clone()], vec![bad], 0, 10).await.difference.unwrap();
        assert_eq!((d.offset, d.side), (Some(0), Side::Target));
        // Offsets on one side only: the target's copy is at fault either way.
        let d = run(vec![good.clone(), batch(10..20, 0)], vec![good.clone()], 0, 20).await.difference.unwrap();
        assert_eq!((d.offset, d.side), (Some(10), Side::Target));
        let d = run(vec![good.clone()], vec![good, batch(10..20, 0)], 0, 20).await.difference.unwrap();
        assert_eq!((d.offset, d.side), (Some(10), Side::Target));
    }
}
