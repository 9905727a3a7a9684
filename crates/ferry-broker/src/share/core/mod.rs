//! The decisions of the message models, without I/O or clocks: which records a member may take now, how a settled
//! record moves a partition's progress, and when a failed record is retried or dead-lettered. Times are given.
//!
//! A queue or serial group's progress in one partition is its `start` (the lowest offset not settled) and the
//! records at or above it that have a state (delivered at least once, failed, or settled out of order). Only records
//! below `start + window` are delivered, so that state stays bounded by the window.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The default lock timeout, ms.
pub const DEFAULT_LOCK_MS: u64 = 30_000;
/// The default window, records per partition.
pub const DEFAULT_WINDOW: u32 = 2_000;
/// The default retries (attempts after the first), as RocketMQ's 16.
pub const DEFAULT_RETRIES: u32 = 16;
/// The default backoff, ms: 1 s, 5 s, 10 s, 30 s, 1 m, 2 m, 5 m, then 10 m for every later attempt.
pub const DEFAULT_BACKOFF_MS: &[u64] = &[1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000];
/// Bounds a client may ask for.
pub const LOCK_MS_RANGE: (u64, u64) = (100, 3_600_000);
/// Bounds on the window.
pub const WINDOW_RANGE: (u32, u32) = (1, 100_000);
/// Most retries a policy or a record may ask for.
pub const MAX_RETRIES: u32 = 1_000;
/// Most steps in a backoff policy, and the longest step (a day).
pub const MAX_BACKOFF_STEPS: usize = 64;
/// The longest backoff step, ms.
pub const MAX_BACKOFF_MS: u64 = 86_400_000;

/// A group's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Every member receives every record from its own position.
    Broadcast,
    /// Any member takes any record, locked to it; each record succeeds once.
    Queue,
    /// One active member takes the records in order.
    Serial,
}

impl Mode {
    /// The name operators see.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Broadcast => "broadcast",
            Mode::Queue => "queue",
            Mode::Serial => "serial",
        }
    }
}

/// A group's settings, fixed by its first join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The model.
    pub mode: Mode,
    /// How long a delivered record stays locked, ms.
    pub lock_ms: u64,
    /// Most unsettled records per partition.
    pub window: u32,
    /// The backoff steps, ms.
    pub backoff_ms: Vec<u64>,
    /// Retries (attempts after the first) for a record that names none.
    pub retries: u32,
}

impl Settings {
    /// The wait after failed attempt `attempt` (1-based): the policy's step for it, the last step past the end.
    pub fn backoff(&self, attempt: u32) -> u64 {
        let steps = if self.backoff_ms.is_empty() { DEFAULT_BACKOFF_MS } else { &self.backoff_ms };
        let i = (attempt.max(1) as usize - 1).min(steps.len() - 1);
        steps[i]
    }
}

/// Checks what a join asks for; the error names the field and its bounds.
pub fn check_settings(lock_ms: u64, window: u32, backoff_ms: &[u64], retries: u32) -> Result<(), String> {
    if !(LOCK_MS_RANGE.0..=LOCK_MS_RANGE.1).contains(&lock_ms) {
        return Err(format!("lock_timeout_ms {lock_ms} is outside {}..={}", LOCK_MS_RANGE.0, LOCK_MS_RANGE.1));
    }
    if !(WINDOW_RANGE.0..=WINDOW_RANGE.1).contains(&window) {
        return Err(format!("window {window} is outside {}..={}", WINDOW_RANGE.0, WINDOW_RANGE.1));
    }
    if backoff_ms.len() > MAX_BACKOFF_STEPS {
        return Err(format!("the retry backoff has {} steps, above {MAX_BACKOFF_STEPS}", backoff_ms.len()));
    }
    if let Some(b) = backoff_ms.iter().find(|b| **b > MAX_BACKOFF_MS) {
        return Err(format!("a retry backoff step of {b} ms is above a day ({MAX_BACKOFF_MS} ms)"));
    }
    if retries > MAX_RETRIES {
        return Err(format!("retries {retries} is above {MAX_RETRIES}"));
    }
    Ok(())
}

