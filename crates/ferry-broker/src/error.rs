//! The broker's error type and its mapping to gRPC status codes. Each variant carries the topic, partition or
//! offset involved, and its message says what to do. The code table is in `proto/broker.proto`.

use ferry_storage::StorageError;
use tonic::{Code, Status};

mod client;
pub mod txn;

/// The gRPC metadata key of an error's stable reason name (`unknown_topic`, `producer_expired`, ...). The code says
/// what kind of failure it is; the reason says which rule, so a client can act on it without parsing the message.
/// docs/broker.md lists every reason with its code.
pub const REASON_KEY: &str = "ferry-reason";

/// A status with its code, message and reason name.
pub fn status(code: Code, reason: &'static str, message: impl Into<String>) -> Status {
    let mut status = Status::new(code, message);
    status.metadata_mut().insert(REASON_KEY, tonic::metadata::MetadataValue::from_static(reason));
    status
}

/// Result alias for broker operations.
pub type Result<T, E = BrokerError> = std::result::Result<T, E>;

/// Everything a broker operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No such topic.
    #[error("topic \"{topic}\" does not exist; create it with `ferryctl topic create {topic} --partitions N`")]
    UnknownTopic {
        /// Topic name.
        topic: String,
    },
    /// No such partition.
    #[error("partition {partition} does not exist: topic \"{topic}\" has {count} partitions (0..{count})")]
    UnknownPartition {
        /// Topic name.
        topic: String,
        /// Asked partition.
        partition: u32,
        /// Partitions the topic has.
        count: u32,
    },
    /// The topic name breaks the naming rules.
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidTopicName {
        /// The name.
        name: String,
        /// Which rule.
        reason: &'static str,
    },
    /// A request field is invalid.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// A configured limit on client-controlled state would be passed.
    #[error("{what} (the limit is {key} in the broker config)")]
    LimitReached {
        /// What would pass which limit.
        what: String,
        /// The config key of the limit.
        key: &'static str,
    },
    /// The topic exists already.
    #[error("topic \"{topic}\" already exists (id {topic_id}); delete it first or choose another name")]
    TopicExists {
        /// Topic name.
        topic: String,
        /// Its id.
        topic_id: String,
    },
    /// Partition counts only grow.
    #[error("partition count can only grow: topic \"{topic}\" has {current}, asked for {requested}")]
    ShrinkPartitions {
        /// Topic name.
        topic: String,
        /// Current count.
        current: u32,
        /// Requested count.
        requested: u32,
    },
    /// Ordinary produce to a mirror topic.
    #[error("topic \"{topic}\" mirrors {source_cluster}; promote it before writing (`ferryctl topic promote {topic}`)")]
    MirrorTopicReadOnly {
        /// Topic name.
        topic: String,
        /// Alias (or id) of the cluster it mirrors.
        source_cluster: String,
    },
    /// A write to a fenced topic (a failover made it read-only so that what it holds is final).
    #[error("topic \"{topic}\" is fenced at epoch {epoch} ({reason}); it is read-only, reads go on")]
    TopicFenced {
        /// Topic name.
        topic: String,
        /// The fence epoch.
        epoch: u64,
        /// Why: names the failover.
        reason: String,
    },
    /// A job record written by compare-and-set on a version that is no longer its version.
    #[error("job {job:?} is at version {current}, not {expected}: another run of it wrote first; read it again")]
    JobConflict {
        /// The job id.
        job: String,
        /// The version the writer read.
        expected: u64,
        /// The version it is at.
        current: u64,
    },
    /// A mirror-only operation on a topic that is not a mirror topic.
    #[error("topic \"{topic}\" is not a mirror topic (created locally or promoted); {what} is refused")]
    NotAMirrorTopic {
        /// Topic name.
        topic: String,
        /// The refused operation.
        what: &'static str,
    },
    /// A batch is over `max_batch_bytes`.
    #[error("batch of {size} bytes for {topic}/{partition} exceeds max_batch_bytes ({max}); send smaller batches")]
    BatchTooLarge {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// Batch size.
        size: u64,
        /// Limit.
        max: u64,
    },
    /// A batch is malformed or fails its CRC.
    #[error("corrupt batch for {topic}/{partition}: {reason}; the batch was not written, resend it")]
    CorruptBatch {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// What was wrong.
        reason: String,
    },
    /// A batch is malformed (not a CRC problem).
    #[error("malformed batch for {topic}/{partition}: {reason}")]
    MalformedBatch {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// What was wrong.
        reason: String,
    },
    /// An offset outside the log.
    #[error("offset {offset} is out of range for {topic}/{partition}: the log holds [{log_start}, {log_end})")]
    OffsetOutOfRange {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// Asked offset.
        offset: u64,
        /// First offset held.
        log_start: u64,
        /// Log end offset.
        log_end: u64,
    },
    /// An append with offsets was refused against the partition's log end (see [`RefusalKind`]).
    #[error("offset append to {topic}/{partition} refused at offset {offset}: {reason}")]
    AppendRefused {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// Base offset of the refused batch.
        offset: u64,
        /// Which rule refused it.
        kind: RefusalKind,
        /// The log's explanation.
        reason: String,
    },
    /// Idempotent producer sequence or epoch problem.
    #[error("producer {producer_id} on {topic}/{partition}: {reason}")]
    ProducerSequence {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// Producer id.
        producer_id: i64,
        /// Which rule refused the batch.
        kind: SequenceRefusal,
        /// What was wrong.
        reason: String,
    },
    /// Group membership or generation problem.
    #[error("group \"{group}\": {reason}")]
    Group {
        /// Group name.
        group: String,
        /// Which rule refused the request.
        kind: GroupRefusal,
        /// What was wrong.
        reason: String,
    },
    /// A transactional-message request the transaction's recorded state refuses.
    #[error(transparent)]
    Transaction(#[from] txn::TxnRefused),
    /// The storage layer failed.
    #[error("storage error on {topic}/{partition}: {source}")]
    Storage {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// The storage error.
        #[source]
        source: StorageError,
    },
    /// Broker-level I/O (metadata files).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// File involved.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the data directory's lock.
    #[error(
        "data directory {} is in use by another ferry-broker ({holder}); stop that broker or point data_dir elsewhere",
        path.display()
    )]
    DataDirInUse {
        /// The data directory.
        path: std::path::PathBuf,
        /// What the lock file says of its holder.
        holder: String,
    },
    /// The caller's token may not do this (docs/broker.md, "Tokens and scopes").
    #[error("{message}")]
    PermissionDenied {
        /// The token's name.
        token: String,
        /// The RPC.
        operation: &'static str,
        /// What was refused and why, naming the token and the operation.
        message: String,
    },
    /// A replicated partition this broker does not lead (docs/cluster.md): nothing was done; go to the leader.
    #[error(
        "{topic}/{partition} is led by {} at leader epoch {epoch}; this broker is not its leader",
        if *leader == 0 { "no broker yet (an election is running)".to_owned() } else { format!("broker {leader} ({address})") }
    )]
    NotLeader {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// The leader's broker id, 0 when none is known.
        leader: u32,
        /// Its address, empty when unknown.
        address: String,
        /// The leader epoch this broker knows.
        epoch: u32,
    },
    /// A replicated partition this broker leads but may not act for now: its etcd lease could have run out and no
    /// failsafe confirmation covers it (docs/cluster.md, "Self-fencing"). Answered as NOT_LEADER without a leader.
    #[error("{topic}/{partition}: this broker may not act as its leader now ({why}); ask another member who leads it")]
    LeaderFenced {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// Why.
        why: String,
    },
    /// A read or write that named a leader epoch other than the one this leader serves (Kafka's KIP-320): the
    /// client's is older (it refreshes its metadata) or newer (this broker has not learnt it yet).
    #[error(
        "{topic}/{partition}: the request names leader epoch {asked} but this broker leads epoch {current};          refresh the partition's leader and retry"
    )]
    FencedLeaderEpoch {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// The epoch the client named.
        asked: u32,
        /// The epoch this broker leads at.
        current: u32,
        /// This broker's id.
        leader: u32,
        /// Its address.
        address: String,
    },
    /// A group call at a cluster member that does not coordinate the group: the coordinator is the leader of the
    /// group's offsets partition.
    #[error(
        "this broker does not coordinate group \"{group}\"; its coordinator is broker {leader} at {address} (leader \
         epoch {epoch} of its offsets partition)"
    )]
    NotCoordinator {
        /// The group.
        group: String,
        /// The coordinator's broker id, 0 when none is known.
        leader: u32,
        /// Its address, empty when unknown.
        address: String,
        /// The leader epoch of the group's offsets partition.
        epoch: u32,
    },
    /// A replicated write while fewer replicas are in sync than it needs: nothing was written.
    #[error(
        "{topic}/{partition} has {in_sync} in-sync replica(s) ({isr:?}), fewer than the {needed} a write to it needs; \
         nothing was written, retry once a replica is back"
    )]
    NotEnoughReplicas {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// How many are in sync.
        in_sync: usize,
        /// Their broker ids.
        isr: Vec<u32>,
        /// How many a write needs.
        needed: usize,
    },
    /// A raft3 write was appended by the leader but not acknowledged by its in-sync set: it may or may not stay.
    #[error(
        "{topic}/{partition}: the write at offsets {base}..={last} was not acknowledged: {why}; an idempotent \
         producer's retry is safe (a duplicate is recognised)"
    )]
    NotAcknowledged {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: u32,
        /// First offset written.
        base: u64,
        /// Last offset written.
        last: u64,
        /// Why.
        why: String,
    },
    /// The operation needs a cluster member (etcd endpoints), or the cluster's master could not be reached.
    #[error("{0}")]
    Cluster(String),
    /// A leader election asked by an operator that would lose acknowledged records without `--unclean`, or that
    /// no live replica can take.
    #[error("{0}")]
    ElectionRefused(String),
    /// Anything else that is the broker's fault.
    #[error("internal error: {0}")]
    Internal(String),
    /// A delayed record that is no longer pending (delivered or cancelled) cannot be cancelled.
    #[error("{0}")]
    DelayNotPending(String),
}

