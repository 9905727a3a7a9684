//! A message's trace: the record; per message-model group its status and every transition; its lineage both
//! ways (original -> dead letter -> edited -> redriven), read from the lineage headers of the records themselves
//! ([`crate::core::lineage`]); the stored batch's epoch, producer and leader, and the transaction that appended it
//! with its outcome ([`crate::core::provenance`]); and, for a mirror topic, its source.
//!
//! Invariants: the lineage search reads at most `budget_bytes` (default the config's scan budget) over the topics
//! the chain touches, at most [`MAX_TOPICS`] of them, and reports `truncated` when it ran out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use axum::Json;
use axum::extract::{Path, Query, State};
use ferry_client::OffsetSpec;
use ferry_client::proto as pb;
use serde::Deserialize;
use serde_json::{Value, json};

use super::read::group_names;
use super::{cluster, dlq_topic};
use crate::AppState;
use crate::Cluster;
use crate::core::lineage::{Coord, Kind, origin};
use crate::core::provenance::{leader_at_write, transaction_of};
use crate::error::{ApiError, ApiResult};
use crate::records::{CHUNK_BYTES, Format, Rec, batch_header, fetch, read_one, render};

/// The most topics a lineage search reads.
pub const MAX_TOPICS: usize = 8;
/// The most steps followed back from a record.
pub const MAX_DEPTH: usize = 8;

/// The trace's options.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TraceQuery {
    /// Comma-separated groups to report besides those found (message-model groups with a dead-letter topic).
    pub groups: Option<String>,
    /// text, json or hex.
    #[serde(default)]
    pub format: Format,
    /// Bytes the lineage search may read.
    pub budget_bytes: Option<u64>,
}

/// `GET .../partitions/{partition}/records/{offset}`: the record and its trace.
pub async fn trace(
    State(s): State<AppState>,
    Path((name, topic, partition, offset)): Path<(String, String, u32, u64)>,
    Query(q): Query<TraceQuery>,
) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    let budget = q.budget_bytes.unwrap_or(s.config.scan_budget_bytes).min(crate::config::MAX_SCAN_BUDGET);
    Ok(Json(trace_json(&c, &Coord { topic, partition, offset }, &q, budget).await?))
}

/// The trace as JSON (shared by the page).
pub async fn trace_json(c: &Cluster, at: &Coord, q: &TraceQuery, budget: u64) -> ApiResult<Value> {
    let rec = read_one(&c.client, at).await?.ok_or_else(|| ApiError::NotFound(format!("no record at {at}")))?;
    let extra: Vec<String> =
        q.groups.as_deref().unwrap_or("").split(',').filter(|g| !g.is_empty()).map(str::to_owned).collect();
    let (_, names) = group_names(c, &extra).await?;
    let mut groups = Vec::new();
    for g in &names {
        let Ok(d) = c.share.describe(g).await else { continue };
        if !extra.contains(g) && !d.partitions.iter().any(|p| p.topic == at.topic) {
            continue;
        }
        let Ok(st) = c.share.status(g, &at.topic, at.partition, at.offset).await else { continue };
        groups.push(json!({
            "group": g, "status": st.status, "delivery_count": st.delivery_count, "held_by": st.member_id,
            "history": st.history.iter().map(|t| json!({"at_ms": t.at_ms, "member_id": t.member_id, "event": t.event,
                "delivery_count": t.delivery_count, "error": t.error, "detail": t.detail})).collect::<Vec<_>>(),
        }));
    }
    let described = c.admin.describe_topic(&at.topic).await?;
    let (produced, transaction) = provenance(c, at, &rec, &described).await?;
    let info = described.topic;
    let mirror = info.mirror.as_ref().map(|m| {
        json!({"source_cluster": m.source_cluster, "source_cluster_id": m.source_cluster_id, "source_topic": m.source_topic,
               "source_partition": at.partition, "source_offset": at.offset})
    });
    let lineage = lineage(c, &rec, at, &names, budget).await?;
    Ok(json!({
        "topic": at.topic, "record": render(&rec, q.format),
        "produced": produced, "transaction": transaction,
        "origin": origin(&rec.header_view()).map(|(kind, from)| json!({"kind": kind, "from": from})),
        "groups": groups, "mirror": mirror, "lineage": lineage,
    }))
}

