//! The RPO clock of one partition: how long the oldest source record that is not yet on the target has been
//! waiting, measured on the mirror's own monotonic clock.
//!
//! A record starts waiting when the mirror first sees the source's log end pass it (a fetch stream position, a data
//! delivery, or the independent ListOffsets probe, whichever comes first). Each sighting of a higher log end leaves
//! a mark (log end, when seen); the marks at or below the cache offset are dropped as the target acknowledges, so
//! the first mark past the cache offset says since when the oldest waiting record has been waiting. With nothing
//! past the cache offset the RPO is 0.
//!
//! Memory is bounded: at most [`MARKS`] marks; when full, the two neighbouring marks whose sightings are closest in
//! time merge (the earlier sighting with the later log end), so the figure can only read high, by at most the
//! time the merged marks span (about twice the waiting time over [`MARKS`]), never low. Record timestamps play no
//! part: producers choose them, and a producer's clock ahead would make the figure read 0 while records wait (case 9
//! of the cluster analysis). A sighting may be dated earlier than the mirror saw it, by the source broker's own
//! account of when its log end moved (`log_end_age_ms`); that only makes it closer to the time the records were
//! received.
//!
//! A record the mirror never sighted waits too: a leader that acknowledges records and dies (or is cut off) before
//! any stream position, delivery or probe answer carries them leaves nothing to mark until a new leader answers.
//! So the probe's answers bound what the mirror cannot see ([`Heard`]): each answer from a partition's leader says
//! nothing was acknowledged unseen before the probe was asked. Once no answer has come for longer than a healthy
//! probe takes (`source.health.check_interval + source.health.timeout`), the RPO counts from when the last answered
//! probe was asked ([`unheard_since`]): any record acknowledged since may be waiting. That reads high when nothing
//! was written, never low. A partition never answered (a Kafka source is not probed) has only its marks.
//! Everything here is pure: the caller passes the clock readings.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most marks one partition keeps.
pub const MARKS: usize = 64;

/// A source log end and the instant the mirror first saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    end: u64,
    seen: Instant,
    /// The latest first sighting merged into this mark (`seen` until it is merged): its error is `last - seen`.
    last: Instant,
}

/// One partition's marks.
#[derive(Debug, Clone, Default)]
pub struct RpoClock {
    marks: VecDeque<Mark>,
    /// The offset everything below of which is on the target, as last told.
    mirrored: u64,
}

impl RpoClock {
    /// The source's log end was `end` at `now`: every record below it exists by `now` at the latest.
    pub fn saw_end(&mut self, end: u64, now: Instant) {
        if end <= self.mirrored || self.marks.back().is_some_and(|m| m.end >= end) {
            return;
        }
        if self.marks.len() >= MARKS {
            self.merge();
        }
        self.marks.push_back(Mark { end, seen: now, last: now });
    }

    /// Everything below `offset` is on the target (the cache offset moved), at `now`. A cache offset that moved
    /// back (the target lost an acknowledged tail, or was truncated) makes the records above it wait again, from
    /// `now`.
    pub fn mirrored_to(&mut self, offset: u64, now: Instant) {
        if offset < self.mirrored {
            let end = self.marks.front().map_or(self.mirrored, |m| m.end.min(self.mirrored));
            if end > offset {
                self.marks.push_front(Mark { end, seen: now, last: now });
            }
        }
        self.mirrored = offset;
        while self.marks.front().is_some_and(|m| m.end <= offset) {
            self.marks.pop_front();
        }
    }

    /// Since when the longest-waiting record at or after `offset` has waited; `None` when none waits.
    pub fn waiting_since(&self, offset: u64) -> Option<Instant> {
        self.marks.iter().filter(|m| m.end > offset).map(|m| m.seen).min()
    }

    /// Merges the two neighbouring marks whose merge reads the least high: the earlier sighting with the later
    /// log end.
    fn merge(&mut self) {
        let error = |i: usize| self.marks[i + 1].last.saturating_duration_since(self.marks[i].seen);
        let Some(i) = (0..self.marks.len().saturating_sub(1)).min_by_key(|&i| error(i)) else { return };
        let (a, b) = (self.marks[i], self.marks[i + 1]);
        self.marks[i] = Mark { end: b.end, seen: a.seen.min(b.seen), last: a.last.max(b.last) };
        self.marks.remove(i + 1);
    }
}

