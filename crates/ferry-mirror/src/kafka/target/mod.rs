//! [`KafkaTarget`]: a Kafka-API cluster as the mirror's target.
//!
//! Kafka assigns its own offsets, so the target keeps the source's in provenance headers and reports everything in
//! source offsets (see [`crate::cluster`]):
//! - `partition()` reads the partition's tail (read-committed) for the last record from this source partition:
//!   its log end is that record's source offset + 1 (0 when there is none, or the start recorded by an empty
//!   append, kept in memory). After kill -9 the mirror therefore resumes exactly after what is durably there.
//! - `append()` decodes the batches, skips records below the partition's log end (already there) and produces the
//!   rest in order to the same partition number with key, value, timestamp, headers and provenance, as one
//!   transaction when the target supports them (see [`writer`]).
//! - Group offsets are translated through an exact per-partition offset map ([`offset_map`]), and through a binary
//!   search over the provenance headers for offsets older than the map.
//! - Mirror marks: a topic named by the rename policy is reported as a mirror topic unless its tail holds records
//!   and none from this source cluster (a topic written locally). Its source topic id is the one in the provenance
//!   headers (or the one given at creation; empty when the topic is empty and the process restarted), its source
//!   cluster id the one given at creation (empty after a restart).

mod append;
mod lookup;
mod members;
mod offset_map;
mod provenance;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use ferry_batch::Batch;
use ferry_client::proto as pb;
use ferry_client::{ClientError, Code};
use parking_lot::Mutex;
use rdkafka::admin::{AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use self::members::Member;
use self::offset_map::{Lookup, OffsetMap};
use self::provenance::Origin;
use self::writer::{TXN_UNKNOWN, Writer};
use super::client::KafkaClients;
use super::error::{KafkaSetupError, map_error, status};
use super::props::{Side, blocking};
use super::reader::Reader;
use super::topic_config;
use crate::cluster::{AppendOutcome, GroupState, Membership, Result, TargetCluster, TargetLimits, TargetPartition};
use crate::config::Rename;
use crate::tp::TargetTp;

/// Whether a Kafka target's appends are transactions (zombie fencing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionSupport {
    /// No writer has probed the target yet.
    Unknown,
    /// Each append is one transaction; a new writer of a partition fences the old one.
    Supported,
    /// The target refused transactions: idempotent producers only (two writers can duplicate).
    Unsupported,
}

/// Kafka's default `message.max.bytes`, used when `[target.kafka]` does not set it.
const DEFAULT_MESSAGE_MAX_BYTES: u64 = 1 << 20;

/// How a [`KafkaTarget`] is built.
#[derive(Debug, Clone)]
pub struct KafkaTargetOptions {
    /// Bootstrap servers (`[target] brokers`).
    pub bootstrap: Vec<String>,
    /// `[target.kafka]` librdkafka properties.
    pub properties: BTreeMap<String, String>,
    /// `mirror.name` (client id, transactional ids).
    pub mirror: String,
    /// `source.cluster`: the alias written in the provenance headers.
    pub source_cluster: String,
    /// The rename policy: which source topic a target topic holds.
    pub rename: Rename,
    /// Timeout of admin, offset and read calls.
    pub call_timeout: Duration,
    /// Most decompressed bytes an offered batch may inflate to when its records are decoded for Kafka
    /// (`reshape::decode_limit`).
    pub decode_limit: usize,
}

impl KafkaTargetOptions {
    /// Options with the default call timeout.
    pub fn new(
        bootstrap: Vec<String>,
        properties: BTreeMap<String, String>,
        mirror: &str,
        source_cluster: &str,
        rename: Rename,
    ) -> KafkaTargetOptions {
        KafkaTargetOptions {
            bootstrap,
            properties,
            mirror: mirror.to_owned(),
            source_cluster: source_cluster.to_owned(),
            rename,
            call_timeout: super::source::CALL_TIMEOUT,
            decode_limit: crate::reshape::decode_limit(16 << 20, DEFAULT_MESSAGE_MAX_BYTES),
        }
    }
}

/// What the target knows of a mirror topic's source.
#[derive(Debug, Clone, Default)]
struct MarkInfo {
    source_cluster_id: String,
    source_topic_id: String,
}

type Tp = (String, u32);
type Slot = Arc<tokio::sync::Mutex<Option<Writer>>>;