/// Why a group request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRefusal {
    /// A commit without a member id while the group has members (`group_has_members`).
    ActiveMembers,
    /// The member id is not in the group, for instance after its session expired (`unknown_member`).
    UnknownMember,
    /// The member's generation is not the group's current one (`stale_generation`).
    StaleGeneration,
}

/// Why an append with offsets was refused; each has its own `ErrorCode` in the AppendWithOffsets response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// A batch above the log end that source retention does not explain, or below the log start (GAP_REFUSED).
    Gap,
    /// A batch that straddles the log end (STRADDLES_END).
    Straddle,
    /// A batch whose epoch is below the latest epoch in the log's history (EPOCH_REGRESSED).
    EpochRegressed,
}

impl RefusalKind {
    /// Classifies the log's refusal. The log reports refusals as text, so this matches its wording; the
    /// partition tests pin every case, so a change of wording fails them. `None` is a request error (offsets of
    /// the offered batches not increasing), not an outcome against the log.
    pub fn of(reason: &str) -> Option<RefusalKind> {
        if reason.contains("epoch regressed") {
            Some(RefusalKind::EpochRegressed)
        } else if reason.contains("straddles the log end") {
            Some(RefusalKind::Straddle)
        } else if reason.contains("above the log end offset") || reason.contains("below the log start offset") {
            Some(RefusalKind::Gap)
        } else {
            None
        }
    }
}

