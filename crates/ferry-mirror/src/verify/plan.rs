//! The verifier's decisions, without I/O: which partition takes the next step (round robin, so every partition is
//! covered in turn), which range a step compares, and what its outcome does to the partition's progress.
//!
//! A pass over a partition compares `[later log start, cache offset)` as they were when the pass started, in steps
//! of a bounded number of bytes. It completes when every batch of that range was compared equal; it ends early at a
//! mismatch (reported once per offset and side until a pass completes clean) or when a side cannot be read (the log
//! moved under the reader: the next pass starts afresh). Each new pass starts at the beginning again, so records
//! mirrored long ago are checked again too: bit rot does not pick recent data.

use std::collections::BTreeMap;

use super::compare::Side;
use crate::state::{Mismatch, VerifyProgress};
use crate::tp::SourceTp;

/// What one step found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every batch up to `to` compared equal.
    Verified {
        /// Where the comparison got to.
        to: u64,
    },
    /// The first mismatch.
    Mismatch {
        /// The first mismatching offset.
        offset: u64,
        /// The side at fault.
        side: Side,
        /// What differs.
        reason: String,
    },
    /// A side could not be read.
    Unreadable,
}

#[derive(Debug, Default)]
struct Part {
    progress: VerifyProgress,
    in_pass: bool,
    reported: Option<(u64, Side)>,
}

/// The progress of every partition this process verifies.
#[derive(Debug, Default)]
pub struct Plan {
    parts: BTreeMap<SourceTp, Part>,
    last: Option<SourceTp>,
}

impl Plan {
    /// The partition after the last one stepped on, among `eligible` (sorted), wrapping around. Partitions that
    /// are no longer eligible stay known (a paused or restarting partition keeps its progress) until
    /// [`Plan::retain`] drops them.
    pub fn next(&mut self, eligible: &[SourceTp]) -> Option<SourceTp> {
        let at = self.last.as_ref().map_or(0, |l| eligible.partition_point(|tp| tp <= l));
        let next = eligible.get(at).or_else(|| eligible.first()).cloned();
        self.last = next.clone();
        next
    }

    /// The next `n` partitions in turn ([`Plan::next`] `n` times), `n` at most `eligible`'s length.
    pub fn next_group(&mut self, eligible: &[SourceTp], n: usize) -> Vec<SourceTp> {
        (0..n.min(eligible.len())).filter_map(|_| self.next(eligible)).collect()
    }

    /// Forgets the partitions not in `owned`.
    pub fn retain(&mut self, owned: impl Fn(&SourceTp) -> bool) {
        self.parts.retain(|tp, _| owned(tp));
    }

    /// Whether `tp` has a pass in progress.
    pub fn in_pass(&self, tp: &SourceTp) -> bool {
        self.parts.get(tp).is_some_and(|p| p.in_pass)
    }

    /// Starts a pass over `[start, end)`; an empty range completes it at once (at `now_ms`).
    pub fn start_pass(&mut self, tp: &SourceTp, start: u64, end: u64, now_ms: i64) {
        let part = self.parts.entry(tp.clone()).or_default();
        let p = &mut part.progress;
        p.enabled = true;
        p.pass_start_offset = start;
        p.pass_end_offset = end.max(start);
        p.verified_to_offset = start;
        part.in_pass = true;
        if end <= start {
            complete(part, now_ms);
        }
    }

    /// The range the next step of `tp`'s pass compares.
    pub fn range(&self, tp: &SourceTp) -> Option<(u64, u64)> {
        let p = &self.parts.get(tp).filter(|p| p.in_pass)?.progress;
        Some((p.verified_to_offset, p.pass_end_offset))
    }

    /// Applies a step's outcome at `now_ms`; returns the mismatch to report, unless it was reported already.
    pub fn on_step(&mut self, tp: &SourceTp, step: Step, now_ms: i64) -> Option<Mismatch> {
        let part = self.parts.get_mut(tp)?;
        match step {
            Step::Verified { to } => {
                part.progress.verified_to_offset = to.max(part.progress.verified_to_offset);
                if to >= part.progress.pass_end_offset {
                    complete(part, now_ms);
                }
                None
            }
            Step::Mismatch { offset, side, reason } => {
                part.in_pass = false;
                part.progress.verified_to_offset = offset.max(part.progress.pass_start_offset);
                let mismatch = Mismatch { offset, side: side.name().to_owned(), reason };
                part.progress.mismatch = Some(mismatch.clone());
                let new = part.reported != Some((offset, side));
                part.reported = Some((offset, side));
                new.then_some(mismatch)
            }
            Step::Unreadable => {
                part.in_pass = false;
                None
            }
        }
    }

    /// The progress of `tp` as the monitor shows it.
    pub fn progress(&self, tp: &SourceTp) -> Option<&VerifyProgress> {
        self.parts.get(tp).map(|p| &p.progress)
    }
}

