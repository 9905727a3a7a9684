//! Rendering the email templates (parsed and checked as config files by [`crate::config::templates`]) for a
//! notice.

pub use crate::config::templates::{PLACEHOLDERS, SHIPPED_BODY, SHIPPED_SUBJECT, Template, Templates};

use super::notice::{AlarmIdentity, Notice};
use crate::config::templates::Piece;

impl Template {
    /// Renders the template for `notice`.
    pub fn render(&self, notice: &Notice, id: &AlarmIdentity) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Var(v) => out.push_str(&value(v, notice, id)),
            }
        }
        out
    }
}

fn value(name: &str, n: &Notice, id: &AlarmIdentity) -> String {
    let e = &n.event;
    match name {
        "event" => e.kind.name().to_owned(),
        "severity" => n.severity.name().to_owned(),
        "status" => n.status().to_owned(),
        "notice" => n.kind.name().to_owned(),
        "mirror" => id.mirror.clone(),
        "source_cluster" => id.source_cluster.clone(),
        "target_cluster" => id.target_cluster.clone(),
        "scope" => n.scope(),
        "topic" => e.topic.clone().unwrap_or_else(|| "-".into()),
        "partition" => e.partition.map_or_else(|| "-".into(), |p| p.to_string()),
        "route" => e.route.clone().unwrap_or_else(|| "-".into()),
        "message" => e.message.clone(),
        "details" if e.details.is_empty() => "  (none)".to_owned(),
        "details" => e
            .details
            .to_map()
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("  {k}: {s}"),
                other => format!("  {k}: {other}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        "timestamp" => n.timestamp(),
        "cleared" => n.cleared().to_string(),
        "key" => e.key(),
        // Template::parse admits only PLACEHOLDERS, all handled above.
        _ => String::new(),
    }
}

impl Templates {
    /// The subject line: one line, whitespace runs (including newlines) collapsed.
    pub fn subject(&self, notice: &Notice, id: &AlarmIdentity) -> String {
        self.subject.render(notice, id).split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The plain-text body.
    pub fn body(&self, notice: &Notice, id: &AlarmIdentity) -> String {
        self.body.render(notice, id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::alarm::notice::NoticeKind;
    use crate::events::{Event, EventKind, Severity};

    fn id() -> AlarmIdentity {
        AlarmIdentity { mirror: "m1".into(), source_cluster: "dc-a".into(), target_cluster: "dc-b".into() }
    }

    fn notice(kind: NoticeKind, cleared: bool) -> Notice {
        let mut e = Event::new(EventKind::PartitionStalled, "orders/2 made no progress for 1m").partition("orders", 2);
        e = e.with(crate::events::Details::Stall(crate::events::StallFacts {
            cache_offset: Some(40),
            reason: Some("no progress".into()),
            ..Default::default()
        }));
        e.timestamp_ms = 1_700_000_000_000;
        e.cleared = cleared;
        Notice { event: Arc::new(e), severity: Severity::Warning, kind }
    }

    #[test]
    fn shipped_templates_render_every_field() {
        let t = Templates::load(None).unwrap();
        let n = notice(NoticeKind::Alarm, false);
        assert_eq!(t.subject(&n, &id()), "[ferry warning] ALARM: partition_stalled on m1 (orders/2)");
        let body = t.body(&n, &id());
        let want = "ALARM: partition_stalled (warning)

orders/2 made no progress for 1m

Mirror:     m1 (dc-a -> dc-b)
Topic:      orders
Partition:  2
Route:      -
Time:       2023-11-14T22:13:20.000Z
Cleared:    false

Details:
  cache_offset: 40
  reason: no progress

Runbook: docs/alarms.md, section \"partition_stalled\".
-- 
Sent by ferry-mirror. Alarm key: partition_stalled/orders/2/-
";
        assert_eq!(body, want);
        let r = notice(NoticeKind::Recovery, true);
        assert_eq!(t.subject(&r, &id()), "[ferry warning] RESOLVED: partition_stalled on m1 (orders/2)");
        assert!(t.body(&r, &id()).contains("Cleared:    true\n"));
    }

    #[test]
    fn braces_escape_and_bad_templates_are_refused() {
        let t = Template::parse("{{literal}} {event}}}").unwrap();
        assert_eq!(t.render(&notice(NoticeKind::Alarm, false), &id()), "{literal} partition_stalled}");
        assert!(Template::parse("{evnt}").unwrap_err().starts_with("unknown placeholder {evnt}"));
        assert!(Template::parse("{event").unwrap_err().contains("without its '}'"));
        assert!(Template::parse("a } b").unwrap_err().contains("lone '}'"));
    }

    #[test]
    fn files_next_to_the_rules_replace_the_shipped_ones() {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.toml");
        std::fs::create_dir(dir.path().join("templates")).unwrap();
        std::fs::write(dir.path().join("templates/email_subject.txt"), "{status}\n{event}\n").unwrap();
        let t = Templates::load(Some(&rules)).unwrap();
        let n = notice(NoticeKind::Repeat, false);
        assert_eq!(t.subject(&n, &id()), "STILL ACTIVE partition_stalled");
        // The body was not replaced.
        assert!(t.body(&n, &id()).starts_with("STILL ACTIVE: partition_stalled (warning)\n"));
        std::fs::write(dir.path().join("templates/email_body.txt"), "{oops}").unwrap();
        let err = Templates::load(Some(&rules)).unwrap_err();
        assert_eq!(err.len(), 1);
        assert!(err[0].contains("templates/email_body.txt: unknown placeholder {oops}"), "{err:?}");
    }
}
