//! Reads: the caller's session, clusters, overview, topics, groups and transactions.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use ferry_client::proto as pb;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{cluster, dlq_topic};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::{AppState, Cluster};

/// The most topics one page lists.
pub const MAX_TOPICS_PAGE: usize = 1000;
/// The most groups whose backlog the overview and the groups list describe.
pub const MAX_GROUPS_DESCRIBED: usize = 100;

/// `GET /api/v1/session`: who the caller is and its CSRF token.
pub async fn session(Extension(p): Extension<Principal>) -> Json<Principal> {
    Json(p)
}

/// `GET /api/v1/clusters`.
pub async fn clusters(State(s): State<AppState>) -> Json<Value> {
    Json(
        json!({"clusters": s.clusters.iter().map(|c| json!({"name": c.name, "brokers": c.brokers})).collect::<Vec<_>>()}),
    )
}

fn mirror_json(m: &Option<pb::MirrorSource>) -> Value {
    m.as_ref().map_or(Value::Null, |m| {
        json!({"source_cluster": m.source_cluster, "source_cluster_id": m.source_cluster_id,
               "source_topic": m.source_topic, "source_topic_id": m.source_topic_id})
    })
}

fn topic_json(t: &pb::TopicInfo) -> Value {
    let c = t.config.clone().unwrap_or_default();
    json!({
        "name": t.name, "topic_id": t.topic_id, "partitions": t.partitions, "replication": t.replication,
        "created_ms": t.created_ms, "mirror": mirror_json(&t.mirror),
        "fence": t.fence.as_ref().map(|f| json!({"epoch": f.epoch, "reason": f.reason, "at_ms": f.at_ms})),
        "config": {"flush": c.flush, "flush_interval_ms": c.flush_interval_ms, "flush_bytes": c.flush_bytes,
                   "retention_bytes": c.retention_bytes, "retention_ms": c.retention_ms,
                   "segment_bytes": c.segment_bytes, "segment_ms": c.segment_ms},
    })
}

/// Paging of lists.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// First item.
    #[serde(default)]
    pub offset: usize,
    /// Items (at most [`MAX_TOPICS_PAGE`]).
    #[serde(default = "default_limit")]
    pub limit: usize,
    /// Only names containing this.
    #[serde(default)]
    pub q: Option<String>,
}

const fn default_limit() -> usize {
    100
}

/// The topics of a cluster, a page at a time, internal ones hidden.
pub async fn topic_list(c: &Cluster, page: &Page) -> ApiResult<(usize, Vec<pb::TopicInfo>)> {
    if page.limit == 0 || page.limit > MAX_TOPICS_PAGE {
        return Err(ApiError::BadRequest(format!("limit: {} is outside 1..={MAX_TOPICS_PAGE}", page.limit)));
    }
    let mut all = c.admin.list_topics().await?;
    all.retain(|t| !t.name.starts_with("__") && page.q.as_ref().is_none_or(|q| t.name.contains(q.as_str())));
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let total = all.len();
    Ok((total, all.into_iter().skip(page.offset).take(page.limit).collect()))
}

/// `GET .../topics?offset=&limit=&q=`.
pub async fn topics(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(page): Query<Page>,
) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    let (total, list) = topic_list(&c, &page).await?;
    Ok(Json(json!({"total": total, "offset": page.offset, "topics": list.iter().map(topic_json).collect::<Vec<_>>()})))
}

/// The most partitions one topic answer or page lists.
pub const MAX_PARTITIONS_PAGE: usize = 1000;
/// Partitions per topic answer or page by default.
pub const DEFAULT_PARTITIONS_PAGE: usize = 100;

/// Paging of a topic's partition table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionPage {
    /// The first partition listed.
    #[serde(default)]
    pub partitions_offset: usize,
    /// How many (default [`DEFAULT_PARTITIONS_PAGE`], at most [`MAX_PARTITIONS_PAGE`]).
    pub partitions_limit: Option<usize>,
}

impl PartitionPage {
    /// The validated limit.
    pub fn limit(&self) -> ApiResult<usize> {
        let limit = self.partitions_limit.unwrap_or(DEFAULT_PARTITIONS_PAGE);
        if limit == 0 || limit > MAX_PARTITIONS_PAGE {
            return Err(ApiError::BadRequest(format!(
                "partitions_limit: {limit} is outside 1..={MAX_PARTITIONS_PAGE}"
            )));
        }
        Ok(limit)
    }
}