fn complete(part: &mut Part, now_ms: i64) {
    part.in_pass = false;
    part.progress.verified_to_offset = part.progress.pass_end_offset;
    part.progress.passes_completed += 1;
    part.progress.last_pass_completed_ms = Some(now_ms);
    part.progress.mismatch = None;
    part.reported = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: u32) -> SourceTp {
        SourceTp::new("orders", p)
    }

    #[test]
    fn partitions_take_turns_and_a_pass_ends_at_its_end() {
        let mut plan = Plan::default();
        let all = [tp(0), tp(1), tp(2)];
        let order: Vec<u32> = (0..7).filter_map(|_| plan.next(&all)).map(|t| t.partition).collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2, 0]);
        // Partition 1 leaves the eligible set (paused, say): the others keep their turns.
        assert_eq!(plan.next(&[tp(0), tp(2)]).map(|t| t.partition), Some(2));
        assert_eq!(plan.next(&[]), None);

        // (step, range before it, verified_to after, passes completed, completed at)
        plan.start_pass(&tp(0), 100, 400, 1_000);
        let table = [
            (Step::Verified { to: 180 }, (100, 400), 180, 0, None),
            (Step::Verified { to: 350 }, (180, 400), 350, 0, None),
            // The last batch straddles the pass end.
            (Step::Verified { to: 410 }, (350, 400), 400, 1, Some(2_000)),
        ];
        for (i, (step, range, to, passes, at)) in table.into_iter().enumerate() {
            assert_eq!(plan.range(&tp(0)), Some(range), "step {i}");
            assert_eq!(plan.on_step(&tp(0), step, 2_000), None, "step {i}");
            let p = plan.progress(&tp(0)).unwrap();
            assert_eq!((p.verified_to_offset, p.passes_completed, p.last_pass_completed_ms), (to, passes, at));
        }
        assert!(!plan.in_pass(&tp(0)) && plan.range(&tp(0)).is_none());
        // An empty pass (nothing mirrored yet) completes at once.
        plan.start_pass(&tp(1), 0, 0, 3_000);
        let p = plan.progress(&tp(1)).unwrap();
        assert_eq!((p.enabled, p.passes_completed, p.last_pass_completed_ms), (true, 1, Some(3_000)));
    }

    #[test]
    fn groups_take_turns_without_repeating_a_partition_and_find_their_place_after_one_left() {
        let mut plan = Plan::default();
        let all: Vec<SourceTp> = (0..5).map(tp).collect();
        let parts = |g: Vec<SourceTp>| g.into_iter().map(|t| t.partition).collect::<Vec<_>>();
        assert_eq!(parts(plan.next_group(&all, 2)), [0, 1]);
        assert_eq!(parts(plan.next_group(&all, 2)), [2, 3]);
        // The round's last group is cut to what is left of it by the caller; a group never holds a partition twice.
        assert_eq!(parts(plan.next_group(&all, 1)), [4]);
        assert_eq!(parts(plan.next_group(&all, 9)), [0, 1, 2, 3, 4]);
        // The last partition stepped on is no longer eligible: the turn goes on after its place.
        assert_eq!(parts(plan.next_group(&all, 3)), [0, 1, 2]);
        assert_eq!(parts(plan.next_group(&[tp(0), tp(1), tp(3), tp(4)], 2)), [3, 4]);
        plan.last = Some(tp(2));
        assert_eq!(parts(plan.next_group(&[tp(0), tp(4)], 2)), [4, 0]);
        assert!(plan.next_group(&[], 4).is_empty());
    }

    #[test]
    fn a_mismatch_is_reported_once_until_a_pass_completes_clean() {
        let mut plan = Plan::default();
        let bad = || Step::Mismatch { offset: 40, side: Side::Target, reason: "fails its CRC check".into() };
        let want = Mismatch { offset: 40, side: "target".into(), reason: "fails its CRC check".into() };
        plan.start_pass(&tp(0), 0, 100, 0);
        assert_eq!(plan.on_step(&tp(0), Step::Verified { to: 40 }, 1), None);
        assert_eq!(plan.on_step(&tp(0), bad(), 2), Some(want.clone()));
        let p = plan.progress(&tp(0)).unwrap();
        assert_eq!((p.verified_to_offset, p.mismatch.clone(), plan.in_pass(&tp(0))), (40, Some(want.clone()), false));
        // The next pass finds it again: not reported again.
        plan.start_pass(&tp(0), 0, 100, 3);
        assert_eq!(plan.on_step(&tp(0), bad(), 4), None);
        // Another side or offset is news.
        plan.start_pass(&tp(0), 0, 100, 5);
        let source = Step::Mismatch { offset: 40, side: Side::Source, reason: "fails its CRC check".into() };
        assert_eq!(plan.on_step(&tp(0), source, 6).map(|m| m.side), Some("source".to_owned()));
        // A clean pass clears it; the same mismatch later is reported again.
        plan.start_pass(&tp(0), 0, 100, 7);
        assert_eq!(plan.on_step(&tp(0), Step::Verified { to: 100 }, 8), None);
        assert_eq!(plan.progress(&tp(0)).unwrap().mismatch, None);
        plan.start_pass(&tp(0), 0, 100, 9);
        assert_eq!(plan.on_step(&tp(0), bad(), 10), Some(want));
        // An unreadable side ends the pass without a verdict; forgetting a partition drops its progress.
        plan.start_pass(&tp(0), 0, 100, 11);
        assert_eq!(plan.on_step(&tp(0), Step::Unreadable, 12), None);
        assert!(!plan.in_pass(&tp(0)));
        plan.retain(|t| t.partition != 0);
        assert!(plan.progress(&tp(0)).is_none());
    }
}
