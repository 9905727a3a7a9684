//! What a channel delivers: a [`Notice`] (an event, the severity its rule gives it, and whether it is the alarm,
//! a repeat or a recovery), and the webhook's JSON body built from it.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::events::{Event, Severity};

/// Who raises the alarms: shown in every notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmIdentity {
    /// `mirror.name`.
    pub mirror: String,
    /// `source.cluster`.
    pub source_cluster: String,
    /// `target.cluster`.
    pub target_cluster: String,
}

/// Why a notification is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeKind {
    /// The event itself.
    Alarm,
    /// The condition still holds (sent every `repeat`).
    Repeat,
    /// The condition ended.
    Recovery,
}

impl NoticeKind {
    /// The lowercase name (`alarm`, `repeat`, `recovery`).
    pub const fn name(self) -> &'static str {
        match self {
            NoticeKind::Alarm => "alarm",
            NoticeKind::Repeat => "repeat",
            NoticeKind::Recovery => "recovery",
        }
    }
}

/// One notification to deliver.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The event (for a repeat, the latest event of the condition; for a recovery, the clearing event).
    pub event: Arc<Event>,
    /// The severity from the rule of the alarm.
    pub severity: Severity,
    /// Alarm, repeat or recovery.
    pub kind: NoticeKind,
}

impl Notice {
    /// Whether this notice says a condition ended.
    pub fn cleared(&self) -> bool {
        self.kind == NoticeKind::Recovery || self.event.cleared || self.event.kind.clears().is_some()
    }

    /// The human status word: `ALARM`, `STILL ACTIVE` or `RESOLVED`.
    pub fn status(&self) -> &'static str {
        match (self.kind, self.cleared()) {
            (NoticeKind::Repeat, _) => "STILL ACTIVE",
            (_, true) => "RESOLVED",
            (_, false) => "ALARM",
        }
    }

    /// What the event is about: `topic/partition`, `topic`, `route NAME`, or `mirror`.
    pub fn scope(&self) -> String {
        let e = &self.event;
        match (&e.topic, e.partition, &e.route) {
            (Some(t), Some(p), _) => format!("{t}/{p}"),
            (Some(t), None, _) => t.clone(),
            (None, _, Some(r)) => format!("route {r}"),
            (None, _, None) => "mirror".to_owned(),
        }
    }

    /// The event time in RFC 3339 (UTC, milliseconds).
    pub fn timestamp(&self) -> String {
        let ms = u64::try_from(self.event.timestamp_ms).unwrap_or(0);
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
    }
}

/// The webhook body.
#[derive(Debug, Serialize)]
struct Payload<'a> {
    event: &'static str,
    severity: &'static str,
    notice: &'static str,
    mirror: &'a str,
    source_cluster: &'a str,
    target_cluster: &'a str,
    topic: Option<&'a str>,
    partition: Option<u32>,
    route: Option<&'a str>,
    message: &'a str,
    details: &'a crate::events::Details,
    cleared: bool,
    timestamp: String,
    key: String,
}

/// The JSON body of a webhook notification (the exact bytes that are signed and sent).
pub fn webhook_body(notice: &Notice, id: &AlarmIdentity) -> Vec<u8> {
    let e = &notice.event;
    let payload = Payload {
        event: e.kind.name(),
        severity: notice.severity.name(),
        notice: notice.kind.name(),
        mirror: &id.mirror,
        source_cluster: &id.source_cluster,
        target_cluster: &id.target_cluster,
        topic: e.topic.as_deref(),
        partition: e.partition,
        route: e.route.as_deref(),
        message: &e.message,
        details: &e.details,
        cleared: notice.cleared(),
        timestamp: notice.timestamp(),
        key: e.key(),
    };
    // Serialising strings, numbers and JSON values cannot fail.
    serde_json::to_vec(&payload).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventKind;

    fn id() -> AlarmIdentity {
        AlarmIdentity { mirror: "dc-a_to_dc-b".into(), source_cluster: "dc-a".into(), target_cluster: "dc-b".into() }
    }

    #[test]
    fn webhook_body_has_the_documented_shape() {
        let mut e = Event::new(EventKind::LagAboveThreshold, "orders/3 lags 20000 records")
            .partition("orders", 3)
            .with(crate::events::Details::Lag(crate::events::LagFacts {
                lag: 20000,
                latency_ms: 1500,
                lag_threshold: Some(10000),
                ..Default::default()
            }));
        e.timestamp_ms = 1_700_000_000_123;
        let n = Notice { event: Arc::new(e), severity: Severity::Critical, kind: NoticeKind::Alarm };
        let body: serde_json::Value = serde_json::from_slice(&webhook_body(&n, &id())).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "event": "lag_above_threshold",
                "severity": "critical",
                "notice": "alarm",
                "mirror": "dc-a_to_dc-b",
                "source_cluster": "dc-a",
                "target_cluster": "dc-b",
                "topic": "orders",
                "partition": 3,
                "route": null,
                "message": "orders/3 lags 20000 records",
                "details": {"lag": 20000, "latency_ms": 1500, "lag_threshold": 10000},
                "cleared": false,
                "timestamp": "2023-11-14T22:13:20.123Z",
                "key": "lag_above_threshold/orders/3/-"
            })
        );
    }

    #[test]
    fn recovery_wording() {
        let e = Arc::new(Event::new(EventKind::SourceNetRecovered, "route ok").route("primary"));
        let n = Notice { event: Arc::clone(&e), severity: Severity::Critical, kind: NoticeKind::Recovery };
        assert!(n.cleared());
        assert_eq!((n.status(), n.scope()), ("RESOLVED", "route primary".to_owned()));
        let r = Notice { event: e, severity: Severity::Critical, kind: NoticeKind::Repeat };
        assert_eq!(r.status(), "STILL ACTIVE");
        let m = Notice {
            event: Arc::new(Event::new(EventKind::AddTopic, "started")),
            severity: Severity::Info,
            kind: NoticeKind::Alarm,
        };
        assert_eq!((m.status(), m.scope(), m.cleared()), ("ALARM", "mirror".to_owned(), false));
    }
}
