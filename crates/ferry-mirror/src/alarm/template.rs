//! Email templates: `alerts/templates/email_subject.txt` and `email_body.txt`, compiled in, each replaceable by a
//! file of the same name in a `templates/` folder next to the rules file.
//!
//! A template is plain text with `{placeholder}`s (`{{` and `}}` write literal braces). Placeholders are checked
//! when the template is loaded, so a typo is a config error naming the file, never a silent blank.

use std::path::{Path, PathBuf};

use super::notice::{AlarmIdentity, Notice};

/// The shipped subject template.
pub const SHIPPED_SUBJECT: &str = include_str!("../../../../alerts/templates/email_subject.txt");
/// The shipped body template.
pub const SHIPPED_BODY: &str = include_str!("../../../../alerts/templates/email_body.txt");

/// Every placeholder a template may use.
pub const PLACEHOLDERS: &[&str] = &[
    "event",
    "severity",
    "status",
    "notice",
    "mirror",
    "source_cluster",
    "target_cluster",
    "scope",
    "topic",
    "partition",
    "route",
    "message",
    "details",
    "timestamp",
    "cleared",
    "key",
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(&'static str),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            lit.push_str(&rest[..i]);
            let (brace, after) = (&rest[i..i + 1], &rest[i + 1..]);
            if after.starts_with(brace) {
                lit.push_str(brace);
                rest = &after[1..];
                continue;
            }
            if brace == "}" {
                return Err(format!("a lone '}}' at byte {i} (write '}}}}' for a literal brace)"));
            }
            let Some(end) = after.find('}') else {
                return Err("a '{' without its '}' (write '{{' for a literal brace)".to_owned());
            };
            let name = &after[..end];
            let Some(var) = PLACEHOLDERS.iter().find(|p| **p == name) else {
                return Err(format!(
                    "unknown placeholder {{{name}}} (the placeholders are {})",
                    PLACEHOLDERS.join(", ")
                ));
            };
            if !lit.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut lit)));
            }
            pieces.push(Piece::Var(var));
            rest = &after[end + 1..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit));
        }
        Ok(Template { pieces })
    }

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

/// The subject and body templates of the email channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    subject: Template,
    body: Template,
}

impl Templates {
    /// The shipped templates, replaced by `templates/email_subject.txt` / `email_body.txt` next to `rules` where
    /// such files exist. Problems name the file.
    pub fn load(rules: Option<&Path>) -> Result<Templates, Vec<String>> {
        let dir = rules.map(|r| r.parent().unwrap_or(Path::new(".")).join("templates"));
        let mut problems = Vec::new();
        let mut one = |file: &str, shipped: &str| {
            let path: Option<PathBuf> = dir.as_ref().map(|d| d.join(file)).filter(|p| p.is_file());
            let (text, origin) = match &path {
                Some(p) => match std::fs::read_to_string(p) {
                    Ok(t) => (t, p.display().to_string()),
                    Err(e) => {
                        problems.push(format!("alarms template {}: cannot read: {e}", p.display()));
                        return None;
                    }
                },
                None => (shipped.to_owned(), format!("(shipped) alerts/templates/{file}")),
            };
            Template::parse(&text).map_err(|e| problems.push(format!("alarms template {origin}: {e}"))).ok()
        };
        let subject = one("email_subject.txt", SHIPPED_SUBJECT);
        let body = one("email_body.txt", SHIPPED_BODY);
        match (subject, body) {
            (Some(subject), Some(body)) => Ok(Templates { subject, body }),
            _ => Err(problems),
        }
    }

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
        e = e.detail("cache_offset", 40).detail("reason", "no progress");
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
