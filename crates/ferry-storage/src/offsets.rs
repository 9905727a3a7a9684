//! Appends with caller-supplied offsets and epochs: the mirror's path (design §3, "Append with offsets").
//!
//! A call is handled in two phases so that nothing is half-written:
//! 1. check every offered batch (whole, CRC, size, offsets strictly increasing across the call) and plan every
//!    step against a simulated log end: present, write, jump over a gap, or stop at a divergence. Any refusal
//!    (a gap that source retention does not explain, a straddle, an epoch going backwards) fails the whole call
//!    here, before any byte is written;
//! 2. carry the plan out.
//!
//! Divergence can only be found before the first write of a call: once a batch has been written at the log end,
//! every later batch starts above it.

use ferry_batch::{self as batch, BatchHeader, BatchIter, Record};

use crate::state::LogCore;
use crate::types::{BatchMeta, Caller, OffsetAppendOutcome};
use crate::{Result, StorageError};

/// Read size used when collecting stored records to compare.
const COMPARE_READ_BYTES: u64 = 1024 * 1024;

/// One offered batch.
struct Offered<'a> {
    header: BatchHeader,
    bytes: &'a [u8],
}

/// What to do with one offered batch (or before it).
enum Step {
    Present,
    Write(usize),
    Jump(u64),
    Diverged(u64),
}

/// The first offset at which two record sequences over the same range differ; `None` when they are equal.
pub(crate) fn first_difference(stored: &[Record], offered: &[Record]) -> Option<u64> {
    let len = stored.len().max(offered.len());
    (0..len).find_map(|i| match (stored.get(i), offered.get(i)) {
        (Some(a), Some(b)) if a == b => None,
        (Some(a), Some(b)) => Some(a.offset.min(b.offset)),
        (Some(a), None) => Some(a.offset),
        (None, Some(b)) => Some(b.offset),
        (None, None) => None,
    })
}

impl LogCore {
    fn refused(&self, offset: u64, reason: String) -> StorageError {
        StorageError::OffsetAppendRefused { dir: self.dir.clone(), offset, reason }
    }

