//! What a core shows of itself: its view, and what its lane publishes to the partition's status.

use super::{CoreView, PartitionCore, Phase};
use crate::state::{PartitionState, Snapshot};

impl PartitionCore {
    /// A snapshot for the monitor.
    pub fn view(&self) -> CoreView {
        CoreView {
            phase: self.phase.clone(),
            paused: self.paused,
            cache: self.cache,
            target_log_end: self.target_log_end,
            source: self.source.clone(),
            last_error: self.last_error.clone(),
            pending_bytes: self.pending_bytes,
        }
    }

    /// What the monitor shows of the partition (see [`crate::state::PartitionStatus::publish`]), with `retrying`
    /// (the failure being retried) as the error when the core has none. The fields of [`PartitionCore::view`] it
    /// needs, read in place: a lane publishes after every wake.
    pub fn published(&self, retrying: Option<&String>) -> Snapshot {
        let state = match (&self.phase, self.paused) {
            (Phase::Halted(_), _) => PartitionState::Halted,
            (_, true) => PartitionState::Paused,
            (Phase::Mirroring, false) => PartitionState::Mirroring,
            _ => PartitionState::Starting,
        };
        Snapshot {
            state,
            cache: self.cache,
            source_log_start: self.source.log_start,
            source_log_end: self.source.log_end,
            target_log_end: self.target_log_end,
            last_error: self.last_error.as_ref().or(retrying).cloned(),
        }
    }

    /// Bytes fetched and not yet appended.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }
}
