//! The audited actions (admin scope, CSRF token, `"confirm": true`): produce, edit-and-resend, a dead-letter
//! redrive job, a group's offset reset and an operator's transaction resolution.
//!
//! Invariants: an action either does what it says or answers an error and changes nothing the console can
//! undo; a resend writes a new record naming its source (never a change in place); an offset reset is refused
//! (409 `group_active`) while the group has members, as the broker refuses commits without membership then.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ferry_client::batch::{Compression, Header, ProducerInfo, Record, encode_records};
use ferry_client::proto as pb;
use ferry_client::{OffsetSpec, Transactions, TxnOutcome};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{cluster, now_ms};
use crate::auth::{AuditDetail, Principal};
use crate::core::idempotency::{Decision, MAX_KEY_CHARS, Scope, valid_key};
use crate::core::lineage::{Coord, edit_headers};
use crate::error::{ApiError, ApiResult};
use crate::records::read_one;
use crate::{AppState, Cluster};

fn confirmed(confirm: bool) -> ApiResult<()> {
    if confirm {
        Ok(())
    } else {
        Err(ApiError::ConfirmationRequired("this action needs \"confirm\": true in its body".into()))
    }
}

fn answer(body: Value, detail: Value) -> Response {
    let mut r = Json(body).into_response();
    r.extensions_mut().insert(AuditDetail(detail));
    r
}

/// The header naming a writing action's idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Runs a writing action once per idempotency key (when the request has one): a repeat with the same key and body
/// gets the first answer (its audit detail says `"replayed": true`) and writes nothing.
async fn once<F>(
    s: &AppState,
    p: &Principal,
    cluster: &str,
    action: &'static str,
    headers: &HeaderMap,
    body: &impl Serialize,
    run: F,
) -> ApiResult<Response>
where
    F: Future<Output = ApiResult<(Value, Value)>>,
{
    let Some(key) = headers.get(IDEMPOTENCY_HEADER) else {
        let (body, detail) = run.await?;
        return Ok(answer(body, detail));
    };
    let key = key.to_str().ok().filter(|k| valid_key(k)).ok_or_else(|| {
        ApiError::BadRequest(format!("{IDEMPOTENCY_HEADER}: 1-{MAX_KEY_CHARS} visible ASCII characters"))
    })?;
    let scope = Scope { caller: p.name.clone(), cluster: cluster.to_owned(), action, key: key.to_owned() };
    let digest: [u8; 32] = Sha256::digest(serde_json::to_vec(body).unwrap_or_default()).into();
    let decision = s.idempotency.lock().begin(&scope, digest);
    match decision {
        Decision::Replay((body, mut detail)) => {
            detail["replayed"] = json!(true);
            Ok(answer(body, detail))
        }
        Decision::InFlight => Err(ApiError::Conflict(
            "idempotency_key_in_flight",
            format!("a request with this {IDEMPOTENCY_HEADER} is still running: ask again once it answered"),
        )),
        Decision::Reused => Err(ApiError::Conflict(
            "idempotency_key_reused",
            format!("this {IDEMPOTENCY_HEADER} was used with another request body: use a new key"),
        )),
        Decision::Run => match run.await {
            Ok((body, detail)) => {
                s.idempotency.lock().finish(&scope, (body.clone(), detail.clone()));
                Ok(answer(body, detail))
            }
            Err(e) => {
                s.idempotency.lock().release(&scope);
                Err(e)
            }
        },
    }
}

/// A header in a request body.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderIn {
    /// Name.
    pub key: String,
    /// Value (text); null for a null value.
    pub value: Option<String>,
}

async fn produce_one(
    c: &Cluster,
    topic: &str,
    partition: Option<u32>,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Vec<(String, Option<Vec<u8>>)>,
) -> ApiResult<Coord> {
    if topic.starts_with("__") {
        return Err(ApiError::BadRequest(format!("topic: {topic:?} is internal; the console does not write to it")));
    }
    let record = Record {
        offset: 0,
        timestamp: now_ms(),
        key: key.clone(),
        value,
        headers: headers.into_iter().map(|(k, v)| Header { key: k, value: v.map(Bytes::from) }).collect(),
    };
    let batches = encode_records(&[record], 0, Compression::None, ProducerInfo::default());
    let req = pb::ProduceRequest { topic: topic.to_owned(), partition, key, batches };
    let client = match partition {
        Some(p) => c.client.for_partition(topic, p),
        None => c.client.clone(),
    };
    let r = client.produce(req).await?;
    Ok(Coord { topic: topic.to_owned(), partition: r.partition, offset: r.base_offset })
}

