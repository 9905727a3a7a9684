//! Output formats: aligned text tables, the topic JSON of `topic describe/list`, and the one-object-per-line record
//! JSON of `consume --format json` with its base64 fallback.
//!
//! JSON objects are written from structs or ordered maps, so keys appear in the documented order. Bytes that are
//! valid UTF-8 appear as strings under their name; anything else appears under `NAME_base64` as standard base64;
//! a null stays null under the plain name.

use base64::Engine as _;
use bytes::Bytes;
use clap::ValueEnum;
use ferry_batch::Header;
use ferry_client::ConsumerRecord;
use ferry_client::admin::{MirrorSource, PartitionInfo, TopicConfig, TopicInfo};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// Human-readable text.
    #[default]
    Text,
    /// JSON.
    Json,
}

/// A text table with columns padded to their widest cell.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with a header row.
    pub fn new(header: &[&str]) -> Self {
        Table { rows: vec![header.iter().map(|h| (*h).to_owned()).collect()] }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, two spaces between columns, no trailing spaces.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', widths[c] - cell.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Topic config with every field, unset ones as null.
#[derive(Debug, Serialize, PartialEq)]
pub struct ConfigJson {
    flush: Option<String>,
    flush_interval_ms: Option<u64>,
    flush_bytes: Option<u64>,
    retention_bytes: Option<u64>,
    retention_ms: Option<u64>,
    segment_bytes: Option<u64>,
    segment_ms: Option<u64>,
    /// Left out while the topic follows the broker's `delay.max_delay`.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_delay_ms: Option<u64>,
}

impl From<&TopicConfig> for ConfigJson {
    fn from(c: &TopicConfig) -> Self {
        ConfigJson {
            flush: c.flush.clone(),
            flush_interval_ms: c.flush_interval_ms,
            flush_bytes: c.flush_bytes,
            retention_bytes: c.retention_bytes,
            retention_ms: c.retention_ms,
            segment_bytes: c.segment_bytes,
            segment_ms: c.segment_ms,
            max_delay_ms: c.max_delay_ms,
        }
    }
}

/// The mirror mark of a topic.
#[derive(Debug, Serialize, PartialEq)]
pub struct MirrorJson {
    source_cluster: String,
    source_cluster_id: String,
    source_topic: String,
    source_topic_id: String,
}

impl From<&MirrorSource> for MirrorJson {
    fn from(m: &MirrorSource) -> Self {
        MirrorJson {
            source_cluster: m.source_cluster.clone(),
            source_cluster_id: m.source_cluster_id.clone(),
            source_topic: m.source_topic.clone(),
            source_topic_id: m.source_topic_id.clone(),
        }
    }
}

/// An offset range `[start, end)`.
#[derive(Debug, Serialize, PartialEq)]
pub struct GapJson {
    start: u64,
    end: u64,
}

/// One partition of `topic describe`.
#[derive(Debug, Serialize, PartialEq)]
pub struct PartitionJson {
    partition: u32,
    log_start_offset: u64,
    log_end_offset: u64,
    epoch: u32,
    size_bytes: u64,
    segments: u32,
    gaps: Vec<GapJson>,
}

impl From<&PartitionInfo> for PartitionJson {
    fn from(p: &PartitionInfo) -> Self {
        PartitionJson {
            partition: p.partition,
            log_start_offset: p.log_start_offset,
            log_end_offset: p.log_end_offset,
            epoch: p.epoch,
            size_bytes: p.size_bytes,
            segments: p.segments,
            gaps: p.gaps.iter().map(|g| GapJson { start: g.start, end: g.end }).collect(),
        }
    }
}

/// A topic as `topic describe --format json` (with `partition_info`) and `topic list --format json` print it.
#[derive(Debug, Serialize, PartialEq)]
pub struct TopicJson {
    name: String,
    topic_id: String,
    partitions: u32,
    config: ConfigJson,
    mirror: Option<MirrorJson>,
    /// "single", "double_write" or "raft3".
    replication: String,
    /// double_write: writes go on with one replica while a lost one is replaced.
    risk_phase: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition_info: Option<Vec<PartitionJson>>,
}

impl TopicJson {
    /// The JSON of a topic, with partition details when given.
    pub fn new(topic: &TopicInfo, partitions: Option<&[PartitionInfo]>) -> Self {
        TopicJson {
            name: topic.name.clone(),
            topic_id: topic.topic_id.clone(),
            partitions: topic.partitions,
            config: topic.config.as_ref().map(ConfigJson::from).unwrap_or_else(|| (&TopicConfig::default()).into()),
            mirror: topic.mirror.as_ref().map(MirrorJson::from),
            replication: if topic.replication.is_empty() { "single".into() } else { topic.replication.clone() },
            risk_phase: topic.risk_phase,
            partition_info: partitions.map(|ps| ps.iter().map(PartitionJson::from).collect()),
        }
    }
}

/// Standard base64.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Writes `name` (UTF-8 or null) or `name_base64` into a JSON map.
fn bytes_entry<M: SerializeMap>(map: &mut M, name: &str, value: Option<&Bytes>) -> Result<(), M::Error> {
    match value {
        None => map.serialize_entry(name, &()),
        Some(b) => match std::str::from_utf8(b) {
            Ok(text) => map.serialize_entry(name, text),
            Err(_) => map.serialize_entry(&format!("{name}_base64"), &base64(b)),
        },
    }
}

struct HeaderJson<'a>(&'a Header);

