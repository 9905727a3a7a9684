//! Reading records through the broker's Fetch RPC (at the partition's leader) and showing them as JSON: keys,
//! values and headers as text, JSON or hex.
//!
//! Invariants: a fetch asks for at most [`CHUNK_BYTES`]; a batch that starts before the asked offset contributes
//! only its records at or after it; a corrupt batch is an error naming topic, partition and offset, never a panic.

use bytes::Bytes;
use ferry_client::BrokerClient;
use ferry_client::batch::{BatchHeader, MAX_DECOMPRESSED_BYTES, decode_records_shared, split_verified};
use ferry_client::proto as pb;
use serde_json::{Value, json};

use crate::core::lineage::Coord;
use crate::core::scan::View;
use crate::error::{ApiError, ApiResult};

/// The most bytes one fetch asks for.
pub const CHUNK_BYTES: u64 = 1024 * 1024;

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Timestamp, ms.
    pub timestamp: i64,
    /// Key.
    pub key: Option<Bytes>,
    /// Value.
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Bytes>)>,
}

impl Rec {
    /// The header pairs as borrowed slices (for the pure cores).
    pub fn header_view(&self) -> Vec<(&str, Option<&[u8]>)> {
        self.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_ref()).map(|v| lossy(v))
    }
}

/// What one fetch returned.
#[derive(Debug, Clone, Default)]
pub struct Chunk {
    /// Records at or after the asked offset.
    pub records: Vec<Rec>,
    /// Bytes of batches received.
    pub bytes: u64,
    /// Where to fetch next.
    pub next_offset: u64,
    /// The partition's log start.
    pub log_start: u64,
    /// The partition's log end (readable end).
    pub log_end: u64,
}

/// One partition's answer to a Fetch from `offset` with no wait, its errors mapped.
async fn fetch_data(
    client: &BrokerClient,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u64,
) -> ApiResult<pb::PartitionData> {
    let req = pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: topic.to_owned(),
            partition,
            offset,
            max_bytes,
            leader_epoch: None,
        }],
        max_wait_ms: 0,
        max_bytes,
    };
    let resp = client.for_partition(topic, partition).fetch(req).await?;
    let Some(data) = resp.partitions.into_iter().next() else {
        return Err(ApiError::Upstream(format!("fetch of {topic}/{partition}: the broker answered no partition")));
    };
    if data.error == pb::ErrorCode::UnknownTopicOrPartition as i32 {
        return Err(ApiError::NotFound(format!("no partition {partition} of topic {topic:?}")));
    }
    if data.error == pb::ErrorCode::OffsetOutOfRange as i32 {
        return Err(ApiError::BadRequest(format!(
            "offset {offset} of {topic}/{partition} is outside [{}, {}]",
            data.log_start_offset, data.log_end_offset
        )));
    }
    if data.error != 0 {
        return Err(ApiError::Upstream(format!("fetch of {topic}/{partition} at {offset}: {}", data.message)));
    }
    Ok(data)
}

/// Fetches from `offset` with no wait.
pub async fn fetch(
    client: &BrokerClient,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u64,
) -> ApiResult<Chunk> {
    let data = fetch_data(client, topic, partition, offset, max_bytes).await?;
    let mut chunk = Chunk {
        records: Vec::new(),
        bytes: data.batches.len() as u64,
        next_offset: data.next_offset.max(offset),
        log_start: data.log_start_offset,
        log_end: data.log_end_offset,
    };
    let corrupt = |e: &dyn std::fmt::Display| ApiError::Upstream(format!("{topic}/{partition} at {offset}: {e}"));
    for (_, batch) in split_verified(&data.batches).map_err(|e| corrupt(&e))? {
        for r in decode_records_shared(&batch, MAX_DECOMPRESSED_BYTES).map_err(|e| corrupt(&e))? {
            if r.offset >= offset {
                chunk.records.push(Rec {
                    partition,
                    offset: r.offset,
                    timestamp: r.timestamp,
                    key: r.key,
                    value: r.value,
                    headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
                });
            }
        }
    }
    Ok(chunk)
}