/// `POST .../produce`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceBody {
    /// Topic.
    pub topic: String,
    /// Partition (by key or round robin when unset).
    pub partition: Option<u32>,
    /// Key (text).
    pub key: Option<String>,
    /// Value (text).
    pub value: Option<String>,
    /// Headers.
    #[serde(default)]
    pub headers: Vec<HeaderIn>,
    /// Must be true.
    #[serde(default)]
    pub confirm: bool,
}

/// Produces one record.
pub async fn produce(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Extension(p): Extension<Principal>,
    request_headers: HeaderMap,
    Json(b): Json<ProduceBody>,
) -> ApiResult<Response> {
    confirmed(b.confirm)?;
    let c = cluster(&s, &name)?;
    once(&s, &p, &name, "produce", &request_headers, &b, async {
        let headers = b.headers.iter().map(|h| (h.key.clone(), h.value.clone().map(String::into_bytes))).collect();
        let (key, value) = (b.key.clone().map(Bytes::from), b.value.clone().map(Bytes::from));
        let at = produce_one(&c, &b.topic, b.partition, key, value, headers).await?;
        Ok((json!({"written": at}), json!({"cluster": name, "written": at.to_string()})))
    })
    .await
}

/// `POST .../resend`: a new record from an existing one, with edits.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResendBody {
    /// The source record.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// Where the new record goes (default: a dead letter's origin topic, else the source's topic).
    pub to_topic: Option<String>,
    /// Its partition (default: the broker picks by key).
    pub to_partition: Option<u32>,
    /// A new key (default: the source's).
    pub key: Option<String>,
    /// A new value (default: the source's).
    pub value: Option<String>,
    /// New user headers (default: the source's, without lineage headers).
    pub headers: Option<Vec<HeaderIn>>,
    /// Must be true.
    #[serde(default)]
    pub confirm: bool,
}

/// Edit and resend.
pub async fn resend(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Extension(p): Extension<Principal>,
    request_headers: HeaderMap,
    Json(b): Json<ResendBody>,
) -> ApiResult<Response> {
    confirmed(b.confirm)?;
    let c = cluster(&s, &name)?;
    let digest_of = serde_json::to_value(&b).unwrap_or_default();
    once(&s, &p, &name, "resend", &request_headers, &digest_of, resend_once(&c, &p, b)).await
}

async fn resend_once(c: &Cluster, p: &Principal, b: ResendBody) -> ApiResult<(Value, Value)> {
    let name = c.name.clone();
    let from = Coord { topic: b.topic.clone(), partition: b.partition, offset: b.offset };
    let src = read_one(&c.client, &from).await?.ok_or_else(|| ApiError::NotFound(format!("no record at {from}")))?;
    let to = b.to_topic.or_else(|| src.header("ferry-dlq-topic")).unwrap_or_else(|| b.topic.clone());
    let base: Vec<(String, Option<Vec<u8>>)> = match b.headers {
        Some(h) => h.into_iter().map(|h| (h.key, h.value.map(String::into_bytes))).collect(),
        None => src.headers.iter().map(|(k, v)| (k.clone(), v.as_ref().map(|v| v.to_vec()))).collect(),
    };
    let headers = edit_headers(&base, &from, &c.name, &p.name, now_ms());
    let key = b.key.map(Bytes::from).or(src.key.clone());
    let value = b.value.map(Bytes::from).or(src.value.clone());
    let at = produce_one(c, &to, b.to_partition, key, value, headers).await?;
    Ok((
        json!({"from": from, "written": at}),
        json!({"cluster": name, "from": from.to_string(), "written": at.to_string()}),
    ))
}

/// `POST .../groups/{group}/redrive`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveBody {
    /// Target topic (default: each dead letter's origin).
    pub to: Option<String>,
    /// Records per second (0: unlimited).
    #[serde(default)]
    pub rate: u32,
    /// Count only.
    #[serde(default)]
    pub dry_run: bool,
    /// Must be true.
    #[serde(default)]
    pub confirm: bool,
}

fn job_json(j: &pb::RedriveResponse) -> Value {
    json!({"job_id": j.job_id, "state": j.state, "from_offset": j.from_offset, "end_offset": j.end_offset,
           "next_offset": j.next_offset, "copied": j.copied, "per_topic": j.per_topic, "dry_run": j.dry_run,
           "error": j.error, "started_ms": j.started_ms, "finished_ms": j.finished_ms})
}

/// Starts (or attaches to) the group's redrive job.
pub async fn redrive(
    State(s): State<AppState>,
    Path((name, group)): Path<(String, String)>,
    Json(b): Json<RedriveBody>,
) -> ApiResult<Response> {
    confirmed(b.confirm)?;
    let c = cluster(&s, &name)?;
    let req = pb::RedriveRequest {
        group: group.clone(),
        to: b.to.unwrap_or_default(),
        rate: b.rate,
        dry_run: b.dry_run,
        status_only: false,
    };
    let j = c.share.redrive(req).await?;
    let body = job_json(&j);
    Ok(answer(body.clone(), json!({"cluster": name, "group": group, "job": body})))
}