impl BrokerError {
    /// Wraps a storage error for `topic/partition`, lifting the cases that have their own code.
    pub fn storage(topic: &str, partition: u32, source: StorageError) -> BrokerError {
        let topic = topic.to_owned();
        match source {
            StorageError::OffsetOutOfRange { offset, log_start, log_end, .. } => {
                BrokerError::OffsetOutOfRange { topic, partition, offset, log_start, log_end }
            }
            StorageError::BatchTooLarge { size, max, .. } => BrokerError::BatchTooLarge { topic, partition, size, max },
            StorageError::InvalidBatch {
                source: ferry_batch::BatchError::CrcMismatch { stored, computed }, ..
            } => BrokerError::CorruptBatch {
                topic,
                partition,
                reason: format!("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"),
            },
            StorageError::InvalidBatch { source, .. } => {
                BrokerError::MalformedBatch { topic, partition, reason: source.to_string() }
            }
            StorageError::Closed { .. } => BrokerError::UnknownTopic { topic },
            // A client's offsets (or a log end they moved): the request's fault, not the broker's.
            StorageError::OffsetOverflow { offset, .. } => BrokerError::InvalidArgument(format!(
                "{topic}/{partition}: offsets of a batch (or a log start) at {offset} would pass the largest offset, \
                 2^63 - 2"
            )),
            other => BrokerError::Storage { topic, partition, source: other },
        }
    }

