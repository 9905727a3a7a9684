//! Browsing: a page of records by offset, by time or newest first; and the filter scan, which streams what it
//! finds as JSON lines (`application/x-ndjson`) with its progress, so no answer waits for a whole partition.
//!
//! Invariants: a page holds at most [`MAX_PAGE_RECORDS`] records; a scan fetches at most its byte budget (plus
//! the last chunk, at most [`CHUNK_BYTES`]) and ends with one `done` line saying why (`budget`, `limit`, `end`).

use std::convert::Infallible;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ferry_client::{BrokerClient, OffsetSpec};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::cluster;
use crate::config::{MAX_PAGE_RECORDS, MAX_SCAN_BUDGET};
use crate::core::scan::{Filter, Matcher, Scan, Stop};
use crate::error::{ApiError, ApiResult};
use crate::records::{CHUNK_BYTES, Format, fetch, read_range, render, view};
use crate::{AppState, Cluster};

/// Where a page starts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// From this offset.
    pub offset: Option<u64>,
    /// From the first record at or after this time (ms since the epoch).
    pub timestamp: Option<i64>,
    /// The last `limit` records, newest first.
    #[serde(default)]
    pub newest: bool,
    /// Records per page (default 50, at most 500).
    #[serde(default = "default_page")]
    pub limit: usize,
    /// text, json or hex.
    #[serde(default)]
    pub format: Format,
}

const fn default_page() -> usize {
    50
}

/// A page of records as JSON (shared by the page view).
pub async fn page(c: &Cluster, topic: &str, partition: u32, q: &PageQuery) -> ApiResult<Value> {
    if q.limit == 0 || q.limit > MAX_PAGE_RECORDS {
        return Err(ApiError::BadRequest(format!("limit: {} is outside 1..={MAX_PAGE_RECORDS}", q.limit)));
    }
    let given = [q.offset.is_some(), q.timestamp.is_some(), q.newest].iter().filter(|b| **b).count();
    if given > 1 {
        return Err(ApiError::BadRequest("give one of offset, timestamp and newest".into()));
    }
    let bounds = c.admin.list_offset(topic, partition, OffsetSpec::Latest).await?;
    let (start, end) = (bounds.log_start_offset, bounds.log_end_offset);
    let from = if let Some(ts) = q.timestamp {
        c.admin.list_offset(topic, partition, OffsetSpec::Timestamp(ts)).await?.offset.unwrap_or(end)
    } else if q.newest {
        end.saturating_sub(q.limit as u64).max(start)
    } else {
        q.offset.unwrap_or(start).max(start)
    };
    let mut records =
        if from >= end { Vec::new() } else { read_range(&c.client, topic, partition, from, q.limit).await?.0 };
    if q.newest {
        records.reverse();
    }
    let next = records.iter().map(|r| r.offset + 1).max().unwrap_or(from);
    Ok(json!({
        "topic": topic, "partition": partition, "log_start_offset": start, "log_end_offset": end, "from": from,
        "newest_first": q.newest, "next_offset": next, "prev_offset": from.saturating_sub(q.limit as u64).max(start),
        "records": records.iter().map(|r| render(r, q.format)).collect::<Vec<_>>(),
    }))
}

/// `GET .../partitions/{partition}/records`.
pub async fn records(
    State(s): State<AppState>,
    Path((name, topic, partition)): Path<(String, String, u32)>,
    Query(q): Query<PageQuery>,
) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    Ok(Json(page(&c, &topic, partition, &q).await?))
}

/// A scan's parameters.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ScanQuery {
    /// One partition (all when unset).
    pub partition: Option<u32>,
    /// Start offset (with one partition; the log start otherwise).
    pub from_offset: Option<u64>,
    /// Records at or after this time, ms (the start found by ListOffsets by time).
    pub from_time: Option<i64>,
    /// Records before this time, ms.
    pub until_time: Option<i64>,
    /// Key contains this (equals it with `key_exact`).
    pub key: Option<String>,
    /// The key must equal `key` (a search by key).
    #[serde(default)]
    pub key_exact: bool,
    /// Value contains this.
    pub value: Option<String>,
    /// A header `name` or `name=value-part`.
    pub header: Option<String>,
    /// key, value and the header value are regexes.
    #[serde(default)]
    pub regex: bool,
    /// Bytes to fetch at most (default from the config; at most 4 GiB).
    pub budget_bytes: Option<u64>,
    /// Matches to stop at (default 100, at most 500).
    #[serde(default = "default_matches")]
    pub limit: usize,
    /// text, json or hex.
    #[serde(default)]
    pub format: Format,
}

