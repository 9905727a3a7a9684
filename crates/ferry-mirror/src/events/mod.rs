//! The EventBus and every event the mirror raises, in one module.
//!
//! Rust names are CamelCase; the names in rules, webhooks, logs and metrics are the seed's snake_case
//! ([`EventKind::name`]). Emitting an event logs it, counts it (`ferry_mirror_events_total{event}`), keeps it in a
//! short history for the monitor, and publishes it on a tokio broadcast channel. The Alarmer and the Monitor
//! subscribe; nothing parses logs. The facts each kind carries are in the `details` module ([`Details`]).

mod details;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::broadcast;

pub use self::details::*;
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
    /// A partition's RPO (how long the oldest record not yet on the target has waited) stayed above its threshold.
    RpoAboveThreshold,
    /// The background verifier found a mirrored batch that differs from the source's, or fails its own CRC.
    VerifyMismatch,
    /// A failover job started (after its pre-checks passed).
    FailoverStarted,
    /// A failover fenced its source topics: they are read-only.
    Fenced,
    /// The target holds everything the fenced source topics hold.
    Drained,
    /// The target topics were promoted as one cut: writable, no longer mirrored.
    Promoted,
}

impl EventKind {
    /// All kinds, in declaration order.
    pub const ALL: [EventKind; 19] = [
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
        EventKind::RpoAboveThreshold,
        EventKind::VerifyMismatch,
        EventKind::FailoverStarted,
        EventKind::Fenced,
        EventKind::Drained,
        EventKind::Promoted,
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
            EventKind::RpoAboveThreshold => "rpo_above_threshold",
            EventKind::VerifyMismatch => "verify_mismatch",
            EventKind::FailoverStarted => "failover_started",
            EventKind::Fenced => "fenced",
            EventKind::Drained => "drained",
            EventKind::Promoted => "promoted",
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
            EventKind::SourceNetBeSwitched
            | EventKind::LagAboveThreshold
            | EventKind::PartitionStalled
            | EventKind::RpoAboveThreshold
            | EventKind::Fenced
            | EventKind::Drained => Severity::Warning,
            EventKind::SourceNetNotAvailable
            | EventKind::TargetNetNotAvailable
            | EventKind::PartitionDiverged
            | EventKind::SyncError
            | EventKind::DataLostBeforeMirroring
            | EventKind::VerifyMismatch
            | EventKind::FailoverStarted
            | EventKind::Promoted => Severity::Critical,
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
                "data_lost_before_mirroring",
                "rpo_above_threshold",
                "verify_mismatch",
                "failover_started",
                "fenced",
                "drained",
                "promoted"
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