    /// The stable reason name sent with the status (`ferry-reason`); docs/broker.md lists them.
    pub fn reason(&self) -> &'static str {
        match self {
            BrokerError::UnknownTopic { .. } => "unknown_topic",
            BrokerError::UnknownPartition { .. } => "unknown_partition",
            BrokerError::InvalidTopicName { .. } => "invalid_name",
            BrokerError::InvalidArgument(_) => "invalid_argument",
            BrokerError::LimitReached { .. } => "limit_reached",
            BrokerError::TopicExists { .. } => "topic_exists",
            BrokerError::ShrinkPartitions { .. } => "partitions_only_grow",
            BrokerError::MirrorTopicReadOnly { .. } => "mirror_topic_read_only",
            BrokerError::NotAMirrorTopic { .. } => "not_a_mirror_topic",
            BrokerError::TopicFenced { .. } => "topic_fenced",
            BrokerError::JobConflict { .. } => "job_conflict",
            BrokerError::BatchTooLarge { .. } => "batch_too_large",
            BrokerError::CorruptBatch { .. } => "corrupt_batch",
            BrokerError::MalformedBatch { .. } => "malformed_batch",
            BrokerError::OffsetOutOfRange { .. } => "offset_out_of_range",
            BrokerError::AppendRefused { kind, .. } => match kind {
                RefusalKind::Gap => "gap_refused",
                RefusalKind::Straddle => "straddles_end",
                RefusalKind::EpochRegressed => "epoch_regressed",
            },
            BrokerError::ProducerSequence { kind, .. } => kind.reason(),
            BrokerError::Group { kind, .. } => match kind {
                GroupRefusal::ActiveMembers => "group_has_members",
                GroupRefusal::UnknownMember => "unknown_member",
                GroupRefusal::StaleGeneration => "stale_generation",
            },
            BrokerError::Transaction(t) => t.reason_name(),
            BrokerError::Storage { .. } => "storage_error",
            BrokerError::Io { .. } => "io_error",
            BrokerError::DataDirInUse { .. } => "data_dir_in_use",
            BrokerError::PermissionDenied { .. } => "permission_denied",
            BrokerError::NotLeader { .. } | BrokerError::LeaderFenced { .. } => "not_leader",
            BrokerError::FencedLeaderEpoch { .. } => "fenced_leader_epoch",
            BrokerError::NotCoordinator { .. } => "not_coordinator",
            BrokerError::NotEnoughReplicas { .. } => "not_enough_replicas",
            BrokerError::NotAcknowledged { .. } => "not_acknowledged",
            BrokerError::Cluster(_) => "cluster_unavailable",
            BrokerError::ElectionRefused(_) => "election_refused",
            BrokerError::Internal(_) => "internal",
            BrokerError::DelayNotPending(_) => "delay_not_pending",
        }
    }

    /// The gRPC code of this error.
    pub fn code(&self) -> Code {
        match self {
            BrokerError::UnknownTopic { .. } | BrokerError::UnknownPartition { .. } => Code::NotFound,
            BrokerError::Transaction(t) => t.code(),
            BrokerError::InvalidTopicName { .. }
            | BrokerError::InvalidArgument(_)
            | BrokerError::MalformedBatch { .. } => Code::InvalidArgument,
            BrokerError::TopicExists { .. } => Code::AlreadyExists,
            BrokerError::ShrinkPartitions { .. }
            | BrokerError::MirrorTopicReadOnly { .. }
            | BrokerError::NotAMirrorTopic { .. }
            | BrokerError::TopicFenced { .. }
            | BrokerError::JobConflict { .. }
            | BrokerError::ProducerSequence { .. }
            | BrokerError::AppendRefused { .. }
            | BrokerError::Group { .. }
            | BrokerError::ElectionRefused(_)
            | BrokerError::DelayNotPending(_) => Code::FailedPrecondition,
            BrokerError::BatchTooLarge { .. } | BrokerError::LimitReached { .. } => Code::ResourceExhausted,
            BrokerError::CorruptBatch { .. } => Code::DataLoss,
            BrokerError::OffsetOutOfRange { .. } => Code::OutOfRange,
            BrokerError::PermissionDenied { .. } => Code::PermissionDenied,
            BrokerError::NotLeader { .. }
            | BrokerError::LeaderFenced { .. }
            | BrokerError::FencedLeaderEpoch { .. }
            | BrokerError::NotCoordinator { .. }
            | BrokerError::NotEnoughReplicas { .. }
            | BrokerError::NotAcknowledged { .. }
            | BrokerError::Cluster(_) => Code::Unavailable,
            BrokerError::Storage { .. }
            | BrokerError::Io { .. }
            | BrokerError::DataDirInUse { .. }
            | BrokerError::Internal(_) => Code::Internal,
        }
    }
}

