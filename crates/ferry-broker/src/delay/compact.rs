//! Freeing the delay store's disk: once every record of a sealed segment is finished with (fired and marked
//! fired, or cancelled), the owner deletes the segment. The lowest offset the partition still needs
//! ([`PartState::floor`]) is the lowest of its pending entries' ids and its unfinished firings' records; the whole
//! sealed segments below it go.
//!
//! What a replay cannot rebuild once they are gone (each stream's next firing number, which keys the idempotent
//! move, and each producer's last batch, which deduplicates a retried produce) is first written again as one
//! *snapshot* record above them, acknowledged by the in-sync replicas. A replay from the new log start skips the
//! cancel and intent entries naming ids below it (those were never counted).
//!
//! The cost of this scheme, as with any log-structured delay store: one record pending for long holds its segment
//! and every later one until it fires or is cancelled (docs/messaging.md, "Delay").

use std::sync::Arc;

use super::codec::{StoreRecord, encode};
use super::partition::PartState;
use super::{Delays, now_ms};
use crate::error::{BrokerError, Result};
use crate::state::{Entry, Owned};

/// How often an owner looks for segments to free, ms.
const CHECK_EVERY_MS: i64 = 1_000;

/// The key of a snapshot record.
const SNAPSHOT_KEY: &[u8] = b"__snapshot";

impl Delays {
    /// Deletes the sealed segments of `owned` that hold nothing still needed, after writing a snapshot above them.
    pub(super) async fn maybe_compact(&self, owned: &Owned, state: &mut PartState) -> Result<()> {
        let now = now_ms();
        if now - state.compact_checked_ms < CHECK_EVERY_MS {
            return Ok(());
        }
        state.compact_checked_ms = now;
        let log = Arc::clone(owned.part.log());
        let bases = log.segment_base_offsets();
        let floor = state.floor(log.log_end_offset());
        // Only when a whole sealed segment lies below what is still needed.
        if bases.len() < 2 || bases[1] > floor {
            return Ok(());
        }
        let snapshot = Entry { key: SNAPSHOT_KEY.into(), value: encode(&StoreRecord::Snapshot(state.snapshot())) };
        self.logs.append(owned, &[snapshot]).await?;
        let topic = owned.part.topic().to_owned();
        let k = owned.k;
        let deleted = tokio::task::spawn_blocking(move || {
            let n = log.delete_segments_before(floor)?;
            Ok::<_, ferry_storage::StorageError>((n, log.log_start_offset()))
        })
        .await
        .map_err(|e| BrokerError::Internal(format!("the delay compaction task failed: {e}")))?
        .map_err(|e| BrokerError::storage(&topic, k, e))?;
        state.log_start = deleted.1;
        tracing::info!(partition = k, segments = deleted.0, log_start = deleted.1, "delay store compacted");
        Ok(())
    }
}
