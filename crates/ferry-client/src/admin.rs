//! [`Admin`]: thin, typed topic, offset, mirror and group administration over [`BrokerClient`].
//!
//! Results are the protocol's own message types where they are already plain data (`TopicInfo`,
//! `PartitionInfo`, `CommittedOffset`, ...); a response field the protocol promises but the broker left out is a
//! [`ClientError::Protocol`], never a panic or a silent default.

use bytes::Bytes;
use ferry_proto as pb;

use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};

mod dr;
mod offsets;

pub use dr::{Job, TopicOutcome};

pub use ferry_proto::{
    AppendWithOffsetsResponse, CommittedOffset, DescribeGroupResponse, EpochEndResponse, GroupSummary,
    MetadataResponse, MirrorSource, OffsetRange, PartitionInfo, TopicConfig, TopicInfo,
};

/// How many times a partition answer pointing at another leader is followed before its error is returned.
const LEADER_ROUNDS: u32 = 4;

/// Which offset [`Admin::list_offsets`] looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start offset.
    Earliest,
    /// The log end offset.
    Latest,
    /// The first offset whose record timestamp is at or after this (ms since the epoch).
    Timestamp(i64),
}

/// The answer of [`Admin::list_offsets`] for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The offset asked for; `None` for a timestamp after the last record.
    pub offset: Option<u64>,
    /// Log start offset.
    pub log_start_offset: u64,
    /// Log end offset.
    pub log_end_offset: u64,
    /// How long ago, by the answering broker's clock, the log end reached its value (what a replicated
    /// partition's readers see: its high watermark); `None` when the broker does not say.
    pub log_end_age_ms: Option<u64>,
    /// The fence in force at the answering leader, when the topic is fenced there.
    pub fence_epoch: Option<u64>,
    /// The end of the answering broker's own log (a replicated partition's `log_end_offset` is its high
    /// watermark): with a fence in force and both equal, what the partition holds is final.
    pub stored_end_offset: u64,
}

/// A topic and its partitions, as [`Admin::describe_topic`] returns them.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicDescription {
    /// The topic.
    pub topic: TopicInfo,
    /// Its partitions, in partition order.
    pub partitions: Vec<PartitionInfo>,
}

/// The answer of [`Admin::promote`].
#[derive(Debug, Clone, PartialEq)]
pub struct Promoted {
    /// The topic after promotion.
    pub topic: TopicInfo,
    /// False when the topic was not a mirror topic (promote is idempotent).
    pub was_mirror: bool,
}