/// What is known of one record at or above a partition's start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rec {
    /// Deliveries so far.
    pub deliveries: u32,
    /// Not to be delivered before this time, ms (a retry's backoff).
    pub not_before_ms: i64,
    /// Failed at least once.
    pub failures: u32,
    /// First and last failure times, ms.
    pub first_fail_ms: i64,
    /// Last failure time, ms.
    pub last_fail_ms: i64,
    /// The last failure's error text.
    pub last_error: String,
    /// Settled: succeeded or dead-lettered.
    pub done: bool,
    /// Dead-lettered (with `done`).
    pub dead: bool,
}

/// A delivered record's lock (kept in memory only: a new owner starts with none, and the record is NEW again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// The member holding it.
    pub member: String,
    /// When it ends, ms.
    pub until_ms: i64,
    /// The retries the record allows (its own header's, or the group's).
    pub retries: u32,
}

/// A queue or serial group's progress in one partition.
#[derive(Debug, Clone, Default)]
pub struct Part {
    /// The lowest offset not settled.
    pub start: u64,
    /// Records at or above `start` with a state.
    pub recs: BTreeMap<u64, Rec>,
    /// Records locked now (memory only).
    pub locks: BTreeMap<u64, Lock>,
}

/// A record's status, as operators see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting for a delivery.
    New,
    /// Failed, waiting for its retry's backoff.
    RetryWait,
    /// Delivered and locked.
    Ing,
    /// Succeeded.
    Success,
    /// Dead-lettered.
    Fail,
}

impl Status {
    /// The name operators see.
    pub fn name(self) -> &'static str {
        match self {
            Status::New => "NEW",
            Status::RetryWait => "RETRY_WAIT",
            Status::Ing => "ING",
            Status::Success => "SUCCESS",
            Status::Fail => "FAIL",
        }
    }
}

impl Part {
    /// A partition starting at `start`.
    pub fn at(start: u64) -> Part {
        Part { start, ..Part::default() }
    }

    /// Whether `offset` is in the window.
    pub fn in_window(&self, offset: u64, window: u32) -> bool {
        offset >= self.start && offset < self.start.saturating_add(u64::from(window))
    }

    /// Whether `offset` may be delivered now: in the window, not settled, not locked, its backoff over.
    pub fn available(&self, offset: u64, window: u32, now_ms: i64) -> bool {
        if !self.in_window(offset, window) || self.locks.contains_key(&offset) {
            return false;
        }
        self.recs.get(&offset).is_none_or(|r| !r.done && r.not_before_ms <= now_ms)
    }

    /// The first offset at or after `from` a member could take now (`None` when the window holds none):
    /// where a read for a delivery starts.
    pub fn first_available(&self, window: u32, now_ms: i64) -> Option<u64> {
        let end = self.start.saturating_add(u64::from(window));
        (self.start..end).find(|o| self.available(*o, window, now_ms))
    }

    /// Picks from `offsets` (records that exist, ascending) what `member` may take now, at most `max`. A serial
    /// group takes in order: it stops at the first record that is not available (locked, waiting for a retry).
    pub fn pick(&self, offsets: &[u64], window: u32, now_ms: i64, max: usize, serial: bool) -> Vec<u64> {
        let mut out = Vec::new();
        if serial && self.blocked_below(offsets.first().copied().unwrap_or(u64::MAX), now_ms) {
            return out;
        }
        for &o in offsets {
            if out.len() >= max {
                break;
            }
            if self.available(o, window, now_ms) {
                out.push(o);
            } else if serial && self.recs.get(&o).is_none_or(|r| !r.done) {
                break;
            }
        }
        out
    }

    /// Whether a record below `offset` holds a serial group back: locked, or waiting for its retry.
    fn blocked_below(&self, offset: u64, now_ms: i64) -> bool {
        self.locks.range(..offset).next().is_some()
            || self.recs.range(self.start..offset).any(|(_, r)| !r.done && r.not_before_ms > now_ms)
    }

    /// Marks `offsets` delivered (their delivery count raised): the effect of a replayed delivery record.
    pub fn delivered(&mut self, offsets: &[u64]) {
        for &o in offsets {
            if o >= self.start {
                self.recs.entry(o).or_default().deliveries += 1;
            }
        }
    }

    /// Settles `offset` (succeeded or dead-lettered) and moves the start past every settled record.
    pub fn settle(&mut self, offset: u64, dead: bool) {
        self.locks.remove(&offset);
        if offset < self.start {
            return;
        }
        let r = self.recs.entry(offset).or_default();
        r.done = true;
        r.dead = dead;
        self.advance();
    }

