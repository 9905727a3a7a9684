//! Replicated topics' shape, through the catalog: creation, config changes, promotion, growth and deletion are
//! each one compare-and-swap in etcd on the topic's record, made by whichever member a client asked. Every member
//! then takes the catalog's record into its replicas at its next beat ([`Replication::sync_topics`]): the local
//! metadata follows the record, new partitions are opened, and a deleted topic's replicas (named by the tombstone
//! of its id) are removed with their committed offsets.

use std::sync::Arc;

use ferry_proto as pb;

use super::Replication;
use crate::cluster::catalog::{self, Replication as Mode, Snapshot};
use crate::cluster::core::placement;
use crate::error::{BrokerError, Result};
use crate::groups::CLUSTER_OFFSETS_TOPIC;
use crate::node::registry::now_ms;
use crate::node::topic::{MirrorMark, TopicMeta, TopicSettings, validate_topic_name};

/// Compare-and-swap attempts of one change before it gives up (each re-reads the catalog).
const ATTEMPTS: usize = 5;

fn unreachable(e: etcd_client::Error) -> BrokerError {
    BrokerError::Cluster(format!("cannot reach etcd: {e}"))
}

impl Replication {
    /// Creates replicated topic `name`: placed over the live brokers and written to the catalog in one
    /// transaction; this broker's replicas are opened before it answers.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        mode: Mode,
        risk_phase: bool,
        settings: TopicSettings,
        mirror: Option<MirrorMark>,
    ) -> Result<pb::TopicInfo> {
        validate_topic_name(name)?;
        check_count(name, partitions)?;
        if risk_phase && mode != Mode::DoubleWrite {
            return Err(BrokerError::InvalidArgument(format!(
                "topic \"{name}\": the risk phase is a double_write setting, not {}'s",
                mode.as_str()
            )));
        }
        let mut etcd = self.etcd.clone();
        let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
        if let Some(t) = snap.topics.get(name) {
            return Err(BrokerError::TopicExists { topic: name.to_owned(), topic_id: t.topic_id.clone() });
        }
        if let Ok(local) = self.core.topic(name) {
            return Err(BrokerError::TopicExists { topic: name.to_owned(), topic_id: local.id() });
        }
        let states = placement::place(&snap, partitions, mode.replicas())
            .ok_or_else(|| not_enough_brokers(name, &snap, mode))?;
        let record = TopicMeta {
            name: name.to_owned(),
            topic_id: uuid::Uuid::new_v4().to_string(),
            partitions,
            replication: mode,
            created_ms: now_ms(),
            settings,
            mirror,
            promoted_ms: None,
            risk_phase,
            fence: None,
            promote_epoch: None,
        };
        if !catalog::create_topic(&mut etcd, name, &record, &states).await.map_err(unreachable)? {
            return Err(BrokerError::TopicExists { topic: name.to_owned(), topic_id: String::new() });
        }
        tracing::info!(topic = name, partitions, topic_id = %record.topic_id, "replicated topic created in the catalog");
        if states.iter().any(|s| s.replicas.contains(&self.s.me)) {
            self.core.ensure_replicas(name, &record).await?;
        }
        self.kick.notify_one();
        Ok(self.info(name, &record))
    }

    /// As controller: creates the cluster's replicated internal topics (the committed offsets, and every internal
    /// state topic of `node::internal`) that do not exist yet, once three brokers can take their replicas. Each is
    /// flushed on every write, as a single broker's committed offsets are.
    pub(super) async fn ensure_internal_topics(&self, etcd: &mut etcd_client::Client, snap: &Snapshot) {
        let mut wanted = Vec::new();
        if let Some(cluster) = self.groups.cluster() {
            let offsets = crate::node::internal::InternalTopic {
                name: CLUSTER_OFFSETS_TOPIC,
                partitions: cluster.partitions(),
                segment_bytes: 4 << 20,
                retention_ms: 0,
            };
            wanted.push(offsets);
        }
        wanted.extend(crate::node::internal::INTERNAL_TOPICS.iter().copied());
        for t in wanted {
            if snap.topics.contains_key(t.name) {
                continue;
            }
            let Some(states) = placement::place(snap, t.partitions, Mode::Raft3.replicas()) else { return };
            let record = t.meta(Mode::Raft3, uuid::Uuid::new_v4().to_string(), now_ms());
            match catalog::create_topic(etcd, t.name, &record, &states).await {
                Ok(true) => tracing::info!(
                    topic = t.name,
                    partitions = record.partitions,
                    "created a replicated internal topic; each partition's leader owns the state of its keys"
                ),
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(topic = t.name, error = %e, "creating an internal topic failed; next beat retries")
                }
            }
        }
    }

    /// The partitions of replicated topic `name` in the catalog as last read.
    pub fn partition_count(&self, name: &str) -> Option<u32> {
        self.snap.read().topics.get(name).map(|t| t.partitions)
    }

    /// The id of the replicated topic `name` in the catalog as last read, or of the local topic of that name.
    pub fn topic_id(&self, name: &str) -> Option<String> {
        let from_catalog = self.snap.read().topics.get(name).map(|t| t.topic_id.clone());
        from_catalog.or_else(|| self.core.topic(name).ok().map(|t| t.id()))
    }

    /// Whether `name` is a replicated topic: in the catalog as last read, or a local replica.
    pub fn is_replicated(&self, name: &str) -> bool {
        self.snap.read().topics.contains_key(name)
            || self.core.topic(name).is_ok_and(|t| !t.meta().replication.is_single())
    }

    /// Overlays `changes` on the topic's config in the catalog.
    pub async fn alter_config(&self, name: &str, changes: &TopicSettings) -> Result<pb::TopicInfo> {
        let record = self
            .change(name, |record| {
                record.settings.merge(changes);
                Ok(true)
            })
            .await?;
        Ok(self.info(name, &record))
    }

    /// Clears the topic's mirror mark in the catalog (a compare-and-swap: one promotion wins). Returns the topic
    /// and whether it was a mirror topic.
    pub async fn promote(&self, name: &str) -> Result<(pb::TopicInfo, bool)> {
        let mut was_mirror = false;
        let record = self
            .change(name, |record| {
                was_mirror = record.mirror.take().is_some();
                if was_mirror {
                    record.promoted_ms = Some(now_ms());
                }
                Ok(was_mirror)
            })
            .await?;
        if was_mirror {
            tracing::warn!(
                topic = name,
                "replicated mirror topic promoted in the catalog: writable, and no longer accepts mirrored data"
            );
        }
        Ok((self.info(name, &record), was_mirror))
    }

    /// Grows the topic to `count` partitions, the new ones placed over the live brokers like a new topic's.
    pub async fn grow(&self, name: &str, count: u32) -> Result<pb::TopicInfo> {
        check_count(name, count)?;
        let mut etcd = self.etcd.clone();
        for _ in 0..ATTEMPTS {
            let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
            let (mut record, revision) = found(name, &snap)?;
            let current = record.partitions;
            if count < current {
                return Err(BrokerError::ShrinkPartitions { topic: name.to_owned(), current, requested: count });
            }
            if count == current {
                return Ok(self.info(name, &record));
            }
            let mode = record.replication;
            let states = placement::place(&snap, count - current, mode.replicas())
                .ok_or_else(|| not_enough_brokers(name, &snap, mode))?;
            record.partitions = count;
            if catalog::grow_topic(&mut etcd, name, revision, &record, current, &states).await.map_err(unreachable)? {
                tracing::info!(topic = name, from = current, to = count, "replicated topic grown in the catalog");
                self.sync_topic(name, &record).await?;
                self.kick.notify_one();
                return Ok(self.info(name, &record));
            }
        }
        Err(busy(name))
    }

    /// Deletes the topic from the catalog, leaving the tombstone of its id; every member removes its replicas at
    /// its next beat, this one before it answers.
    pub async fn delete(&self, name: &str) -> Result<()> {
        let mut etcd = self.etcd.clone();
        for _ in 0..ATTEMPTS {
            let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
            let (record, revision) = found(name, &snap)?;
            if catalog::delete_topic(&mut etcd, name, revision, &record.topic_id).await.map_err(unreachable)? {
                tracing::info!(topic = name, topic_id = %record.topic_id, "replicated topic deleted from the catalog");
                self.drop_local(name, &record.topic_id).await?;
                self.kick.notify_one();
                return Ok(());
            }
        }
        Err(busy(name))
    }

    /// Applies `edit` to the topic's record and writes it back by compare-and-swap, re-reading and retrying when
    /// another change won meanwhile; `edit` answers whether there is anything to write. This broker's replicas
    /// take the new record before it returns.
    pub(super) async fn change(
        &self,
        name: &str,
        mut edit: impl FnMut(&mut TopicMeta) -> Result<bool>,
    ) -> Result<TopicMeta> {
        let mut etcd = self.etcd.clone();
        for _ in 0..ATTEMPTS {
            let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
            let (mut record, revision) = found(name, &snap)?;
            if !edit(&mut record)? {
                return Ok(record);
            }
            if catalog::update_topic(&mut etcd, name, revision, &record).await.map_err(unreachable)? {
                self.sync_topic(name, &record).await?;
                self.kick.notify_one();
                return Ok(record);
            }
        }
        Err(busy(name))
    }

    /// Takes the catalog's topics into this broker's replicas (one beat): deleted topics' replicas go, new topics
    /// placed here are opened, and the others follow their records.
    pub(super) async fn sync_topics(&self, snap: &Snapshot) {
        for topic in self.core.topics() {
            let meta = topic.meta();
            if !meta.replication.is_single()
                && snap.deleted.contains(&meta.topic_id)
                && let Err(e) = self.drop_local(&meta.name, &meta.topic_id).await
            {
                tracing::warn!(topic = meta.name, error = %e, "cannot remove the replicas of a deleted topic");
            }
        }
        for (name, record) in &snap.topics {
            let placed_here =
                snap.partitions.iter().any(|((t, _), v)| t == name && v.state.replicas.contains(&self.s.me));
            if placed_here && let Err(e) = self.sync_topic(name, record).await {
                tracing::warn!(topic = name, error = %e, "cannot take the catalog's record into this broker's replicas");
            }
        }
    }

    /// Makes this broker's replicas of `name` what `record` says: opened, grown, and with its config, mirror mark
    /// and promotion.
    async fn sync_topic(&self, name: &str, record: &TopicMeta) -> Result<()> {
        let topic = match self.core.topic(name) {
            Ok(t) => t,
            Err(_) => return self.core.ensure_replicas(name, record).await.map(drop),
        };
        if topic.id() != record.topic_id || topic.meta().replication.is_single() {
            return Err(in_the_way(name, &topic.id(), record));
        }
        if topic.partition_count() < record.partitions {
            self.core.alter_partitions(name, record.partitions).await?;
        }
        if self.core.apply_catalog(name, record).await? {
            tracing::info!(
                topic = name,
                mirror = record.mirror.is_some(),
                promoted = record.promoted_ms.is_some(),
                fenced = record.fence.as_ref().map(|f| f.epoch),
                "this broker's replicas took the catalog's record"
            );
        }
        Ok(())
    }

    /// Removes this broker's replicas of the deleted topic `name` of id `topic_id`, with their committed offsets.
    async fn drop_local(&self, name: &str, topic_id: &str) -> Result<()> {
        let Ok(topic) = self.core.topic(name) else { return Ok(()) };
        if topic.id() != topic_id {
            return Ok(());
        }
        let groups = Arc::clone(&self.groups);
        let gone = name.to_owned();
        self.core.delete_topic(name, Box::new(move || groups.forget_topics(&|t| t == gone).map(drop))).await?;
        tracing::info!(topic = name, topic_id, "replicas of a deleted replicated topic removed");
        Ok(())
    }

    /// The catalog's topics as clients see them, those this broker holds no replica of too (but the internal
    /// ones).
    pub fn catalog_topics(&self) -> Vec<pb::TopicInfo> {
        let topics: Vec<(String, TopicMeta)> =
            self.snap.read().topics.iter().map(|(n, r)| (n.clone(), r.clone())).collect();
        topics
            .iter()
            .filter(|(name, _)| !name.starts_with(crate::node::topic::RESERVED_PREFIX))
            .map(|(name, record)| self.info(name, record))
            .collect()
    }

    /// The protocol view of the topic `record` describes.
    pub(super) fn info(&self, name: &str, record: &TopicMeta) -> pb::TopicInfo {
        match self.core.topic(name) {
            Ok(t) if t.id() == record.topic_id => self.core.topic_info(&t),
            _ => record.clone().to_proto(self.core.defaults()),
        }
    }

    /// The topic's record and revision from the catalog as it is now (a client's view of a replicated topic this
    /// broker holds no replica of).
    pub async fn describe(&self, name: &str) -> Result<pb::TopicInfo> {
        let mut etcd = self.etcd.clone();
        let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
        let (record, _) = found(name, &snap)?;
        Ok(self.info(name, &record))
    }
}

