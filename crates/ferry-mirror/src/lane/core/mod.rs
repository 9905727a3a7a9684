//! The decision core of one mirrored partition: every rule of the mirror (design §4, the target is the truth),
//! with no I/O.
//!
//! The shape is tikv/raft-rs's `RawNode`: the driver feeds [`Input`]s to [`PartitionCore::step`], takes the
//! [`Action`]s it produced with [`PartitionCore::take_actions`], performs them, and feeds the answers back. The
//! core holds the partition's one copy of its state: its phase, the operator's pause, the cache offset, the
//! pending batches, the epochs it has checked and the last source position. At most one request is outstanding;
//! each carries an id, and the answer of a request the core has given up on (a resync, a halt) is ignored.
//!
//! The rules, each with table-driven tests in `tests/`:
//! - **Resume** (target is the truth): a target partition with data or a recorded start resumes at its log end,
//!   after its last batch is compared with the source's (a target holding other data diverges). An empty one
//!   starts at the source's log end on the mirror's very first run with `start_position = latest`, else at the
//!   source's log start; if the source group shows progress although the target is empty, the target lost data:
//!   `sync_error`, and the partition is copied again from the source's log start.
//! - **Append**: batches go in order, contiguous from the cache offset, one epoch per request; a batch partly on
//!   the target or larger than the target's `max_batch_bytes` is re-encoded (split) keeping every offset; the cache
//!   offset moves only when the target acknowledged.
//! - **Present / DIVERGED**: the target decides what is already there; `DIVERGED` diverges at its offset.
//! - **Gaps**: source retention whose log start passed what the partition holds (seen in a fetch's
//!   `OFFSET_OUT_OF_RANGE`, a stream position, or the independent probe) raises `data_lost_before_mirroring` for
//!   exactly the offsets deleted, once, at once (also while paused or while the target is down); fetching stops so
//!   nothing of that range still in flight is taken in, and the target records the same range as a gap after the
//!   pending batches; a batch that starts above the cache offset is a gap inside the source log only if the source
//!   confirms it, and stale data otherwise.
//! - **Epochs**: a batch of a newer source epoch than the target's last is appended only after the source says
//!   where the last copied epoch ended; an end below the cache offset diverges, and so does a Ferry source that
//!   no longer knows that epoch.
//! - **Divergence**: a changed source topic id always halts; a source log end below the cache offset, an epoch end
//!   below it and `DIVERGED` halt or truncate (`on_divergence`); truncation re-reads the target and resumes.
//! - **Lost target**: a target log end below the cache offset (seen by a probe or a refused append) resyncs from the
//!   target's log end; a vanished target partition resumes once it exists again.
//! - **Pause**: nothing is appended while paused; positions and data are still taken in.

mod divergence;
mod plan;
mod publish;
mod resume;
#[cfg(test)]
mod tests;
mod types;

use std::collections::VecDeque;

use ferry_client::batch::Batch;

pub use self::types::*;
use crate::cluster::{AppendOutcome, TargetPartition};
use crate::config::OnDivergence;
use crate::lane::budget::Held;

/// A fetched batch waiting to be appended, with the bytes it holds.
#[derive(Debug)]
pub(crate) struct Pending {
    pub batch: Batch,
    pub held: Held,
}

/// Where the partition is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Reading the target (and the source) to decide where to resume.
    Resolving,
    /// An empty target is being positioned at the start point.
    Positioning,
    /// The target's last batch is being compared with the source's.
    Verifying,
    /// Copying (or caught up).
    Mirroring,
    /// The target is being truncated after a divergence.
    Truncating,
    /// Stopped until an operator resumes it.
    Halted(String),
}

/// A snapshot for the monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreView {
    /// The phase.
    pub phase: Phase,
    /// Whether an operator paused it.
    pub paused: bool,
    /// The next offset to copy.
    pub cache: u64,
    /// The target's log end as last read from the target (never the cache offset).
    pub target_log_end: Option<u64>,
    /// The source's position as last seen.
    pub source: SourcePos,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// Bytes of batches waiting.
    pub pending_bytes: u64,
}