    /// Skips the offsets below `offset` that hold no record (a gap in the log, or records the log no longer has).
    pub fn skip_to(&mut self, offset: u64) {
        if offset > self.start {
            self.start = offset;
            self.recs = self.recs.split_off(&offset);
            self.locks = self.locks.split_off(&offset);
        }
    }

    fn advance(&mut self) {
        while self.recs.get(&self.start).is_some_and(|r| r.done) {
            self.recs.remove(&self.start);
            self.start += 1;
        }
    }

    /// Records a failure of `offset` at `now_ms`, to be retried at `not_before_ms`.
    pub fn failed(&mut self, offset: u64, now_ms: i64, not_before_ms: i64, error: &str) {
        self.locks.remove(&offset);
        if offset < self.start {
            return;
        }
        let r = self.recs.entry(offset).or_default();
        r.failures += 1;
        if r.first_fail_ms == 0 {
            r.first_fail_ms = now_ms;
        }
        r.last_fail_ms = now_ms;
        r.last_error = error.to_owned();
        r.not_before_ms = not_before_ms;
    }

    /// Locks that ended by `now_ms`, removed (their records are NEW again, the count already raised).
    pub fn expire_locks(&mut self, now_ms: i64) -> Vec<(u64, String)> {
        let ended: Vec<u64> = self.locks.iter().filter(|(_, l)| l.until_ms <= now_ms).map(|(o, _)| *o).collect();
        ended.into_iter().filter_map(|o| self.locks.remove(&o).map(|l| (o, l.member))).collect()
    }

    /// Releases every lock `member` holds (it left or died).
    pub fn release_member(&mut self, member: &str) -> Vec<u64> {
        let held: Vec<u64> = self.locks.iter().filter(|(_, l)| l.member == member).map(|(o, _)| *o).collect();
        for o in &held {
            self.locks.remove(o);
        }
        held
    }

    /// The status of `offset`.
    pub fn status(&self, offset: u64, now_ms: i64) -> Status {
        if offset < self.start {
            return Status::Success;
        }
        if self.locks.contains_key(&offset) {
            return Status::Ing;
        }
        match self.recs.get(&offset) {
            Some(r) if r.done && r.dead => Status::Fail,
            Some(r) if r.done => Status::Success,
            Some(r) if r.not_before_ms > now_ms => Status::RetryWait,
            _ => Status::New,
        }
    }

    /// Counts: (in flight, failed waiting for a retry, dead-lettered above the start).
    pub fn counts(&self, now_ms: i64) -> (u64, u64, u64) {
        let failed = self.recs.values().filter(|r| !r.done && r.not_before_ms > now_ms).count();
        let dead = self.recs.values().filter(|r| r.dead).count();
        (self.locks.len() as u64, failed as u64, dead as u64)
    }
}

/// What becomes of a record whose holder reports a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// NEW again at this time, ms.
    RetryAt(i64),
    /// To the dead-letter topic.
    DeadLetter,
}

/// Decides a failure: `deliveries` so far, `retries` allowed (the record's own or the group's), an asked wait.
pub fn after_failure(
    settings: &Settings,
    deliveries: u32,
    retries: u32,
    asked_ms: Option<u64>,
    now_ms: i64,
) -> AfterFailure {
    if deliveries > retries {
        return AfterFailure::DeadLetter;
    }
    let wait = asked_ms.unwrap_or_else(|| settings.backoff(deliveries)).min(MAX_BACKOFF_MS);
    AfterFailure::RetryAt(now_ms.saturating_add(wait as i64))
}

/// Whether a record about to be delivered again has used every attempt (its earlier deliveries' locks expired or
/// their members died without an answer): it is dead-lettered instead, so a record that kills its consumers does
/// not circle for ever.
pub fn exhausted(deliveries: u32, retries: u32) -> bool {
    deliveries > retries
}

/// The serial group's active member: the longest-lived (earliest `since`, then smallest id), of `members`
/// (id, since).
pub fn active_member<'a>(members: impl Iterator<Item = (&'a str, u64)>) -> Option<&'a str> {
    members.min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0))).map(|(id, _)| id)
}

#[cfg(test)]
mod tests;
