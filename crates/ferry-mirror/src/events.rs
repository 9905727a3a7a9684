//! The EventBus and every event the mirror raises, in one module.
//!
//! Rust names are CamelCase; the names in rules, webhooks, logs and metrics are the seed's snake_case
//! ([`EventKind::name`]). Emitting an event logs it, counts it (`ferry_mirror_events_total{event}`), keeps it in a
//! short history for the monitor, and publishes it on a tokio broadcast channel. The Alarmer and the Monitor
//! subscribe; nothing parses logs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::metrics::Metrics;

/// Every kind of event, with its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A newly matching source topic is now mirrored.
    AddTopic,
    /// A source topic disappeared or stopped matching; its tasks stopped, the target topic is kept.
    RemoveTopic,
    /// A source topic's partition count grew and the target followed.
    ModifyPartitionNum,
    /// A source route failed `failure_threshold` probes in a row.
    SourceNetNotAvailable,
    /// The mirror switched to another source route.
    SourceNetBeSwitched,
    /// A route that was unavailable is healthy again.
    SourceNetRecovered,
    /// The target cluster cannot be reached.
    TargetNetNotAvailable,
    /// The target cluster is reachable again.
    TargetNetRecovered,
    /// A partition's lag or replication latency stayed above its threshold.
    LagAboveThreshold,
    /// A partition made no progress while the source had data.
    PartitionStalled,
    /// Source and target disagree about a partition's history.
    PartitionDiverged,
    /// Something failed that needs an operator (a promoted target, lost target data, an auth failure...).
    SyncError,
    /// Source records were removed (by source retention) before they were mirrored; the target records the gap.
    DataLostBeforeMirroring,
}

impl EventKind {
    /// All kinds, in declaration order.
    pub const ALL: [EventKind; 13] = [
        EventKind::AddTopic,
        EventKind::RemoveTopic,
        EventKind::ModifyPartitionNum,
        EventKind::SourceNetNotAvailable,
        EventKind::SourceNetBeSwitched,
        EventKind::SourceNetRecovered,
        EventKind::TargetNetNotAvailable,
        EventKind::TargetNetRecovered,
        EventKind::LagAboveThreshold,
        EventKind::PartitionStalled,
        EventKind::PartitionDiverged,
        EventKind::SyncError,
        EventKind::DataLostBeforeMirroring,
    ];

    /// The snake_case name used in rules, webhooks, logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::AddTopic => "add_topic",
            EventKind::RemoveTopic => "remove_topic",
            EventKind::ModifyPartitionNum => "modify_partition_num",
            EventKind::SourceNetNotAvailable => "source_net_not_available",
            EventKind::SourceNetBeSwitched => "source_net_be_switched",
            EventKind::SourceNetRecovered => "source_net_recovered",
            EventKind::TargetNetNotAvailable => "target_net_not_available",
            EventKind::TargetNetRecovered => "target_net_recovered",
            EventKind::LagAboveThreshold => "lag_above_threshold",
            EventKind::PartitionStalled => "partition_stalled",
            EventKind::PartitionDiverged => "partition_diverged",
            EventKind::SyncError => "sync_error",
            EventKind::DataLostBeforeMirroring => "data_lost_before_mirroring",
        }
    }

    /// Parses a snake_case name.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The severity the shipped rules give it.
    pub const fn default_severity(self) -> Severity {
        match self {
            EventKind::AddTopic | EventKind::RemoveTopic | EventKind::ModifyPartitionNum => Severity::Info,
            EventKind::SourceNetRecovered | EventKind::TargetNetRecovered => Severity::Info,
            EventKind::SourceNetBeSwitched | EventKind::LagAboveThreshold | EventKind::PartitionStalled => {
                Severity::Warning
            }
            EventKind::SourceNetNotAvailable
            | EventKind::TargetNetNotAvailable
            | EventKind::PartitionDiverged
            | EventKind::SyncError
            | EventKind::DataLostBeforeMirroring => Severity::Critical,
        }
    }

    /// The condition this event ends, for kinds that are recovery notices.
    pub const fn clears(self) -> Option<EventKind> {
        match self {
            EventKind::SourceNetRecovered => Some(EventKind::SourceNetNotAvailable),
            EventKind::TargetNetRecovered => Some(EventKind::TargetNetNotAvailable),
            _ => None,
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How bad an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// For the record.
    Info,
    /// Needs attention soon.
    Warning,
    /// Needs someone now.
    Critical,
}

impl Severity {
    /// Parses "info", "warning" or "critical".
    pub fn from_name(name: &str) -> Option<Severity> {
        match name {
            "info" => Some(Severity::Info),
            "warning" => Some(Severity::Warning),
            "critical" => Some(Severity::Critical),
            _ => None,
        }
    }

    /// The lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

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

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// When, ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// Source topic involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Partition involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// Route involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// One sentence for humans.
    pub message: String,
    /// The facts, typed per shape.
    pub details: Details,
    /// True when this notice says the condition ended (lag back under the threshold, stall over).
    pub cleared: bool,
}

impl Event {
    /// A new event of `kind` with a message.
    pub fn new(kind: EventKind, message: impl Into<String>) -> Event {
        Event {
            kind,
            timestamp_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
            topic: None,
            partition: None,
            route: None,
            message: message.into(),
            details: Details::None,
            cleared: false,
        }
    }

    /// Sets the topic and partition.
    pub fn partition(mut self, topic: &str, partition: u32) -> Event {
        self.topic = Some(topic.to_owned());
        self.partition = Some(partition);
        self
    }

    /// Sets the topic.
    pub fn topic(mut self, topic: &str) -> Event {
        self.topic = Some(topic.to_owned());
        self
    }

    /// Sets the route.
    pub fn route(mut self, route: &str) -> Event {
        self.route = Some(route.to_owned());
        self
    }

    /// Sets the facts.
    pub fn with(mut self, details: Details) -> Event {
        self.details = details;
        self
    }

    /// Marks the event as the end of its condition.
    pub fn cleared(mut self) -> Event {
        self.cleared = true;
        self
    }

    /// The key alarms are throttled and repeated by: kind, topic, partition, route.
    pub fn key(&self) -> String {
        let kind = self.kind.clears().unwrap_or(self.kind);
        format!(
            "{}/{}/{}/{}",
            kind.name(),
            self.topic.as_deref().unwrap_or("-"),
            self.partition.map_or_else(|| "-".to_owned(), |p| p.to_string()),
            self.route.as_deref().unwrap_or("-")
        )
    }
}

/// How many recent events the bus keeps for the monitor.
pub const HISTORY: usize = 200;

/// The bus: a broadcast channel plus a short history.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Arc<Event>>,
    history: Arc<Mutex<VecDeque<Arc<Event>>>>,
    metrics: Metrics,
}

