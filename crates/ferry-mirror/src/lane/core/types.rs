//! What goes into and out of the decision core: its configuration, its inputs (source data and positions, the
//! answers to its requests, operator controls, target probes) and its outputs (requests to perform, seats to take,
//! events to raise).

use ferry_client::batch::Batch;

use crate::cluster::{AppendOutcome, TargetPartition};
pub use crate::cluster::{EpochAnswer, TailBatch};
use crate::config::OnDivergence;
use crate::lane::budget::Held;
use crate::tp::{SourceTp, TargetTp};

/// How the source's epoch history reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A Ferry source keeps a full epoch history: "no such epoch" means the source lost the epoch the target's
    /// last batch was written in.
    Ferry,
    /// A Kafka source exposes no leader epochs to the mirror; its batches all carry epoch 0.
    Kafka,
}

/// The partition's fixed facts.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The source partition.
    pub tp: SourceTp,
    /// The target partition.
    pub target: TargetTp,
    /// The source topic id the target mirror topic records.
    pub topic_id: String,
    /// What to do on divergence.
    pub on_divergence: OnDivergence,
    /// Whether an empty target starts at the source's log end (`start_position = latest`, first run only).
    pub first_run_latest: bool,
    /// The target's `max_batch_bytes`: larger source batches are split.
    pub target_max_batch: u64,
    /// Most decompressed bytes a batch may inflate to when it is split or cut (`reshape::decode_limit`).
    pub decode_limit: usize,
    /// How the source's epoch history reads.
    pub source_kind: SourceKind,
    /// Whether the source partition is replicated (a cluster's double_write or raft3): its readable end may lag
    /// what was copied while a new leader's high watermark catches up.
    pub replicated_source: bool,
}

/// Where the source partition stands, as of a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePos {
    /// Source log start.
    pub log_start: u64,
    /// Source log end.
    pub log_end: u64,
    /// Source partition epoch.
    pub epoch: u32,
    /// Source topic id (empty when the source does not say).
    pub topic_id: String,
}

/// A source error for the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceFault {
    /// The fetch position is outside the source log (below its start or above its end).
    OutOfRange,
    /// The source holds a batch that fails its CRC.
    Corrupt,
    /// The topic or partition does not exist (yet, or any more): discovery handles it, no alarm here.
    Missing,
    /// Anything else, by its code name.
    Other(String),
}

/// The facts the resume rule needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeFacts {
    /// The target partition.
    pub target: TargetPartition,
    /// The source group's committed offset, if any.
    pub committed: Option<u64>,
    /// The source's log start.
    pub source_earliest: u64,
    /// The source's log end.
    pub source_latest: u64,
}

/// The batch holding the target's last offset, on both sides.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TailFacts {
    /// On the target (`None`: the target cannot say, e.g. a Kafka target).
    pub target: Option<TailBatch>,
    /// On the source (`None`: the source no longer holds that offset, or cannot say).
    pub source: Option<TailBatch>,
}

/// Why a request failed for good (retriable failures are retried by the driver and never reach the core).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The target topic or partition does not exist (discovery re-creates it).
    NotFound(String),
    /// Refused, with the reason.
    Refused(String),
}

/// A batch append: whole batches with their source offsets, contiguous from the cache offset.
#[derive(Debug)]
pub struct AppendPlan {
    /// The batches, in order.
    pub batches: Vec<Batch>,
    /// The source's log start, sent along.
    pub source_log_start: u64,
    /// Records in them.
    pub records: u64,
    /// Bytes in them.
    pub bytes: u64,
    /// The last offset.
    pub last_offset: u64,
    /// The epoch of the batches.
    pub epoch: u32,
    /// The newest record timestamp.
    pub max_timestamp: i64,
    /// The budget the batches hold (released when the plan is done with).
    pub held: Held,
}

/// Work for the driver; its answer comes back as [`Input::Answer`] with the same id.
#[derive(Debug)]
pub enum Request {
    /// Read the target partition, the source group's commit and the source's offsets.
    ReadResume,
    /// Read the batch holding `at` on both sides.
    CompareTail {
        /// The target's last offset.
        at: u64,
    },
    /// An empty append that moves the target's log end to `to` (its start, when empty).
    Jump {
        /// Where.
        to: u64,
    },
    /// Ask the source where an epoch ended.
    EpochEnd {
        /// The epoch of the target's last batch.
        epoch: u32,
    },
    /// The first batch the source holds at or after `at`.
    ProbeGap {
        /// The cache offset.
        at: u64,
    },
    /// Append batches.
    Append(AppendPlan),
    /// Truncate the target to the batch boundary at or below `at`.
    Truncate {
        /// Where.
        at: u64,
    },
}

