//! TopicAndOffsetManager: which topics are mirrored, their target topics, and where each partition resumes.
//!
//! **Discovery** runs every `discovery_interval` (and at once after a SIGHUP): source topics matching an include
//! regex and no exclude regex are mirrored, except topics that are themselves mirror topics and topics whose name
//! starts with `{target.cluster}.` — that is what keeps active-active pairs from looping. Target topics are created
//! as mirror topics (same partition count, the source's config, the source cluster id and topic id recorded),
//! grown when the source grows (`modify_partition_num`), and kept in step with later config changes. A source
//! topic that disappears or stops matching raises `remove_topic`; its target topic is kept. A process's first round
//! also raises it once for each mirror topic of this source whose source topic is gone (deleted while no mirror
//! process ran).
//!
//! The set is published before the events that announce a change (`add_topic`, `remove_topic`,
//! `modify_partition_num`), so the SyncManager, which reconciles on them, always reads the new set. Where each
//! partition resumes is the lane's resume rule (`lane::core`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ferry_client::ClientError;
use ferry_client::proto as pb;
use futures::StreamExt;

use crate::cluster::TargetCluster;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{Rename, TopicsConfig};
use crate::egress::EgressHandle;
use crate::events::{Details, Event, EventBus, EventKind, ResizeFacts, TopicFacts};
use crate::state::Shared;

/// One mirrored topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirroredTopic {
    /// Source topic name.
    pub source: String,
    /// The source topic id the target mirror topic records (a re-created source topic differs, and halts).
    pub source_id: String,
    /// Partition count on the target.
    pub partitions: u32,
    /// Target topic name.
    pub target: String,
    /// Whether the source topic is replicated (double_write, raft3): its log end may briefly read below what was
    /// copied while a new leader's high watermark catches up, which is no divergence.
    pub replicated_source: bool,
}

/// The set of mirrored topics, by source name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicSet {
    /// Topics.
    pub topics: BTreeMap<String, MirroredTopic>,
    /// True once a discovery round completed (before that the set is empty because nothing is known).
    pub discovered: bool,
}

/// Target topic name of a source topic.
pub fn target_name(rename: Rename, source_cluster: &str, topic: &str) -> String {
    match rename {
        Rename::Identity => topic.to_owned(),
        Rename::Prefix => format!("{source_cluster}.{topic}"),
    }
}

/// Whether a source topic is selected by the rules (before the mirror-topic check).
pub fn selected(cfg: &TopicsConfig, target_cluster: &str, topic: &str) -> bool {
    cfg.include.iter().any(|r| r.is_match(topic))
        && !cfg.exclude.iter().any(|r| r.is_match(topic))
        && !topic.starts_with(&format!("{target_cluster}."))
}

/// Target mirror topics of this source whose source topic is gone: marked with this source cluster, named by the
/// rename policy after a source topic the rules select, and that source topic absent from `source_names` (the
/// listing of every source topic). Returns (source topic, target topic) pairs.
pub fn gone_from_source<'a>(
    rules: &TopicsConfig,
    naming: &Naming,
    source_names: &BTreeSet<&str>,
    target_topics: impl IntoIterator<Item = &'a pb::TopicInfo>,
) -> Vec<(String, String)> {
    target_topics
        .into_iter()
        .filter_map(|t| {
            let mark = t.mirror.as_ref()?;
            let ours = mark.source_cluster == naming.source_cluster
                && target_name(rules.rename, &naming.source_cluster, &mark.source_topic) == t.name
                && selected(rules, &naming.target_cluster, &mark.source_topic);
            (ours && !source_names.contains(mark.source_topic.as_str()))
                .then(|| (mark.source_topic.clone(), t.name.clone()))
        })
        .collect()
}

/// The parts of a topic config the mirror keeps in step.
fn config_differs(source: Option<&pb::TopicConfig>, target: Option<&pb::TopicConfig>) -> bool {
    // Only fields both sides report are compared: a Kafka side reports a partial config, and a field one side does
    // not know is nothing to copy.
    fn differ<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
        matches!((a, b), (Some(a), Some(b)) if a != b)
    }
    match (source, target) {
        (Some(s), Some(t)) => {
            differ(&s.flush, &t.flush)
                || differ(&s.flush_interval_ms, &t.flush_interval_ms)
                || differ(&s.flush_bytes, &t.flush_bytes)
                || differ(&s.retention_bytes, &t.retention_bytes)
                || differ(&s.retention_ms, &t.retention_ms)
                || differ(&s.segment_bytes, &t.segment_bytes)
                || differ(&s.segment_ms, &t.segment_ms)
        }
        _ => false,
    }
}