/// An answer of the independent probe from a partition's leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    /// When the answered probe was asked: every record acknowledged before then was in the answer.
    pub asked: Instant,
    /// How long a healthy probe may go without another answer (`check_interval + timeout`).
    pub grace: Duration,
}

/// The last [`Heard`] of a partition, in atomics: the probe of thousands of idle partitions takes no lock.
#[derive(Debug)]
pub struct HeardCell {
    /// When the answered probe was asked, as signed ns from [`clock_base`]; [`NEVER`] before the first answer.
    at: AtomicI64,
    /// Its grace, ns.
    grace: AtomicU64,
}

/// A [`HeardCell`] reading never taken.
const NEVER: i64 = i64::MIN;

impl Default for HeardCell {
    fn default() -> Self {
        clock_base();
        HeardCell { at: AtomicI64::new(NEVER), grace: AtomicU64::new(0) }
    }
}

impl HeardCell {
    /// Keeps `heard` unless a later-asked answer is already kept (rounds may finish out of order).
    pub fn store(&self, heard: Heard) {
        let at = from_base(heard.asked);
        if self.at.fetch_max(at, Ordering::Relaxed) <= at {
            self.grace.store(u64::try_from(heard.grace.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }

    /// The kept answer; `None` before the first.
    pub fn load(&self) -> Option<Heard> {
        let at = self.at.load(Ordering::Relaxed);
        if at == NEVER {
            return None;
        }
        let base = clock_base();
        let asked = match u64::try_from(at) {
            Ok(after) => base + Duration::from_nanos(after),
            // Before the base: as early as the clock can say, never later (an answer dated later reads low).
            Err(_) => base.checked_sub(Duration::from_nanos(at.unsigned_abs())).unwrap_or(base),
        };
        Some(Heard { asked, grace: Duration::from_nanos(self.grace.load(Ordering::Relaxed)) })
    }
}

/// The instant [`HeardCell`] readings count from (so one fits an atomic); set by the first cell.
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// `at` as signed ns from [`clock_base`] (about 292 years either way).
fn from_base(at: Instant) -> i64 {
    let base = clock_base();
    match at.checked_duration_since(base) {
        Some(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        None => i64::try_from(base.duration_since(at).as_nanos()).map_or(NEVER + 1, |d| -d),
    }
}

/// Since when records may have waited unseen: when the last answer (`heard`) was asked, once no answer came for
/// longer than its grace; `None` while the probe is heard in time, or was never heard.
pub fn unheard_since(heard: Option<Heard>, now: Instant) -> Option<Instant> {
    heard.filter(|h| now.saturating_duration_since(h.asked) > h.grace).map(|h| h.asked)
}

/// The RPO at `now`: the time since `waiting_since`.
pub fn rpo(waiting_since: Option<Instant>, now: Instant) -> Duration {
    waiting_since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// One step of a table: what happens at second `at`, and the RPO expected right after, in seconds.
    enum Step {
        Saw(u64),
        Mirrored(u64),
    }

    fn run(steps: &[(u64, Step, u64)]) {
        let t0 = Instant::now();
        let mut c = RpoClock::default();
        for (i, (at, step, want)) in steps.iter().enumerate() {
            let now = t0 + Duration::from_secs(*at);
            match step {
                Step::Saw(end) => c.saw_end(*end, now),
                Step::Mirrored(offset) => c.mirrored_to(*offset, now),
            }
            let got = rpo(c.waiting_since(c.mirrored), now);
            assert_eq!(got, Duration::from_secs(*want), "step {i} at {at}s");
        }
    }

    #[test]
    fn the_clock_follows_the_oldest_waiting_record() {
        use Step::*;
        run(&[
            // Caught up at 10: nothing waits, however often the same end is seen.
            (0, Mirrored(10), 0),
            (1, Saw(10), 0),
            (5, Saw(10), 0),
            // Record 10 appears at 6 s; records 11 and 12 at 8 s and 9 s.
            (6, Saw(11), 0),
            (8, Saw(12), 2),
            (9, Saw(13), 3),
            // A lower or equal end seen later (a stale reading) changes nothing.
            (10, Saw(12), 4),
            // Record 10 is copied: record 11 is the oldest, waiting since 8 s.
            (11, Mirrored(11), 3),
            (12, Mirrored(13), 0),
            (20, Saw(13), 0),
        ]);
    }

    #[test]
    fn an_unheard_partition_counts_from_the_last_answered_probe_once_past_the_grace() {
        let t0 = Instant::now();
        let heard = Heard { asked: t0 + S, grace: 2 * S };
        assert_eq!(unheard_since(None, t0 + 100 * S), None, "never heard: only the marks count");
        assert_eq!(unheard_since(Some(heard), t0 + 2 * S), None, "within the grace");
        assert_eq!(unheard_since(Some(heard), t0 + 3 * S), None, "exactly the grace is still in time");
        let late = t0 + 3 * S + Duration::from_millis(1);
        assert_eq!(unheard_since(Some(heard), late), Some(t0 + S), "past it: since the answered probe was asked");
        assert_eq!(rpo(unheard_since(Some(heard), t0 + 7 * S), t0 + 7 * S), 6 * S);
    }

    #[test]
    fn a_heard_cell_keeps_the_latest_asked_answer_also_from_before_its_base() {
        let cell = HeardCell::default();
        assert_eq!(cell.load(), None);
        let now = Instant::now();
        // Before the clock's base (an answer asked before the first cell): kept exactly, not moved later.
        let early = Heard { asked: now - 10 * S, grace: S };
        cell.store(early);
        assert_eq!(cell.load(), Some(early));
        let later = Heard { asked: now + S, grace: 2 * S };
        cell.store(later);
        cell.store(early);
        assert_eq!(cell.load(), Some(later), "an answer asked earlier, kept after a later one, changes nothing");
    }

    #[test]
    fn a_cache_offset_that_moves_back_makes_records_wait_again_from_now() {
        use Step::*;
        run(&[
            (0, Saw(10), 0),
            (4, Mirrored(10), 0),
            (5, Saw(12), 0),
            // The target lost offsets 6..10 (a lost async tail): they wait again from 7 s; 10 and 11 since 5 s.
            (7, Mirrored(6), 2),
            (8, Mirrored(10), 3),
            (9, Mirrored(12), 0),
        ]);
    }

    #[test]
    fn marks_are_bounded_and_merging_only_reads_high() {
        let t0 = Instant::now();
        let mut c = RpoClock::default();
        for i in 1..=1000u64 {
            c.saw_end(i, t0 + Duration::from_secs(i));
            assert!(c.marks.len() <= MARKS);
        }
        // Record 500 (first seen at 501 s) is the oldest after 500 are copied: a merged mark may say earlier, by at
        // most about twice the waiting time over MARKS.
        c.mirrored_to(500, t0 + Duration::from_secs(1000));
        let since = c.waiting_since(500).unwrap();
        assert!(since <= t0 + 501 * S, "never low");
        assert!(since >= t0 + 501 * S - 2 * 1000 / MARKS as u32 * S, "high by {:?}", t0 + 501 * S - since);
    }

    #[test]
    fn case_9_a_sighting_dated_by_the_sources_own_clock_reads_earlier_and_no_timestamp_shortens_it() {
        let t0 = Instant::now();
        let mut c = RpoClock::default();
        // The probe at 30 s reads end 10, which the source says it reached 20 s earlier: records below 10 have
        // waited 20 s at least, whatever their producers stamped on them.
        c.saw_end(10, t0 + 30 * S - 20 * S);
        assert_eq!(rpo(c.waiting_since(0), t0 + 30 * S), 20 * S);
        assert_eq!(rpo(None, t0 + 30 * S), Duration::ZERO);
    }
}