/// A topic's description as JSON (shared by the page): its settings, the totals, and one page of its partitions.
pub async fn describe(c: &Cluster, topic: &str, page: &PartitionPage) -> ApiResult<Value> {
    let limit = page.limit()?;
    let d = c.admin.describe_topic(topic).await?;
    let meta = c.client.metadata_for(vec![topic.to_owned()]).await.ok();
    let placement =
        |p: u32| meta.as_ref().and_then(|m| m.partitions.iter().find(|x| x.topic == topic && x.partition == p));
    let single_leader = meta.as_ref().map(|m| m.broker_address.clone()).unwrap_or_default();
    let delayed = ferry_client::Delayed::new(c.client.clone()).describe(topic).await.unwrap_or_default();
    let partitions: Vec<Value> = d
        .partitions
        .iter()
        .skip(page.partitions_offset)
        .take(limit)
        .map(|p| {
            let pl = placement(p.partition);
            let d = delayed.iter().find(|d| d.partition == p.partition);
            json!({
                "partition": p.partition, "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
                "size_bytes": p.size_bytes, "segments": p.segments, "epoch": p.epoch,
                "leader": pl.filter(|pl| pl.leader_id != 0).map_or(single_leader.clone(), |pl| pl.leader_address.clone()),
                "leader_id": pl.map_or(0, |pl| pl.leader_id),
                "replicas": pl.map_or(Vec::new(), |pl| pl.replicas.clone()),
                "isr": pl.map_or(Vec::new(), |pl| pl.isr.clone()),
                "error": (p.error != 0).then(|| p.message.clone()),
                "delayed_pending": d.map_or(0, |d| d.pending),
                "delayed_earliest_due_ms": d.map_or(0, |d| d.earliest_due_ms),
            })
        })
        .collect();
    Ok(json!({"topic": topic_json(&d.topic), "partitions": partitions,
              "partitions_total": d.partitions.len(), "partitions_offset": page.partitions_offset,
              "partitions_limit": limit,
              "delayed_pending": delayed.iter().map(|d| d.pending).sum::<u64>()}))
}

/// `GET .../topics/{topic}?partitions_offset=&partitions_limit=`.
pub async fn topic(
    State(s): State<AppState>,
    Path((name, topic)): Path<(String, String)>,
    Query(page): Query<PartitionPage>,
) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    Ok(Json(describe(&c, &topic, &page).await?))
}

/// A share group's description as JSON.
pub fn share_json(d: &pb::ShareDescribeResponse) -> Value {
    let mode = match pb::ShareMode::try_from(d.mode) {
        Ok(pb::ShareMode::Broadcast) => "broadcast",
        Ok(pb::ShareMode::Queue) => "queue",
        Ok(pb::ShareMode::Serial) => "serial",
        _ => "unknown",
    };
    json!({
        "group": d.group, "mode": mode, "lock_timeout_ms": d.lock_timeout_ms, "window": d.window,
        "members": d.members.iter().map(|m| json!({"member_id": m.member_id, "client_id": m.client_id,
            "in_flight": m.in_flight, "active": m.active, "joined_ms": m.joined_ms})).collect::<Vec<_>>(),
        "partitions": d.partitions.iter().map(|p| json!({"topic": p.topic, "partition": p.partition,
            "start_offset": p.start_offset, "end_offset": p.end_offset, "waiting": p.waiting, "in_flight": p.in_flight,
            "failed": p.failed, "dead_lettered": p.dead_lettered, "lag": p.lag})).collect::<Vec<_>>(),
        "backlog": d.partitions.iter().map(|p| p.lag).sum::<u64>(),
        "redeliveries": d.redeliveries, "lock_expiries": d.lock_expiries, "dead_lettered": d.dead_lettered,
        "settled": d.settled,
    })
}

/// The names of the groups a cluster knows: partitioned groups, and message-model groups (ShareList, plus those
/// seen through their dead-letter topics), plus `extra`.
pub async fn group_names(c: &Cluster, extra: &[String]) -> ApiResult<(Vec<pb::GroupSummary>, BTreeSet<String>)> {
    let partitioned = c.admin.list_groups().await?;
    let mut share: BTreeSet<String> = extra.iter().cloned().collect();
    share.extend(c.share.list().await?.into_iter().map(|g| g.group));
    for t in c.admin.list_topics().await? {
        if let Some(g) = t.name.strip_suffix(".dlq") {
            share.insert(g.to_owned());
        }
    }
    Ok((partitioned, share))
}

/// Extra group names to look at.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupsQuery {
    /// Comma-separated group names.
    #[serde(default)]
    pub names: Option<String>,
}

/// `GET .../groups?names=`.
pub async fn groups(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<GroupsQuery>,
) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    Ok(Json(groups_json(&c, q.names.as_deref()).await?))
}

/// The groups list (shared by the page and the overview).
pub async fn groups_json(c: &Cluster, names: Option<&str>) -> ApiResult<Value> {
    let extra: Vec<String> = names.unwrap_or("").split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    let (partitioned, share) = group_names(c, &extra).await?;
    let mut shared = Vec::new();
    for g in share.iter().take(MAX_GROUPS_DESCRIBED) {
        if let Ok(d) = c.share.describe(g).await {
            shared.push(share_json(&d));
        }
    }
    shared.sort_by_key(|g| std::cmp::Reverse(g["backlog"].as_u64().unwrap_or(0)));
    Ok(json!({
        "partitioned": partitioned.iter().map(|g| json!({"group": g.group, "members": g.members, "generation": g.generation})).collect::<Vec<_>>(),
        "message_groups": shared,
    }))
}