fn check_count(name: &str, partitions: u32) -> Result<()> {
    if partitions == 0 || partitions > 10_000 {
        return Err(BrokerError::InvalidArgument(format!(
            "topic \"{name}\": a replicated topic has 1 to 10000 partitions, not {partitions}"
        )));
    }
    Ok(())
}

fn found(name: &str, snap: &Snapshot) -> Result<(TopicMeta, i64)> {
    match (snap.topics.get(name), snap.topic_revisions.get(name)) {
        (Some(record), Some(&revision)) => Ok((record.clone(), revision)),
        _ => Err(BrokerError::UnknownTopic { topic: name.to_owned() }),
    }
}

fn not_enough_brokers(name: &str, snap: &Snapshot, mode: Mode) -> BrokerError {
    let usable: Vec<u32> = snap.brokers.keys().copied().filter(|id| !snap.draining.contains(id)).collect();
    BrokerError::Cluster(format!(
        "topic \"{name}\": {} needs {} brokers, and {} can take replicas ({usable:?}; brokers being drained take \
         none)",
        mode.as_str(),
        mode.replicas(),
        usable.len()
    ))
}

fn busy(name: &str) -> BrokerError {
    BrokerError::Cluster(format!(
        "topic \"{name}\" kept changing in the catalog while this change was tried {ATTEMPTS} times; try again"
    ))
}

fn in_the_way(name: &str, local_id: &str, record: &TopicMeta) -> BrokerError {
    BrokerError::Cluster(format!(
        "a local topic \"{name}\" (id {local_id}) is in the way of the cluster's replicated topic of id {}",
        record.topic_id
    ))
}