    /// Splits and checks the offered bytes: whole batches, good CRCs, within the size limit, offsets strictly
    /// increasing and not overflowing.
    fn parse_offered<'a>(&self, batches: &'a [u8], log_end: u64, max: u64, caller: Caller) -> Result<Vec<Offered<'a>>> {
        let mut out: Vec<Offered<'a>> = Vec::new();
        let mut iter = BatchIter::new(batches);
        loop {
            let at = iter.position();
            let item = match iter.next() {
                None => break,
                Some(item) => item,
            };
            // Best offset to name for a batch we cannot parse: its own base field, else where it would go.
            let named = batches
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map_or_else(|| out.last().map_or(log_end, |p| p.header.next_offset()), u64::from_be_bytes);
            let invalid = |source| StorageError::InvalidBatch { dir: self.dir.clone(), offset: named, source };
            let (_, bytes) = item.map_err(invalid)?;
            let header = caller.check(bytes).map_err(invalid)?;
            if bytes.len() as u64 > max {
                return Err(StorageError::BatchTooLarge {
                    dir: self.dir.clone(),
                    offset: header.base_offset,
                    size: bytes.len() as u64,
                    max,
                });
            }
            if header.base_offset.checked_add(u64::from(header.last_offset_delta)).is_none_or(|l| l > crate::MAX_OFFSET)
            {
                return Err(StorageError::OffsetOverflow { dir: self.dir.clone(), offset: header.base_offset });
            }
            if let Some(prev) = out.last()
                && header.base_offset <= prev.header.last_offset()
            {
                return Err(self.refused(
                    header.base_offset,
                    format!(
                        "offsets must increase across the offered batches: this batch starts at {} but the one before it ends at {}",
                        header.base_offset,
                        prev.header.last_offset()
                    ),
                ));
            }
            out.push(Offered { header, bytes });
        }
        Ok(out)
    }

    /// `Log::append_with_offsets`.
    pub(crate) fn append_offsets(
        &self,
        batches: &[u8],
        source_log_start: u64,
        caller: Caller,
    ) -> Result<OffsetAppendOutcome> {
        let mut w = self.writer.lock();
        let (leo, log_start, max, mut last_epoch) = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            (st.log_end(), st.log_start(), st.config.max_batch_bytes, st.epochs.last_history_epoch())
        };
        let offered = self.parse_offered(batches, leo, max, caller)?;
        if source_log_start > crate::MAX_OFFSET + 1 {
            return Err(StorageError::OffsetOverflow { dir: self.dir.clone(), offset: source_log_start });
        }

        // Phase 1: plan against a simulated log end.
        let mut steps = Vec::with_capacity(offered.len() + 1);
        let mut end = leo;
        if offered.is_empty() && leo < source_log_start {
            steps.push(Step::Jump(source_log_start));
        }
        for (i, b) in offered.iter().enumerate() {
            let (base, last) = (b.header.base_offset, b.header.last_offset());
            if last < end {
                if base < log_start {
                    return Err(self.refused(
                        base,
                        format!(
                            "batch [{base}, {last}] lies below the log start offset {log_start}: that range was removed here by retention and cannot be checked"
                        ),
                    ));
                }
                match self.compare_stored(b)? {
                    None => steps.push(Step::Present),
                    Some(at) => {
                        steps.push(Step::Diverged(at));
                        break;
                    }
                }
                continue;
            }
            if base < end {
                return Err(self.refused(
                    base,
                    format!("batch [{base}, {last}] straddles the log end offset {end}; batch boundaries must match"),
                ));
            }
            if base > end {
                // Only a batch that starts exactly at the source's log start explains the gap: one starting above it
                // would silently skip [source_log_start, base), records the source may still hold.
                if !(end < source_log_start && source_log_start == base) {
                    return Err(self.refused(
                        base,
                        format!(
                            "batch at {base} is above the log end offset {end}; a gap is allowed only when the log end is below the source log start offset ({source_log_start}) and the batch starts exactly at it"
                        ),
                    ));
                }
                steps.push(Step::Jump(base));
            }
            let epoch = b.header.epoch;
            if let Some(latest) = last_epoch
                && epoch < latest
            {
                return Err(self.refused(
                    base,
                    format!("epoch regressed: the batch at {base} has epoch {epoch}, below the latest epoch {latest} in the log's history"),
                ));
            }
            last_epoch = Some(last_epoch.map_or(epoch, |l| l.max(epoch)));
            steps.push(Step::Write(i));
            end = last + 1;
        }

        // Phase 2: carry it out.
        let (mut written, mut present) = (0u32, 0u32);
        for step in steps {
            match step {
                Step::Present => present += 1,
                Step::Jump(target) => self.jump(&mut w, target)?,
                Step::Write(i) => {
                    let b = &offered[i];
                    let meta = BatchMeta::from_header(0, &b.header);
                    self.write_batch(&mut w, &[b.bytes], meta, caller)?;
                    written += 1;
                }
                Step::Diverged(at) => {
                    let log_end_offset = self.state.read().log_end();
                    return Ok(OffsetAppendOutcome::Diverged { at, written, present, log_end_offset });
                }
            }
        }
        let log_end_offset = self.state.read().log_end();
        Ok(OffsetAppendOutcome::Appended { written, present, log_end_offset })
    }

    /// Compares an offered batch lying below the log end with what is stored: `None` when the stored batch at its
    /// base has the same last offset, CRC and epoch; otherwise the first differing offset.
    fn compare_stored(&self, b: &Offered<'_>) -> Result<Option<u64>> {
        let (base, last) = (b.header.base_offset, b.header.last_offset());
        // Both sides are decoded here: each decode holds at most the bounded limit of decompressed bytes.
        let limit = batch::decode_limit(self.state.read().config.max_batch_bytes);
        let first = self.read_batches(base, 1)?;
        if let Some(Ok((stored, _))) = BatchIter::new(&first.batches).next()
            && stored.base_offset == base
            && stored.last_offset() == last
            && stored.crc == b.header.crc
            && stored.epoch == b.header.epoch
        {
            return Ok(None);
        }
        let mut stored_records = Vec::new();
        let mut offset = base;
        while offset <= last {
            let read = self.read_batches(offset, COMPARE_READ_BYTES)?;
            if read.batches.is_empty() {
                break;
            }
            for item in BatchIter::new(&read.batches) {
                // Read already verified every batch it returned.
                let (header, bytes) =
                    item.map_err(|source| StorageError::InvalidBatch { dir: self.dir.clone(), offset, source })?;
                let records = batch::decode_records_bounded(bytes, limit).map_err(|source| {
                    StorageError::InvalidBatch { dir: self.dir.clone(), offset: header.base_offset, source }
                })?;
                stored_records.extend(records.into_iter().filter(|r| (base..=last).contains(&r.offset)));
            }
            offset = read.next_offset;
        }
        // The offered batch passed `verify`, so it decodes unless its record section is malformed.
        let offered_records = batch::decode_records_bounded(b.bytes, limit)
            .map_err(|source| StorageError::InvalidBatch { dir: self.dir.clone(), offset: base, source })?;
        Ok(Some(first_difference(&stored_records, &offered_records).unwrap_or(base)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(offset: u64, value: &str) -> Record {
        Record {
            offset,
            timestamp: 1,
            key: None,
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: vec![],
        }
    }

    #[test]
    fn first_difference_names_the_first_differing_offset() {
        let a = vec![rec(1, "a"), rec(2, "b"), rec(3, "c")];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &[rec(1, "a"), rec(2, "x"), rec(3, "c")]), Some(2));
        assert_eq!(first_difference(&a, &a[..2]), Some(3));
        assert_eq!(first_difference(&a[..1], &a), Some(2));
        assert_eq!(first_difference(&[rec(1, "a"), rec(3, "c")], &a), Some(2));
        assert_eq!(first_difference(&[], &a), Some(1));
    }
}