/// Up to `limit` records from `from`, stopping at the log end; with the log's bounds.
pub async fn read_range(
    client: &BrokerClient,
    topic: &str,
    partition: u32,
    from: u64,
    limit: usize,
) -> ApiResult<(Vec<Rec>, u64, u64)> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let chunk = fetch(client, topic, partition, next, CHUNK_BYTES).await?;
        let advanced = chunk.next_offset > next;
        next = chunk.next_offset;
        out.extend(chunk.records.into_iter().take(limit - out.len().min(limit)));
        if out.len() >= limit || !advanced || next >= chunk.log_end {
            return Ok((out, chunk.log_start, chunk.log_end));
        }
    }
}

/// The record at `c`, if the log holds it.
pub async fn read_one(client: &BrokerClient, c: &Coord) -> ApiResult<Option<Rec>> {
    let chunk = fetch(client, &c.topic, c.partition, c.offset, 64 * 1024).await?;
    Ok(chunk.records.into_iter().find(|r| r.offset == c.offset))
}

/// The header of the stored batch that holds the record at `c` (its partition epoch, producer id and epoch), if
/// the log holds it.
pub async fn batch_header(client: &BrokerClient, c: &Coord) -> ApiResult<Option<BatchHeader>> {
    let data = fetch_data(client, &c.topic, c.partition, c.offset, 64 * 1024).await?;
    let corrupt = |e: &dyn std::fmt::Display| ApiError::Upstream(format!("{c}: {e}"));
    let batches = split_verified(&data.batches).map_err(|e| corrupt(&e))?;
    Ok(batches
        .into_iter()
        .map(|(h, _)| h)
        .find(|h| h.base_offset <= c.offset && c.offset <= h.base_offset + u64::from(h.last_offset_delta)))
}

/// A borrowed view for the scan core.
pub fn view<'a>(r: &'a Rec, headers: &'a [(&'a str, Option<&'a [u8]>)]) -> View<'a> {
    View { offset: r.offset, timestamp: r.timestamp, key: r.key.as_deref(), value: r.value.as_deref(), headers }
}

/// How bytes are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// UTF-8 (lossy).
    #[default]
    Text,
    /// Parsed JSON when it is JSON, text otherwise.
    Json,
    /// Lowercase hex.
    Hex,
}

/// Lossy UTF-8.
pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(b: &Option<Bytes>, format: Format) -> Value {
    let Some(b) = b else { return Value::Null };
    match format {
        Format::Text => Value::String(lossy(b)),
        Format::Hex => Value::String(b.iter().map(|x| format!("{x:02x}")).collect()),
        Format::Json => serde_json::from_slice(b).unwrap_or_else(|_| Value::String(lossy(b))),
    }
}

/// The JSON shape of a record in every answer.
pub fn render(r: &Rec, format: Format) -> Value {
    json!({
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": show(&r.key, format),
        "value": show(&r.value, format),
        "value_bytes": r.value.as_ref().map_or(0, Bytes::len),
        "headers": r.headers.iter().map(|(k, v)| json!({"key": k, "value": show(v, format)})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let r = Rec {
            partition: 1,
            offset: 2,
            timestamp: 3,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(br#"{"a":1}"#)),
            headers: vec![("h".into(), None)],
        };
        assert_eq!(render(&r, Format::Text)["value"], json!(r#"{"a":1}"#));
        assert_eq!(render(&r, Format::Json)["value"], json!({"a": 1}));
        assert_eq!(render(&r, Format::Json)["key"], json!("k"));
        assert_eq!(render(&r, Format::Hex)["key"], json!("6b"));
        assert_eq!(render(&r, Format::Text)["headers"], json!([{"key": "h", "value": null}]));
    }
}