struct Inner {
    clients: KafkaClients,
    mirror: String,
    source_cluster: String,
    rename: Rename,
    decode_limit: usize,
    writers: Mutex<HashMap<Tp, Slot>>,
    maps: Mutex<HashMap<Tp, OffsetMap>>,
    transactions: AtomicU8,
    marks: Mutex<HashMap<String, MarkInfo>>,
    starts: Mutex<HashMap<Tp, u64>>,
    member: tokio::sync::Mutex<Option<Member>>,
}

/// A Kafka target (see the module docs).
#[derive(Clone)]
pub struct KafkaTarget {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTarget")
            .field("clients", &self.inner.clients)
            .field("source_cluster", &self.inner.source_cluster)
            .finish_non_exhaustive()
    }
}

impl KafkaTarget {
    /// A target over `options.bootstrap`. Checks the properties; connects on first use.
    pub fn new(options: KafkaTargetOptions) -> Result<KafkaTarget, KafkaSetupError> {
        let clients = KafkaClients::new(
            Side::Target,
            options.bootstrap,
            options.properties,
            format!("ferry-mirror.{}", options.mirror),
            options.call_timeout,
        )?;
        Ok(KafkaTarget {
            inner: Arc::new(Inner {
                clients,
                mirror: options.mirror,
                source_cluster: options.source_cluster,
                rename: options.rename,
                decode_limit: options.decode_limit,
                writers: Mutex::new(HashMap::new()),
                maps: Mutex::new(HashMap::new()),
                transactions: AtomicU8::new(TXN_UNKNOWN),
                marks: Mutex::new(HashMap::new()),
                starts: Mutex::new(HashMap::new()),
                member: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// Whether appends are transactional (known once the first writer probed the target).
    pub fn transactions(&self) -> TransactionSupport {
        match self.inner.transactions.load(Ordering::Acquire) {
            writer::TXN_YES => TransactionSupport::Supported,
            writer::TXN_NO => TransactionSupport::Unsupported,
            _ => TransactionSupport::Unknown,
        }
    }

    /// The source topic a target topic holds under the rename policy (`None`: not a name the mirror writes).
    pub fn source_topic_of(&self, target_topic: &str) -> Option<String> {
        match self.inner.rename {
            Rename::Identity => Some(target_topic.to_owned()),
            Rename::Prefix => target_topic.strip_prefix(&format!("{}.", self.inner.source_cluster)).map(str::to_owned),
        }
    }
}

#[async_trait::async_trait]
impl TargetCluster for KafkaTarget {
    async fn limits(&self) -> Result<TargetLimits> {
        let limit = self
            .inner
            .clients
            .properties()
            .get("message.max.bytes")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
        Ok(TargetLimits { max_batch_bytes: limit, max_message_bytes: limit.max(4 << 20) })
    }

    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>> {
        let topics = self.inner.clients.topics().await?;
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let mut configs = self.inner.clients.topic_configs(&names).await;
        let mut out = Vec::with_capacity(topics.len());
        for t in topics {
            let mirror = match self.source_topic_of(&t.name) {
                Some(source) => self.mark(&t.name, t.partitions, &source).await?,
                None => None,
            };
            out.push(pb::TopicInfo {
                topic_id: super::kafka_topic_id(&t.name),
                partitions: t.partitions,
                config: configs.remove(&t.name).flatten(),
                mirror,
                created_ms: 0,
                replication: "single".into(),
                risk_phase: false,
                name: t.name,
                ..Default::default()
            });
        }
        Ok(out)
    }

    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: pb::TopicConfig,
        mirror: pb::MirrorSource,
        _replication: &str,
        _risk_phase: bool,
    ) -> Result<()> {
        let admin = self.inner.clients.admin()?;
        let entries = topic_config::to_kafka(&config);
        let opts = AdminOptions::new().operation_timeout(Some(self.inner.clients.timeout()));
        // The broker's default replication factor (KIP-464); an older broker needs a number: 1.
        let mut result = None;
        for rf in [-1, 1] {
            let mut topic = NewTopic::new(name, partitions as i32, TopicReplication::Fixed(rf));
            for (k, v) in &entries {
                topic = topic.set(k, v);
            }
            let r =
                admin.create_topics([&topic], &opts).await.map_err(|e| self.admin_error(&e, "create topic", name))?;
            match r.into_iter().next() {
                Some(Err((_, RDKafkaErrorCode::InvalidReplicationFactor | RDKafkaErrorCode::InvalidRequest)))
                    if rf == -1 =>
                {
                    continue;
                }
                other => {
                    result = other;
                    break;
                }
            }
        }
        match result {
            Some(Ok(_)) | None => {
                let mut marks = self.inner.marks.lock();
                let m = marks.entry(name.to_owned()).or_default();
                m.source_cluster_id = mirror.source_cluster_id;
                m.source_topic_id = mirror.source_topic_id;
                Ok(())
            }
            Some(Err((_, code))) => {
                Err(map_error(&KafkaError::AdminOp(code), "create topic", name, self.inner.clients.brokers_text(), ""))
            }
        }
    }

    async fn alter_partitions(&self, name: &str, partitions: u32) -> Result<()> {
        let admin = self.inner.clients.admin()?;
        let opts = AdminOptions::new().operation_timeout(Some(self.inner.clients.timeout()));
        let grow = NewPartitions::new(name, partitions as usize);
        let unsupported = |what: String| {
            status(
                Code::Unimplemented,
                format!(
                    "the Kafka target does not support adding partitions (CreatePartitions, KIP-195): grow topic \
                     {name} to {partitions} partitions on the target by hand ({what})"
                ),
                self.inner.clients.brokers_text(),
            )
        };
        match admin.create_partitions([&grow], &opts).await {
            Err(e) if KafkaClients::unsupported(&e) => Err(unsupported(e.to_string())),
            Err(e) => Err(self.admin_error(&e, "grow topic", name)),
            Ok(r) => match r.into_iter().next() {
                Some(Err((_, code))) => {
                    let e = KafkaError::AdminOp(code);
                    if KafkaClients::unsupported(&e) {
                        Err(unsupported(e.to_string()))
                    } else {
                        Err(self.admin_error(&e, "grow topic", name))
                    }
                }
                _ => Ok(()),
            },
        }
    }

    async fn alter_topic_config(&self, name: &str, config: pb::TopicConfig) -> Result<()> {
        let entries = topic_config::to_kafka(&config);
        if entries.is_empty() {
            return Ok(());
        }
        let admin = self.inner.clients.admin()?;
        let opts = AdminOptions::new().request_timeout(Some(self.inner.clients.timeout()));
        let mut alter = AlterConfig::new(ResourceSpecifier::Topic(name));
        for (k, v) in &entries {
            alter = alter.set(k, v);
        }
        let r =
            admin.alter_configs([&alter], &opts).await.map_err(|e| self.admin_error(&e, "alter config of", name))?;
        match r.into_iter().next() {
            Some(Err((_, code))) => {
                let e = KafkaError::AdminOp(code);
                let mut err = self.admin_error(&e, "alter config of", name);
                if KafkaClients::unsupported(&e) {
                    err = status(
                        Code::Unimplemented,
                        format!(
                            "the Kafka target does not support AlterConfigs: topic {name}'s config is not copied ({e})"
                        ),
                        self.inner.clients.brokers_text(),
                    );
                }
                Err(err)
            }
            _ => Ok(()),
        }
    }

    async fn partition(&self, tp: &TargetTp) -> Result<TargetPartition> {
        let (topic, partition) = (tp.topic(), tp.partition);
        let origin = self.origin(topic, partition)?;
        let slot = self.slot(topic, partition);
        let mut guard = slot.lock().await;
        let log_end = self.log_end_from_tail(topic, &origin).await?;
        if let Some(w) = guard.as_ref()
            && w.log_end != log_end
        {
            tracing::warn!(
                topic,
                partition,
                writer = w.log_end,
                tail = log_end,
                "Kafka target partition changed under its writer; reopening it"
            );
            if let Some(w) = guard.take() {
                w.close();
            }
        }
        let log_start = self.inner.starts.lock().get(&(topic.to_owned(), partition)).copied().unwrap_or(0);
        Ok(TargetPartition { log_start, log_end, last_epoch: None })
    }

    async fn append(
        &self,
        tp: &TargetTp,
        source_topic_id: &str,
        source_log_start: u64,
        batches: &[Batch],
    ) -> Result<AppendOutcome> {
        let (topic, partition) = (tp.topic(), tp.partition);
        let origin = self.origin(topic, partition)?;
        let slot = self.slot(topic, partition);
        let mut guard = slot.lock().await;
        if guard.is_none() {
            let mut w =
                Writer::open(&self.inner.clients, &self.inner.mirror, topic, partition, &self.inner.transactions)
                    .await?;
            // Read after the writer registered: a fenced writer's open transaction is aborted by now.
            w.log_end = match self.log_end_from_tail(topic, &origin).await {
                Ok(end) => end,
                Err(e) => {
                    w.close();
                    return Err(e);
                }
            };
            tracing::info!(
                topic,
                partition,
                log_end = w.log_end,
                transactional = w.transactional(),
                "Kafka target writer open"
            );
            *guard = Some(w);
        }
        let writer = guard.as_mut().expect("opened above");
        let result = self.append_locked(writer, topic, &origin, source_topic_id, source_log_start, batches).await;
        if result.is_err()
            && let Some(w) = guard.take()
        {
            // The partition's state is unknown now: the next call reopens the writer and reads the tail again.
            w.close();
        }
        result
    }

    async fn truncate(&self, tp: &TargetTp, _offset: u64) -> Result<u64> {
        let (topic, partition) = (tp.topic(), tp.partition);
        Err(status(
            Code::FailedPrecondition,
            format!("truncation is not possible on a Kafka target ({topic}/{partition}): set on_divergence = \"halt\""),
            self.inner.clients.brokers_text(),
        ))
    }

    async fn group_state(&self, group: &str) -> Result<GroupState> {
        let groups = self.inner.clients.groups(Some(group)).await?;
        let active_members = groups
            .iter()
            .find(|g| g.name == group)
            .map(|g| {
                // Some Kafka-API brokers list no members for a group that has them: a live state counts as one.
                let live = !matches!(g.state.as_str(), "" | "Empty" | "Dead");
                if g.members == 0 && live { 1 } else { g.members }
            })
            .unwrap_or(0);
        let committed = self.inner.clients.committed(group, &[]).await?;
        let mut offsets = Vec::new();
        for c in committed {
            if self.source_topic_of(&c.topic).is_none() {
                continue;
            }
            let offset = self.to_source(&c.topic, c.partition, c.offset).await?;
            offsets.push(pb::CommittedOffset { offset, ..c });
        }
        Ok(GroupState { active_members, offsets })
    }

    async fn commit_group(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()> {
        let mut translated = Vec::with_capacity(offsets.len());
        for o in offsets {
            let offset = self.to_target(&o.topic, o.partition, o.offset).await?;
            translated.push(pb::CommittedOffset { offset, ..o });
        }
        self.inner.clients.commit(group, translated).await
    }

    async fn join(&self, group: &str, member_id: &str, topics: Vec<String>, session: Duration) -> Result<Membership> {
        let mut topics = topics;
        topics.sort();
        let mut slot = self.inner.member.lock().await;
        if let Some(m) = slot.as_ref()
            && (m.group != group || !m.subscribes(&topics))
            && let Some(old) = slot.take()
        {
            blocking("leave", move || {
                old.leave();
                Ok(())
            })
            .await?;
        }
        if slot.is_none() {
            *slot = Some(Member::join(&self.inner.clients, group, member_id, topics, session)?);
        }
        let member = slot.take().expect("joined above");
        let before = member.generation();
        let wait = (session * 2).max(Duration::from_secs(10));
        let member = blocking("join", move || {
            if before == 0 {
                member.wait_generation(before, wait);
            }
            Ok(member)
        })
        .await?;
        let current = member.current();
        *slot = Some(member);
        let mut m = current.ok_or_else(|| {
            status(
                Code::FailedPrecondition,
                "the scale-out member lost its assignment",
                self.inner.clients.brokers_text(),
            )
        })?;
        m.members =
            self.inner.clients.groups(Some(group)).await.ok().and_then(|g| g.first().map(|g| g.members)).unwrap_or(0);
        Ok(m)
    }

    async fn heartbeat(&self, group: &str, _member_id: &str, _generation: u64) -> Result<Option<Membership>> {
        let slot = self.inner.member.lock().await;
        Ok(slot.as_ref().filter(|m| m.group == group).and_then(Member::current))
    }

    async fn leave(&self, group: &str, _member_id: &str) -> Result<()> {
        let mut slot = self.inner.member.lock().await;
        if slot.as_ref().is_some_and(|m| m.group == group)
            && let Some(m) = slot.take()
        {
            blocking("leave", move || {
                m.leave();
                Ok(())
            })
            .await?;
        }
        Ok(())
    }
}