/// Why the outstanding request was sent, where the answer alone does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Resume,
    Position {
        to: u64,
    },
    Tail,
    /// Checking that the source epoch `seen` is compatible with the copied one.
    Epoch {
        seen: u32,
    },
    /// Locating the divergence a tail check found, through the source's epoch history.
    TailEpoch {
        seen: u32,
    },
    Gap {
        front: u64,
    },
    /// A jump over a gap, a retention one (`lost` = true) or one inside the source log.
    Jump {
        to: u64,
        lost: bool,
    },
    Append {
        last: u64,
        epoch: u32,
        records: u64,
        bytes: u64,
        max_timestamp: i64,
    },
    Truncate {
        at: u64,
    },
}

/// The decision core of one partition.
#[derive(Debug)]
pub struct PartitionCore {
    config: CoreConfig,
    phase: Phase,
    paused: bool,
    /// Next offset to copy: everything below it was acknowledged by the target.
    cache: u64,
    /// Offset the next fetched batch must reach past to be kept (one past the last pending batch).
    expected: u64,
    pending: VecDeque<Pending>,
    pending_bytes: u64,
    /// Epoch of the target's last batch.
    copied_epoch: Option<u32>,
    /// Highest source epoch known compatible with `copied_epoch`.
    checked_epoch: u32,
    /// A newer source epoch seen and not checked yet.
    epoch_due: Option<u32>,
    source: SourcePos,
    target_log_end: Option<u64>,
    /// Where the source's retention moved its log start past the cache offset: jump there when the pending
    /// batches are appended.
    jump_to: Option<u64>,
    /// The end of the offsets already reported lost before mirroring.
    lost_to: u64,
    /// The seat data must carry; bumped on every re-seat.
    seat: u64,
    outstanding: Option<(u64, Purpose)>,
    next_id: u64,
    last_error: Option<String>,
    /// The source error code last alarmed on, to alarm once per code.
    reported: Option<String>,
    /// Largest append request, in bytes.
    request_limit: u64,
    /// A tail check's mismatch (offset, reason) while its epoch check locates the divergence.
    tail_mismatch: Option<(u64, String)>,
    actions: Vec<Action>,
}

impl PartitionCore {
    /// A core for `config`; it starts by resolving where to resume.
    pub fn new(config: CoreConfig, paused: bool, request_limit: u64) -> PartitionCore {
        let mut core = PartitionCore {
            config,
            phase: Phase::Resolving,
            paused,
            cache: 0,
            expected: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
            copied_epoch: None,
            checked_epoch: 0,
            epoch_due: None,
            source: SourcePos::default(),
            target_log_end: None,
            jump_to: None,
            lost_to: 0,
            seat: 0,
            outstanding: None,
            next_id: 1,
            last_error: None,
            reported: None,
            request_limit: request_limit.max(1),
            tail_mismatch: None,
            actions: Vec::new(),
        };
        core.send(Request::ReadResume, Purpose::Resume);
        core
    }

    /// The actions produced since the last call.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The next offset to copy.
    pub fn cache(&self) -> u64 {
        self.cache
    }

    /// The offset a (re)started fetch of the current seat should start at: past what is pending.
    pub fn fetch_from(&self) -> u64 {
        self.expected
    }

    /// The current seat.
    pub fn seat(&self) -> u64 {
        self.seat
    }

    /// Changes the largest append request (the SyncManager splits `sync.max_memory` over the partitions).
    pub fn set_request_limit(&mut self, bytes: u64) {
        self.request_limit = bytes.max(1);
    }

    /// Whether the partition is halted.
    pub fn is_halted(&self) -> bool {
        matches!(self.phase, Phase::Halted(_))
    }

