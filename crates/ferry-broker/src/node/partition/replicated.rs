//! The replicated partition's part of [`Partition`]: reads capped at the high watermark, role changes between
//! writes, and a follower's truncation.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use ferry_batch::{BatchHeader, BatchIter};
use ferry_storage::{ReadResult, StorageError};

use super::Partition;
use crate::error::{BrokerError, Result};
use crate::node::producer_state::ProducerStates;
use crate::node::replica::PartitionState;
use crate::node::replica::{Leading, NotLeading};

impl Partition {
    /// A client's read of a replicated partition, up to `end`, what the leader's rules allow
    /// (`cluster::serving::read` decides it): `Ok(Some(end))` reads below `end`; `Ok(None)` serves nothing new yet
    /// (an offset up to the log end waits, it is not out of range); `Err` refuses. Batches end at a batch
    /// boundary at or below `end` (every replica's log end is one).
    pub fn read_within(&self, offset: u64, max_bytes: u64, end: Result<Option<u64>>) -> Result<ReadResult> {
        let leo = self.log.log_end_offset();
        let log_start = self.log.log_start_offset();
        let hw = self.replica.as_ref().map_or(leo, |r| r.hw().min(leo));
        let empty = |end: u64| ReadResult {
            batches: Bytes::new(),
            next_offset: offset,
            log_start_offset: log_start,
            log_end_offset: end,
            epoch: self.log.epoch(),
        };
        match end? {
            None if offset <= leo && offset >= log_start => Ok(empty(hw)),
            Some(end) if offset >= end && offset <= leo => Ok(empty(end)),
            None => self.read_log(offset, max_bytes),
            Some(end) => {
                let mut r = self.read_log(offset, max_bytes)?;
                cut_at(&mut r, offset, end);
                Ok(r)
            }
        }
    }

    /// The NOT_LEADER error of this partition, naming who this replica thinks leads.
    pub fn not_leader_error(&self, n: NotLeading) -> BrokerError {
        self.not_leader(n)
    }

    pub(super) fn not_leader(&self, n: NotLeading) -> BrokerError {
        BrokerError::NotLeader {
            topic: self.topic.clone(),
            partition: self.index,
            leader: n.leader,
            address: n.address,
            epoch: n.epoch,
        }
    }

    /// Makes this replica the leader at `state`'s epoch (see [`Replica::become_leader`]), between writes. After an
    /// unclean election at this epoch (`state.unclean_epoch`), a new leader first starts a new partition epoch, so
    /// that a mirror downstream sees the history change.
    pub async fn become_leader(&self, state: &PartitionState, revision: i64) -> Result<()> {
        let Some(r) = &self.replica else { return Ok(()) };
        let _writes = self.writer.lock().await;
        let (r, log, state) = (Arc::clone(r), Arc::clone(&self.log), state.clone());
        let (topic, index) = (self.topic.clone(), self.index);
        tokio::task::spawn_blocking(move || {
            let new_leader = r.leading().map_or(true, |l| l.epoch != state.leader_epoch);
            if new_leader && state.unclean_epoch == Some(state.leader_epoch) {
                let epoch = log.bump_epoch().map_err(|e| BrokerError::storage(&topic, index, e))?;
                tracing::warn!(
                    event = "unclean_leader",
                    topic,
                    partition = index,
                    leader_epoch = state.leader_epoch,
                    partition_epoch = epoch,
                    "leading after an unclean election: records only the lost leader had are gone, and a new \
                     partition epoch starts here"
                );
            }
            r.become_leader(&**log.file_system(), &state, revision, log.log_end_offset())
        })
        .await
        .map_err(|e| BrokerError::Internal(format!("leader change task failed: {e}")))?
    }

    /// Makes this replica a follower of `leader` (at `address`) at `epoch`, between writes.
    pub async fn become_follower(&self, leader: u32, epoch: u32, address: String) {
        if let Some(r) = &self.replica {
            let _writes = self.writer.lock().await;
            r.become_follower(leader, epoch, address);
        }
    }

    /// A follower's truncation to the batch boundary at or below `offset` (KIP-101): the log, the leader-epoch
    /// history past it and the high watermark; the producer state is rebuilt from what stays. Returns the new log
    /// end offset.
    pub async fn truncate_replica(&self, offset: u64) -> Result<u64> {
        let mut producers = self.writer.lock().await;
        let (leo, rebuilt) = self.cut(offset, &producers).await?;
        *producers = rebuilt;
        if let Some(r) = &self.replica {
            r.truncate_epochs(&**self.log.file_system(), leo)?;
            if r.hw() > leo {
                r.reset_hw(leo);
            }
        }
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        Ok(leo)
    }

    /// The mirror's truncation of a replicated partition, by its leader: a new leader epoch starts at the new log
    /// end, so every follower truncates to it as well when it reconciles with the new epoch (KIP-101). `bump`
    /// writes the new epoch to etcd (a compare-and-swap on this leader's state) and returns it with the state's
    /// revision; it runs under the write lock and before the log is cut, so the old epoch's followers are fenced
    /// first and no write slips in between.
    pub async fn truncate_leading<F, Fut>(&self, offset: u64, bump: F) -> Result<u64>
    where
        F: FnOnce(Leading) -> Fut,
        Fut: Future<Output = Result<(u32, i64)>>,
    {
        let Some(replica) = self.replica.clone() else { return self.truncate(offset).await };
        let mut producers = self.writer.lock().await;
        let l = replica.leading().map_err(|n| self.not_leader(n))?;
        let (epoch, revision) = bump(l.clone()).await?;
        let (leo, rebuilt) = self.cut(offset, &producers).await?;
        *producers = rebuilt;
        let fs = self.log.file_system();
        replica.truncate_epochs(&**fs, leo)?;
        if replica.hw() > leo {
            replica.reset_hw(leo);
        }
        let state = PartitionState { leader_epoch: epoch, ..l.state.clone() };
        replica.become_leader(&**fs, &state, revision, leo)?;
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        Ok(leo)
    }

    /// Truncates the log to the batch boundary at or below `offset` and rebuilds the producer state from what
    /// stays (the last two segments, as at start-up). The caller holds the write lock.
    async fn cut(&self, offset: u64, producers: &ProducerStates) -> Result<(u64, ProducerStates)> {
        let log = Arc::clone(&self.log);
        let mut rebuilt = ProducerStates::new(producers.settings());
        tokio::task::spawn_blocking(move || -> Result<(u64, ProducerStates), StorageError> {
            let leo = log.truncate_to(offset)?;
            let bases = log.segment_base_offsets();
            let from = bases.len().checked_sub(2).map_or(0, |i| bases[i]);
            log.for_each_batch_header(from, &mut |h: &BatchHeader| rebuilt.record(h, h.base_offset, h.last_offset()))?;
            Ok((leo, rebuilt))
        })
        .await
        .map_err(|e| BrokerError::Internal(format!("truncate task failed: {e}")))?
        .map_err(|e| self.err(e))
    }
}

/// Cuts a read from `offset` at `end` (a batch boundary: every replica's log end is one): only the batches that
/// end below it stay.
fn cut_at(r: &mut ReadResult, offset: u64, end: u64) {
    let mut keep = 0;
    let mut next = offset;
    for item in BatchIter::new(&r.batches) {
        let Ok((header, bytes)) = item else { break };
        if header.last_offset() >= end {
            break;
        }
        keep += bytes.len();
        next = header.last_offset() + 1;
    }
    r.batches = r.batches.slice(..keep);
    r.next_offset = next;
    r.log_end_offset = end;
}
