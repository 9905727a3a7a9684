//! Reading a config: the TOML text plus environment overrides become one tree ([`tree`]), and the tree becomes
//! the typed sections ([`deserialize`]) with every unknown key and bad value reported, not just the first.
//!
//! How every problem is found: serde stops at the first error, so [`deserialize`] notes it with its key path
//! (`serde_path_to_error`), removes the offending key from the tree (the section's default then applies), and
//! tries again, until the tree deserializes. Each try is a plain in-memory walk; a config has a few dozen keys.

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::Segment;

use crate::Problems;

/// Environment overrides: `{prefix}__SECTION__KEY=value`, e.g. `FERRY_MIRROR__SYNC__COMMIT_INTERVAL=2s`.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    /// The variable prefix, e.g. `FERRY_MIRROR`.
    pub prefix: &'a str,
    /// Keys (`section.key`) whose value is a comma-separated list.
    pub list_keys: &'a [&'a str],
}

/// Reads `text` (TOML) and, when `env` is given, the environment overrides over it, into one tree.
pub fn tree(text: &str, env: Option<Env<'_>>) -> Result<Value, Problems> {
    let mut builder = config::Config::builder().add_source(config::File::from_str(text, config::FileFormat::Toml));
    if let Some(env) = env {
        let mut source =
            config::Environment::with_prefix(env.prefix).prefix_separator("__").separator("__").try_parsing(true);
        if !env.list_keys.is_empty() {
            source = source.list_separator(",");
            for key in env.list_keys {
                source = source.with_list_parse_key(key);
            }
        }
        builder = builder.add_source(source);
    }
    let one = |e: config::ConfigError| Problems(vec![e.to_string()]);
    builder.build().map_err(one)?.try_deserialize::<Value>().map_err(one)
}

/// Reads `text` (TOML) alone into a tree, for files without environment overrides (the alarm rules).
pub fn toml_tree(text: &str) -> Result<Value, String> {
    toml::from_str::<Value>(text).map_err(|e| format!("invalid TOML: {}", e.to_string().trim()))
}

/// At most this many problems are collected from one tree (each costs one more try).
const MAX_PROBLEMS: usize = 200;