/// The answer to a [`Request`].
#[derive(Debug)]
pub enum Answer {
    /// To [`Request::ReadResume`].
    Resume(ResumeFacts),
    /// To [`Request::CompareTail`].
    Tail(TailFacts),
    /// To [`Request::Jump`] (and to [`Request::Append`] where the outcome alone is enough: every record counts).
    Appended(Result<AppendOutcome, Failure>),
    /// To [`Request::Append`]: the outcome, and the records and bytes this process put on the target (batches the
    /// target already held on a first attempt are not counted; those present on a retry after a lost answer are:
    /// the lost attempt wrote them).
    Batches {
        /// The outcome.
        result: Result<AppendOutcome, Failure>,
        /// Records this process put on the target.
        records: u64,
        /// Bytes this process put on the target.
        bytes: u64,
    },
    /// To [`Request::EpochEnd`].
    EpochEnd(EpochAnswer),
    /// To [`Request::ProbeGap`]: the base offset and topic id of the first batch at or after the asked offset.
    Gap(Option<(u64, String)>),
    /// To [`Request::Truncate`]: the new log end.
    Truncated(Result<u64, String>),
}

/// Something for the core to take into account.
#[derive(Debug)]
pub enum Input {
    /// Batches fetched under `seat`, and the position they were read at.
    Data {
        /// The seat they were fetched under (data of an older seat is dropped).
        seat: u64,
        /// Whole batches, ascending.
        batches: Vec<Batch>,
        /// The bytes they hold.
        held: Held,
        /// The position.
        pos: SourcePos,
    },
    /// A position heartbeat.
    Position(SourcePos),
    /// The source's log start, as the independent probe (ListOffsets) read it. Only what retention deleted is
    /// taken from it: a probe may be older than the stream's last word, so its log end decides nothing here.
    SourceLogStart(u64),
    /// A source error.
    SourceError {
        /// What kind.
        fault: SourceFault,
        /// The source's words.
        message: String,
        /// The position, as far as it is known.
        pos: SourcePos,
    },
    /// The answer to request `id`.
    Answer {
        /// The request's id.
        id: u64,
        /// The answer.
        answer: Answer,
    },
    /// Request `id` failed and is being retried (for the status only).
    Retrying {
        /// The request's id.
        id: u64,
        /// Why.
        error: String,
    },
    /// The target's log end, read by a probe that started when the cache offset was `cache_before`.
    TargetLogEnd {
        /// The target's log end.
        log_end: u64,
        /// The cache offset when the probe started.
        cache_before: u64,
    },
    /// An operator paused the partition.
    Pause,
    /// An operator resumed it (a halted partition re-checks where it stands).
    Resume,
}

/// What the core raises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreEvent {
    /// Source and target disagree about the partition's history.
    Diverged {
        /// The first offset where they differ.
        at: u64,
        /// The cache offset then.
        cache: u64,
        /// Why.
        reason: String,
        /// The policy applied.
        policy: OnDivergence,
    },
    /// The partition stopped and needs an operator.
    Halted {
        /// Why.
        reason: String,
    },
    /// Something failed that needs an operator but did not stop the partition.
    SyncError {
        /// Why.
        reason: String,
        /// The source's error code, when one caused it.
        code: Option<String>,
    },
    /// The target lost records the mirror had appended: copying again from the target's log end.
    TargetLost {
        /// The target's log end now.
        log_end: u64,
        /// The cache offset before.
        cache: u64,
    },
    /// Source records were removed before they were mirrored: `[start, end)` is a gap on the target.
    DataLost {
        /// First offset lost.
        start: u64,
        /// One past the last.
        end: u64,
    },
}

/// What the driver must do.
#[derive(Debug)]
pub enum Action {
    /// Perform `request` and answer with `id`.
    Send {
        /// Its id.
        id: u64,
        /// The work.
        request: Request,
    },
    /// Drop the request in flight: its answer no longer matters.
    Cancel,
    /// Fetch the partition from `from`, tagging what is fetched with `seat`; `None` stops fetching it.
    Seat(Option<(u64, u64)>),
    /// Raise an event.
    Emit(CoreEvent),
    /// Records and bytes newly on the target, and the newest record's timestamp (metrics).
    Copied {
        /// Records appended.
        records: u64,
        /// Bytes appended.
        bytes: u64,
        /// Newest record timestamp.
        max_timestamp: i64,
    },
}