/// Every transaction the cluster's members list (resolved ones still remembered too): each member lists those of
/// the internal partitions it owns.
async fn all_transactions(c: &Cluster, meta: &pb::MetadataResponse) -> ApiResult<Vec<pb::TxnInfo>> {
    let req = pb::TxnListRequest { all: true };
    if meta.brokers.is_empty() {
        return Ok(c.client.txn_list(req).await?.transactions);
    }
    let mut out = Vec::new();
    for b in &meta.brokers {
        let client = c.client.for_broker(b.broker_id).unwrap_or_else(|| c.client.clone());
        out.extend(client.txn_list(req).await?.transactions);
    }
    Ok(out)
}

/// The trace's `produced` (the stored batch's partition epoch, producer id and epoch, and its leader when that is
/// knowable) and `transaction` (the committed transaction that appended it, or null).
async fn provenance(
    c: &Cluster,
    at: &Coord,
    rec: &Rec,
    described: &ferry_client::TopicDescription,
) -> ApiResult<(Value, Value)> {
    let header = batch_header(&c.client, at).await?.ok_or_else(|| ApiError::NotFound(format!("no record at {at}")))?;
    let meta = c.client.metadata_for(vec![at.topic.clone()]).await?;
    let placement = meta.partitions.iter().find(|p| p.topic == at.topic && p.partition == at.partition);
    let single = meta.brokers.is_empty() && placement.is_none_or(|p| p.leader_id == 0);
    let (leader, basis) = leader_at_write(single, &meta.broker_address);
    let now = described.partitions.iter().find(|p| p.partition == at.partition);
    let produced = json!({
        "timestamp": rec.timestamp, "partition_epoch": header.epoch, "batch_base_offset": header.base_offset,
        "producer_id": header.producer_id, "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence, "leader": leader, "leader_basis": basis,
        "leader_now": c.client.for_partition(&at.topic, at.partition).address(),
        "leader_epoch_now": placement.map(|p| p.leader_epoch), "partition_epoch_now": now.map(|p| p.epoch),
    });
    if header.producer_id < 0 {
        return Ok((produced, Value::Null));
    }
    let transaction = match all_transactions(c, &meta).await {
        Ok(txns) => transaction_of(header.producer_id, &at.topic, at.partition, at.offset, &txns).map(|t| {
            json!({"group": t.group, "txn_id": t.txn_id, "state": t.state, "decided_by": t.decided_by,
                   "producer_id": t.producer_id, "offsets": t.offsets.iter().map(|o| json!({"topic": o.topic,
                   "partition": o.partition, "base_offset": o.base_offset, "last_offset": o.last_offset})).collect::<Vec<_>>()})
        }),
        // The caller may not list transactions (a forwarded token without the admin scope): say so, not null.
        Err(e) => Some(json!({"producer_id": header.producer_id, "lookup_error": e.to_string()})),
    };
    Ok((produced, transaction.unwrap_or(Value::Null)))
}

struct Node {
    rec: Rec,
    topic: String,
    parent: Option<(Kind, Coord)>,
}

/// Reads the lineage-bearing records of `topic` within `budget`.
async fn lineage_records(
    c: &Cluster,
    topic: &str,
    budget: &mut u64,
    out: &mut BTreeMap<Coord, Node>,
) -> ApiResult<bool> {
    let Ok(d) = c.admin.describe_topic(topic).await else { return Ok(true) };
    for p in 0..d.topic.partitions {
        let b = c.admin.list_offset(topic, p, OffsetSpec::Latest).await?;
        let mut next = b.log_start_offset;
        while next < b.log_end_offset {
            if *budget == 0 {
                return Ok(false);
            }
            let chunk = fetch(&c.client, topic, p, next, CHUNK_BYTES.min(*budget)).await?;
            *budget = budget.saturating_sub(chunk.bytes);
            if chunk.next_offset <= next {
                break;
            }
            next = chunk.next_offset;
            for r in chunk.records {
                if let Some(parent) = origin(&r.header_view()) {
                    let coord = Coord { topic: topic.to_owned(), partition: p, offset: r.offset };
                    out.insert(coord, Node { rec: r, topic: topic.to_owned(), parent: Some(parent) });
                }
            }
        }
    }
    Ok(true)
}

