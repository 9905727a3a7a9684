//! Email templates, as config files: `alerts/templates/email_subject.txt` and `email_body.txt`, compiled in,
//! each replaceable by a file of the same name in a `templates/` folder next to the rules file.
//!
//! A template is plain text with `{placeholder}`s (`{{` and `}}` write literal braces). Placeholders are checked
//! when the template is loaded, so a typo is a config error naming the file, never a silent blank. Rendering a
//! notice is the alarm component's part.

use std::path::{Path, PathBuf};

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

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Literal text.
    Text(String),
    /// A placeholder, one of [`PLACEHOLDERS`].
    Var(&'static str),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub(crate) pieces: Vec<Piece>,
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
}

/// The subject and body templates of the email channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    pub(crate) subject: Template,
    pub(crate) body: Template,
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
}
