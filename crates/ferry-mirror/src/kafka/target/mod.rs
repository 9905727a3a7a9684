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

mod members;
mod offset_map;
mod provenance;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ferry_batch::{BatchIter, Record, decode_records};
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
use crate::cluster::{GroupState, Membership, Result, TargetCluster, TargetLimits, TargetPartition};
use crate::config::Rename;

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

    fn origin(&self, topic: &str, partition: u32) -> Result<Origin> {
        let source = self.source_topic_of(topic).ok_or_else(|| {
            status(
                Code::InvalidArgument,
                format!(
                    "Kafka target topic {topic} is not named by the rename policy for source cluster {}",
                    self.inner.source_cluster
                ),
                self.inner.clients.brokers_text(),
            )
        })?;
        Ok(Origin { cluster: self.inner.source_cluster.clone(), topic: source, partition })
    }

    fn slot(&self, topic: &str, partition: u32) -> Slot {
        let mut writers = self.inner.writers.lock();
        Arc::clone(writers.entry((topic.to_owned(), partition)).or_default())
    }

    async fn read<T, F>(&self, what: &'static str, subject: String, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Reader) -> Result<T, KafkaError> + Send + 'static,
    {
        self.inner.clients.with_reader(what, subject, f).await
    }

    /// The last record of `origin` in the target partition: (target offset, source offset, topic id).
    async fn scan(&self, topic: &str, origin: &Origin) -> Result<Option<(u64, u64, Option<String>)>> {
        let (t, o) = (topic.to_owned(), origin.clone());
        let found = self
            .read("tail read of", format!("{topic}/{}", origin.partition), move |r| provenance::tail(r, &t, &o))
            .await?;
        Ok(found.map(|(tgt, p)| (tgt as u64, p.offset, p.topic_id)))
    }

    fn remember_topic_id(&self, topic: &str, id: Option<&str>) {
        if let Some(id) = id.filter(|i| !i.is_empty()) {
            self.inner.marks.lock().entry(topic.to_owned()).or_default().source_topic_id = id.to_owned();
        }
    }

    /// The log end (source offsets) from the tail, seeding the offset map.
    async fn log_end_from_tail(&self, topic: &str, origin: &Origin) -> Result<u64> {
        let tp = (topic.to_owned(), origin.partition);
        let start = self.inner.starts.lock().get(&tp).copied().unwrap_or(0);
        let scanned = self.scan(topic, origin).await?;
        if let Some((tgt, src, id)) = &scanned {
            self.remember_topic_id(topic, id.as_deref());
            let mut maps = self.inner.maps.lock();
            let map = maps.entry(tp).or_default();
            if map.to_target(*src) != Lookup::Exact(*tgt) {
                map.clear();
                map.record(*src, *tgt);
            }
        }
        Ok(scanned.map_or(0, |(_, src, _)| src + 1).max(start))
    }

    /// Target offset of the first record whose source offset is at least `src`.
    async fn to_target(&self, topic: &str, partition: u32, src: u64) -> Result<u64> {
        let tp = (topic.to_owned(), partition);
        if let Some(Lookup::Exact(t)) = self.inner.maps.lock().get(&tp).map(|m| m.to_target(src)) {
            return Ok(t);
        }
        let origin = self.origin(topic, partition)?;
        let t = topic.to_owned();
        let at = self
            .read("offset search in", format!("{topic}/{partition}"), move |r| provenance::locate(r, &t, &origin, src))
            .await?;
        Ok(at.max(0) as u64)
    }

    /// Source offset of the first record at target offset `tgt` or later (the log end when none).
    async fn to_source(&self, topic: &str, partition: u32, tgt: u64) -> Result<u64> {
        let tp = (topic.to_owned(), partition);
        if let Some(Lookup::Exact(s)) = self.inner.maps.lock().get(&tp).map(|m| m.to_source(tgt)) {
            return Ok(s);
        }
        let origin = self.origin(topic, partition)?;
        let (t, o) = (topic.to_owned(), origin.clone());
        let found = self
            .read("offset read in", format!("{topic}/{partition}"), move |r| {
                provenance::first_from(r, &t, &o, tgt as i64, i64::MAX)
            })
            .await?;
        match found {
            Some((_, p)) => Ok(p.offset),
            None => self.log_end_from_tail(topic, &origin).await,
        }
    }

    /// The mirror mark of a topic named by the rename policy (`None`: written locally, not a mirror topic).
    async fn mark(&self, topic: &str, partitions: u32, source_topic: &str) -> Result<Option<pb::MirrorSource>> {
        let known = self.inner.marks.lock().get(topic).cloned();
        let id = match known.as_ref().map(|m| m.source_topic_id.clone()).filter(|i| !i.is_empty()) {
            Some(id) => Some(id),
            None => {
                let (t, cluster, src) = (topic.to_owned(), self.inner.source_cluster.clone(), source_topic.to_owned());
                let sample = self
                    .read("tail read of", topic.to_owned(), move |r| {
                        let mut non_empty = false;
                        for p in 0..partitions {
                            let (found, any) = provenance::tail_sample(r, &t, p, &cluster)?;
                            non_empty |= any;
                            if let Some(prov) = found.filter(|prov| prov.topic == src) {
                                return Ok(Some(Some(prov.topic_id.unwrap_or_default())));
                            }
                        }
                        Ok(if non_empty { None } else { Some(None) })
                    })
                    .await?;
                match sample {
                    // Records, none of them mirrored from this source: a local topic.
                    None => return Ok(None),
                    Some(id) => id,
                }
            }
        };
        if let Some(id) = &id {
            self.remember_topic_id(topic, Some(id));
        }
        Ok(Some(pb::MirrorSource {
            source_cluster_id: known.map(|k| k.source_cluster_id).unwrap_or_default(),
            source_topic_id: id.unwrap_or_default(),
            source_topic: source_topic.to_owned(),
            source_cluster: self.inner.source_cluster.clone(),
        }))
    }

    fn admin_error(&self, e: &KafkaError, op: &str, subject: &str) -> ClientError {
        let cause = self.inner.clients.admin().map(|a| a.inner().context().cause()).unwrap_or_default();
        map_error(e, op, subject, self.inner.clients.brokers_text(), &cause)
    }

    /// Writes the records of `batches` not yet in the partition.
    async fn append_locked(
        &self,
        writer: &mut Writer,
        topic: &str,
        origin: &Origin,
        source_topic_id: &str,
        source_log_start: u64,
        batches: &Bytes,
    ) -> Result<pb::AppendWithOffsetsResponse> {
        let tp = (topic.to_owned(), origin.partition);
        let brokers = self.inner.clients.brokers_text();
        let mut resp = pb::AppendWithOffsetsResponse::default();
        if batches.is_empty() {
            if source_log_start > writer.log_end {
                // An empty target positioned at a start point, or a source retention gap carried over.
                if writer.log_end == 0 {
                    self.inner.starts.lock().insert(tp.clone(), source_log_start);
                }
                writer.log_end = source_log_start;
            }
            resp.log_end_offset = writer.log_end;
            resp.log_start_offset = self.inner.starts.lock().get(&tp).copied().unwrap_or(0);
            return Ok(resp);
        }
        let mut records: Vec<Record> = Vec::new();
        let mut cursor = writer.log_end;
        for (i, item) in BatchIter::new(batches).enumerate() {
            let (header, bytes) = item.map_err(|e| {
                status(Code::InvalidArgument, format!("{topic}/{}: malformed batch: {e}", origin.partition), brokers)
            })?;
            if i == 0 && header.base_offset > writer.log_end && source_log_start <= writer.log_end {
                resp.error = pb::ErrorCode::GapRefused as i32;
                resp.message = format!(
                    "batch at offset {} is above the Kafka target's log end {} (source offsets) and the source log \
                     start {source_log_start} does not explain the gap",
                    header.base_offset, writer.log_end
                );
                resp.log_end_offset = writer.log_end;
                return Ok(resp);
            }
            if header.last_offset() < writer.log_end {
                resp.present_batches += 1;
                continue;
            }
            let decoded = decode_records(bytes).map_err(|e| {
                status(
                    Code::InvalidArgument,
                    format!(
                        "{topic}/{}: batch at offset {} cannot be decoded: {e}",
                        origin.partition, header.base_offset
                    ),
                    brokers,
                )
            })?;
            resp.written_batches += 1;
            for r in decoded {
                if r.offset >= cursor {
                    cursor = r.offset + 1;
                    records.push(r);
                }
            }
        }
        if !records.is_empty() {
            let pairs = writer.write(&records, origin, source_topic_id).await?;
            let mut maps = self.inner.maps.lock();
            let map = maps.entry(tp.clone()).or_default();
            for (src, tgt) in pairs {
                map.record(src, tgt);
            }
            writer.log_end = cursor;
            self.remember_topic_id(topic, Some(source_topic_id));
        }
        resp.log_end_offset = writer.log_end;
        resp.log_start_offset = self.inner.starts.lock().get(&tp).copied().unwrap_or(0);
        Ok(resp)
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
                name: t.name,
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

    async fn partition(&self, topic: &str, partition: u32) -> Result<TargetPartition> {
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
        topic: &str,
        partition: u32,
        source_topic_id: &str,
        source_log_start: u64,
        batches: Bytes,
    ) -> Result<pb::AppendWithOffsetsResponse> {
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
        let result = self.append_locked(writer, topic, &origin, source_topic_id, source_log_start, &batches).await;
        if result.is_err()
            && let Some(w) = guard.take()
        {
            // The partition's state is unknown now: the next call reopens the writer and reads the tail again.
            w.close();
        }
        result
    }

    async fn truncate(&self, topic: &str, partition: u32, _offset: u64) -> Result<u64> {
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
