//! The broker's state: cluster identity and the topic registry (create, delete, alter, promote), plus the
//! background duties on partitions (async flush, retention).
//!
//! Topic admin operations are serialised by one async mutex so that, for example, a create racing a delete of the
//! same name cannot interleave. A client's create holds it only to check and reserve the name (see `create`): its
//! directories and fsyncs run outside it, so creates of different topics run side by side. Lookups take a short
//! read lock on the registry map.

mod create;
mod data_dir;
mod failover;
mod replicas;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ferry_proto as pb;
use ferry_storage::LogConfig;
use ferry_storage::fs::FsRef;
use parking_lot::RwLock;
use tokio::sync::watch;

use self::data_dir::{lock_data_dir, resolve_cluster_id};
use crate::error::{BrokerError, Result};
use crate::node::partition::{Partition, WriteGuard};
use crate::node::producer_state;
use crate::node::topic::Replication;
use crate::node::topic::{MirrorMark, RESERVED_PREFIX, TOPIC_FILE, TopicMeta, TopicSettings};

/// Broker-owned files live under this directory inside the data dir.
pub const META_DIR: &str = "__ferry_meta";
const DELETED_PREFIX: &str = "__ferry_deleted_";

/// A topic: its metadata and its partitions.
#[derive(Debug)]
pub struct Topic {
    dir: PathBuf,
    meta: RwLock<TopicMeta>,
    /// One slot per partition; a replicated topic's slot is empty on a member that holds no replica of it.
    partitions: RwLock<Vec<Option<Arc<Partition>>>>,
}

impl Topic {
    /// A snapshot of the metadata.
    pub fn meta(&self) -> TopicMeta {
        self.meta.read().clone()
    }

    /// The topic's UUID.
    pub fn id(&self) -> String {
        self.meta.read().topic_id.clone()
    }

    /// The mirror mark, when the topic is a mirror topic.
    pub fn mirror(&self) -> Option<MirrorMark> {
        self.meta.read().mirror.clone()
    }

    /// Partition count.
    pub fn partition_count(&self) -> u32 {
        self.partitions.read().len() as u32
    }

    /// The partitions held here (all of a single broker's topic; a replicated topic's replicas on this member).
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().iter().flatten().cloned().collect()
    }

    /// Whether this broker holds partition `index`.
    pub fn holds(&self, index: u32) -> bool {
        self.partitions.read().get(index as usize).is_some_and(Option::is_some)
    }

    /// One partition: unknown past the count; [`BrokerError::NotLeader`] (leader unknown here) for a replicated
    /// partition this member holds no replica of (the service names the catalog's leader instead).
    pub fn partition(&self, index: u32) -> Result<Arc<Partition>> {
        let parts = self.partitions.read();
        match parts.get(index as usize) {
            Some(Some(p)) => Ok(Arc::clone(p)),
            Some(None) => Err(BrokerError::NotLeader {
                topic: self.meta.read().name.clone(),
                partition: index,
                leader: 0,
                address: String::new(),
                epoch: 0,
            }),
            None => Err(BrokerError::UnknownPartition {
                topic: self.meta.read().name.clone(),
                partition: index,
                count: parts.len() as u32,
            }),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Bounds on state clients control (`[limits]` of the broker config, whose defaults these are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Topics at most.
    pub max_topics: u32,
    /// Partitions over all topics at most.
    pub max_partitions: u32,
    /// Partitions one Subscribe stream follows at most.
    pub max_subscribe_partitions: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_topics: 10_000, max_partitions: 100_000, max_subscribe_partitions: 100_000 }
    }
}

/// The broker's topics and identity.
#[derive(Debug)]
pub struct BrokerCore {
    data_dir: PathBuf,
    limits: Limits,
    /// Every file the broker touches is reached through this (the real file system outside tests).
    fs: FsRef,
    /// The data directory's lock, held while the core lives: two brokers on one directory would corrupt it.
    _lock: ferry_storage::fs::LockGuard,
    cluster_id: String,
    defaults: LogConfig,
    /// Expiry and bound of every partition's idempotent-producer state.
    producers: producer_state::Settings,
    topics: Arc<RwLock<BTreeMap<String, Arc<Topic>>>>,
    admin: tokio::sync::Mutex<()>,
    /// Names whose creation runs outside the admin lock (see `create`).
    creating: create::Creating,
    arrivals: watch::Sender<u64>,
    /// This broker's id in its cluster; `None` for a single broker.
    broker_id: Option<u32>,
    /// Position beats sent on subscribe streams since start (`ferry_broker_subscribe_beats_total`).
    beats: std::sync::atomic::AtomicU64,
}