    /// Takes one input into account.
    pub fn step(&mut self, input: Input) {
        match input {
            Input::Data { seat, batches, held, pos } => {
                if seat == self.seat && self.phase == Phase::Mirroring {
                    self.on_position(pos);
                    self.accept(batches, held);
                } else {
                    self.observe(pos);
                }
            }
            Input::Position(pos) => self.on_position(pos),
            Input::SourceLogStart(log_start) => self.retention_passed(log_start),
            Input::SourceError { fault, message, pos } => self.on_source_error(fault, message, pos),
            Input::Answer { id, answer } => {
                match self.outstanding {
                    Some((current, purpose)) if current == id => {
                        self.outstanding = None;
                        self.on_answer(purpose, answer);
                    }
                    // The answer to a request given up on.
                    _ => {}
                }
            }
            Input::Retrying { id, error } => {
                if self.outstanding.is_some_and(|(current, _)| current == id) {
                    self.last_error = Some(error);
                }
            }
            Input::TargetLogEnd { log_end, cache_before } => self.on_target_log_end(log_end, cache_before),
            Input::Pause => self.paused = true,
            Input::Resume => {
                self.paused = false;
                if self.is_halted() {
                    // Re-check from scratch: a divergence that is still there halts again.
                    self.restart();
                }
            }
        }
        self.schedule();
    }

    // ---- inputs ------------------------------------------------------------------------------------------------

    /// Records the source position without acting on it (halted, or data of an older seat).
    fn observe(&mut self, pos: SourcePos) {
        if pos.log_end > 0 || pos.log_start > 0 || !pos.topic_id.is_empty() {
            self.source = pos;
        }
    }

    fn on_position(&mut self, pos: SourcePos) {
        self.observe(pos);
        if self.phase != Phase::Mirroring {
            return;
        }
        self.reported = None;
        let pos = self.source.clone();
        if !pos.topic_id.is_empty() && pos.topic_id != self.config.topic_id {
            let reason = format!(
                "the source topic was re-created (id {} became {}); the target holds the old topic's records",
                self.config.topic_id, pos.topic_id
            );
            self.diverged(self.cache.min(pos.log_end), reason, true);
            return;
        }
        if pos.log_end < self.cache && self.config.replicated_source && pos.epoch <= self.checked_epoch {
            // A new leader of the source partition serves up to its high watermark, which catches up with the
            // old one's within moments: no divergence (an unclean election starts a new partition epoch instead,
            // which the epoch check below sees). Wait for it.
            self.last_error = Some(format!(
                "waiting for the source's new leader: it serves up to {}, below the cache offset {}",
                pos.log_end, self.cache
            ));
            return;
        }
        if pos.log_end < self.cache {
            let reason = format!(
                "the source log end offset {} is below the cache offset {}: the source lost records the target holds",
                pos.log_end, self.cache
            );
            self.diverged(pos.log_end, reason, false);
            return;
        }
        if pos.epoch > self.checked_epoch {
            self.epoch_due = Some(self.epoch_due.map_or(pos.epoch, |d| d.max(pos.epoch)));
        }
        self.retention_passed(pos.log_start);
    }

    /// The source's log start is `log_start`. Past what the partition holds (the cache offset and the pending
    /// batches), the records in between were deleted before they were mirrored: report them now, once, and stop
    /// fetching, so data of that range still in flight is dropped and the target's gap is exactly what was
    /// reported. The target records it (a jump) once the pending batches are appended.
    fn retention_passed(&mut self, log_start: u64) {
        let held = self.expected.max(self.cache);
        if self.phase != Phase::Mirroring || log_start <= held {
            return;
        }
        if self.jump_to.is_none() {
            self.seat += 1;
            self.actions.push(Action::Seat(None));
        }
        self.jump_to = Some(self.jump_to.map_or(log_start, |j| j.max(log_start)));
        let from = held.max(self.lost_to);
        if log_start > from {
            self.lost_to = log_start;
            self.emit(CoreEvent::DataLost { start: from, end: log_start });
        }
    }

    /// Queues fetched batches, dropping what is already below the expected offset.
    fn accept(&mut self, batches: Vec<Batch>, mut held: Held) {
        for batch in batches {
            let bytes = batch.len() as u64;
            if batch.last_offset() < self.expected {
                drop(held.split(bytes));
                continue;
            }
            self.expected = batch.next_offset();
            self.pending_bytes += bytes;
            let h = held.split(bytes);
            self.pending.push_back(Pending { batch, held: h });
        }
    }