const fn default_matches() -> usize {
    100
}

fn matcher(field: &str, text: &str, regex: bool) -> ApiResult<Matcher> {
    if regex {
        let r = regex::bytes::RegexBuilder::new(text)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| ApiError::BadRequest(format!("{field}: not a valid regex: {e}")))?;
        Ok(Matcher::Regex(r))
    } else {
        Ok(Matcher::Substring(text.as_bytes().to_vec()))
    }
}

/// The filter a query asks for.
pub fn filter(q: &ScanQuery) -> ApiResult<Filter> {
    let key = match &q.key {
        Some(k) if q.key_exact => Some(Matcher::Exact(k.as_bytes().to_vec())),
        Some(k) => Some(matcher("key", k, q.regex)?),
        None => None,
    };
    let header = match &q.header {
        Some(h) => Some(match h.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(matcher("header", v, q.regex)?)),
            None => (h.clone(), None),
        }),
        None => None,
    };
    let value = q.value.as_deref().map(|v| matcher("value", v, q.regex)).transpose()?;
    Ok(Filter { key, value, header, from_ms: q.from_time, until_ms: q.until_time })
}

struct Range {
    partition: u32,
    from: u64,
    end: u64,
}

async fn ranges(c: &Cluster, topic: &str, q: &ScanQuery) -> ApiResult<Vec<Range>> {
    let partitions: Vec<u32> = match q.partition {
        Some(p) => vec![p],
        None => (0..c.admin.describe_topic(topic).await?.topic.partitions).collect(),
    };
    let mut out = Vec::new();
    for p in partitions {
        let b = c.admin.list_offset(topic, p, OffsetSpec::Latest).await?;
        let mut from = b.log_start_offset;
        let mut end = b.log_end_offset;
        if let Some(t) = q.from_time {
            from = c.admin.list_offset(topic, p, OffsetSpec::Timestamp(t)).await?.offset.unwrap_or(end);
        }
        if let (Some(o), Some(_)) = (q.from_offset, q.partition) {
            from = from.max(o);
        }
        if let Some(t) = q.until_time {
            end = c.admin.list_offset(topic, p, OffsetSpec::Timestamp(t)).await?.offset.unwrap_or(end);
        }
        out.push(Range { partition: p, from, end: end.max(from) });
    }
    Ok(out)
}

/// `GET .../topics/{topic}/scan`: a streamed filter scan (JSON lines).
pub async fn scan(
    State(s): State<AppState>,
    Path((name, topic)): Path<(String, String)>,
    Query(q): Query<ScanQuery>,
) -> ApiResult<Response> {
    let c = cluster(&s, &name)?;
    let budget = q.budget_bytes.unwrap_or(s.config.scan_budget_bytes);
    if budget == 0 || budget > MAX_SCAN_BUDGET {
        return Err(ApiError::BadRequest(format!("budget_bytes: {budget} is outside 1..={MAX_SCAN_BUDGET}")));
    }
    if q.limit == 0 || q.limit > MAX_PAGE_RECORDS {
        return Err(ApiError::BadRequest(format!("limit: {} is outside 1..={MAX_PAGE_RECORDS}", q.limit)));
    }
    if q.key_exact && q.key.is_none() {
        return Err(ApiError::BadRequest("key_exact needs key".into()));
    }
    let f = filter(&q)?;
    let ranges = ranges(&c, &topic, &q).await?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    let client = c.client.clone();
    tokio::spawn(run_scan(client, topic, ranges, f, budget, q.limit, q.format, tx));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-store")], body).into_response())
}