fn step_json(n: &Node, relation: &str, depth: i64) -> Value {
    json!({
        "relation": relation, "depth": depth, "kind": n.parent.as_ref().map(|(k, _)| *k),
        "topic": n.topic, "partition": n.rec.partition, "offset": n.rec.offset, "timestamp": n.rec.timestamp,
        "from": n.parent.as_ref().map(|(_, c)| c.to_string()),
        "group": n.rec.header("ferry-dlq-group"), "error": n.rec.header("ferry-dlq-error"),
        "attempts": n.rec.header("ferry-dlq-attempts"), "edited_by": n.rec.header(crate::core::lineage::EDITED_BY),
    })
}

async fn lineage(c: &Cluster, rec: &Rec, at: &Coord, groups: &BTreeSet<String>, mut budget: u64) -> ApiResult<Value> {
    // Back: follow the headers, one record at a time.
    let mut back = Vec::new();
    let mut cur = origin(&rec.header_view());
    let mut topics: BTreeSet<String> = BTreeSet::from([at.topic.clone()]);
    while let Some((kind, parent)) = cur.take() {
        if back.len() >= MAX_DEPTH {
            break;
        }
        let Some(r) = read_one(&c.client, &parent).await.ok().flatten() else {
            back.push(
                json!({"relation": "origin", "kind": Value::Null, "topic": parent.topic, "partition": parent.partition,
                "offset": parent.offset, "missing": true}),
            );
            break;
        };
        topics.insert(parent.topic.clone());
        cur = origin(&r.header_view());
        back.push(step_json(
            &Node { rec: r, topic: parent.topic.clone(), parent: cur.clone() },
            "origin",
            -(back.len() as i64) - 1,
        ));
        let _ = kind;
    }
    back.reverse();
    // Forward: the records naming this one (or a descendant) as their origin, in the topics the chain touches.
    for g in groups {
        topics.insert(dlq_topic(g));
    }
    let mut found = BTreeMap::new();
    let mut read: BTreeSet<String> = BTreeSet::new();
    let mut complete = true;
    while let Some(t) = topics.iter().find(|t| !read.contains(*t)).cloned() {
        if read.len() >= MAX_TOPICS {
            complete = false;
            break;
        }
        read.insert(t.clone());
        complete &= lineage_records(c, &t, &mut budget, &mut found).await?;
        for n in found.values() {
            if let Some(dlq_origin) = n.rec.header("ferry-dlq-topic") {
                topics.insert(dlq_origin);
            }
        }
    }
    let mut children: BTreeMap<Coord, Vec<Coord>> = BTreeMap::new();
    for (coord, n) in &found {
        if let Some((_, p)) = &n.parent {
            children.entry(p.clone()).or_default().push(coord.clone());
        }
    }
    let mut forward = Vec::new();
    let mut queue = VecDeque::from([(at.clone(), 0i64)]);
    let mut seen = BTreeSet::from([at.clone()]);
    while let Some((coord, depth)) = queue.pop_front() {
        for child in children.get(&coord).into_iter().flatten() {
            if seen.insert(child.clone()) && depth < MAX_DEPTH as i64 {
                forward.push(step_json(&found[child], "derived", depth + 1));
                queue.push_back((child.clone(), depth + 1));
            }
        }
    }
    Ok(json!({"origins": back, "derived": forward, "truncated": !complete, "topics_read": read}))
}
