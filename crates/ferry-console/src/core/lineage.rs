//! How records derive from each other, read from their headers alone:
//! - a dead letter carries `ferry-dlq-topic`, `-partition`, `-offset` (its original);
//! - a redriven record carries `ferry-redriven-from: {group}.dlq/{partition}/{offset}` (its dead letter);
//! - a record the console re-sent after an edit carries `ferry-origin-topic`, `-partition`, `-offset` (and
//!   `ferry-origin-cluster`, `ferry-edited-by`, `ferry-edited-at-ms`).
//!
//! Invariant: an edit never copies the lineage headers of its source (a resent dead letter is not a dead letter);
//! it names its source instead, so every step of a chain names exactly the step before it.

use std::fmt;

/// A record's place.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Coord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
}

impl fmt::Display for Coord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

impl Coord {
    /// Parses `topic/partition/offset` (the topic may not contain `/`).
    pub fn parse(text: &str) -> Option<Coord> {
        let mut parts = text.rsplitn(3, '/');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        let topic = parts.next()?;
        (!topic.is_empty()).then(|| Coord { topic: topic.to_owned(), partition, offset })
    }
}

/// How a record derives from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A dead letter of the other.
    DeadLetter,
    /// Redriven from the other (a dead letter).
    Redriven,
    /// Re-sent from the other after an edit.
    Edited,
}

/// The header names of an edit.
pub const ORIGIN_TOPIC: &str = "ferry-origin-topic";
/// See [`ORIGIN_TOPIC`].
pub const ORIGIN_PARTITION: &str = "ferry-origin-partition";
/// See [`ORIGIN_TOPIC`].
pub const ORIGIN_OFFSET: &str = "ferry-origin-offset";
/// See [`ORIGIN_TOPIC`].
pub const ORIGIN_CLUSTER: &str = "ferry-origin-cluster";
/// Who edited it (a console token's name).
pub const EDITED_BY: &str = "ferry-edited-by";
/// When, ms since the epoch.
pub const EDITED_AT: &str = "ferry-edited-at-ms";

fn header<'a>(headers: &'a [(&'a str, Option<&'a [u8]>)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| *k == name).and_then(|(_, v)| std::str::from_utf8((*v)?).ok())
}

fn coord(headers: &[(&str, Option<&[u8]>)], t: &str, p: &str, o: &str) -> Option<Coord> {
    Some(Coord {
        topic: header(headers, t)?.to_owned(),
        partition: header(headers, p)?.parse().ok()?,
        offset: header(headers, o)?.parse().ok()?,
    })
}

/// Where a record comes from, per its headers.
pub fn origin(headers: &[(&str, Option<&[u8]>)]) -> Option<(Kind, Coord)> {
    if let Some(c) = coord(headers, "ferry-dlq-topic", "ferry-dlq-partition", "ferry-dlq-offset") {
        return Some((Kind::DeadLetter, c));
    }
    if let Some(c) = header(headers, "ferry-redriven-from").and_then(Coord::parse) {
        return Some((Kind::Redriven, c));
    }
    coord(headers, ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET).map(|c| (Kind::Edited, c))
}

fn is_lineage(name: &str) -> bool {
    name.starts_with("ferry-dlq-")
        || name.starts_with("ferry-origin-")
        || name == "ferry-redriven-from"
        || name == EDITED_BY
        || name == EDITED_AT
}

/// The headers of an edited copy of the record at `source`: its own headers without lineage, then the edit's.
pub fn edit_headers(
    source_headers: &[(String, Option<Vec<u8>>)],
    source: &Coord,
    cluster: &str,
    who: &str,
    at_ms: i64,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out: Vec<_> = source_headers.iter().filter(|(k, _)| !is_lineage(k)).cloned().collect();
    for (k, v) in [
        (ORIGIN_CLUSTER, cluster.to_owned()),
        (ORIGIN_TOPIC, source.topic.clone()),
        (ORIGIN_PARTITION, source.partition.to_string()),
        (ORIGIN_OFFSET, source.offset.to_string()),
        (EDITED_BY, who.to_owned()),
        (EDITED_AT, at_ms.to_string()),
    ] {
        out.push((k.to_owned(), Some(v.into_bytes())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(t: &str, p: u32, o: u64) -> Coord {
        Coord { topic: t.into(), partition: p, offset: o }
    }

    #[test]
    fn origins_table() {
        type Row<'a> = (Vec<(&'a str, &'a str)>, Option<(Kind, Coord)>);
        let table: Vec<Row<'_>> = vec![
            (vec![], None),
            (
                vec![("ferry-dlq-topic", "orders"), ("ferry-dlq-partition", "1"), ("ferry-dlq-offset", "7")],
                Some((Kind::DeadLetter, c("orders", 1, 7))),
            ),
            (vec![("ferry-dlq-topic", "orders"), ("ferry-dlq-partition", "x"), ("ferry-dlq-offset", "7")], None),
            (vec![("ferry-redriven-from", "billing.dlq/0/12")], Some((Kind::Redriven, c("billing.dlq", 0, 12)))),
            (vec![("ferry-redriven-from", "garbage")], None),
            (
                vec![(ORIGIN_TOPIC, "billing.dlq"), (ORIGIN_PARTITION, "0"), (ORIGIN_OFFSET, "3")],
                Some((Kind::Edited, c("billing.dlq", 0, 3))),
            ),
        ];
        for (headers, want) in table {
            let h: Vec<(&str, Option<&[u8]>)> = headers.iter().map(|(k, v)| (*k, Some(v.as_bytes()))).collect();
            assert_eq!(origin(&h), want, "{headers:?}");
        }
    }

    #[test]
    fn an_edit_names_its_source_and_drops_older_lineage() {
        let src = vec![
            ("trace".to_owned(), Some(b"t1".to_vec())),
            ("ferry-dlq-topic".to_owned(), Some(b"orders".to_vec())),
            ("ferry-redriven-from".to_owned(), Some(b"g.dlq/0/1".to_vec())),
        ];
        let out = edit_headers(&src, &c("g.dlq", 0, 4), "dc1", "ops", 99);
        let names: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["trace", ORIGIN_CLUSTER, ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET, EDITED_BY, EDITED_AT]
        );
        let view: Vec<(&str, Option<&[u8]>)> = out.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        assert_eq!(origin(&view), Some((Kind::Edited, c("g.dlq", 0, 4))));
    }
}