/// Deserializes `tree` into `T`, adding every problem to `problems` as `{key}: {what}`; `see` completes the hint
/// of an unknown key (e.g. `"see conf/mirror.toml for every key"`). Keys with problems take their defaults, so the
/// result is still complete and the sections' own checks can run on it.
pub fn deserialize<T: DeserializeOwned + Default>(mut tree: Value, problems: &mut Problems, see: &str) -> T {
    // Sequence elements removed so far, as (path of the sequence, index) in the original tree: later paths are
    // mapped back through them, so `include[2]` is still called `include[2]` after `include[0]` was removed.
    let mut removed: Vec<(Vec<Seg>, usize)> = Vec::new();
    for _ in 0..MAX_PROBLEMS {
        let error = match serde_path_to_error::deserialize::<_, T>(&tree) {
            Ok(value) => return value,
            Err(e) => e,
        };
        let current: Vec<Seg> = error.path().iter().filter_map(Seg::from_segment).collect();
        let complete = current.len() == error.path().iter().count();
        let original = to_original(&current, &removed);
        problems.push(display(&original), message(&error.inner().to_string(), see));
        if !complete || current.is_empty() || !remove(&mut tree, &current) {
            // Nothing more can be told apart; the report already says what is wrong.
            return T::default();
        }
        if let (Some(Seg::Index(i)), Some(parent)) = (original.last(), original.get(..original.len() - 1)) {
            removed.push((parent.to_vec(), *i));
        }
    }
    problems.push_text(format!("more than {MAX_PROBLEMS} problems; fix these first"));
    T::default()
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

impl Seg {
    fn from_segment(s: &Segment) -> Option<Seg> {
        match s {
            Segment::Map { key } => Some(Seg::Key(key.clone())),
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Enum { .. } | Segment::Unknown => None,
        }
    }
}

fn to_original(current: &[Seg], removed: &[(Vec<Seg>, usize)]) -> Vec<Seg> {
    let mut out: Vec<Seg> = Vec::with_capacity(current.len());
    for seg in current {
        let mapped = match seg {
            Seg::Key(_) => seg.clone(),
            Seg::Index(i) => {
                let mut gone: Vec<usize> = removed.iter().filter(|(p, _)| *p == out).map(|(_, r)| *r).collect();
                gone.sort_unstable();
                let mut original = *i;
                for r in gone {
                    if r <= original {
                        original += 1;
                    }
                }
                Seg::Index(original)
            }
        };
        out.push(mapped);
    }
    out
}

fn display(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if out.is_empty() => out.push_str(&quoted(k)),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(&quoted(k));
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A key as TOML writes it: bare when it can be, else quoted (librdkafka properties hold dots).
fn quoted(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

fn remove(tree: &mut Value, path: &[Seg]) -> bool {
    let Some((last, parents)) = path.split_last() else { return false };
    let mut cur = tree;
    for seg in parents {
        let next = match (seg, cur) {
            (Seg::Key(k), Value::Object(m)) => m.get_mut(k),
            (Seg::Index(i), Value::Array(a)) => a.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else { return false };
        cur = next;
    }
    match (last, cur) {
        (Seg::Key(k), Value::Object(m)) => m.remove(k).is_some(),
        (Seg::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            true
        }
        _ => false,
    }
}

/// serde's wording made to read like the rest of the report.
fn message(text: &str, see: &str) -> String {
    let see = if see.is_empty() { String::new() } else { format!("; {see}") };
    if let Some(rest) = text.strip_prefix("unknown field `") {
        let expected = rest.split_once(", expected ").map_or("no keys here", |(_, e)| e);
        let expected = expected.strip_prefix("one of ").unwrap_or(expected).replace('`', "");
        return format!("unknown key (the keys here are {expected}{see})");
    }
    if let Some(rest) = text.strip_prefix("unknown variant `")
        && let Some((value, expected)) = rest.split_once("`, expected ")
    {
        let expected = expected.strip_prefix("one of ").unwrap_or(expected).replace('`', "\"");
        return format!("{value:?} is not one of {expected}");
    }
    text.to_owned()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Section {
        count: u32,
        name: String,
        list: Vec<u8>,
        kind: Kind,
    }

    impl Default for Section {
        fn default() -> Self {
            Section { count: 3, name: "x".into(), list: vec![], kind: Kind::Halt }
        }
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Halt,
        Truncate,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct File {
        a: Section,
        b: Vec<Section>,
        c: BTreeMap<String, String>,
    }

    fn load(text: &str) -> (File, Vec<String>) {
        let mut p = Problems::new();
        let tree = tree(text, None).unwrap();
        let file = deserialize::<File>(tree, &mut p, "see the docs");
        // The order follows the tree's maps; compare as a sorted list.
        let mut problems = p.0;
        problems.sort();
        (file, problems)
    }

    #[test]
    fn every_bad_key_is_reported_and_the_rest_is_kept() {
        let (file, problems) = load(
            "[a]\ncount = -1\nnmae = \"y\"\nname = \"kept\"\nlist = [1, 300, 2, 400, 5]\nkind = \"stop\"\n\
             [[b]]\ncount = 1\n[[b]]\ncount = \"two\"\n[c]\n\"dotted.key\" = 1\n",
        );
        assert_eq!(
            problems,
            [
                "a.count: invalid value: integer `-1`, expected u32",
                "a.kind: \"stop\" is not one of \"halt\" or \"truncate\"",
                "a.list[1]: invalid value: integer `300`, expected u8",
                "a.list[3]: invalid value: integer `400`, expected u8",
                "a.nmae: unknown key (the keys here are count, name, list, kind; see the docs)",
                "b[1].count: invalid type: string \"two\", expected u32",
                "c.\"dotted.key\": invalid type: integer `1`, expected a string",
            ]
        );
        assert_eq!(file.a.name, "kept");
        assert_eq!(file.a.count, 3, "a bad key takes its default");
        assert_eq!(file.a.list, [1, 2, 5], "the bad elements are left out, the others kept");
        assert_eq!(file.b.len(), 2);
    }

    #[test]
    fn bad_toml_is_one_problem() {
        let err = tree("[a\n", None).unwrap_err();
        assert_eq!(err.len(), 1);
    }
}