/// Administration calls. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Admin {
    client: BrokerClient,
    /// Set once a broker answered ListOffsets by topic with nothing (it predates the form): asked flat from then on.
    flat_offsets: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Admin {
    /// Administration over `client`.
    pub fn new(client: BrokerClient) -> Self {
        Admin { client, flat_offsets: Default::default() }
    }

    /// The underlying client.
    pub fn client(&self) -> &BrokerClient {
        &self.client
    }

    /// Cluster id, advertised address and limits.
    pub async fn metadata(&self) -> Result<MetadataResponse> {
        self.client.metadata().await
    }

    /// Creates a topic; with `mirror` it is a read-only mirror topic.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: TopicConfig,
        mirror: Option<MirrorSource>,
    ) -> Result<TopicInfo> {
        self.create_topic_kept(name, partitions, Some(config), mirror, "", false).await
    }

    /// Creates a topic kept as `replication` says: "single", "double_write" (two replicas) or "raft3" (three
    /// replicas over the cluster's brokers).
    pub async fn create_replicated_topic(&self, name: &str, partitions: u32, replication: &str) -> Result<TopicInfo> {
        self.create_topic_kept(name, partitions, None, None, replication, false).await
    }

    /// Creates a topic with every option: its config, its mirror mark, and how it is kept (`replication`: "" or
    /// "single" for one broker's topic, "double_write" or "raft3" over the cluster's brokers; `risk_phase`, for
    /// double_write, lets writes go on with one replica while a lost one is replaced).
    pub async fn create_topic_kept(
        &self,
        name: &str,
        partitions: u32,
        config: Option<TopicConfig>,
        mirror: Option<MirrorSource>,
        replication: &str,
        risk_phase: bool,
    ) -> Result<TopicInfo> {
        let request = pb::CreateTopicRequest {
            name: name.to_owned(),
            partitions,
            config,
            mirror,
            replication: replication.to_owned(),
            risk_phase,
        };
        let response = self.client.create_topic(request).await?;
        self.require("CreateTopic", response.topic)
    }

    /// Deletes a topic.
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        self.client.delete_topic(pb::DeleteTopicRequest { name: name.to_owned() }).await.map(drop)
    }

    /// Every topic.
    pub async fn list_topics(&self) -> Result<Vec<TopicInfo>> {
        Ok(self.client.list_topics(pb::ListTopicsRequest::default()).await?.topics)
    }

    /// Every topic, unless the list is exactly the one an earlier answer's `digest` named: the topics (`None` when
    /// unchanged) and the list's digest. A broker from before digests answers with the list and an empty digest.
    pub async fn list_topics_since(&self, digest: &[u8]) -> Result<(Option<Vec<TopicInfo>>, Vec<u8>)> {
        let request = pb::ListTopicsRequest { unless_digest: digest.to_vec().into() };
        let answer = self.client.list_topics(request).await?;
        if answer.unchanged && !digest.is_empty() && answer.digest.as_ref() == digest {
            return Ok((None, answer.digest.to_vec()));
        }
        Ok((Some(answer.topics), answer.digest.to_vec()))
    }

    /// A topic with its partitions (sorted by partition). On a cluster each replicated partition is described by
    /// its leader, at the leader epoch this client knows (Kafka's KIP-320): a partition the asked broker cannot
    /// answer for is asked again at the leader it names, a few rounds at most; one still unanswered keeps its
    /// error (`PartitionInfo::error`, with the leader hint).
    pub async fn describe_topic(&self, name: &str) -> Result<TopicDescription> {
        let response = self.client.describe_topic(self.describe_request(name, &[])).await?;
        let topic = self.require("DescribeTopic", response.topic)?;
        let mut partitions: std::collections::BTreeMap<u32, PartitionInfo> =
            response.partitions.into_iter().map(|p| (p.partition, p)).collect();
        let mut backoff = self.client.config().retry.backoff();
        for round in 0..LEADER_ROUNDS {
            let redirected: Vec<u32> = partitions
                .values()
                .filter(|p| self.redirects(name, p.partition, p.error, p.leader.as_ref()))
                .map(|p| p.partition)
                .collect();
            if redirected.is_empty() {
                break;
            }
            if round > 0 {
                tokio::time::sleep(backoff.next().unwrap_or_default()).await;
            }
            let mut by_leader: std::collections::BTreeMap<String, (BrokerClient, Vec<u32>)> = Default::default();
            for p in redirected {
                let c = self.client.for_partition(name, p);
                by_leader.entry(c.address()).or_insert_with(|| (c, Vec::new())).1.push(p);
            }
            let asks = by_leader.into_values().map(|(c, ps)| {
                let request = self.describe_request(name, &ps);
                async move { (ps, c.describe_topic(request).await) }
            });
            for (asked, answer) in futures::future::join_all(asks).await {
                let Ok(answer) = answer else { continue };
                for p in answer.partitions.into_iter().filter(|p| asked.contains(&p.partition)) {
                    partitions.insert(p.partition, p);
                }
            }
        }
        Ok(TopicDescription { topic, partitions: partitions.into_values().collect() })
    }

    fn describe_request(&self, name: &str, partitions: &[u32]) -> pb::DescribeTopicRequest {
        let known = |p: u32| self.client.known_leader_epoch(name, p).map(|e| (p, e));
        pb::DescribeTopicRequest {
            name: name.to_owned(),
            leader_epochs: partitions.iter().filter_map(|p| known(*p)).collect(),
        }
    }

    /// Whether a partition's answer is a pointer elsewhere (NOT_LEADER or FENCED_LEADER_EPOCH): its hint is learnt,
    /// and the caller asks again.
    fn redirects(&self, topic: &str, partition: u32, error: i32, hint: Option<&pb::LeaderHint>) -> bool {
        let moved = error == pb::ErrorCode::NotLeader as i32 || error == pb::ErrorCode::FencedLeaderEpoch as i32;
        if let (true, Some(h)) = (moved, hint) {
            self.client.take_hint(topic, partition, h);
        }
        moved
    }

    /// Grows a topic to `partitions`.
    pub async fn alter_partitions(&self, name: &str, partitions: u32) -> Result<TopicInfo> {
        let request = pb::AlterPartitionsRequest { name: name.to_owned(), partitions };
        let response = self.client.alter_partitions(request).await?;
        self.require("AlterPartitions", response.topic)
    }

    /// Changes the config fields that are set in `config`.
    pub async fn alter_topic_config(&self, name: &str, config: TopicConfig) -> Result<TopicInfo> {
        let request = pb::AlterTopicConfigRequest { name: name.to_owned(), config: Some(config) };
        let response = self.client.alter_topic_config(request).await?;
        self.require("AlterTopicConfig", response.topic)
    }

    /// Clears the mirror mark of a topic.
    pub async fn promote(&self, name: &str) -> Result<Promoted> {
        let response = self.client.promote(pb::PromoteRequest { name: name.to_owned() }).await?;
        Ok(Promoted { topic: self.require("Promote", response.topic)?, was_mirror: response.was_mirror })
    }

    /// Offsets of one partition.
    pub async fn list_offset(&self, topic: &str, partition: u32, spec: OffsetSpec) -> Result<PartitionOffsets> {
        let mut all = self.list_offsets(&[(topic.to_owned(), partition, spec)]).await?;
        match all.pop() {
            Some(r) if all.is_empty() => Ok(r),
            _ => Err(self.protocol("ListOffsets", "expected exactly one partition in the answer")),
        }
    }

    /// The first offset after `epoch` on a partition.
    pub async fn epoch_end(&self, topic: &str, partition: u32, epoch: u32) -> Result<EpochEndResponse> {
        self.client.epoch_end(pb::EpochEndRequest { topic: topic.to_owned(), partition, epoch }).await
    }

    /// Truncates a mirror topic's partition to a batch boundary at or below `offset`; returns the new LEO.
    pub async fn truncate_partition(&self, topic: &str, partition: u32, offset: u64) -> Result<u64> {
        let request = pb::TruncatePartitionRequest { topic: topic.to_owned(), partition, offset };
        Ok(self.client.truncate_partition(request).await?.log_end_offset)
    }

    /// Appends batches that already carry offsets to a mirror topic. The response's `error` is left for the
    /// caller to act on (DIVERGED, GAP_REFUSED, ...): these are outcomes, not transport failures.
    pub async fn append_with_offsets(
        &self,
        topic: &str,
        partition: u32,
        source_topic_id: &str,
        source_log_start_offset: u64,
        batches: Bytes,
    ) -> Result<AppendWithOffsetsResponse> {
        let request = pb::AppendWithOffsetsRequest {
            topic: topic.to_owned(),
            partition,
            source_topic_id: source_topic_id.to_owned(),
            source_log_start_offset,
            batches,
        };
        self.client.append_with_offsets(request).await
    }

    /// Marks broker `broker_id` as being drained (with `cancel`, no longer): the controller moves its leaderships,
    /// then its replicas, to other brokers. Returns every broker being drained.
    pub async fn drain_broker(&self, broker_id: u32, cancel: bool) -> Result<Vec<u32>> {
        Ok(self.client.drain_broker(pb::DrainBrokerRequest { broker_id, cancel }).await?.draining)
    }

    /// Elects a leader of `topic`/`partition` (see `ElectLeader` in broker.proto); `unclean` allows a live replica
    /// out of sync when no in-sync one is live.
    pub async fn elect_leader(&self, topic: &str, partition: u32, unclean: bool) -> Result<pb::ElectLeaderResponse> {
        self.elect_leader_naming_dead(topic, partition, unclean, Vec::new()).await
    }

    /// [`Admin::elect_leader`], naming members of the old in-sync set the operator knows to be down: an unclean
    /// election is not refused for a failsafe promise a live replica still holds to one of them.
    pub async fn elect_leader_naming_dead(
        &self,
        topic: &str,
        partition: u32,
        unclean: bool,
        dead: Vec<u32>,
    ) -> Result<pb::ElectLeaderResponse> {
        self.client.elect_leader(pb::ElectLeaderRequest { topic: topic.to_owned(), partition, unclean, dead }).await
    }

    /// Every group.
    pub async fn list_groups(&self) -> Result<Vec<GroupSummary>> {
        Ok(self.client.list_groups(pb::ListGroupsRequest {}).await?.groups)
    }

    /// A group's members, assignments and committed offsets.
    pub async fn describe_group(&self, group: &str) -> Result<DescribeGroupResponse> {
        self.client.describe_group(pb::DescribeGroupRequest { group: group.to_owned() }).await
    }

    /// Committed offsets of `group`, for the given partitions (empty: all the group has).
    pub async fn fetch_committed_offsets(
        &self,
        group: &str,
        partitions: &[(String, u32)],
    ) -> Result<Vec<CommittedOffset>> {
        let request = pb::FetchCommittedOffsetsRequest {
            group: group.to_owned(),
            partitions: partitions
                .iter()
                .map(|(topic, partition)| pb::TopicPartition { topic: topic.clone(), partition: *partition })
                .collect(),
        };
        Ok(self.client.fetch_committed_offsets(request).await?.offsets)
    }

    /// Commits offsets for `group` without membership (empty member id, generation 0).
    pub async fn commit_offsets(&self, group: &str, offsets: Vec<CommittedOffset>) -> Result<()> {
        let request =
            pb::CommitOffsetsRequest { group: group.to_owned(), member_id: String::new(), generation: 0, offsets };
        self.client.commit_offsets(request).await.map(drop)
    }

    fn require<T>(&self, rpc: &'static str, value: Option<T>) -> Result<T> {
        value.ok_or_else(|| self.protocol(rpc, "the topic field is missing"))
    }

    fn protocol(&self, rpc: &'static str, message: &str) -> ClientError {
        ClientError::Protocol { rpc, broker: self.client.address(), message: message.to_owned() }
    }
}

/// Turns a per-partition error code into a [`ClientError::Partition`].
pub(crate) fn partition_result(topic: &str, partition: u32, code: i32, message: &str) -> Result<()> {
    let code = pb::ErrorCode::try_from(code).unwrap_or(pb::ErrorCode::StorageError);
    if code == pb::ErrorCode::None {
        return Ok(());
    }
    Err(ClientError::Partition { topic: topic.to_owned(), partition, code, message: message.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_errors_keep_topic_partition_and_code() {
        assert!(partition_result("t", 0, 0, "").is_ok());
        let err =
            partition_result("t", 2, pb::ErrorCode::UnknownTopicOrPartition as i32, "no such partition").unwrap_err();
        assert!(err.is_not_found());
        assert_eq!(err.to_string(), "t/2: UNKNOWN_TOPIC_OR_PARTITION: no such partition");
        // An unknown future code is still an error, never success.
        let err = partition_result("t", 2, 999, "new code").unwrap_err();
        assert_eq!(err.partition_code(), Some(pb::ErrorCode::StorageError));
    }
}