/// `GET .../groups/{group}`: the message-model description and the partitioned one, whichever exist.
pub async fn group(State(s): State<AppState>, Path((name, group)): Path<(String, String)>) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    let described = c.share.describe(&group).await.ok();
    if let Some(d) = &described {
        s.history.lock().record(&name, &group, crate::core::history::sample_of(d, super::now_ms()));
    }
    let share = described.map(|d| {
        let mut v = share_json(&d);
        let h = s.history.lock();
        v["history"] = json!(h.series(&name, &group));
        v["rates"] = json!(h.rates(&name, &group));
        v
    });
    let part = c.admin.describe_group(&group).await.ok().filter(|d| !d.members.is_empty() || !d.offsets.is_empty());
    let part = part.map(|d| {
        json!({"generation": d.generation,
               "members": d.members.iter().map(|m| json!({"member_id": m.member_id, "client_id": m.client_id,
                   "assignment": m.assignment.iter().map(|a| format!("{}/{}", a.topic, a.partition)).collect::<Vec<_>>()})).collect::<Vec<_>>(),
               "offsets": d.offsets.iter().map(|o| json!({"topic": o.topic, "partition": o.partition, "offset": o.offset})).collect::<Vec<_>>()})
    });
    if share.is_none() && part.is_none() {
        return Err(ApiError::NotFound(format!("no group {group:?} in cluster {name:?}")));
    }
    Ok(Json(json!({"group": group, "message_group": share, "partitioned": part, "dlq_topic": dlq_topic(&group)})))
}

/// `GET .../transactions`: pending and recently resolved.
pub async fn transactions(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    Ok(Json(transactions_json(&c).await?))
}

/// The transactions list (shared by the page).
pub async fn transactions_json(c: &Cluster) -> ApiResult<Value> {
    let list = c.client.txn_list(pb::TxnListRequest { all: true }).await?;
    Ok(json!({"transactions": list.transactions.iter().map(|t| json!({
        "group": t.group, "txn_id": t.txn_id, "state": t.state, "age_ms": t.age_ms, "checks": t.checks,
        "messages": t.messages, "bytes": t.bytes, "waiting_for_producer": t.waiting_for_producer,
        "decided_by": t.decided_by, "producer_id": t.producer_id,
        "offsets": t.offsets.iter().map(|o| json!({"topic": o.topic, "partition": o.partition,
            "base_offset": o.base_offset, "last_offset": o.last_offset})).collect::<Vec<_>>()})).collect::<Vec<_>>()}))
}

/// `GET .../overview`.
pub async fn overview(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    Ok(Json(overview_json(&s, &c).await?))
}

/// The overview (shared by the page).
pub async fn overview_json(s: &AppState, c: &Cluster) -> ApiResult<Value> {
    let meta = c.admin.metadata().await?;
    let status = c.client.cluster_status(pb::ClusterStatusRequest {}).await.ok();
    let at_risk: Vec<Value> = status
        .iter()
        .flat_map(|st| st.partitions.iter())
        .filter(|p| p.under_replicated || p.at_risk)
        .filter_map(|p| {
            p.placement.as_ref().map(|pl| {
                json!({"topic": pl.topic, "partition": pl.partition,
            "under_replicated": p.under_replicated, "at_risk": p.at_risk})
            })
        })
        .collect();
    let topics = c.admin.list_topics().await?;
    let user_topics = topics.iter().filter(|t| !t.name.starts_with("__")).count();
    let groups = groups_json(c, None).await?;
    let mut mirrors = Vec::new();
    for m in &s.config.mirrors {
        let status = async {
            s.http
                .get(format!("{}/api/v1/status", m.url.trim_end_matches('/')))
                .send()
                .await?
                .error_for_status()?
                .json::<Value>()
                .await
        }
        .await;
        mirrors.push(match status {
            Ok(v) => json!({"name": m.name, "url": m.url, "reachable": true, "mirror": v["mirror"],
                "active_route": v["active_route"], "target_down": v["target_down"],
                "partitions_by_state": v["totals"]["partitions_by_state"], "lag": v["totals"]["lag"],
                "rpo_max_seconds": v["totals"]["rpo_max_seconds"]}),
            Err(e) => json!({"name": m.name, "url": m.url, "reachable": false, "error": e.to_string()}),
        });
    }
    let brokers: Vec<Value> = if meta.brokers.is_empty() {
        vec![json!({"broker_id": meta.broker_id, "address": meta.broker_address})]
    } else {
        meta.brokers.iter().map(|b| json!({"broker_id": b.broker_id, "address": b.address})).collect()
    };
    Ok(json!({
        "cluster": c.name, "cluster_id": meta.cluster_id, "version": meta.version, "brokers": brokers,
        "controller_id": status.as_ref().map_or(0, |s| s.controller_id),
        "topics": user_topics, "partitions": topics.iter().filter(|t| !t.name.starts_with("__")).map(|t| u64::from(t.partitions)).sum::<u64>(),
        "partitions_at_risk": at_risk,
        "largest_backlogs": groups["message_groups"].as_array().map(|g| g.iter().take(10).map(|g| json!({"group": g["group"], "mode": g["mode"], "backlog": g["backlog"]})).collect::<Vec<_>>()),
        "partitioned_groups": groups["partitioned"],
        "mirrors": mirrors,
    }))
}
