//! The resume rule (the target is the truth: resume at its log end after comparing its last batch with the
//! source's, or position an empty target) and the epoch checks (where the last copied epoch ended on the source).

use super::*;

impl PartitionCore {
    pub(super) fn on_resume(&mut self, facts: ResumeFacts) {
        let ResumeFacts { target, committed, source_earliest, source_latest } = facts;
        self.target_log_end = Some(target.log_end);
        if target.has_position() {
            self.cache = target.log_end;
            self.copied_epoch = target.last_epoch;
            self.checked_epoch = target.last_epoch.unwrap_or(0);
            if target.log_end > target.log_start {
                self.phase = Phase::Verifying;
                self.send(Request::CompareTail { at: target.log_end - 1 }, Purpose::Tail);
            } else {
                self.start_mirroring(target.log_end, target.last_epoch);
            }
            return;
        }
        // Nothing on the target: no epoch was copied (a truncation may have removed every batch of the old one).
        self.copied_epoch = None;
        self.checked_epoch = 0;
        let start = match committed {
            Some(c) if c > 0 => {
                let reason = format!(
                    "target partition {} is empty although the mirror had committed offset {c} for {}: the target \
                     lost data; copying it again from the earliest source offset {source_earliest}",
                    self.config.target, self.config.tp
                );
                self.emit(CoreEvent::SyncError { reason, code: None });
                source_earliest
            }
            _ if self.config.first_run_latest => source_latest,
            _ => source_earliest,
        };
        if start > 0 {
            self.phase = Phase::Positioning;
            self.send(Request::Jump { to: start }, Purpose::Position { to: start });
        } else {
            self.start_mirroring(0, None);
        }
    }

    pub(super) fn on_tail(&mut self, facts: TailFacts) {
        let at = self.cache;
        let (Some(target), Some(source)) = (facts.target, facts.source) else {
            // Nothing to compare: the source no longer holds that offset (its position is checked as it comes), or
            // a side cannot say.
            self.start_mirroring(at, self.copied_epoch);
            return;
        };
        if (target.base, target.last, target.epoch, target.crc) == (source.base, source.last, source.epoch, source.crc)
        {
            self.start_mirroring(at, self.copied_epoch);
            return;
        }
        // Different boundaries are fine where the mirror split a batch: the records must match one by one.
        let differs = target.records.iter().find(|t| {
            source.records.iter().find(|s| s.offset == t.offset).is_none_or(|s| {
                (s.timestamp, &s.key, &s.value, &s.headers) != (t.timestamp, &t.key, &t.value, &t.headers)
            })
        });
        let (at, reason) = match differs {
            None if target.epoch == source.epoch => {
                self.start_mirroring(at, self.copied_epoch);
                return;
            }
            None => (
                target.base,
                format!(
                    "the target's last batch (offsets {}..={}) has epoch {} where the source's has {}",
                    target.base, target.last, target.epoch, source.epoch
                ),
            ),
            Some(r) => (
                r.offset,
                format!(
                    "the target holds a different record at offset {} than the source (its last batch, offsets \
                     {}..={}, does not match the source's)",
                    r.offset, target.base, target.last
                ),
            ),
        };
        if source.epoch > target.epoch {
            // The source wrote that offset in a newer epoch: where the target's epoch ended on the source is the
            // exact divergence point (the last batch only shows that there is one).
            self.tail_mismatch = Some((at, reason));
            self.send(Request::EpochEnd { epoch: target.epoch }, Purpose::TailEpoch { seen: source.epoch });
            return;
        }
        self.phase = Phase::Mirroring;
        self.diverged(at, reason, false);
    }

    /// The epoch answer of a tail check that found a mismatch.
    pub(super) fn on_tail_epoch(&mut self, seen: u32, answer: EpochAnswer) {
        let (at, reason) = self.tail_mismatch.take().unwrap_or((self.cache, "the target's tail differs".into()));
        self.phase = Phase::Mirroring;
        match answer {
            EpochAnswer::Found { end, .. } if end < self.cache => self.on_epoch_end(seen, answer),
            EpochAnswer::Before { .. } if self.config.source_kind == SourceKind::Ferry => {
                self.on_epoch_end(seen, answer)
            }
            _ => self.diverged(at, reason, false),
        }
    }

    pub(super) fn start_mirroring(&mut self, cache: u64, copied_epoch: Option<u32>) {
        self.cache = cache;
        if copied_epoch.is_some() {
            self.copied_epoch = copied_epoch;
        }
        self.phase = Phase::Mirroring;
        self.last_error = None;
        self.clear_pending();
        self.reseat();
    }

    /// Starts over from the target (after a truncation, a resync or an operator's resume of a halted partition).
    pub(super) fn restart(&mut self) {
        self.cancel();
        self.clear_pending();
        self.jump_to = None;
        self.epoch_due = None;
        self.phase = Phase::Resolving;
        self.actions.push(Action::Seat(None));
        self.send(Request::ReadResume, Purpose::Resume);
    }

    pub(super) fn target_lost(&mut self, log_end: u64) {
        let cache = self.cache;
        self.target_log_end = Some(log_end);
        self.emit(CoreEvent::TargetLost { log_end, cache });
        self.restart();
    }

    pub(super) fn on_epoch_end(&mut self, seen: u32, answer: EpochAnswer) {
        let copied = self.copied_epoch.unwrap_or(0);
        match answer {
            EpochAnswer::Found { end, .. } if end < self.cache => {
                let reason = format!(
                    "source epoch {copied} ends at offset {end}, below the cache offset {}: the source lost and reused \
                     offsets the target already holds (source epoch now {seen})",
                    self.cache
                );
                self.diverged(end, reason, false);
            }
            EpochAnswer::Before { first } if self.config.source_kind == SourceKind::Ferry => {
                let reason = format!(
                    "the source no longer knows epoch {copied}, in which the target's last batch was written (its \
                     history starts at offset {first}): the source lost that epoch's records"
                );
                self.diverged(first.min(self.cache), reason, false);
            }
            _ => {
                self.checked_epoch = self.checked_epoch.max(seen);
                if self.epoch_due.is_some_and(|d| d <= self.checked_epoch) {
                    self.epoch_due = None;
                }
            }
        }
    }
}
