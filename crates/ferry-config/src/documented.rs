//! The documented defaults of a reference config file (`conf/mirror.toml`, `conf/broker.toml`), so a test can
//! check each against the compiled default through the real loader.
//!
//! The convention the reference files follow:
//! - `[section]` and `[[section]]` lines, written plainly or commented out at the start of a line (`# [section]`),
//!   open a section;
//! - a commented-out assignment at the start of a line, `# key = value` (one `#`, one space), is the documented
//!   default of `key` in that section: uncommenting it changes nothing;
//! - indented comment lines (`#   key = value`, `#   [section]`) are examples, not defaults: keys without a
//!   default, or sample tables;
//! - plain `key = value` lines are the reference file's own settings (required keys and sample values).
//!
//! A line that starts like a documented default (`# word = ...`) but is not a valid TOML assignment is an error,
//! so a default cannot silently drop out of the check.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde::de::{self, Visitor};

/// A section header: its key path and whether it is an array of tables (`[[x]]`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Section {
    /// Key path, e.g. `["source", "health"]`.
    pub path: Vec<String>,
    /// `[[x]]`: the keys belong to each entry.
    pub array: bool,
}

impl Section {
    /// `a.b`, or `` for the top level.
    pub fn dotted(&self) -> String {
        self.path.join(".")
    }
}

/// One documented default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentedDefault {
    /// 1-based line number in the file.
    pub line: usize,
    /// The section it belongs to.
    pub section: Section,
    /// The key.
    pub key: String,
    /// The assignment as written after `# `, e.g. `check_interval = "1s"`.
    pub assignment: String,
}

impl DocumentedDefault {
    /// `section.key`.
    pub fn dotted(&self) -> String {
        join(&self.section.dotted(), &self.key)
    }
}

fn join(section: &str, key: &str) -> String {
    if section.is_empty() { key.to_owned() } else { format!("{section}.{key}") }
}

/// How one line reads under the convention.
enum Line {
    Blank,
    Header(Section),
    Assignment(String, String),
    Other,
}

/// Reads `text` (without the comment marker) as a header or an assignment.
fn classify(text: &str, line: usize) -> Result<Line, String> {
    let t = text.trim_end();
    if t.is_empty() {
        return Ok(Line::Blank);
    }
    if t.starts_with('[') {
        return match header(t) {
            Some(s) => Ok(Line::Header(s)),
            None => Ok(Line::Other),
        };
    }
    let Some((key, _)) = t.split_once(" = ") else { return Ok(Line::Other) };
    let bare = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let quoted = key.len() >= 2 && key.starts_with('"') && key.ends_with('"');
    if !bare && !quoted {
        return Ok(Line::Other);
    }
    let table: toml::Table =
        t.parse().map_err(|e: toml::de::Error| format!("line {line}: {t:?} is not a TOML assignment: {e}"))?;
    let key = table.keys().next().cloned().ok_or_else(|| format!("line {line}: no key in {t:?}"))?;
    Ok(Line::Assignment(key, t.to_owned()))
}

fn header(t: &str) -> Option<Section> {
    let table: toml::Table = t.parse().ok()?;
    let mut section = Section::default();
    let mut cur = &table;
    loop {
        let mut it = cur.iter();
        let (k, v) = it.next()?;
        if it.next().is_some() {
            return None;
        }
        section.path.push(k.clone());
        match v {
            toml::Value::Table(t) if t.is_empty() => return Some(section),
            toml::Value::Table(t) => cur = t,
            toml::Value::Array(a) if a.len() == 1 => match &a[0] {
                toml::Value::Table(t) if t.is_empty() => {
                    section.array = true;
                    return Some(section);
                }
                _ => return None,
            },
            _ => return None,
        }
    }
}

/// Splits a line into (comment level, text): `None` for a plain line, `Some(0)` for `# text`, `Some(n)` for a
/// comment indented by `n` more spaces.
fn comment(line: &str) -> Option<(usize, &str)> {
    let rest = line.strip_prefix('#')?;
    let rest = rest.strip_prefix(' ').unwrap_or(rest);
    let indent = rest.len() - rest.trim_start().len();
    Some((indent, rest.trim_start()))
}