/// Whether the source topic's config must be copied to the target: it differs from the target's, and it is not what
/// was copied last. The target broker may adjust a value (a segment is never smaller than its largest batch), and
/// then the two configs never match; copying again on every round would change nothing.
fn must_copy_config(
    source: Option<&pb::TopicConfig>,
    target: Option<&pb::TopicConfig>,
    last_copied: Option<&pb::TopicConfig>,
) -> bool {
    config_differs(source, target) && last_copied.is_none_or(|last| config_differs(source, Some(last)))
}

/// Identity and naming the manager needs.
#[derive(Debug, Clone)]
pub struct Naming {
    /// `source.cluster`.
    pub source_cluster: String,
    /// `target.cluster`.
    pub target_cluster: String,
    /// `target.replication`: "source", or the mode of every mirror topic created.
    pub target_replication: String,
}

impl Naming {
    /// How the mirror topic of source topic `t` is kept on the target: its own mode and risk phase under
    /// `target.replication = "source"`, else the configured mode.
    pub fn replication_of(&self, t: &pb::TopicInfo) -> (String, bool) {
        if self.target_replication == "source" {
            let mode = if t.replication.is_empty() { "single".to_owned() } else { t.replication.clone() };
            (mode, t.risk_phase)
        } else {
            (self.target_replication.clone(), false)
        }
    }
}

/// The TopicAndOffsetManager.
pub struct TopicAndOffsetManager {
    naming: Naming,
    rules: watch::Receiver<TopicsConfig>,
    target: Arc<dyn TargetCluster>,
    egress: EgressHandle,
    events: EventBus,
    shared: Arc<Shared>,
    tx: watch::Sender<Arc<TopicSet>>,
    /// Target topics refused because they are not (or no longer) mirror topics, to alarm once.
    refused: BTreeSet<String>,
    /// The source config last given to each target topic (at creation or by a copy).
    copied_config: BTreeMap<String, pb::TopicConfig>,
    /// Events of the current round, raised once its topic set is published.
    deferred: Vec<Event>,
    /// Whether the current round created or changed a target topic (or tried to).
    acted: bool,
    /// What the last round read, and whether it was quiet.
    last: LastRound,
}

/// What the last completed discovery round read. A round that reads exactly the same (both sides' lists, by their
/// digests; the same rules and source cluster) after a quiet one (nothing created or changed, no event) would
/// decide the same and do nothing: it is skipped, and a list that did not change costs its digest, not the list.
#[derive(Default)]
struct LastRound {
    source_digest: Vec<u8>,
    target_digest: Vec<u8>,
    source_topics: Vec<pb::TopicInfo>,
    target_topics: Vec<pb::TopicInfo>,
    rules: Option<TopicsConfig>,
    cluster_id: String,
    quiet: bool,
}

impl TopicAndOffsetManager {
    /// A manager publishing the topic set on `tx`.
    pub fn new(
        naming: Naming,
        rules: watch::Receiver<TopicsConfig>,
        target: Arc<dyn TargetCluster>,
        egress: EgressHandle,
        events: EventBus,
        shared: Arc<Shared>,
        tx: watch::Sender<Arc<TopicSet>>,
    ) -> TopicAndOffsetManager {
        TopicAndOffsetManager {
            naming,
            rules,
            target,
            egress,
            events,
            shared,
            tx,
            refused: BTreeSet::new(),
            copied_config: BTreeMap::new(),
            deferred: Vec::new(),
            acted: false,
            last: LastRound::default(),
        }
    }

