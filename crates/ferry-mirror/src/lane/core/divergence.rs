//! Divergence (halt or truncate), the target's refusals of an append, failures given up on, and halting.

use super::*;

impl PartitionCore {
    pub(super) fn diverged(&mut self, at: u64, reason: String, force_halt: bool) {
        let policy = if force_halt { OnDivergence::Halt } else { self.config.on_divergence };
        self.emit(CoreEvent::Diverged { at, cache: self.cache, reason: reason.clone(), policy });
        self.cancel();
        self.clear_pending();
        self.jump_to = None;
        match policy {
            OnDivergence::Halt => {
                self.phase = Phase::Halted(format!("diverged at offset {at}: {reason}"));
                self.last_error = Some(format!("diverged at offset {at}: {reason}"));
                self.actions.push(Action::Seat(None));
            }
            OnDivergence::Truncate => {
                self.phase = Phase::Truncating;
                self.actions.push(Action::Seat(None));
                self.send(Request::Truncate { at }, Purpose::Truncate { at });
            }
        }
    }

    pub(super) fn on_refusal(&mut self, outcome: AppendOutcome) {
        match outcome {
            AppendOutcome::Appended { .. } => {}
            AppendOutcome::Diverged { at, message } => {
                self.diverged(at, format!("the target holds different data: {message}"), false)
            }
            AppendOutcome::TopicIdMismatch(message) => self.diverged(self.cache, message, true),
            AppendOutcome::EpochRegressed(message) => self.diverged(self.cache, message, false),
            AppendOutcome::NotAMirrorTopic(_) => self.halt(format!(
                "target topic {} was promoted (it is no longer a mirror topic); mirroring into it stopped",
                self.config.target.topic()
            )),
            AppendOutcome::GapRefused(_) | AppendOutcome::StraddlesEnd(_) => {
                // The target is not where the mirror thought: re-read it (the target is the truth).
                let log_end = self.target_log_end.unwrap_or(self.cache);
                if log_end < self.cache {
                    self.target_lost(log_end);
                } else {
                    self.restart();
                }
            }
            AppendOutcome::Refused { code, message } => self.halt(format!("target error {code}: {message}")),
        }
    }

    pub(super) fn on_failure(&mut self, failure: Failure) {
        match failure {
            // The target topic or partition vanished: discovery re-creates it; then resume from the target.
            Failure::NotFound(message) => {
                self.last_error = Some(format!("target: {message}"));
                self.restart();
            }
            Failure::Refused(message) => self.halt(format!("target refused the batches: {message}")),
        }
    }

    pub(super) fn halt(&mut self, reason: String) {
        self.emit(CoreEvent::Halted { reason: reason.clone() });
        self.cancel();
        self.clear_pending();
        self.jump_to = None;
        self.phase = Phase::Halted(reason.clone());
        self.last_error = Some(reason);
        self.actions.push(Action::Seat(None));
    }
}