/// Every documented default in `text`, in file order.
pub fn defaults(text: &str) -> Result<Vec<DocumentedDefault>, String> {
    let mut out = Vec::new();
    let mut section = Section::default();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let (commented, body) = match comment(line) {
            Some((0, body)) => (true, body),
            Some(_) => continue,
            None => (false, line.trim_start()),
        };
        match classify(body, n)? {
            Line::Header(s) => section = s,
            Line::Assignment(key, assignment) if commented => {
                out.push(DocumentedDefault { line: n, section: section.clone(), key, assignment })
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Every `section.key` the file mentions: as a setting, a documented default, an example, or a table header.
pub fn mentioned(text: &str) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    let mut section = Section::default();
    let mut example: Option<Section> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let (indented, body) = match comment(line) {
            Some((0, body)) => (false, body),
            Some((_, body)) => (true, body),
            None => (false, line.trim_start()),
        };
        let kind = classify(body, n)?;
        if !indented && !matches!(kind, Line::Blank) {
            example = None;
        }
        match kind {
            Line::Header(s) => {
                out.insert(s.dotted());
                if indented { example = Some(s) } else { section = s }
            }
            Line::Assignment(key, _) => {
                let within = if indented { example.as_ref().unwrap_or(&section) } else { &section };
                out.insert(join(&within.dotted(), &key));
            }
            Line::Blank | Line::Other => {}
        }
    }
    Ok(out)
}

/// `base` (a TOML document) with the documented default's assignment added in its section. For a `[[x]]`
/// section the key goes into the last entry of `x`, which `base` must have.
pub fn with_default(base: &str, d: &DocumentedDefault) -> Result<String, String> {
    let mut doc: toml::Table = base.parse().map_err(|e| format!("the base document: {e}"))?;
    let mut cur = &mut doc;
    for (i, k) in d.section.path.iter().enumerate() {
        let last = i + 1 == d.section.path.len();
        if last && d.section.array && !cur.contains_key(k) {
            return Err(format!("the base document has no [[{}]] entry", d.section.dotted()));
        }
        let entry = cur.entry(k.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Array(a) if last && d.section.array => match a.last_mut() {
                Some(toml::Value::Table(t)) => t,
                _ => return Err(format!("the base document has no [[{}]] entry", d.section.dotted())),
            },
            toml::Value::Table(t) => t,
            _ => return Err(format!("the base document's {k} is not a table")),
        };
    }
    let one: toml::Table = d.assignment.parse().map_err(|e| format!("line {}: {e}", d.line))?;
    cur.extend(one);
    toml::to_string(&doc).map_err(|e| e.to_string())
}

/// The keys a serde struct reads (its field names as written in the file, skipped fields left out).
pub fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut capture = Capture(None);
    let _ = T::deserialize(&mut capture);
    capture.0.unwrap_or(&[])
}

struct Capture(Option<&'static [&'static str]>);

#[derive(Debug)]
struct Captured;

impl std::fmt::Display for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names captured")
    }
}

impl std::error::Error for Captured {}

impl de::Error for Captured {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Captured
    }
}

impl<'de> de::Deserializer<'de> for &mut Capture {
    type Error = Captured;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Captured> {
        Err(Captured)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Captured> {
        self.0 = Some(fields);
        Err(Captured)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"# A reference file.
[a]
# Required.
name = "x"
# How often.
# interval = "1s"
# Optional, for example:
#   token_file = "/etc/t"
# Optional TLS, for example:
#   [a.tls]
#   ca_file = "/ca"
# size = "4MiB"   # a trailing comment

# [[a.hooks]]
#   url = "http://h"
# timeout = "5s"

[b]
# "quoted.key" = 1
"#;

    #[test]
    fn commented_assignments_at_the_start_of_a_line_are_the_defaults() {
        let d = defaults(FILE).unwrap();
        let got: Vec<(usize, String, bool, &str)> =
            d.iter().map(|d| (d.line, d.dotted(), d.section.array, d.assignment.as_str())).collect();
        assert_eq!(
            got,
            [
                (6, "a.interval".to_owned(), false, "interval = \"1s\""),
                (12, "a.size".to_owned(), false, "size = \"4MiB\"   # a trailing comment"),
                (16, "a.hooks.timeout".to_owned(), true, "timeout = \"5s\""),
                (19, "b.quoted.key".to_owned(), false, "\"quoted.key\" = 1"),
            ]
        );
    }

    #[test]
    fn every_form_of_a_key_counts_as_mentioned() {
        let m = mentioned(FILE).unwrap();
        let want = [
            "a",
            "a.name",
            "a.interval",
            "a.token_file",
            "a.tls",
            "a.tls.ca_file",
            "a.size",
            "a.hooks",
            "a.hooks.url",
            "a.hooks.timeout",
            "b",
            "b.quoted.key",
        ];
        assert_eq!(m, want.iter().map(|s| (*s).to_owned()).collect());
    }

    #[test]
    fn a_default_that_is_not_toml_is_an_error() {
        let err = defaults("[a]\n# kind = \"kafka\" only: more words\n").unwrap_err();
        assert!(err.starts_with("line 2: "), "{err}");
        // Prose is not an assignment.
        assert_eq!(defaults("[a]\n# 0 means = unlimited\n# Use x = y to\n").unwrap(), []);
    }

    #[test]
    fn a_default_is_added_to_its_section_of_a_base_document() {
        let d = defaults(FILE).unwrap();
        let doc = with_default("[a]\nname = \"x\"\n", &d[0]).unwrap();
        let t: toml::Table = doc.parse().unwrap();
        assert_eq!(t["a"]["interval"].as_str(), Some("1s"));
        assert_eq!(t["a"]["name"].as_str(), Some("x"));
        assert!(with_default("", &d[2]).unwrap_err().contains("no [[a.hooks]] entry"));
        let doc = with_default("[[a.hooks]]\nurl = \"u\"\n", &d[2]).unwrap();
        let t: toml::Table = doc.parse().unwrap();
        assert_eq!(t["a"]["hooks"][0]["timeout"].as_str(), Some("5s"));
    }

    #[test]
    fn the_fields_of_a_struct_are_its_keys() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct S {
            a: u32,
            #[serde(rename = "bee")]
            b: u32,
            #[serde(skip)]
            c: u32,
        }
        assert_eq!(fields::<S>(), ["a", "bee"]);
    }
}