    fn on_source_error(&mut self, fault: SourceFault, message: String, pos: SourcePos) {
        self.observe(pos.clone());
        if self.phase != Phase::Mirroring {
            return;
        }
        // Offsets in an error of a re-created topic say nothing about the mirrored one: it always halts.
        if !pos.topic_id.is_empty() && pos.topic_id != self.config.topic_id {
            let reason = format!(
                "the source topic was re-created (id {} became {}); the target holds the old topic's records",
                self.config.topic_id, pos.topic_id
            );
            self.diverged(self.cache, reason, true);
            return;
        }
        match fault {
            // Source retention deleted records before they were mirrored: carry the gap over.
            SourceFault::OutOfRange if pos.log_start > self.expected => self.retention_passed(pos.log_start),
            SourceFault::OutOfRange if pos.log_end < self.expected => {
                let reason = format!(
                    "the source log end offset {} is below the fetch position {}: the source lost records",
                    pos.log_end, self.expected
                );
                self.diverged(pos.log_end.min(self.cache), reason, false);
            }
            SourceFault::Corrupt => self.halt(format!("the source holds a corrupt batch: {message}")),
            other => {
                let code = match &other {
                    SourceFault::Missing => "UNKNOWN_TOPIC_OR_PARTITION".to_owned(),
                    SourceFault::OutOfRange => "OFFSET_OUT_OF_RANGE".to_owned(),
                    SourceFault::Other(code) => code.clone(),
                    SourceFault::Corrupt => "CORRUPT_BATCH".to_owned(),
                };
                self.last_error = Some(format!("source: {message}"));
                if self.reported.as_deref() != Some(code.as_str()) {
                    self.reported = Some(code.clone());
                    if other != SourceFault::Missing {
                        let reason = format!("source error on {}: {message}", self.config.tp);
                        self.emit(CoreEvent::SyncError { reason, code: Some(code) });
                    }
                }
            }
        }
    }

    fn on_target_log_end(&mut self, log_end: u64, cache_before: u64) {
        if !matches!(self.phase, Phase::Mirroring) {
            return;
        }
        if log_end < cache_before.min(self.cache) {
            self.target_lost(log_end);
        } else if self.outstanding.is_none() {
            self.target_log_end = Some(log_end.max(self.target_log_end.unwrap_or(0)));
        }
    }

    fn on_answer(&mut self, purpose: Purpose, answer: Answer) {
        match (purpose, answer) {
            (Purpose::Resume, Answer::Resume(facts)) => self.on_resume(facts),
            (Purpose::Position { to }, Answer::Appended(result)) => match result {
                Ok(AppendOutcome::Appended { log_end, .. }) => {
                    self.target_log_end = Some(log_end);
                    self.start_mirroring(log_end.max(to), None);
                }
                Ok(other) => self.halt(format!("cannot position the target at offset {to}: {}", other.describe())),
                Err(failure) => self.on_failure(failure),
            },
            (Purpose::Tail, Answer::Tail(facts)) => self.on_tail(facts),
            (Purpose::Epoch { seen }, Answer::EpochEnd(answer)) => self.on_epoch_end(seen, answer),
            (Purpose::TailEpoch { seen }, Answer::EpochEnd(answer)) => self.on_tail_epoch(seen, answer),
            (Purpose::Gap { front }, Answer::Gap(first)) => match first {
                Some((base, topic_id)) if base == front && topic_id == self.config.topic_id => {
                    // A real gap inside the source log: carry it over, then append the batch at its start.
                    self.send(Request::Jump { to: front }, Purpose::Jump { to: front, lost: false });
                }
                _ => {
                    // Fetched from an older position (a fetch in flight when the partition was re-seated).
                    self.clear_pending();
                    self.reseat();
                }
            },
            (Purpose::Jump { to, lost }, Answer::Appended(result)) => match result {
                Ok(AppendOutcome::Appended { log_end, .. }) => {
                    let from = self.cache;
                    self.target_log_end = Some(log_end);
                    self.cache = log_end.max(to).max(self.cache);
                    // Reported when it was seen; only a remainder it did not name is reported now.
                    let start = from.max(self.lost_to);
                    if lost && self.cache > start {
                        self.lost_to = self.cache;
                        self.emit(CoreEvent::DataLost { start, end: self.cache });
                    }
                    if self.pending.front().is_none_or(|p| p.batch.base_offset() < self.cache) || lost {
                        self.clear_pending();
                        self.reseat();
                    }
                }
                Ok(outcome) => self.on_refusal(outcome),
                Err(failure) => self.on_failure(failure),
            },
            (Purpose::Append { last, epoch, records, bytes, max_timestamp }, answer) => {
                let (result, records, bytes) = match answer {
                    Answer::Batches { result, records, bytes } => (result, records, bytes),
                    Answer::Appended(result) => (result, records, bytes),
                    other => {
                        debug_assert!(false, "answer {other:?} does not fit an append");
                        return;
                    }
                };
                match result {
                    Ok(AppendOutcome::Appended { log_end, .. }) => {
                        self.cache = last + 1;
                        self.copied_epoch = Some(epoch);
                        self.checked_epoch = self.checked_epoch.max(epoch);
                        self.target_log_end = Some(log_end);
                        self.last_error = None;
                        self.actions.push(Action::Copied { records, bytes, max_timestamp });
                    }
                    Ok(outcome) => self.on_refusal(outcome),
                    Err(failure) => self.on_failure(failure),
                }
            }
            (Purpose::Truncate { at }, Answer::Truncated(result)) => match result {
                Ok(_) => self.restart(),
                Err(e) => self.halt(format!("diverged at offset {at} and truncation failed: {e}")),
            },
            (purpose, answer) => {
                debug_assert!(false, "answer {answer:?} does not fit {purpose:?}");
            }
        }
    }

