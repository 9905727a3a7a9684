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
//! What an append did is an [`AppendOutcome`], whatever the target's wire format.
//!
//! The fetch path is not here: it is a [`crate::fetch::FetchSession`] per kind.

pub mod ferry;

use std::time::Duration;

use ferry_client::ClientError;
use ferry_client::batch::{Batch, Record};
use ferry_client::proto as pb;

use crate::tp::{SourceTp, TargetTp};

/// One batch as the tail check reads it on one side.
#[derive(Debug, Clone, PartialEq)]
pub struct TailBatch {
    /// First offset.
    pub base: u64,
    /// Last offset.
    pub last: u64,
    /// Epoch.
    pub epoch: u32,
    /// CRC.
    pub crc: u32,
    /// Its records.
    pub records: Vec<Record>,
}

/// The answer to `EpochEnd(epoch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochAnswer {
    /// The largest epoch at or below the asked one, and the first offset after it.
    Found {
        /// The epoch found.
        epoch: u32,
        /// The first offset after it.
        end: u64,
    },
    /// The source knows no epoch at or below the asked one; its history starts at `first`.
    Before {
        /// The first offset of the source's oldest known epoch.
        first: u64,
    },
    /// The source keeps no history the mirror can read.
    Unknown,
}

/// What an append with offsets did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Every offered batch is on the target now.
    Appended {
        /// The target's log end after the call (in source offsets).
        log_end: u64,
        /// Batches written.
        written: u32,
        /// Batches found already present.
        present: u32,
    },
    /// A batch below the target's log end differs from what the target holds.
    Diverged {
        /// The first differing offset.
        at: u64,
        /// The target's words.
        message: String,
    },
    /// The target mirror topic records another source topic id.
    TopicIdMismatch(String),
    /// A batch's epoch is below the latest in the target's history.
    EpochRegressed(String),
    /// The target topic is not (or no longer) a mirror topic.
    NotAMirrorTopic(String),
    /// A batch above the target's log end that is not a gap left by source retention.
    GapRefused(String),
    /// A batch that straddles the target's log end.
    StraddlesEnd(String),
    /// Any other refusal, by its code name.
    Refused {
        /// The code name.
        code: String,
        /// The target's words.
        message: String,
    },
}

impl AppendOutcome {
    /// One line for logs and errors.
    pub fn describe(&self) -> String {
        match self {
            AppendOutcome::Appended { log_end, written, present } => {
                format!("appended (log end {log_end}, {written} written, {present} present)")
            }
            AppendOutcome::Diverged { at, message } => format!("diverged at offset {at}: {message}"),
            AppendOutcome::TopicIdMismatch(m)
            | AppendOutcome::EpochRegressed(m)
            | AppendOutcome::NotAMirrorTopic(m)
            | AppendOutcome::GapRefused(m)
            | AppendOutcome::StraddlesEnd(m) => m.clone(),
            AppendOutcome::Refused { code, message } => format!("{code}: {message}"),
        }
    }
}

/// Result of a cluster call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// One partition as the independent probe read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The partition.
    pub tp: SourceTp,
    /// Its log start.
    pub log_start: u64,
    /// Its log end (a replicated partition's high watermark).
    pub log_end: u64,
    /// How long ago, by the source broker's own clock, the log end reached that value; `None` when it does not say.
    pub end_age: Option<Duration>,
}

