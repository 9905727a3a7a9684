//! A cluster member's side of the registry: the replicated topics placed on it, opened replica by replica, and
//! their catalog records applied to the local metadata.

use std::path::Path;
use std::sync::Arc;

use super::{BrokerCore, DELETED_PREFIX, Topic};
use crate::error::{BrokerError, Result};
use crate::node::partition::Partition;
use crate::node::topic::TopicMeta;

impl BrokerCore {
    /// Creates this broker's topic `name` of the replicated topic `record` describes, with no replica opened yet,
    /// unless it exists (see [`BrokerCore::open_replica`]).
    pub async fn ensure_replicas(&self, name: &str, record: &TopicMeta) -> Result<Arc<Topic>> {
        let _admin = self.admit(name).await;
        if let Some(existing) = self.topics.read().get(name) {
            return Ok(Arc::clone(existing));
        }
        self.materialize(record.clone(), Vec::new(), None).await
    }

    /// Opens this member's replica `p` of the replicated topic `name` (a partition placed on it), unless it is
    /// open.
    pub async fn open_replica(&self, name: &str, p: u32) -> Result<Arc<Partition>> {
        let topic = self.topic(name)?;
        if let Ok(part) = topic.partition(p) {
            return Ok(part);
        }
        let _admin = self.admit(name).await;
        if let Ok(part) = topic.partition(p) {
            return Ok(part);
        }
        if p >= topic.partition_count() {
            return Err(BrokerError::UnknownPartition {
                topic: name.to_owned(),
                partition: p,
                count: topic.partition_count(),
            });
        }
        let meta = topic.meta();
        let (dir, open) = (topic.dir.clone(), self.partition_opener());
        let part = tokio::task::spawn_blocking(move || open(&meta, &dir, &[p]))
            .await
            .map_err(|e| BrokerError::Internal(e.to_string()))??
            .pop()
            .ok_or_else(|| BrokerError::Internal("opening a replica answered nothing".into()))?;
        topic.partitions.write()[p as usize] = Some(Arc::clone(&part));
        tracing::info!(topic = name, partition = p, "replica opened on this member");
        Ok(part)
    }

    /// Closes and removes this member's replica `p` of replicated topic `name` (a move took it elsewhere): its
    /// slot empties and its directory goes.
    pub async fn remove_replica(&self, name: &str, p: u32) -> Result<()> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        let Some(part) = topic.partitions.write().get_mut(p as usize).and_then(Option::take) else { return Ok(()) };
        let (dir, fs) = (topic.dir.join(p.to_string()), self.fs.clone());
        let trash = topic.dir.join(format!("{DELETED_PREFIX}{p}"));
        let parent = topic.dir.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let _ = part.log().close();
            let io = |path: &Path| {
                let path = path.to_owned();
                move |source| BrokerError::Io { path, source }
            };
            fs.rename(&dir, &trash).map_err(io(&dir))?;
            fs.sync_dir(&parent).map_err(io(&parent))?;
            fs.remove_dir_all(&trash).map_err(io(&trash))?;
            fs.sync_dir(&parent).map_err(io(&parent))
        })
        .await
        .map_err(|e| BrokerError::Internal(e.to_string()))??;
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    /// Takes a replicated topic's config, mirror mark, promotion and fence from its catalog `record` into the local
    /// metadata, when they differ. Returns whether anything changed.
    pub async fn apply_catalog(&self, name: &str, record: &TopicMeta) -> Result<bool> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        let mut meta = topic.meta();
        let before = meta.clone();
        meta.settings = record.settings.clone();
        meta.mirror = record.mirror.clone();
        meta.promoted_ms = record.promoted_ms;
        meta.fence = record.fence.clone();
        meta.promote_epoch = record.promote_epoch;
        if meta == before {
            return Ok(false);
        }
        self.replace_meta(&topic, meta).await?;
        Ok(true)
    }
}