async fn send(tx: &mpsc::Sender<Result<Bytes, Infallible>>, v: Value) -> bool {
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    tx.send(Ok(Bytes::from(line))).await.is_ok()
}

#[allow(clippy::too_many_arguments)]
async fn run_scan(
    client: BrokerClient,
    topic: String,
    ranges: Vec<Range>,
    filter: Filter,
    budget: u64,
    limit: usize,
    format: Format,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let plan: Vec<Value> =
        ranges.iter().map(|r| json!({"partition": r.partition, "from": r.from, "end": r.end})).collect();
    if !send(&tx, json!({"type": "start", "topic": topic, "budget_bytes": budget, "partitions": plan})).await {
        return;
    }
    let (mut spent, mut matched, mut records) = (0u64, 0usize, 0u64);
    let mut stop = Stop::End;
    let mut resume = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        let left = budget.saturating_sub(spent);
        if left == 0 && r.from < r.end {
            stop = Stop::Budget;
            resume.extend(ranges[i..].iter().map(|r| json!({"partition": r.partition, "next_offset": r.from})));
            break;
        }
        let mut scan = Scan::new(filter.clone(), r.from, r.end, left, limit - matched);
        let mut state = scan.start();
        let wants_headers = filter.header.is_some();
        // The next chunk is fetched while this one is filtered: one fetch in flight ahead of the scan.
        let want = |left: u64, scanned: u64| CHUNK_BYTES.min(left.saturating_sub(scanned)).max(1);
        let mut ahead = state.is_none().then(|| {
            let (client, topic, p, at, n) = (client.clone(), topic.clone(), r.partition, scan.next, want(left, 0));
            tokio::spawn(async move { fetch(&client, &topic, p, at, n).await })
        });
        while state.is_none() {
            let Some(task) = ahead.take() else { break };
            let chunk = match task.await.map_err(|e| ApiError::Upstream(e.to_string())).and_then(|c| c) {
                Ok(c) => c,
                Err(e) => {
                    send(&tx, json!({"type": "error", "partition": r.partition, "offset": scan.next, "reason": e.to_string()})).await;
                    return;
                }
            };
            let next = if chunk.next_offset > scan.next { chunk.next_offset } else { r.end };
            let fetched = scan.scanned_bytes + chunk.bytes;
            if next < r.end && fetched < left {
                let (client, topic, p, n) = (client.clone(), topic.clone(), r.partition, want(left, fetched));
                ahead = Some(tokio::spawn(async move { fetch(&client, &topic, p, next, n).await }));
            }
            let views: Vec<Vec<_>> =
                chunk.records.iter().map(|r| if wants_headers { r.header_view() } else { Vec::new() }).collect();
            let vs: Vec<_> = chunk.records.iter().zip(&views).map(|(r, h)| view(r, h)).collect();
            let step = scan.step(chunk.bytes, &vs, next);
            for rec in chunk.records.iter().filter(|x| step.matches.contains(&x.offset)) {
                if !send(&tx, json!({"type": "record", "record": render(rec, format)})).await {
                    return;
                }
            }
            let progress = json!({"type": "progress", "partition": r.partition, "next_offset": scan.next,
                "end_offset": r.end, "scanned_bytes": spent + scan.scanned_bytes,
                "scanned_records": records + scan.scanned_records, "matched": matched + scan.matched});
            if !send(&tx, progress).await {
                return;
            }
            state = step.stop;
        }
        if let Some(task) = ahead.take() {
            task.abort();
        }
        spent += scan.scanned_bytes;
        matched += scan.matched;
        records += scan.scanned_records;
        if scan.next < r.end {
            resume.push(json!({"partition": r.partition, "next_offset": scan.next}));
        }
        match state {
            Some(Stop::End) | None => {}
            Some(s) => {
                stop = s;
                resume.extend(ranges[i + 1..].iter().map(|r| json!({"partition": r.partition, "next_offset": r.from})));
                break;
            }
        }
    }
    send(
        &tx,
        json!({"type": "done", "stop": stop, "scanned_bytes": spent, "scanned_records": records,
        "matched": matched, "resume": resume}),
    )
    .await;
}
