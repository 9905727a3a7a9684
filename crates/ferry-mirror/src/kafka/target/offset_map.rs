//! The source offset -> target offset map of one target partition, for consumer-group offset sync.
//!
//! It is kept as runs: source offsets `src..src+len` were written at target offsets `tgt..tgt+len`. One append
//! (one transaction) of contiguous source offsets is one run; a gap in the source offsets or a transaction marker
//! between appends starts a new run. Every record this process writes is recorded, so from its oldest run on the
//! map is complete and translation is exact; only the oldest runs are dropped past [`MAX_RUNS`]. Below the map's
//! range the caller asks the target itself (binary search over the provenance headers).

use std::collections::VecDeque;

/// Runs kept per partition.
pub(crate) const MAX_RUNS: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    src: u64,
    tgt: u64,
    len: u64,
}

/// A translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The answer.
    Exact(u64),
    /// Before the map's range: ask the target.
    Unknown,
}

/// The map of one partition.
#[derive(Debug, Default, Clone)]
pub(crate) struct OffsetMap {
    runs: VecDeque<Run>,
}

impl OffsetMap {
    /// Records that source offset `src` was written at target offset `tgt` (both growing).
    pub(crate) fn record(&mut self, src: u64, tgt: u64) {
        if let Some(last) = self.runs.back_mut() {
            if src < last.src + last.len || tgt < last.tgt + last.len {
                // Out of order (a stale view after a takeover): start over from here.
                self.runs.clear();
            } else if src == last.src + last.len && tgt == last.tgt + last.len {
                last.len += 1;
                return;
            }
        }
        self.runs.push_back(Run { src, tgt, len: 1 });
        while self.runs.len() > MAX_RUNS {
            self.runs.pop_front();
        }
    }

    /// Forgets everything (the partition's history changed under the mirror).
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
    }

    /// Target offset of the first record whose source offset is at least `src`; one past the last record when
    /// `src` is beyond it.
    pub(crate) fn to_target(&self, src: u64) -> Lookup {
        let Some(first) = self.runs.front() else { return Lookup::Unknown };
        if src < first.src {
            return Lookup::Unknown;
        }
        let i = self.runs.partition_point(|r| r.src + r.len <= src);
        match self.runs.get(i) {
            Some(r) if src >= r.src => Lookup::Exact(r.tgt + (src - r.src)),
            Some(r) => Lookup::Exact(r.tgt),
            None => {
                let last = self.runs.back().expect("non-empty");
                Lookup::Exact(last.tgt + last.len)
            }
        }
    }

    /// Source offset of the first record at target offset `tgt` or later; one past the last source offset when
    /// `tgt` is beyond the last record.
    pub(crate) fn to_source(&self, tgt: u64) -> Lookup {
        let Some(first) = self.runs.front() else { return Lookup::Unknown };
        if tgt < first.tgt {
            return Lookup::Unknown;
        }
        let i = self.runs.partition_point(|r| r.tgt + r.len <= tgt);
        match self.runs.get(i) {
            Some(r) if tgt >= r.tgt => Lookup::Exact(r.src + (tgt - r.tgt)),
            Some(r) => Lookup::Exact(r.src),
            None => {
                let last = self.runs.back().expect("non-empty");
                Lookup::Exact(last.src + last.len)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two appends: source 10..15 at target 100..105 (marker at 105), source 20..22 (a compaction gap) at 106..108.
    fn sample() -> OffsetMap {
        let mut m = OffsetMap::default();
        for i in 0..5 {
            m.record(10 + i, 100 + i);
        }
        for i in 0..2 {
            m.record(20 + i, 106 + i);
        }
        m
    }

    #[test]
    fn source_to_target_is_exact_within_the_map() {
        let m = sample();
        assert_eq!(m.to_target(9), Lookup::Unknown);
        assert_eq!(m.to_target(10), Lookup::Exact(100));
        assert_eq!(m.to_target(14), Lookup::Exact(104));
        // 15..20 has no record: the next one is source 20 at target 106.
        assert_eq!(m.to_target(15), Lookup::Exact(106));
        assert_eq!(m.to_target(19), Lookup::Exact(106));
        assert_eq!(m.to_target(21), Lookup::Exact(107));
        // At or past the end: one past the last record.
        assert_eq!(m.to_target(22), Lookup::Exact(108));
        assert_eq!(m.to_target(1000), Lookup::Exact(108));
    }

    #[test]
    fn target_to_source_is_exact_within_the_map() {
        let m = sample();
        assert_eq!(m.to_source(99), Lookup::Unknown);
        assert_eq!(m.to_source(100), Lookup::Exact(10));
        assert_eq!(m.to_source(104), Lookup::Exact(14));
        // 105 is a transaction marker: the next record is source 20.
        assert_eq!(m.to_source(105), Lookup::Exact(20));
        assert_eq!(m.to_source(107), Lookup::Exact(21));
        assert_eq!(m.to_source(108), Lookup::Exact(22));
    }

    #[test]
    fn runs_are_bounded_and_out_of_order_starts_over() {
        let mut m = OffsetMap::default();
        for i in 0..(MAX_RUNS as u64 + 10) {
            m.record(i * 2, i * 3);
        }
        assert_eq!(m.runs.len(), MAX_RUNS);
        assert_eq!(m.to_target(0), Lookup::Unknown);
        m.record(5, 5);
        assert_eq!(m.to_target(5), Lookup::Exact(5));
        assert_eq!(m.to_target(4), Lookup::Unknown);
        assert_eq!(OffsetMap::default().to_source(0), Lookup::Unknown);
    }
}