impl BrokerCore {
    /// Opens the data directory: resolves the cluster id (configured, or persisted, or generated and persisted),
    /// removes leftovers of interrupted deletions, and opens every topic. Blocking.
    pub fn open(
        fs: FsRef,
        data_dir: &Path,
        configured_cluster_id: Option<&str>,
        defaults: LogConfig,
        producers: producer_state::Settings,
    ) -> Result<BrokerCore> {
        Self::open_as(fs, data_dir, configured_cluster_id, defaults, producers, None)
    }

    /// [`BrokerCore::open`] for cluster member `broker_id` (`None`: a single broker): replicated topics' partitions
    /// open as its replicas.
    pub fn open_as(
        fs: FsRef,
        data_dir: &Path,
        configured_cluster_id: Option<&str>,
        defaults: LogConfig,
        producers: producer_state::Settings,
        broker_id: Option<u32>,
    ) -> Result<BrokerCore> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| BrokerError::Io { path, source }
        };
        ferry_storage::fs::sync_new_dirs(&*fs, &data_dir.join(META_DIR)).map_err(io(data_dir))?;
        let lock = lock_data_dir(&fs, data_dir)?;
        let cluster_id = resolve_cluster_id(&fs, data_dir, configured_cluster_id)?;
        let (arrivals, _) = watch::channel(0u64);
        let core = BrokerCore {
            data_dir: data_dir.to_owned(),
            limits: Limits::default(),
            fs: fs.clone(),
            _lock: lock,
            cluster_id,
            defaults,
            producers,
            topics: Default::default(),
            admin: tokio::sync::Mutex::new(()),
            creating: Default::default(),
            arrivals,
            broker_id,
            beats: Default::default(),
        };
        let mut names = fs.read_dir(data_dir).map_err(io(data_dir))?;
        names.sort();
        for name in names {
            let path = data_dir.join(&name);
            if name.starts_with(DELETED_PREFIX) {
                fs.remove_dir_all(&path).map_err(io(&path))?;
                fs.sync_dir(data_dir).map_err(io(data_dir))?;
                continue;
            }
            if !fs.exists(&path.join(TOPIC_FILE)).map_err(io(&path))? {
                continue;
            }
            let meta = TopicMeta::load(&*fs, &path)?;
            // The broker's own partitions live under reserved names; of those only a cluster's replicated internal
            // topics (the offsets partitions) are topics.
            if name.starts_with(RESERVED_PREFIX)
                && meta.replication.is_single()
                && crate::node::internal::find(&name).is_none()
            {
                continue;
            }
            let topic = core.open_topic(path, meta)?;
            core.topics.write().insert(name, Arc::new(topic));
        }
        Ok(core)
    }

    fn open_topic(&self, dir: PathBuf, meta: TopicMeta) -> Result<Topic> {
        // A replicated topic's replicas are the partition directories this member holds.
        let wanted: Vec<u32> = if meta.replication.is_single() {
            (0..meta.partitions).collect()
        } else {
            let mut held = Vec::new();
            for p in 0..meta.partitions {
                let part_dir = dir.join(p.to_string());
                if self.fs.is_dir(&part_dir).map_err(|source| BrokerError::Io { path: part_dir.clone(), source })? {
                    held.push(p);
                }
            }
            held
        };
        let opened = self.partition_opener()(&meta, &dir, &wanted)?;
        let mut slots: Vec<Option<Arc<Partition>>> = vec![None; meta.partitions as usize];
        for (p, part) in wanted.into_iter().zip(opened) {
            slots[p as usize] = Some(part);
        }
        Ok(Topic { dir, meta: RwLock::new(meta), partitions: RwLock::new(slots) })
    }

    /// What opens partitions `range` of a topic in `dir`, on the blocking pool or at startup: each as a replica
    /// of this broker when the topic is replicated.
    fn partition_opener(&self) -> impl Fn(&TopicMeta, &Path, &[u32]) -> Result<Vec<Arc<Partition>>> + Send + 'static {
        let (fs, defaults, producers, arrivals) =
            (self.fs.clone(), self.defaults.clone(), self.producers, self.arrivals.clone());
        let broker_id = self.broker_id;
        move |meta: &TopicMeta, dir: &Path, range: &[u32]| {
            let cfg = meta.log_config(&defaults);
            let replica_on = if meta.replication.is_single() {
                None
            } else {
                Some((broker_id.unwrap_or(0), meta.replication.min_insync(meta.risk_phase)))
            };
            range
                .iter()
                .map(|&p| {
                    Partition::open(
                        &fs,
                        &meta.name,
                        p,
                        dir.join(p.to_string()),
                        cfg.clone(),
                        producers,
                        arrivals.clone(),
                        replica_on,
                    )
                    .map(|p| Arc::new(p.with_guard(WriteGuard::of(meta))))
                })
                .collect()
        }
    }

    /// Enforces `limits` on later creations (what is on disk already loads whatever the limits).
    pub fn with_limits(mut self, limits: Limits) -> BrokerCore {
        self.limits = limits;
        self
    }

    /// The limits on client-controlled state.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The storage defaults.
    pub fn defaults(&self) -> &LogConfig {
        &self.defaults
    }

    /// A receiver that changes whenever any partition gains data (long polls wait on it).
    pub fn arrivals(&self) -> watch::Receiver<u64> {
        self.arrivals.subscribe()
    }

    /// Counts one position beat sent on a subscribe stream.
    pub fn note_beat(&self) {
        self.beats.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Position beats sent on subscribe streams since start.
    pub fn beats(&self) -> u64 {
        self.beats.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Looks a topic up.
    pub fn topic(&self, name: &str) -> Result<Arc<Topic>> {
        self.topics.read().get(name).cloned().ok_or_else(|| BrokerError::UnknownTopic { topic: name.to_owned() })
    }

    /// Looks a partition up.
    pub fn partition(&self, topic: &str, partition: u32) -> Result<Arc<Partition>> {
        self.topic(topic)?.partition(partition)
    }

    /// All topics, by name.
    pub fn topics(&self) -> Vec<Arc<Topic>> {
        self.topics.read().values().cloned().collect()
    }

    /// The protobuf view of a topic.
    pub fn topic_info(&self, topic: &Topic) -> pb::TopicInfo {
        topic.meta.read().to_proto(&self.defaults)
    }

    /// Creates a single broker's internal state topic `t` (see `node::internal`) unless it exists.
    pub async fn ensure_internal(&self, t: &crate::node::internal::InternalTopic) -> Result<Arc<Topic>> {
        let _admin = self.admin.lock().await;
        if let Some(existing) = self.topics.read().get(t.name) {
            return Ok(Arc::clone(existing));
        }
        let meta = t.meta(Replication::Single, uuid::Uuid::new_v4().to_string(), now_ms());
        let all: Vec<u32> = (0..t.partitions).collect();
        self.materialize(meta, all, None).await
    }

    /// Writes a new topic's directories and metadata, opens partitions `open_now` of it and adds it to the map.
    /// The caller holds the admin lock, or `reserved` the name (see `create`), which goes once the topic is in the
    /// map. All of it runs on the blocking pool to the end even when the caller stops waiting, so a create whose
    /// client went away never leaves a topic on disk that the map lacks.
    async fn materialize(
        &self,
        meta: TopicMeta,
        open_now: Vec<u32>,
        reserved: Option<create::Reservation>,
    ) -> Result<Arc<Topic>> {
        let dir = self.data_dir.join(&meta.name);
        let fs = self.fs.clone();
        let open = self.partition_opener();
        let topics = Arc::clone(&self.topics);
        tokio::task::spawn_blocking(move || -> Result<Arc<Topic>> {
            let _reserved = reserved;
            ferry_storage::fs::sync_new_dirs(&*fs, &dir)
                .map_err(|source| BrokerError::Io { path: dir.clone(), source })?;
            let parts = open(&meta, &dir, &open_now)?;
            let mut slots: Vec<Option<Arc<Partition>>> = vec![None; meta.partitions as usize];
            for (p, part) in open_now.iter().zip(parts) {
                slots[*p as usize] = Some(part);
            }
            // topic.json last: a crash before this leaves a directory without metadata, which is ignored.
            meta.store(&*fs, &dir)?;
            tracing::info!(
                topic = meta.name,
                partitions = meta.partitions,
                mirror = meta.mirror.is_some(),
                replication = meta.replication.as_str(),
                "topic created"
            );
            let name = meta.name.clone();
            let topic = Arc::new(Topic { dir, meta: RwLock::new(meta), partitions: RwLock::new(slots) });
            topics.write().insert(name, Arc::clone(&topic));
            Ok(topic)
        })
        .await
        .map_err(|e| BrokerError::Internal(e.to_string()))?
    }

    /// Deletes a topic and its data, then runs `then` (forgetting the topic's committed offsets) before another
    /// admin call can start: a topic created again under the name right away keeps the offsets committed to it.
    pub async fn delete_topic(&self, name: &str, then: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        self.topics.write().remove(name);
        let id = topic.id();
        let dir = topic.dir.clone();
        let parts = topic.partitions();
        let trash = self.data_dir.join(format!("{DELETED_PREFIX}{id}"));
        let fs = self.fs.clone();
        let data_dir = self.data_dir.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            for p in &parts {
                let _ = p.log().close();
            }
            let io = |path: &Path| {
                let path = path.to_owned();
                move |source| BrokerError::Io { path, source }
            };
            // Rename first so a crash mid-removal never leaves a half-deleted topic that loads again.
            fs.rename(&dir, &trash).map_err(io(&dir))?;
            fs.sync_dir(&data_dir).map_err(io(&data_dir))?;
            fs.remove_dir_all(&trash).map_err(io(&trash))?;
            fs.sync_dir(&data_dir).map_err(io(&data_dir))?;
            then()
        })
        .await
        .map_err(|e| BrokerError::Internal(e.to_string()))??;
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        tracing::info!(topic = name, topic_id = %id, "topic deleted");
        Ok(())
    }

    /// Grows a topic's partition count.
    pub async fn alter_partitions(&self, name: &str, count: u32) -> Result<Arc<Topic>> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        let current = topic.partition_count();
        if count < current {
            return Err(BrokerError::ShrinkPartitions { topic: name.to_owned(), current, requested: count });
        }
        if count > 100_000 {
            return Err(BrokerError::InvalidArgument(format!("topic \"{name}\": at most 100000 partitions")));
        }
        if count == current {
            return Ok(topic);
        }
        self.check_limits(name, 0, count - current)?;
        let mut meta = topic.meta();
        meta.partitions = count;
        let dir = topic.dir.clone();
        let fs = self.fs.clone();
        let open = self.partition_opener();
        // A replicated topic's new partitions open as they are placed on this member (`open_replica`).
        let new: Vec<u32> = if meta.replication.is_single() { (current..count).collect() } else { Vec::new() };
        let new_parts = tokio::task::spawn_blocking(move || -> Result<Vec<Option<Arc<Partition>>>> {
            let parts = open(&meta, &dir, &new)?;
            meta.store(&*fs, &dir)?;
            let mut slots: Vec<Option<Arc<Partition>>> = parts.into_iter().map(Some).collect();
            slots.resize((count - current) as usize, None);
            Ok(slots)
        })
        .await
        .map_err(|e| BrokerError::Internal(e.to_string()))??;
        topic.partitions.write().extend(new_parts);
        topic.meta.write().partitions = count;
        tracing::info!(topic = name, from = current, to = count, "partitions added");
        Ok(topic)
    }

    /// Changes per-topic settings; the new log config applies to every partition at once.
    pub async fn alter_config(&self, name: &str, changes: TopicSettings) -> Result<Arc<Topic>> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        let mut meta = topic.meta();
        meta.settings.merge(&changes);
        self.replace_meta(&topic, meta).await?;
        Ok(topic)
    }

    /// Stores a topic's new metadata, then gives every partition the log config it implies. The caller holds the
    /// admin lock.
    async fn replace_meta(&self, topic: &Topic, meta: TopicMeta) -> Result<()> {
        let cfg = meta.log_config(&self.defaults);
        let dir = topic.dir.clone();
        let stored = meta.clone();
        let fs = self.fs.clone();
        tokio::task::spawn_blocking(move || stored.store(&*fs, &dir))
            .await
            .map_err(|e| BrokerError::Internal(e.to_string()))??;
        let guard = WriteGuard::of(&meta);
        for p in topic.partitions() {
            p.log().set_config(cfg.clone());
            if p.guard() != guard {
                p.set_guard(guard.clone()).await;
            }
        }
        *topic.meta.write() = meta;
        Ok(())
    }

    /// Clears a topic's mirror mark. Returns whether it was a mirror topic.
    pub async fn promote(&self, name: &str) -> Result<(Arc<Topic>, bool)> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        let mut meta = topic.meta();
        let was_mirror = meta.mirror.take().is_some();
        if was_mirror {
            meta.promoted_ms = Some(now_ms());
            self.replace_meta(&topic, meta).await?;
            tracing::warn!(
                topic = name,
                "mirror topic promoted: it is now writable and no longer accepts mirrored data"
            );
        }
        Ok((topic, was_mirror))
    }

    /// Under the async flush policy, fsyncs partitions whose interval is due. Blocking.
    pub fn flush_due(&self) {
        for topic in self.topics() {
            for p in topic.partitions() {
                if let Err(e) = p.log().flush_if_due() {
                    tracing::error!(topic = p.topic(), partition = p.index(), error = %e, "flush failed");
                }
            }
        }
    }

    /// Applies retention to every partition. Blocking.
    pub fn apply_retention(&self) {
        let now = now_ms();
        for topic in self.topics() {
            for p in topic.partitions() {
                match p.log().apply_retention(now) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        topic = p.topic(),
                        partition = p.index(),
                        segments = n,
                        "retention deleted segments"
                    ),
                    Err(e) => tracing::error!(topic = p.topic(), partition = p.index(), error = %e, "retention failed"),
                }
            }
        }
    }

    /// Flushes and closes every log, writing the clean-shutdown markers. Blocking.
    pub fn close(&self) {
        for topic in self.topics() {
            for p in topic.partitions() {
                if let Err(e) = p.log().close() {
                    tracing::error!(topic = p.topic(), partition = p.index(), error = %e, "close failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
