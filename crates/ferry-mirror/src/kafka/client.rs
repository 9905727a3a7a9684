//! The librdkafka clients one side of the mirror shares for everything but fetching and producing: a metadata
//! client, an admin client and one consumer per consumer group (for committed offsets), each created on first use
//! and dropped by [`KafkaClients::reset`] so that the next call dials again. Every blocking librdkafka call runs on
//! the blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ferry_client::ClientError;
use ferry_client::proto as pb;
use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use super::error::{KafkaSetupError, map_error};
use super::props::{Ctx, Side, blocking, client_config};
use super::reader::Reader;
use super::topic_config;

/// A consumer used only for metadata, watermarks and group offsets (never assigned, never subscribed).
pub(crate) type MetaConsumer = BaseConsumer<Ctx>;

/// Group consumers kept at most; more groups than this drop the cache (they are cheap to re-create).
const MAX_GROUP_CLIENTS: usize = 32;

/// One Kafka topic as metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicMeta {
    pub(crate) name: String,
    pub(crate) partitions: u32,
}

/// A group as the cluster lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupMeta {
    pub(crate) name: String,
    pub(crate) state: String,
    pub(crate) members: usize,
}

/// Lazily created clients of one side.
pub(crate) struct KafkaClients {
    side: Side,
    brokers: Vec<String>,
    brokers_text: String,
    properties: BTreeMap<String, String>,
    client_id: String,
    timeout: Duration,
    meta: Mutex<Option<Arc<MetaConsumer>>>,
    admin: Mutex<Option<Arc<AdminClient<Ctx>>>>,
    groups: Mutex<HashMap<String, Arc<MetaConsumer>>>,
    reader: Arc<Mutex<Option<Reader>>>,
}

impl std::fmt::Debug for KafkaClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaClients")
            .field("side", &self.side)
            .field("brokers", &self.brokers)
            .field("properties", &super::redacted(&self.properties))
            .finish_non_exhaustive()
    }
}

impl KafkaClients {
    /// Checks the properties now; clients are created on first use.
    pub(crate) fn new(
        side: Side,
        brokers: Vec<String>,
        properties: BTreeMap<String, String>,
        client_id: String,
        timeout: Duration,
    ) -> Result<KafkaClients, KafkaSetupError> {
        client_config(side, &brokers, &properties, &[], &[])?;
        Ok(KafkaClients {
            side,
            brokers_text: brokers.join(","),
            brokers,
            properties,
            client_id,
            timeout,
            meta: Mutex::new(None),
            admin: Mutex::new(None),
            groups: Mutex::new(HashMap::new()),
            reader: Arc::new(Mutex::new(None)),
        })
    }

    pub(crate) fn side(&self) -> Side {
        self.side
    }

    pub(crate) fn brokers(&self) -> &[String] {
        &self.brokers
    }

    pub(crate) fn brokers_text(&self) -> &str {
        &self.brokers_text
    }

    pub(crate) fn properties(&self) -> &BTreeMap<String, String> {
        &self.properties
    }

    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Drops every client: the next call creates new ones (and connects again).
    pub(crate) fn reset(&self) {
        *self.meta.lock() = None;
        *self.admin.lock() = None;
        self.groups.lock().clear();
        *self.reader.lock() = None;
    }

    fn setup_error(&self, role: &str, e: &KafkaError) -> ClientError {
        KafkaSetupError::ClientCreation {
            role: role.to_owned(),
            brokers: self.brokers_text.clone(),
            message: e.to_string(),
        }
        .into()
    }

    /// A consumer config with `extra` owned properties (client.id is always the mirror's).
    pub(crate) fn consumer_config(&self, extra: &[(&str, String)]) -> Result<rdkafka::ClientConfig, ClientError> {
        let mut owned: Vec<(&str, String)> =
            vec![("client.id", self.client_id.clone()), ("enable.auto.commit", "false".into())];
        owned.extend(extra.iter().cloned());
        Ok(client_config(self.side, &self.brokers, &self.properties, &owned, &[])?)
    }