impl EventBus {
    /// A bus whose emits are counted in `metrics`.
    pub fn new(metrics: Metrics) -> EventBus {
        let (tx, _) = broadcast::channel(4096);
        metrics.expose_events(EventKind::ALL.iter().map(|k| k.name()));
        EventBus { tx, history: Arc::new(Mutex::new(VecDeque::with_capacity(HISTORY))), metrics }
    }

    /// Logs, counts, records and publishes an event.
    pub fn emit(&self, event: Event) {
        let name = event.kind.name();
        let topic = event.topic.as_deref().unwrap_or("");
        let partition = event.partition.map_or(-1, i64::from);
        let route = event.route.as_deref().unwrap_or("");
        match (event.kind.default_severity(), event.cleared) {
            (_, true) | (Severity::Info, _) => {
                tracing::info!(event = name, topic, partition, route, cleared = event.cleared, "{}", event.message)
            }
            (Severity::Warning, _) => tracing::warn!(event = name, topic, partition, route, "{}", event.message),
            (Severity::Critical, _) => tracing::error!(event = name, topic, partition, route, "{}", event.message),
        }
        self.metrics.event(name);
        let event = Arc::new(event);
        {
            let mut h = self.history.lock();
            if h.len() == HISTORY {
                h.pop_front();
            }
            h.push_back(Arc::clone(&event));
        }
        // No subscriber is fine (e.g. during validation).
        let _ = self.tx.send(event);
    }

    /// A new subscription; it sees events emitted from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// The most recent events, oldest first.
    pub fn recent(&self) -> Vec<Arc<Event>> {
        self.history.lock().iter().cloned().collect()
    }

    /// The metrics this bus counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_kind_is_exposed_at_zero_from_the_start() {
        let metrics = Metrics::new();
        let bus = EventBus::new(metrics.clone());
        let text = metrics.encode();
        for kind in EventKind::ALL {
            let line = format!("ferry_mirror_events_total{{event=\"{}\"}} 0", kind.name());
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        bus.emit(Event::new(EventKind::PartitionDiverged, "test"));
        let text = metrics.encode();
        assert!(text.lines().any(|l| l == "ferry_mirror_events_total{event=\"partition_diverged\"} 1"), "{text}");
        assert!(text.lines().any(|l| l == "ferry_mirror_events_total{event=\"add_topic\"} 0"), "{text}");
    }

    #[test]
    fn names_are_the_seed_snake_case_and_round_trip() {
        let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "add_topic",
                "remove_topic",
                "modify_partition_num",
                "source_net_not_available",
                "source_net_be_switched",
                "source_net_recovered",
                "target_net_not_available",
                "target_net_recovered",
                "lag_above_threshold",
                "partition_stalled",
                "partition_diverged",
                "sync_error",
                "data_lost_before_mirroring"
            ]
        );
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_name(k.name()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), serde_json::Value::String(k.name().into()));
        }
    }

    #[tokio::test]
    async fn emitted_events_reach_subscribers_and_history() {
        let bus = EventBus::new(Metrics::new());
        let mut rx = bus.subscribe();
        bus.emit(Event::new(EventKind::AddTopic, "orders is mirrored").topic("orders"));
        let got = rx.recv().await.unwrap();
        assert_eq!(got.kind, EventKind::AddTopic);
        assert_eq!(bus.recent().len(), 1);
        let recovered = Event::new(EventKind::SourceNetRecovered, "ok").route("primary");
        let down = Event::new(EventKind::SourceNetNotAvailable, "down").route("primary");
        assert_eq!(recovered.key(), down.key());
    }
}