    /// Runs discovery until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let interval = self.rules.borrow().discovery_interval;
            if let Err(e) = self.discover().await {
                tracing::warn!(error = %e, "topic discovery failed; keeping the current topic set");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
                changed = self.rules.changed() => {
                    if changed.is_err() { return; }
                    tracing::info!("topic rules reloaded; discovering now");
                }
            }
        }
    }

    /// One discovery round.
    pub async fn discover(&mut self) -> Result<(), ClientError> {
        let rules = self.rules.borrow().clone();
        let source = Arc::clone(&self.egress.active().cluster);
        // Taken out for the round: a round that fails part way leaves nothing to compare the next one with.
        let last = std::mem::take(&mut self.last);
        let (source_listed, source_digest) = source.list_topics_since(&last.source_digest).await?;
        let (target_listed, target_digest) = self.target.list_topics_since(&last.target_digest).await?;
        let cluster_id = match self.egress.expected_cluster_id() {
            Some(id) => id,
            None => source.probe(std::time::Duration::from_secs(10)).await?,
        };
        let same_rules = last.rules.as_ref().is_some_and(|r| r.decides_as(&rules));
        if last.quiet
            && source_listed.is_none()
            && target_listed.is_none()
            && same_rules
            && last.cluster_id == cluster_id
        {
            self.last = last;
            self.events.metrics().discovery_round("unchanged");
            return Ok(());
        }
        let source_topics = source_listed.unwrap_or(last.source_topics);
        let target_list = target_listed.unwrap_or(last.target_topics);
        let target_topics: BTreeMap<&str, &pb::TopicInfo> = target_list.iter().map(|t| (t.name.as_str(), t)).collect();
        self.acted = false;
        let previous = self.tx.borrow().clone();
        let mut next = TopicSet { topics: BTreeMap::new(), discovered: true };
        let mut missing = Vec::new();
        for t in &source_topics {
            if t.mirror.is_some() || !selected(&rules, &self.naming.target_cluster, &t.name) {
                continue;
            }
            let target = target_name(rules.rename, &self.naming.source_cluster, &t.name);
            match target_topics.get(target.as_str()) {
                None => missing.push((t, target)),
                Some(existing) => {
                    if let Some(m) = self.reconcile(t, existing).await {
                        next.topics.insert(t.name.clone(), m);
                    }
                }
            }
        }
        self.acted |= !missing.is_empty();
        // Creates run side by side (a target broker writes different topics in parallel): a first round over
        // thousands of topics is not thousands of round trips and fsync chains one after another.
        let (target, naming, cid) = (&self.target, &self.naming, cluster_id.as_str());
        let creates: Vec<_> = missing
            .into_iter()
            .map(|(t, name)| async move {
                let created = create(target.as_ref(), naming, t, &name, cid).await;
                (t, name, created)
            })
            .collect();
        let mut creates = futures::stream::iter(creates).buffer_unordered(CREATES_IN_FLIGHT);
        while let Some((t, target, created)) = creates.next().await {
            match created {
                Ok((m, config)) => {
                    if let Some(config) = config {
                        self.copied_config.insert(m.target.clone(), config);
                    }
                    next.topics.insert(t.name.clone(), m);
                }
                Err(e) => {
                    tracing::warn!(topic = %t.name, target = %target, error = %e, "cannot create the target topic");
                }
            }
        }
        drop(creates);
        for (name, m) in &next.topics {
            if !previous.topics.contains_key(name) {
                self.deferred.push(
                    Event::new(
                        EventKind::AddTopic,
                        format!("mirroring {name} -> {} ({} partitions)", m.target, m.partitions),
                    )
                    .topic(name)
                    .with(Details::Topic(TopicFacts {
                        target_topic: m.target.clone(),
                        partitions: Some(m.partitions),
                    })),
                );
            }
        }
        if !previous.discovered {
            // A new process does not know what an earlier one mirrored, so a source topic deleted while no mirror
            // process ran (or whose deletion made librdkafka crash the last one, docs/kafka.md) would never be
            // reported: the first round reports each such mirror topic of this source once, as it reports every
            // mirrored topic with add_topic.
            let source_names: BTreeSet<&str> = source_topics.iter().map(|t| t.name.as_str()).collect();
            for (source, target) in
                gone_from_source(&rules, &self.naming, &source_names, target_topics.values().copied())
            {
                self.deferred.push(
                    Event::new(
                        EventKind::RemoveTopic,
                        format!("not mirroring {source}: the source topic is gone (deleted on the source); the target topic {target} is kept"),
                    )
                    .topic(&source)
                    .with(Details::Topic(TopicFacts { target_topic: target, partitions: None })),
                );
            }
        }
        for name in previous.topics.keys() {
            if !next.topics.contains_key(name) {
                self.deferred.push(
                    Event::new(EventKind::RemoveTopic, format!("stopped mirroring {name} (deleted on the source or no longer selected); the target topic is kept"))
                        .topic(name),
                );
            }
        }
        *self.shared.topics.lock() = next.topics.iter().map(|(s, m)| (s.clone(), m.target.clone())).collect();
        if *previous != next {
            self.tx.send_replace(Arc::new(next));
        }
        let quiet = !self.acted && self.deferred.is_empty();
        // The events of the round go out once the new set is published: whoever reacts to them reads it.
        for event in self.deferred.drain(..) {
            self.events.emit(event);
        }
        self.last = LastRound {
            source_digest,
            target_digest,
            source_topics,
            target_topics: target_list,
            rules: Some(rules),
            cluster_id,
            quiet,
        };
        self.events.metrics().discovery_round("read");
        Ok(())
    }

    /// Brings an existing target topic in step; `None` when it must not be mirrored into.
    async fn reconcile(&mut self, t: &pb::TopicInfo, existing: &pb::TopicInfo) -> Option<MirroredTopic> {
        let Some(mark) = &existing.mirror else {
            if self.refused.insert(existing.name.clone()) {
                self.deferred.push(
                    Event::new(
                        EventKind::SyncError,
                        format!(
                            "target topic {} exists and is not a mirror topic (promoted, or created locally); {} is not mirrored into it",
                            existing.name, t.name
                        ),
                    )
                    .topic(&t.name)
                    .with(Details::Topic(TopicFacts { target_topic: existing.name.clone(), partitions: None })),
                );
            }
            return None;
        };
        self.refused.remove(&existing.name);
        let mut partitions = existing.partitions;
        if t.partitions > existing.partitions {
            self.acted = true;
            match self.target.alter_partitions(&existing.name, t.partitions).await {
                Ok(_) => {
                    partitions = t.partitions;
                    self.deferred.push(
                        Event::new(
                            EventKind::ModifyPartitionNum,
                            format!(
                                "{} grew from {} to {} partitions; the target followed",
                                t.name, existing.partitions, t.partitions
                            ),
                        )
                        .topic(&t.name)
                        .with(Details::Resized(ResizeFacts { from: existing.partitions, to: t.partitions })),
                    );
                }
                Err(e) => tracing::warn!(topic = %t.name, error = %e, "cannot grow the target topic"),
            }
        }
        if mark.source_topic_id == t.topic_id
            && must_copy_config(t.config.as_ref(), existing.config.as_ref(), self.copied_config.get(&existing.name))
        {
            let config = t.config.clone().unwrap_or_default();
            self.acted = true;
            match self.target.alter_topic_config(&existing.name, config.clone()).await {
                Ok(_) => {
                    tracing::info!(topic = %t.name, "copied the source topic's config change to the target");
                    self.copied_config.insert(existing.name.clone(), config);
                }
                Err(e) => tracing::warn!(topic = %t.name, error = %e, "cannot copy the topic config"),
            }
        }
        Some(MirroredTopic {
            source: t.name.clone(),
            // The id the target records: a re-created source topic shows a different id and its partitions halt.
            // A target that cannot record it (an empty Kafka topic after a restart) adopts the source's id.
            source_id: if mark.source_topic_id.is_empty() { t.topic_id.clone() } else { mark.source_topic_id.clone() },
            partitions,
            target: existing.name.clone(),
            replicated_source: !matches!(t.replication.as_str(), "" | "single"),
        })
    }
}