/// What the source side offers besides fetching.
#[async_trait::async_trait]
pub trait SourceCluster: Send + Sync + std::fmt::Debug {
    /// One bounded health probe (connect included); returns the cluster id the route leads to.
    async fn probe(&self, timeout: Duration) -> Result<String>;
    /// Every topic, with its id, partition count, config and mirror mark.
    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>>;
    /// Every topic, unless the list is exactly the one `digest` (from an earlier answer) names: the list (`None`
    /// when unchanged) and its digest. By default the whole list every time, with an empty digest.
    async fn list_topics_since(&self, digest: &[u8]) -> Result<(Option<Vec<pb::TopicInfo>>, Vec<u8>)> {
        let _ = digest;
        Ok((Some(self.list_topics().await?), Vec::new()))
    }
    /// A partition's (log start, log end).
    async fn log_offsets(&self, tp: &SourceTp) -> Result<(u64, u64)>;
    /// (log start, log end, age of the log end) of many partitions, each at its leader, for the independent probe
    /// ([`crate::source_watch`]); a partition the source cannot answer for is left out, and so are those of a
    /// leader that fails or has not answered `within` (the others' answers are kept: one broker down or paused
    /// must not blind the probe to every partition). A source without such a call answers nothing, and its fetch
    /// stream's positions alone feed the RPO clock and the stall watchdog (a Kafka source: librdkafka reads
    /// watermarks one blocking call per partition, which a probe every check interval must not queue up behind the
    /// lanes' own reads).
    async fn log_offsets_many(&self, tps: &[SourceTp], within: Duration) -> Result<Vec<Probed>> {
        let _ = (tps, within);
        Ok(Vec::new())
    }
    /// `EpochEnd(epoch)`.
    async fn epoch_end(&self, tp: &SourceTp, epoch: u32) -> Result<EpochAnswer>;
    /// Committed offsets of a group (all of them when `partitions` is empty).
    async fn committed(&self, group: &str, partitions: &[SourceTp]) -> Result<Vec<pb::CommittedOffset>>;
    /// Commits offsets for a group, without membership.
    async fn commit(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()>;
    /// Every group name.
    async fn list_groups(&self) -> Result<Vec<String>>;
    /// The base offset of the first batch stored at or after `offset`, with the topic id, or `None` when there is
    /// none. The producers use it to tell a real gap inside the source log from batches fetched before a reseat.
    /// Sources whose fetch path builds batches starting at the requested offset (Kafka) never show such gaps and
    /// answer `None`.
    async fn first_batch_at(&self, tp: &SourceTp, offset: u64) -> Result<Option<(u64, String)>> {
        let _ = (tp, offset);
        Ok(None)
    }
    /// The batch holding `offset`, with its records (the resume rule compares it with the target's last batch), or
    /// `None` when the source no longer holds it or cannot say.
    async fn batch_at(&self, tp: &SourceTp, offset: u64) -> Result<Option<TailBatch>> {
        let _ = (tp, offset);
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
    /// As [`SourceCluster::list_topics_since`].
    async fn list_topics_since(&self, digest: &[u8]) -> Result<(Option<Vec<pb::TopicInfo>>, Vec<u8>)> {
        let _ = digest;
        Ok((Some(self.list_topics().await?), Vec::new()))
    }
    /// Creates a mirror topic kept as `replication` says (a Ferry target's mode; a Kafka target follows its own
    /// replication factor). An existing topic is `ClientError` with ALREADY_EXISTS.
    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: pb::TopicConfig,
        mirror: pb::MirrorSource,
        replication: &str,
        risk_phase: bool,
    ) -> Result<()>;
    /// Grows a topic.
    async fn alter_partitions(&self, name: &str, partitions: u32) -> Result<()>;
    /// Copies topic config.
    async fn alter_topic_config(&self, name: &str, config: pb::TopicConfig) -> Result<()>;
    /// Where a partition stands, in source offsets.
    async fn partition(&self, tp: &TargetTp) -> Result<TargetPartition>;
    /// [`TargetCluster::partition`] of many partitions in few calls, for the lanes' resume reads
    /// ([`crate::lane::gather`]); a partition it cannot answer for is left out (its lane reads it alone). A target
    /// without such a call answers nothing.
    async fn partitions_many(&self, tps: &[TargetTp]) -> Result<Vec<(TargetTp, TargetPartition)>> {
        let _ = tps;
        Ok(Vec::new())
    }
    /// Appends whole source batches (with source offsets and epochs), in order; no batches moves an empty stretch
    /// of the target to `source_log_start`. An attempt whose outcome is unknown (the connection broke after
    /// sending) is an error, not retried inside: the caller retries and accounts for it.
    async fn append(
        &self,
        tp: &TargetTp,
        source_topic_id: &str,
        source_log_start: u64,
        batches: &[Batch],
    ) -> Result<AppendOutcome>;
    /// Truncates to the batch boundary at or below `offset` (source offsets); returns the new log end.
    async fn truncate(&self, tp: &TargetTp, offset: u64) -> Result<u64>;
    /// The batch holding `offset`, with its records, or `None` when the target cannot say.
    async fn batch_at(&self, tp: &TargetTp, offset: u64) -> Result<Option<TailBatch>> {
        let _ = (tp, offset);
        Ok(None)
    }
    /// Every partition's log end (source offsets) of a topic, for the target probe; empty when the target cannot
    /// tell cheaply (then only appends show a lost tail).
    async fn log_ends(&self, topic: &str) -> Result<Vec<(u32, u64)>> {
        let _ = topic;
        Ok(Vec::new())
    }
    /// The log ends of many partitions of any topics, for the target probe: those the target could tell (a topic
    /// whose read failed, or a partition whose leader did not answer, is left out). By default one
    /// [`TargetCluster::log_ends`] per topic; a target that can answer for many partitions at once overrides it.
    async fn log_ends_many(&self, tps: &[TargetTp]) -> Result<Vec<(TargetTp, u64)>> {
        let topics: std::collections::BTreeSet<&str> = tps.iter().map(|tp| tp.topic()).collect();
        let mut out = Vec::new();
        for topic in topics {
            let Ok(ends) = self.log_ends(topic).await else { continue };
            out.extend(ends.into_iter().map(|(partition, end)| (TargetTp::new(topic, partition), end)));
        }
        Ok(out)
    }
    /// The client of a Ferry target, whose log holds the source's batches as they are (the verifier reads them);
    /// `None` for a target that re-encodes what it stores.
    fn ferry_client(&self) -> Option<ferry_client::BrokerClient> {
        None
    }
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