    /// The metadata client.
    pub(crate) fn meta(&self) -> Result<Arc<MetaConsumer>, ClientError> {
        let mut slot = self.meta.lock();
        if let Some(c) = slot.as_ref() {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(self.fresh_meta()?);
        *slot = Some(Arc::clone(&c));
        Ok(c)
    }

    /// A new metadata client that knows only the bootstrap servers, so its first request goes through them (a
    /// long-lived client also talks to the brokers the cluster advertises, whatever the route).
    pub(crate) fn fresh_meta(&self) -> Result<MetaConsumer, ClientError> {
        let cfg = self.consumer_config(&[])?;
        let label = format!("{} metadata [{}]", self.side.section(), self.brokers_text);
        cfg.create_with_context(Ctx::new(label)).map_err(|e| self.setup_error("metadata", &e))
    }

    /// The admin client.
    pub(crate) fn admin(&self) -> Result<Arc<AdminClient<Ctx>>, ClientError> {
        let mut slot = self.admin.lock();
        if let Some(c) = slot.as_ref() {
            return Ok(Arc::clone(c));
        }
        let cfg =
            client_config(self.side, &self.brokers, &self.properties, &[("client.id", self.client_id.clone())], &[])?;
        let label = format!("{} admin [{}]", self.side.section(), self.brokers_text);
        let c: AdminClient<Ctx> =
            cfg.create_with_context(Ctx::new(label)).map_err(|e| self.setup_error("admin", &e))?;
        let c = Arc::new(c);
        *slot = Some(Arc::clone(&c));
        Ok(c)
    }

    /// The consumer that reads and commits `group`'s offsets (never joins the group).
    pub(crate) fn group(&self, group: &str) -> Result<Arc<MetaConsumer>, ClientError> {
        let mut groups = self.groups.lock();
        if let Some(c) = groups.get(group) {
            return Ok(Arc::clone(c));
        }
        if groups.len() >= MAX_GROUP_CLIENTS {
            groups.clear();
        }
        let cfg = self.consumer_config(&[("group.id", group.to_owned())])?;
        let label = format!("{} group {group} [{}]", self.side.section(), self.brokers_text);
        let c: MetaConsumer = cfg.create_with_context(Ctx::new(label)).map_err(|e| self.setup_error("group", &e))?;
        let c = Arc::new(c);
        groups.insert(group.to_owned(), Arc::clone(&c));
        Ok(c)
    }

    /// Every topic but internal ones and ones the cluster reports an error for.
    pub(crate) async fn topics(&self) -> Result<Vec<TopicMeta>, ClientError> {
        let c = self.meta()?;
        let timeout = self.timeout;
        let brokers = self.brokers_text.clone();
        blocking("metadata", move || {
            let md = c
                .fetch_metadata(None, timeout)
                .map_err(|e| map_error(&e, "metadata from", &format!("[{brokers}]"), &brokers, &c.context().cause()))?;
            Ok(md
                .topics()
                .iter()
                .filter(|t| t.error().is_none() && !super::is_internal_topic(t.name()))
                .map(|t| TopicMeta { name: t.name().to_owned(), partitions: t.partitions().len() as u32 })
                .collect())
        })
        .await
    }

    /// Runs `f` with the (lazily created) read-committed [`Reader`] on the blocking pool.
    pub(crate) async fn with_reader<T, F>(&self, what: &'static str, subject: String, f: F) -> Result<T, ClientError>
    where
        T: Send + 'static,
        F: FnOnce(&Reader) -> Result<T, KafkaError> + Send + 'static,
    {
        let slot = Arc::clone(&self.reader);
        let cfg = self.consumer_config(&[
            // Required by librdkafka for assign(); the reader never joins nor commits to it.
            ("group.id", format!("{}.reader", self.client_id)),
            ("isolation.level", "read_committed".to_owned()),
            ("enable.partition.eof", "true".to_owned()),
            ("auto.offset.reset", "error".to_owned()),
            // One-shot reads: at the end of a partition the broker must answer at once, not long-poll.
            ("fetch.wait.max.ms", "10".to_owned()),
        ])?;
        let brokers = self.brokers_text.clone();
        let (timeout, side) = (self.timeout, self.side);
        blocking(what, move || {
            let mut guard = slot.lock();
            if guard.is_none() {
                let ctx = Ctx::new(format!("{} reader [{brokers}]", side.section()));
                let consumer: MetaConsumer = cfg.create_with_context(ctx).map_err(|e| {
                    ClientError::from(KafkaSetupError::ClientCreation {
                        role: "reader".into(),
                        brokers: brokers.clone(),
                        message: e.to_string(),
                    })
                })?;
                *guard = Some(Reader { consumer, timeout });
            }
            let reader = guard.as_ref().expect("created above");
            match f(reader) {
                Ok(v) => Ok(v),
                Err(e) => {
                    let cause = reader.consumer.context().cause();
                    if e.rdkafka_error_code().is_some_and(|c| c != RDKafkaErrorCode::UnknownTopicOrPartition) {
                        // Start from a fresh reader next time.
                        *guard = None;
                    }
                    Err(map_error(&e, what, &subject, &brokers, &cause))
                }
            }
        })
        .await
    }

    /// A partition's (log start, log end), the end as fetch responses report it (see [`Reader::bounds`]).
    pub(crate) async fn watermarks(&self, topic: &str, partition: u32) -> Result<(u64, u64), ClientError> {
        let t = topic.to_owned();
        let (lo, hi) =
            self.with_reader("watermarks of", format!("{topic}/{partition}"), move |r| r.bounds(&t, partition)).await?;
        Ok((lo as u64, hi as u64))
    }

    /// Committed offsets of `group` for `partitions` (every partition of every topic when empty). Partitions
    /// without a committed offset are left out.
    pub(crate) async fn committed(
        &self,
        group: &str,
        partitions: &[(String, u32)],
    ) -> Result<Vec<pb::CommittedOffset>, ClientError> {
        let partitions: Vec<(String, u32)> = if partitions.is_empty() {
            self.topics().await?.into_iter().flat_map(|t| (0..t.partitions).map(move |p| (t.name.clone(), p))).collect()
        } else {
            partitions.to_vec()
        };
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.group(group)?;
        let timeout = self.timeout;
        let brokers = self.brokers_text.clone();
        let group = group.to_owned();
        blocking("committed offsets", move || {
            let mut tpl = TopicPartitionList::with_capacity(partitions.len());
            for (t, p) in &partitions {
                tpl.add_partition(t, *p as i32);
            }
            let got = c
                .committed_offsets(tpl, timeout)
                .map_err(|e| map_error(&e, "committed offsets of group", &group, &brokers, &c.context().cause()))?;
            Ok(got
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 && e.error().is_ok() => Some(pb::CommittedOffset {
                        topic: e.topic().to_owned(),
                        partition: e.partition() as u32,
                        offset: o as u64,
                        metadata: e.metadata().to_owned(),
                    }),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// Commits `offsets` (in this cluster's offsets) for `group` without joining it.
    pub(crate) async fn commit(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<(), ClientError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let c = self.group(group)?;
        let brokers = self.brokers_text.clone();
        let group = group.to_owned();
        blocking("commit", move || {
            let mut tpl = TopicPartitionList::with_capacity(offsets.len());
            for o in &offsets {
                let offset = Offset::Offset(i64::try_from(o.offset).unwrap_or(i64::MAX));
                tpl.add_partition_offset(&o.topic, o.partition as i32, offset)
                    .map_err(|e| map_error(&e, "commit for group", &group, &brokers, ""))?;
                if !o.metadata.is_empty()
                    && let Some(mut elem) = tpl.find_partition(&o.topic, o.partition as i32)
                {
                    elem.set_metadata(o.metadata.clone());
                }
            }
            c.commit(&tpl, CommitMode::Sync)
                .map_err(|e| map_error(&e, "commit for group", &group, &brokers, &c.context().cause()))
        })
        .await
    }

    /// Groups (all of them, or the one named) with their state and member count.
    pub(crate) async fn groups(&self, group: Option<&str>) -> Result<Vec<GroupMeta>, ClientError> {
        let c = self.meta()?;
        let timeout = self.timeout;
        let brokers = self.brokers_text.clone();
        let group = group.map(str::to_owned);
        blocking("group list", move || {
            let list = c.fetch_group_list(group.as_deref(), timeout).map_err(|e| {
                map_error(&e, "group list", group.as_deref().unwrap_or(""), &brokers, &c.context().cause())
            })?;
            Ok(list
                .groups()
                .iter()
                .map(|g| GroupMeta {
                    name: g.name().to_owned(),
                    state: g.state().to_owned(),
                    members: g.members().len(),
                })
                .collect())
        })
        .await
    }

    /// The carried configs of `topics` (see [`topic_config`]); a cluster that does not describe configs gives
    /// `None` for every topic.
    pub(crate) async fn topic_configs(&self, topics: &[String]) -> HashMap<String, Option<pb::TopicConfig>> {
        let mut out: HashMap<String, Option<pb::TopicConfig>> = topics.iter().map(|t| (t.clone(), None)).collect();
        if topics.is_empty() {
            return out;
        }
        let Ok(admin) = self.admin() else { return out };
        let specs: Vec<ResourceSpecifier<'_>> = topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        match admin.describe_configs(specs.iter(), &opts).await {
            Ok(results) => {
                for r in results.into_iter().flatten() {
                    let rdkafka::admin::OwnedResourceSpecifier::Topic(name) = &r.specifier else { continue };
                    let entries = r.entries.iter().map(|e| (e.name.as_str(), e.value.as_deref()));
                    out.insert(name.clone(), topic_config::from_kafka(entries));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, brokers = %self.brokers_text, "describe configs failed; configs are not carried")
            }
        }
        out
    }

    /// Whether `e` says the cluster lacks the feature (an old broker, or a Kafka-API broker that leaves it out).
    pub(crate) fn unsupported(e: &KafkaError) -> bool {
        matches!(
            super::error::code_of(e),
            Some(
                RDKafkaErrorCode::UnsupportedFeature
                    | RDKafkaErrorCode::UnsupportedVersion
                    | RDKafkaErrorCode::NotImplemented
            )
        )
    }
}