/// The metadata keys of a NOT_LEADER status: the leader's broker id, address and leader epoch.
pub const LEADER_ID_KEY: &str = "ferry-leader-id";
/// See [`LEADER_ID_KEY`].
pub const LEADER_ADDRESS_KEY: &str = "ferry-leader-address";
/// See [`LEADER_ID_KEY`].
pub const LEADER_EPOCH_KEY: &str = "ferry-leader-epoch";
/// See [`LEADER_ID_KEY`]: the partition the hint is about, as "topic/partition".
pub const LEADER_PARTITION_KEY: &str = "ferry-leader-partition";
/// A NOT_COORDINATOR status carries the coordinator as a leader hint (id, address, epoch) and the group here.
pub const COORDINATOR_GROUP_KEY: &str = "ferry-coordinator-group";

impl From<BrokerError> for Status {
    fn from(err: BrokerError) -> Status {
        let mut s = status(err.code(), err.reason(), err.client_message());
        // A leader hint: the leader's id, epoch and address, and what the hint is about.
        let hint = match &err {
            BrokerError::NotLeader { topic, partition, leader, address, epoch } => {
                Some((*leader, *epoch, address.clone(), LEADER_PARTITION_KEY, format!("{topic}/{partition}")))
            }
            BrokerError::LeaderFenced { topic, partition, .. } => {
                Some((0, 0, String::new(), LEADER_PARTITION_KEY, format!("{topic}/{partition}")))
            }
            BrokerError::FencedLeaderEpoch { topic, partition, leader, address, current, .. } => {
                Some((*leader, *current, address.clone(), LEADER_PARTITION_KEY, format!("{topic}/{partition}")))
            }
            BrokerError::NotCoordinator { group, leader, address, epoch } => {
                Some((*leader, *epoch, address.clone(), COORDINATOR_GROUP_KEY, group.clone()))
            }
            _ => None,
        };
        if let Some((leader, epoch, address, about_key, about)) = hint {
            let md = s.metadata_mut();
            let values = [
                (LEADER_ID_KEY, leader.to_string()),
                (LEADER_EPOCH_KEY, epoch.to_string()),
                (LEADER_ADDRESS_KEY, address),
                (about_key, about),
            ];
            for (key, value) in values {
                if let Ok(v) = value.parse() {
                    md.insert(key, v);
                }
            }
        }
        s
    }
}

/// Which idempotence rule refused a batch. Each has its own `ferry-reason` on the status a client receives, so a
/// client can act on it without reading the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceRefusal {
    /// A newer epoch of the producer id exists (`producer_fenced`).
    Fenced,
    /// The producer id was idle past `storage.producer_id_expiration` (`producer_expired`): a client whose batch
    /// was never sent before may start a new producer id; one whose earlier attempt may have been written may not.
    Expired,
    /// The batch's sequence does not follow the last one written (`out_of_sequence`).
    OutOfOrder,
}

impl SequenceRefusal {
    /// The stable reason name clients see (`ferry-reason`).
    pub fn reason(self) -> &'static str {
        match self {
            SequenceRefusal::Fenced => "producer_fenced",
            SequenceRefusal::Expired => "producer_expired",
            SequenceRefusal::OutOfOrder => "out_of_sequence",
        }
    }
}