/// Target topics a discovery round creates at once.
const CREATES_IN_FLIGHT: usize = 16;

/// Creates the mirror topic `target` of source topic `t` (an existing one, created first by another mirror process,
/// is fine). Gives the topic as mirrored and the config given to it, unless another process created it.
async fn create(
    cluster: &dyn TargetCluster,
    naming: &Naming,
    t: &pb::TopicInfo,
    target: &str,
    cluster_id: &str,
) -> Result<(MirroredTopic, Option<pb::TopicConfig>), ClientError> {
    let mirror = pb::MirrorSource {
        source_cluster_id: cluster_id.to_owned(),
        source_topic_id: t.topic_id.clone(),
        source_topic: t.name.clone(),
        source_cluster: naming.source_cluster.clone(),
    };
    let (replication, risk_phase) = naming.replication_of(t);
    let config = t.config.clone().unwrap_or_default();
    let copied =
        match cluster.create_topic(target, t.partitions, config.clone(), mirror, &replication, risk_phase).await {
            Ok(_) => Some(config),
            // Another mirror process created it first: fine.
            Err(e) if e.is_already_exists() => None,
            Err(e) => return Err(e),
        };
    tracing::info!(topic = %t.name, target, partitions = t.partitions, replication, "created target mirror topic");
    let mirrored = MirroredTopic {
        source: t.name.clone(),
        source_id: t.topic_id.clone(),
        partitions: t.partitions,
        target: target.to_owned(),
        replicated_source: !matches!(t.replication.as_str(), "" | "single"),
    };
    Ok((mirrored, copied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    fn rules(include: &[&str], exclude: &[&str]) -> TopicsConfig {
        TopicsConfig {
            include: include.iter().map(|r| Regex::new(r).unwrap()).collect(),
            exclude: exclude.iter().map(|r| Regex::new(r).unwrap()).collect(),
            rename: Rename::Prefix,
            discovery_interval: std::time::Duration::from_secs(1),
            start_position: crate::config::StartPosition::Earliest,
        }
    }

    #[test]
    fn selection_honours_include_exclude_and_loop_prevention() {
        let r = rules(&["^orders", "^payments$"], &["^__", "internal$"]);
        assert!(selected(&r, "dc-b", "orders.eu"));
        assert!(selected(&r, "dc-b", "payments"));
        assert!(!selected(&r, "dc-b", "payments2"));
        assert!(!selected(&r, "dc-b", "orders.internal"));
        let all = rules(&[".*"], &[]);
        assert!(!selected(&all, "dc-b", "dc-b.orders"), "a topic mirrored from dc-b must not go back to dc-b");
        assert!(selected(&all, "dc-b", "dc-a.orders"));
    }

    #[test]
    fn a_config_is_copied_once_even_when_the_target_adjusts_it() {
        let config = |segment: u64| pb::TopicConfig { segment_bytes: Some(segment), ..Default::default() };
        let (source, target) = (config(64 << 10), config(1 << 20));
        assert!(must_copy_config(Some(&source), Some(&target), None), "never copied: copy");
        assert!(
            !must_copy_config(Some(&source), Some(&target), Some(&source)),
            "copied as it is: the target adjusted it"
        );
        assert!(must_copy_config(Some(&config(128 << 10)), Some(&target), Some(&source)), "the source changed since");
        assert!(!must_copy_config(Some(&target), Some(&target), None), "equal: nothing to copy");
    }

    #[test]
    fn a_mirror_topic_whose_source_topic_is_gone_is_found_and_nothing_else() {
        let naming = Naming {
            source_cluster: "dc-a".into(),
            target_cluster: "dc-b".into(),
            target_replication: "source".into(),
        };
        let topic = |name: &str, source: Option<(&str, &str)>| pb::TopicInfo {
            name: name.into(),
            mirror: source.map(|(cluster, topic)| pb::MirrorSource {
                source_cluster: cluster.into(),
                source_topic: topic.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let target = [
            topic("dc-a.orders", Some(("dc-a", "orders"))),     // gone from the source
            topic("dc-a.payments", Some(("dc-a", "payments"))), // still there
            topic("dc-c.orders", Some(("dc-c", "orders"))),     // another source cluster's
            topic("dc-a.internal", Some(("dc-a", "internal"))), // excluded by the rules
            topic("orders", Some(("dc-a", "orders"))),          // not named by the prefix policy
            topic("dc-a.local", None),                          // not a mirror topic
        ];
        let source: BTreeSet<&str> = ["payments"].into();
        let r = rules(&[".*"], &["internal$"]);
        assert_eq!(
            gone_from_source(&r, &naming, &source, &target),
            vec![("orders".to_owned(), "dc-a.orders".to_owned())]
        );
    }

    #[test]
    fn rename_policies() {
        assert_eq!(target_name(Rename::Identity, "dc-a", "orders"), "orders");
        assert_eq!(target_name(Rename::Prefix, "dc-a", "orders"), "dc-a.orders");
    }
}
