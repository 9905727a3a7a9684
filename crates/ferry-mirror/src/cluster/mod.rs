//! The two sides of the mirror behind interfaces, so that every component (discovery, the resume rule, the
//! producers, commits, group sync, egress, the monitor) works the same whether a side is a Ferry broker or a
//! Kafka-API cluster.
//!
//! Offsets crossing these interfaces are always **source offsets**. A Ferry target keeps them as they are
//! (append-with-offsets); a Kafka target assigns its own and maps them back through the provenance headers it
//! writes (see `kafka::target`), so for the pipeline a target partition's "log end" is always one past the last
//! source offset it holds.
//!
//! Errors are [`ferry_client::ClientError`]s: adapters map their native errors to the gRPC code that says the same
//! thing (NOT_FOUND, UNAUTHENTICATED, UNAVAILABLE, ...), so the pipeline classifies every side's failures alike.
//!
//! The fetch path is not here: it is a component of its own per kind (`source::SourceDcConsumer` for Ferry,
//! `kafka::KafkaSourceConsumer` for Kafka), both speaking the same `ConsumerCmd` / `SourceMsg` protocol.

pub mod ferry;

use std::time::Duration;

use bytes::Bytes;
use ferry_client::ClientError;
use ferry_client::proto as pb;

/// Result of a cluster call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// What the source side offers besides fetching.
#[async_trait::async_trait]
pub trait SourceCluster: Send + Sync + std::fmt::Debug {
    /// One bounded health probe (connect included); returns the cluster id the route leads to.
    async fn probe(&self, timeout: Duration) -> Result<String>;
    /// Every topic, with its id, partition count, config and mirror mark.
    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>>;
    /// A partition's (log start, log end).
    async fn log_offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64)>;
    /// `EpochEnd(epoch)`: `Some((largest epoch <= epoch, first offset after it))`, or `None` when the cluster has
    /// no such epoch or keeps no epoch history the mirror can read.
    async fn epoch_end(&self, topic: &str, partition: u32, epoch: u32) -> Result<Option<(u32, u64)>>;
    /// Committed offsets of a group (all of them when `partitions` is empty).
    async fn committed(&self, group: &str, partitions: &[(String, u32)]) -> Result<Vec<pb::CommittedOffset>>;
    /// Commits offsets for a group, without membership.
    async fn commit(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()>;
    /// Every group name.
    async fn list_groups(&self) -> Result<Vec<String>>;
    /// The base offset of the first batch stored at or after `offset`, with the topic id, or `None` when there is
    /// none. The producers use it to tell a real gap inside the source log from batches fetched before a reseat.
    /// Sources whose fetch path builds batches starting at the requested offset (Kafka) never show such gaps and
    /// answer `None`.
    async fn first_batch_at(&self, topic: &str, partition: u32, offset: u64) -> Result<Option<(u64, String)>> {
        let _ = (topic, partition, offset);
        Ok(None)
    }
    /// Drops the connection after a failure, so the next call dials again.
    fn reconnect(&self);
}

/// Size limits of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetLimits {
    /// Largest batch the target accepts.
    pub max_batch_bytes: u64,
    /// Largest request the target accepts.
    pub max_message_bytes: u64,
}

/// A target partition, in source offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetPartition {
    /// First source offset held (or recorded as the start).
    pub log_start: u64,
    /// One past the last source offset held.
    pub log_end: u64,
    /// Epoch of the last batch held, when the target keeps epochs.
    pub last_epoch: Option<u32>,
}

impl TargetPartition {
    /// Whether the partition holds data or a recorded start (the resume rule's "not empty").
    pub fn has_position(&self) -> bool {
        self.log_end > 0 || self.log_start > 0
    }
}

/// A consumer group on the target, in source offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupState {
    /// Members currently in the group.
    pub active_members: usize,
    /// Committed offsets (source offsets).
    pub offsets: Vec<pb::CommittedOffset>,
}

/// Membership in the scale-out group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// This process's member id.
    pub member_id: String,
    /// Group generation.
    pub generation: u64,
    /// (target topic, partition) assigned to this process.
    pub assignment: Vec<(String, u32)>,
    /// Members in the group (when known).
    pub members: usize,
}

/// What the target side offers.
#[async_trait::async_trait]
pub trait TargetCluster: Send + Sync + std::fmt::Debug {
    /// Size limits.
    async fn limits(&self) -> Result<TargetLimits>;
    /// Every topic, with its mirror mark (a Kafka target reports the marks it can infer).
    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>>;
    /// Creates a mirror topic. An existing topic is `ClientError` with ALREADY_EXISTS.
    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: pb::TopicConfig,
        mirror: pb::MirrorSource,
    ) -> Result<()>;
    /// Grows a topic.
    async fn alter_partitions(&self, name: &str, partitions: u32) -> Result<()>;
    /// Copies topic config.
    async fn alter_topic_config(&self, name: &str, config: pb::TopicConfig) -> Result<()>;
    /// Where a partition stands, in source offsets.
    async fn partition(&self, topic: &str, partition: u32) -> Result<TargetPartition>;
    /// Appends whole source batches (with source offsets and epochs). Outcomes such as DIVERGED are in the
    /// response's `error`; `log_end_offset` is in source offsets. An attempt whose outcome is unknown (the
    /// connection broke after sending) is an error, not retried inside: the caller retries and accounts for it.
    async fn append(
        &self,
        topic: &str,
        partition: u32,
        source_topic_id: &str,
        source_log_start: u64,
        batches: Bytes,
    ) -> Result<pb::AppendWithOffsetsResponse>;
    /// Truncates to the batch boundary at or below `offset` (source offsets); returns the new log end.
    async fn truncate(&self, topic: &str, partition: u32, offset: u64) -> Result<u64>;
    /// A consumer group's members and offsets (source offsets).
    async fn group_state(&self, group: &str) -> Result<GroupState>;
    /// Commits a consumer group's offsets given in source offsets (without membership).
    async fn commit_group(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()>;
    /// Joins (or re-joins) the scale-out group subscribing to `topics`.
    async fn join(&self, group: &str, member_id: &str, topics: Vec<String>, session: Duration) -> Result<Membership>;
    /// Heartbeats; `None` when this member was expelled and must join again.
    async fn heartbeat(&self, group: &str, member_id: &str, generation: u64) -> Result<Option<Membership>>;
    /// Leaves the scale-out group.
    async fn leave(&self, group: &str, member_id: &str) -> Result<()>;
}