impl Serialize for HeaderJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("key", &self.0.key)?;
        bytes_entry(&mut map, "value", self.0.value.as_ref())?;
        map.end()
    }
}

/// A record as `consume --format json` prints it:
/// `{"topic","partition","offset","timestamp","key","value","headers"}`.
pub struct RecordJson<'a>(pub &'a ConsumerRecord);

impl Serialize for RecordJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut map = serializer.serialize_map(Some(7))?;
        map.serialize_entry("topic", &r.topic)?;
        map.serialize_entry("partition", &r.partition)?;
        map.serialize_entry("offset", &r.offset)?;
        map.serialize_entry("timestamp", &r.timestamp)?;
        bytes_entry(&mut map, "key", r.key.as_ref())?;
        bytes_entry(&mut map, "value", r.value.as_ref())?;
        let headers: Vec<HeaderJson<'_>> = r.headers.iter().map(HeaderJson).collect();
        map.serialize_entry("headers", &headers)?;
        map.end()
    }
}

/// One JSON line for a record (without the newline).
pub fn record_json_line(record: &ConsumerRecord) -> String {
    serde_json::to_string(&RecordJson(record)).expect("a record always serialises")
}

/// The text form of a record: the value, or `key<TAB>value`; null prints as nothing. Bytes are written as they
/// are, without the newline.
pub fn record_text(record: &ConsumerRecord, print_key: bool, out: &mut Vec<u8>) {
    if print_key {
        out.extend_from_slice(record.key.as_deref().unwrap_or_default());
        out.push(b'\t');
    }
    out.extend_from_slice(record.value.as_deref().unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_client::admin::OffsetRange;

    fn record(key: Option<&[u8]>, value: Option<&[u8]>, headers: Vec<Header>) -> ConsumerRecord {
        ConsumerRecord {
            topic: "orders".into(),
            partition: 2,
            offset: 41,
            timestamp: 1_700_000_000_123,
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers,
        }
    }

    #[test]
    fn record_json_has_the_documented_shape_and_order() {
        let r = record(
            Some(b"k1"),
            Some("v\u{e9}\n\"q\"".as_bytes()),
            vec![
                Header { key: "a".into(), value: Some(Bytes::from_static(b"1")) },
                Header { key: "a".into(), value: None },
            ],
        );
        assert_eq!(
            record_json_line(&r),
            r#"{"topic":"orders","partition":2,"offset":41,"timestamp":1700000000123,"key":"k1","value":"vé\n\"q\"","headers":[{"key":"a","value":"1"},{"key":"a","value":null}]}"#
        );
    }

    #[test]
    fn invalid_utf8_falls_back_to_base64_and_null_stays_null() {
        let r = record(
            None,
            Some(&[0xff, 0x00, 0x80]),
            vec![Header { key: "bin".into(), value: Some(Bytes::from_static(&[0xc3])) }],
        );
        let v: serde_json::Value = serde_json::from_str(&record_json_line(&r)).unwrap();
        assert_eq!(v["key"], serde_json::Value::Null);
        assert!(v.get("value").is_none());
        assert_eq!(v["value_base64"], "/wCA");
        assert_eq!(v["headers"][0]["key"], "bin");
        assert_eq!(v["headers"][0]["value_base64"], "ww==");
        let r = record(Some(&[0xfe]), None, vec![]);
        let v: serde_json::Value = serde_json::from_str(&record_json_line(&r)).unwrap();
        assert_eq!(v["key_base64"], "/g==");
        assert_eq!(v["value"], serde_json::Value::Null);
        assert_eq!(v["headers"], serde_json::json!([]));
    }

    #[test]
    fn text_form_prints_raw_bytes() {
        let mut out = Vec::new();
        record_text(&record(Some(b"k"), Some(&[0xff, b'x']), vec![]), true, &mut out);
        assert_eq!(out, b"k\t\xffx");
        out.clear();
        record_text(&record(None, None, vec![]), false, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn describe_json_has_the_documented_shape() {
        let topic = TopicInfo {
            name: "orders".into(),
            topic_id: "0b5e".into(),
            partitions: 1,
            config: Some(TopicConfig { flush: Some("async".into()), retention_ms: Some(0), ..Default::default() }),
            mirror: Some(MirrorSource {
                source_cluster_id: "cid".into(),
                source_topic_id: "tid".into(),
                source_topic: "orders".into(),
                source_cluster: "dc-a".into(),
            }),
            created_ms: 5,
            replication: "raft3".into(),
            risk_phase: false,
            ..Default::default()
        };
        let partitions = vec![PartitionInfo {
            partition: 0,
            log_start_offset: 3,
            log_end_offset: 10,
            epoch: 1,
            size_bytes: 999,
            segments: 2,
            gaps: vec![OffsetRange { start: 4, end: 6 }],
            ..PartitionInfo::default()
        }];
        let json = serde_json::to_value(TopicJson::new(&topic, Some(&partitions))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "orders", "topic_id": "0b5e", "partitions": 1,
                "config": {"flush": "async", "flush_interval_ms": null, "flush_bytes": null, "retention_bytes": null,
                           "retention_ms": 0, "segment_bytes": null, "segment_ms": null},
                "mirror": {"source_cluster": "dc-a", "source_cluster_id": "cid", "source_topic": "orders",
                           "source_topic_id": "tid"},
                "replication": "raft3",
                "risk_phase": false,
                "partition_info": [{"partition": 0, "log_start_offset": 3, "log_end_offset": 10, "epoch": 1,
                                    "size_bytes": 999, "segments": 2, "gaps": [{"start": 4, "end": 6}]}]
            })
        );
        let listed = serde_json::to_value(TopicJson::new(&TopicInfo { mirror: None, ..topic }, None)).unwrap();
        assert_eq!(listed["mirror"], serde_json::Value::Null);
        assert!(listed.get("partition_info").is_none());
    }

    #[test]
    fn tables_align_columns() {
        let mut t = Table::new(&["NAME", "PARTITIONS", "ID"]);
        t.row(vec!["orders".into(), "12".into(), "x".into()]);
        t.row(vec!["a".into(), "1".into(), "".into()]);
        assert_eq!(t.render(), "NAME    PARTITIONS  ID\norders  12          x\na       1\n");
    }
}