/// `GET .../groups/{group}/redrive`: the job's progress.
pub async fn redrive_status(
    State(s): State<AppState>,
    Path((name, group)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let c = cluster(&s, &name)?;
    let req = pb::RedriveRequest { group, to: String::new(), rate: 0, dry_run: false, status_only: true };
    Ok(Json(job_json(&c.share.redrive(req).await?)))
}

/// `POST .../groups/{group}/offsets`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetBody {
    /// The topic.
    pub topic: String,
    /// Partitions (all when unset).
    pub partitions: Option<Vec<u32>>,
    /// `earliest`, `latest`, `offset` or `timestamp`.
    pub to: String,
    /// With `to: offset`, the offset; with `to: timestamp`, ms since the epoch.
    pub value: Option<i64>,
    /// Must be true.
    #[serde(default)]
    pub confirm: bool,
}

/// Resets a partitioned group's committed offsets (refused while it has members).
pub async fn reset_offsets(
    State(s): State<AppState>,
    Path((name, group)): Path<(String, String)>,
    Json(b): Json<ResetBody>,
) -> ApiResult<Response> {
    confirmed(b.confirm)?;
    let c = cluster(&s, &name)?;
    let d = c.admin.describe_group(&group).await?;
    if !d.members.is_empty() {
        return Err(ApiError::Conflict(
            "group_active",
            format!("group {group:?} has {} active member(s): stop them before resetting its offsets", d.members.len()),
        ));
    }
    let partitions = match b.partitions {
        Some(p) => p,
        None => (0..c.admin.describe_topic(&b.topic).await?.topic.partitions).collect(),
    };
    let mut offsets = Vec::new();
    for p in partitions {
        let spec = match (b.to.as_str(), b.value) {
            ("earliest", _) => OffsetSpec::Earliest,
            ("latest", _) => OffsetSpec::Latest,
            ("timestamp", Some(t)) => OffsetSpec::Timestamp(t),
            ("offset", Some(_)) => OffsetSpec::Earliest,
            _ => {
                return Err(ApiError::BadRequest(
                    "to: earliest, latest, offset (with value) or timestamp (with value)".into(),
                ));
            }
        };
        let o = c.admin.list_offset(&b.topic, p, spec).await?;
        let offset = match (b.to.as_str(), b.value) {
            ("offset", Some(v)) => {
                let v =
                    u64::try_from(v).map_err(|_| ApiError::BadRequest("value: an offset is not negative".into()))?;
                if v < o.log_start_offset || v > o.log_end_offset {
                    return Err(ApiError::BadRequest(format!(
                        "value: offset {v} is outside [{}, {}] of {}/{p}",
                        o.log_start_offset, o.log_end_offset, b.topic
                    )));
                }
                v
            }
            _ => o.offset.unwrap_or(o.log_end_offset),
        };
        offsets.push(pb::CommittedOffset {
            topic: b.topic.clone(),
            partition: p,
            offset,
            metadata: "ferry-console reset".into(),
        });
    }
    c.admin.commit_offsets(&group, offsets.clone()).await?;
    let list: Vec<Value> =
        offsets.iter().map(|o| json!({"topic": o.topic, "partition": o.partition, "offset": o.offset})).collect();
    Ok(answer(json!({"group": group, "offsets": list}), json!({"cluster": name, "group": group, "offsets": list})))
}

/// `POST .../transactions/resolve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// The producer group.
    pub group: String,
    /// The transaction.
    pub txn_id: String,
    /// `commit` or `rollback`.
    pub outcome: String,
    /// Must be true.
    #[serde(default)]
    pub confirm: bool,
}

/// Resolves a transaction as an operator.
pub async fn resolve_txn(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Json(b): Json<ResolveBody>,
) -> ApiResult<Response> {
    confirmed(b.confirm)?;
    let c = cluster(&s, &name)?;
    let outcome = match b.outcome.as_str() {
        "commit" => TxnOutcome::Commit,
        "rollback" => TxnOutcome::Rollback,
        other => return Err(ApiError::BadRequest(format!("outcome: {other:?} is neither commit nor rollback"))),
    };
    let r = Transactions::new(c.client.clone(), b.group.clone()).resolve(&b.txn_id, outcome, true).await?;
    let body = json!({"group": b.group, "txn_id": b.txn_id,
        "outcome": if r.outcome == TxnOutcome::Commit { "commit" } else { "rollback" },
        "repeated": r.repeated, "decided_by": r.decided_by,
        "offsets": r.offsets.iter().map(|(t, p, f, l)| json!({"topic": t, "partition": p, "base_offset": f, "last_offset": l})).collect::<Vec<_>>()});
    Ok(answer(body.clone(), json!({"cluster": name, "result": body})))
}