    // ---- scheduling --------------------------------------------------------------------------------------------

    /// Issues the next request when none is outstanding.
    fn schedule(&mut self) {
        if self.outstanding.is_some() || self.phase != Phase::Mirroring || self.paused {
            return;
        }
        // A newer source epoch is checked before anything of it is appended (and as soon as it is seen).
        let front_epoch = self.pending.front().map(|p| p.batch.epoch());
        let newer = front_epoch.filter(|&e| e > self.checked_epoch).into_iter().chain(self.epoch_due).max();
        if let Some(seen) = newer {
            match self.copied_epoch {
                Some(copied) if seen > copied => {
                    self.send(Request::EpochEnd { epoch: copied }, Purpose::Epoch { seen });
                    return;
                }
                _ => {
                    self.checked_epoch = self.checked_epoch.max(seen);
                    self.epoch_due = None;
                }
            }
        }
        let Some(front) = self.pending.front().map(|p| p.batch.base_offset()) else {
            if let Some(to) = self.jump_to.take()
                && to > self.cache
            {
                self.send(Request::Jump { to }, Purpose::Jump { to, lost: true });
            }
            return;
        };
        if front > self.cache {
            self.send(Request::ProbeGap { at: self.cache }, Purpose::Gap { front });
            return;
        }
        match plan::plan(self) {
            Ok(Some(p)) => {
                let purpose = Purpose::Append {
                    last: p.last_offset,
                    epoch: p.epoch,
                    records: p.records,
                    bytes: p.bytes,
                    max_timestamp: p.max_timestamp,
                };
                self.send(Request::Append(p), purpose);
            }
            Ok(None) => {}
            Err(reason) => self.halt(reason),
        }
    }

    fn send(&mut self, request: Request, purpose: Purpose) {
        let id = self.next_id;
        self.next_id += 1;
        self.outstanding = Some((id, purpose));
        self.actions.push(Action::Send { id, request });
    }

    fn cancel(&mut self) {
        if self.outstanding.take().is_some() {
            self.actions.push(Action::Cancel);
        }
    }

    fn reseat(&mut self) {
        self.seat += 1;
        self.expected = self.cache;
        self.actions.push(Action::Seat(Some((self.seat, self.cache))));
    }

    fn clear_pending(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.expected = self.cache;
    }

    fn emit(&mut self, event: CoreEvent) {
        self.actions.push(Action::Emit(event));
    }
}

impl TargetPartition {
    /// A target partition at `log_end` holding data from `log_start`.
    pub fn at(log_start: u64, log_end: u64, last_epoch: Option<u32>) -> TargetPartition {
        TargetPartition { log_start, log_end, last_epoch }
    }
}
