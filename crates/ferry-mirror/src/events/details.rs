//! The facts of each event, typed per shape: what webhooks, the API and the alarm templates show as an event's
//! `details` object (absent facts left out).

use serde::Serialize;

/// The facts of an event, typed per shape. Serialized as the event's `details` object (webhooks, the API, the
/// alarm templates), with absent facts left out.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Details {
    /// No facts beyond the message.
    #[default]
    None,
    /// A topic and its target topic (`add_topic`, `remove_topic`, a refused target topic).
    Topic(TopicFacts),
    /// A partition count change (`modify_partition_num`).
    Resized(ResizeFacts),
    /// A route's failure or state (`source_net_*`).
    Route(RouteFacts),
    /// A route switch (`source_net_be_switched`).
    Switch(SwitchFacts),
    /// Lag and latency against the thresholds (`lag_above_threshold`).
    Lag(LagFacts),
    /// A partition without progress (`partition_stalled`).
    Stall(StallFacts),
    /// Where and why source and target disagree (`partition_diverged`).
    Diverged(DivergedFacts),
    /// Why something failed (`sync_error`, `target_net_not_available`).
    Failure(FailureFacts),
    /// A range the target records as a gap (`data_lost_before_mirroring`).
    Gap(GapFacts),
    /// RPO against its threshold (`rpo_above_threshold`).
    Rpo(RpoFacts),
    /// Where a verified copy differs, and which side is at fault (`verify_mismatch`).
    Mismatch(MismatchFacts),
    /// A failover's step (`failover_started`, `fenced`, `drained`, `promoted`).
    Failover(FailoverFacts),
}

/// Facts of a topic event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TopicFacts {
    /// The target topic.
    pub target_topic: String,
    /// Its partition count, when the event concerns it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
}

/// Facts of a partition count change.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ResizeFacts {
    /// The count before.
    pub from: u32,
    /// The count after.
    pub to: u32,
}

/// Facts of a route event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RouteFacts {
    /// Why the route failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The route's brokers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub brokers: Option<String>,
    /// The route in use (for "no healthy route").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
}

/// Facts of a route switch.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct SwitchFacts {
    /// The route left.
    pub from: String,
    /// The route taken.
    pub to: String,
    /// Why.
    pub reason: String,
}

/// Facts of a lag event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct LagFacts {
    /// Why it fired (`lag`, `latency`, `lag and latency`); absent on the recovery notice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Lag, records.
    pub lag: u64,
    /// Replication latency, ms.
    pub latency_ms: u64,
    /// The lag threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_threshold: Option<u64>,
    /// The latency threshold, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_threshold_ms: Option<u64>,
    /// How long it lasted before firing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub for_duration: Option<String>,
    /// The source log end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_offset: Option<u64>,
    /// The cache offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_offset: Option<u64>,
}

/// Facts of a stall event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct StallFacts {
    /// How long without progress makes a stall.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_after: Option<String>,
    /// The source log end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_offset: Option<u64>,
    /// Lag, records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// The cache offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_offset: Option<u64>,
    /// The source log end the independent probe (ListOffsets) read last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probed_source_offset: Option<u64>,
    /// How long the cache offset has not moved while records waited, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_for_ms: Option<u64>,
    /// Why (tests and custom checks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Facts of a divergence.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct DivergedFacts {
    /// The first differing offset.
    pub offset: u64,
    /// The cache offset then.
    pub cache_offset: u64,
    /// Why.
    pub reason: String,
    /// `halt` or `truncate`.
    pub policy: String,
}

/// Facts of a failure.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct FailureFacts {
    /// Why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The source's error code, when one caused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The target's log end, when the target lost records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_offset: Option<u64>,
    /// The cache offset, when the target lost records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_offset: Option<u64>,
}

/// Facts of a gap.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct GapFacts {
    /// First offset lost.
    pub gap_start: u64,
    /// One past the last.
    pub gap_end: u64,
    /// Offsets lost, `gap_end - gap_start`.
    pub records: u64,
}

/// Facts of an RPO event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RpoFacts {
    /// How long the oldest source record not yet on the target has waited, seconds.
    pub rpo_seconds: f64,
    /// The threshold, seconds; absent on the recovery notice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpo_threshold_seconds: Option<f64>,
    /// How long it lasted before firing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub for_duration: Option<String>,
    /// The source log end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_offset: Option<u64>,
    /// The cache offset.
    pub cache_offset: u64,
}

/// Facts of a verification mismatch.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct MismatchFacts {
    /// The first mismatching offset (the base offset of the batch at fault, when a whole batch is).
    pub offset: u64,
    /// The side at fault: `source` (its own batch fails its CRC) or `target` (its copy differs or is corrupt).
    pub side: String,
    /// What differs.
    pub reason: String,
    /// The target topic.
    pub target_topic: String,
}

/// Facts of a failover step.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct FailoverFacts {
    /// The job id.
    pub job: String,
    /// The fence epoch of the job.
    pub epoch: u64,
    /// How many topics the step covered.
    pub topics: usize,
    /// How many partitions it covered.
    pub partitions: usize,
    /// Records not on the target (a failover with the source unreachable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// The step's duration, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
}

impl Details {
    /// The facts as a JSON object (empty for none).
    pub fn to_map(&self) -> serde_json::Map<String, serde_json::Value> {
        let value = match self {
            Details::None => return serde_json::Map::new(),
            Details::Topic(f) => serde_json::to_value(f),
            Details::Resized(f) => serde_json::to_value(f),
            Details::Route(f) => serde_json::to_value(f),
            Details::Switch(f) => serde_json::to_value(f),
            Details::Lag(f) => serde_json::to_value(f),
            Details::Stall(f) => serde_json::to_value(f),
            Details::Diverged(f) => serde_json::to_value(f),
            Details::Failure(f) => serde_json::to_value(f),
            Details::Gap(f) => serde_json::to_value(f),
            Details::Rpo(f) => serde_json::to_value(f),
            Details::Mismatch(f) => serde_json::to_value(f),
            Details::Failover(f) => serde_json::to_value(f),
        };
        match value {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// Whether there are no facts.
    pub fn is_empty(&self) -> bool {
        self.to_map().is_empty()
    }

    /// A fact by name, `null` when absent.
    pub fn value(&self, key: &str) -> serde_json::Value {
        self.to_map().remove(key).unwrap_or(serde_json::Value::Null)
    }
}

impl Serialize for Details {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_map().serialize(serializer)
    }
}
