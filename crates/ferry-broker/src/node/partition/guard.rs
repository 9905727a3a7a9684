//! A partition's write guard: the topic's fence (read-only at a fence epoch, for a failover's drain) and its
//! promotion floor (the partition epoch the first local write after a promotion starts at). Both come from the
//! topic's metadata (a single broker's topic file, or the cluster catalog's record) and are checked under the write
//! lock, so once [`Partition::set_guard`] returns no write slips past a fence and the log end it answers is final.

use ferry_storage::StorageError;

use super::Partition;
use crate::error::{BrokerError, Result};
use crate::node::topic::{Fence, TopicMeta};

/// What the topic's metadata says about writes to this partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteGuard {
    /// Set while the topic is fenced.
    pub fence: Option<Fence>,
    /// A promotion's partition epoch floor (0: none).
    pub epoch_floor: u32,
}

impl WriteGuard {
    /// The guard a topic's metadata sets.
    pub fn of(meta: &TopicMeta) -> WriteGuard {
        WriteGuard { fence: meta.fence.clone(), epoch_floor: meta.promote_epoch.unwrap_or(0) }
    }
}

impl Partition {
    /// The partition with `guard` set, as it opens (before any write).
    pub fn with_guard(self, guard: WriteGuard) -> Partition {
        *self.guard.write() = guard;
        self
    }

    /// Sets the guard between writes. Returns the log end offset at that moment: with a fence set, nothing is
    /// written past it until the fence is lifted.
    pub async fn set_guard(&self, guard: WriteGuard) -> u64 {
        let _writes = self.writer.lock().await;
        *self.guard.write() = guard;
        self.log.log_end_offset()
    }

    /// The guard in force.
    pub fn guard(&self) -> WriteGuard {
        self.guard.read().clone()
    }

    /// Refuses a write to a fenced topic, called under the write lock before anything else is judged: a fenced
    /// topic refuses every writer, leader or not.
    pub(super) fn admit(&self) -> Result<()> {
        if let Some(f) = &self.guard.read().fence {
            return Err(BrokerError::TopicFenced {
                topic: self.topic.clone(),
                epoch: f.epoch,
                reason: f.reason.clone(),
            });
        }
        Ok(())
    }

    /// After a promotion, the first write (once this broker may take it) raises the log's epoch to the floor
    /// first, durably, so what is written here from now on is told apart from the mirrored history by its epoch.
    pub(super) fn raise_to_floor(&self) -> Result<()> {
        let floor = self.guard.read().epoch_floor;
        if floor > self.log.epoch() {
            let epoch = self.log.raise_epoch(floor).map_err(|e: StorageError| self.err(e))?;
            tracing::info!(
                topic = self.topic,
                partition = self.index,
                epoch,
                "first write after a promotion: new partition epoch"
            );
        }
        Ok(())
    }
}
