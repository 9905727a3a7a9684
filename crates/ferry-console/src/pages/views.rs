//! One handler per page; each renders what the matching API call answers.

use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::{esc, layout, seg};
use crate::AppState;
use crate::api::browse::PageQuery;
use crate::api::read::{GroupsQuery, Page};
use crate::api::trace::TraceQuery;
use crate::api::{browse, cluster, read, trace};
use crate::auth::Principal;
use crate::core::lineage::Coord;
use crate::error::ApiResult;

fn render(p: &Principal, cluster: &str, r: ApiResult<(String, String)>) -> Response {
    match r {
        Ok((title, body)) => layout(&title, Some(cluster), &p.csrf, &body).into_response(),
        Err(e) => {
            let body = format!("<p class=\"bad\">{}: {}</p>", esc(e.code()), esc(&e.to_string()));
            (e.status(), layout("Error", Some(cluster), &p.csrf, &body)).into_response()
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

fn table(heads: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut out = String::from("<table><tr>");
    for h in heads {
        out.push_str(&format!("<th>{}</th>", esc(h)));
    }
    out.push_str("</tr>");
    for r in rows {
        out.push_str("<tr>");
        for cell in r {
            out.push_str(&format!("<td>{cell}</td>"));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// `/`: the first cluster's overview.
pub async fn home(State(s): State<AppState>) -> Response {
    let first = s.clusters.first().map_or_else(String::new, |c| seg(&c.name));
    Redirect::to(&format!("/c/{first}")).into_response()
}

/// The overview.
pub async fn overview(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let o = read::overview_json(&s, &c).await?;
        let mut body = format!(
            "<p>Cluster <b>{}</b> (id {}, version {}) · controller {} · {} topics, {} partitions</p>",
            esc(&name),
            esc(&text(&o["cluster_id"])),
            esc(&text(&o["version"])),
            o["controller_id"],
            o["topics"],
            o["partitions"]
        );
        let brokers = o["brokers"].as_array().cloned().unwrap_or_default();
        body += "<h2>Brokers</h2>";
        body += &table(
            &["id", "address"],
            brokers.iter().map(|b| vec![text(&b["broker_id"]), esc(&text(&b["address"]))]).collect(),
        );
        let risk = o["partitions_at_risk"].as_array().cloned().unwrap_or_default();
        body += &format!("<h2>Partitions at risk ({})</h2>", risk.len());
        body += &table(
            &["topic", "partition", "under-replicated", "risk phase"],
            risk.iter()
                .map(|r| {
                    vec![
                        esc(&text(&r["topic"])),
                        text(&r["partition"]),
                        text(&r["under_replicated"]),
                        text(&r["at_risk"]),
                    ]
                })
                .collect(),
        );
        body += "<h2>Largest backlogs</h2>";
        let groups = o["largest_backlogs"].as_array().cloned().unwrap_or_default();
        body += &table(
            &["group", "mode", "backlog"],
            groups
                .iter()
                .map(|g| {
                    vec![
                        format!(
                            "<a href=\"/c/{}/groups/{}\">{}</a>",
                            seg(&name),
                            seg(&text(&g["group"])),
                            esc(&text(&g["group"]))
                        ),
                        esc(&text(&g["mode"])),
                        text(&g["backlog"]),
                    ]
                })
                .collect(),
        );
        let mirrors = o["mirrors"].as_array().cloned().unwrap_or_default();
        if !mirrors.is_empty() {
            body += "<h2>Mirrors</h2>";
            body += &table(
                &["mirror", "reachable", "partitions by state", "lag", "worst RPO (s)", "dashboard"],
                mirrors
                    .iter()
                    .map(|m| {
                        vec![
                            esc(&text(&m["name"])),
                            text(&m["reachable"]),
                            esc(&text(&m["partitions_by_state"])),
                            text(&m["lag"]),
                            text(&m["rpo_max_seconds"]),
                            format!("<a href=\"{}/\">open</a>", esc(&text(&m["url"]))),
                        ]
                    })
                    .collect(),
            );
        }
        Ok((format!("Overview · {name}"), body))
    }
    .await;
    render(&p, &name, r)
}

/// The topics list.
pub async fn topics(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    Query(q): Query<Page>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let (total, list) = read::topic_list(&c, &q).await?;
        let mut body = format!(
            "<form><input name=\"q\" placeholder=\"name contains\" value=\"{}\"> <button>Filter</button></form><p>{} topics; showing {}..{}</p>",
            esc(q.q.as_deref().unwrap_or("")), total, q.offset, q.offset + list.len()
        );
        body += &table(&["topic", "partitions", "replication", "mirror of"], list.iter().map(|t| vec![
            format!("<a href=\"/c/{}/topics/{}\">{}</a>", seg(&name), seg(&t.name), esc(&t.name)),
            t.partitions.to_string(), esc(&t.replication),
            t.mirror.as_ref().map_or(String::new(), |m| esc(&format!("{}/{}", m.source_cluster, m.source_topic)))]).collect());
        if q.offset + list.len() < total {
            body += &format!("<a href=\"?offset={}&limit={}\">next page</a>", q.offset + list.len(), q.limit);
        }
        Ok((format!("Topics · {name}"), body))
    }.await;
    render(&p, &name, r)
}

/// A topic.
pub async fn topic(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((name, topic)): Path<(String, String)>,
    Query(page): Query<read::PartitionPage>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let d = read::describe(&c, &topic, &page).await?;
        let t = &d["topic"];
        let mut body = format!(
            "<p>id {} · {} · created {} · delayed pending {}</p><p>mirror: {}</p><p>config: <code>{}</code></p>",
            esc(&text(&t["topic_id"])), esc(&text(&t["replication"])), t["created_ms"], d["delayed_pending"],
            esc(&text(&t["mirror"])), esc(&t["config"].to_string())
        );
        let parts = d["partitions"].as_array().cloned().unwrap_or_default();
        body += &table(&["partition", "leader", "replicas", "ISR", "log start", "log end", "size", "delayed", "browse"], parts.iter().map(|x| {
            let pn = text(&x["partition"]);
            vec![pn.clone(), esc(&text(&x["leader"])), text(&x["replicas"]), text(&x["isr"]), text(&x["log_start_offset"]),
                 text(&x["log_end_offset"]), text(&x["size_bytes"]), text(&x["delayed_pending"]),
                 format!("<a href=\"/c/{}/browse/{}/{pn}?newest=true\">newest</a> · <a href=\"/c/{}/browse/{}/{pn}\">oldest</a>",
                     seg(&name), seg(&topic), seg(&name), seg(&topic))]
        }).collect());
        let (total, from, limit) = (text(&d["partitions_total"]).parse().unwrap_or(0usize), page.partitions_offset, page.limit()?);
        body += &format!("<p id=\"partition-page\">partitions {}..{} of {total}", from.min(total), (from + parts.len()).min(total));
        if from > 0 {
            body += &format!(" · <a id=\"prev\" href=\"?partitions_offset={}&partitions_limit={limit}\">previous</a>", from.saturating_sub(limit));
        }
        if from + parts.len() < total {
            body += &format!(" · <a id=\"next\" href=\"?partitions_offset={}&partitions_limit={limit}\">next</a>", from + parts.len());
        }
        body += "</p>";
        Ok((format!("Topic {topic}"), body))
    }.await;
    render(&p, &name, r)
}

const SCAN_SCRIPT: &str = r#"
async function scan(form){
  const q = new URLSearchParams(new FormData(form));
  for (const [k,v] of [...q.entries()]) if(!v) q.delete(k);
  const out = document.getElementById('found'); out.innerHTML='';
  const prog = document.getElementById('progress');
  const r = await fetch(form.dataset.url+'?'+q.toString());
  if(!r.ok){prog.textContent='refused: '+await r.text();return false;}
  const reader = r.body.getReader(); const dec = new TextDecoder(); let buf='';
  for(;;){
    const {done, value} = await reader.read(); if(done) break;
    buf += dec.decode(value,{stream:true}); let i;
    while((i=buf.indexOf('\n'))>=0){
      const line = JSON.parse(buf.slice(0,i)); buf = buf.slice(i+1);
      if(line.type==='record'){const rec=line.record; const tr=document.createElement('tr');
        for(const c of [rec.partition, rec.offset, rec.timestamp, JSON.stringify(rec.key), JSON.stringify(rec.value)]){
          const td=document.createElement('td'); td.textContent=c; tr.appendChild(td);}
        out.appendChild(tr);}
      else if(line.type==='progress'){prog.textContent='partition '+line.partition+' at '+line.next_offset+'/'+line.end_offset+', '+line.scanned_bytes+' bytes, '+line.matched+' found';}
      else if(line.type==='done'){prog.textContent+=' · done ('+line.stop+')';}
      else if(line.type==='error'){prog.textContent='error: '+line.reason;}
    }
  }
  return false;
}
"#;

/// Browse a partition.
pub async fn browse(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((name, topic, partition)): Path<(String, String, u32)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let page = browse::page(&c, &topic, partition, &q).await?;
        let (cn, tn) = (seg(&name), seg(&topic));
        let mut body = format!(
            "<p>log [{}, {}) · from {} {}</p><form>offset <input name=\"offset\" size=\"8\"> or time (ms) <input name=\"timestamp\" size=\"14\"> \
             format <select name=\"format\"><option>text</option><option>json</option><option>hex</option></select> <button>Go</button> \
             <a href=\"?newest=true\">newest first</a> · <a href=\"?offset={}\">next page</a></form>",
            page["log_start_offset"], page["log_end_offset"], page["from"],
            if q.newest { "(newest first)" } else { "" }, page["next_offset"]
        );
        let recs = page["records"].as_array().cloned().unwrap_or_default();
        body += &table(&["offset", "timestamp", "key", "value", "headers"], recs.iter().map(|r| vec![
            format!("<a href=\"/c/{cn}/message/{tn}/{partition}/{o}\">{o}</a>", o = r["offset"]),
            text(&r["timestamp"]), format!("<pre>{}</pre>", esc(&text(&r["key"]))), format!("<pre>{}</pre>", esc(&text(&r["value"]))),
            format!("<pre>{}</pre>", esc(&r["headers"].to_string()))]).collect());
        body += &format!(
            "<h2>Filter scan</h2><form data-url=\"/api/v1/clusters/{cn}/topics/{tn}/scan\" onsubmit=\"return scan(this),false\">\
             <input type=\"hidden\" name=\"partition\" value=\"{partition}\">key <input name=\"key\"> value <input name=\"value\"> \
             header <input name=\"header\" placeholder=\"name or name=part\"> <label><input type=\"checkbox\" name=\"regex\" value=\"true\"> regex</label> \
             budget (bytes) <input name=\"budget_bytes\" size=\"10\"> <button>Scan</button></form><p id=\"progress\"></p>\
             <table><tr><th>partition</th><th>offset</th><th>timestamp</th><th>key</th><th>value</th></tr><tbody id=\"found\"></tbody></table>\
             <script>{SCAN_SCRIPT}</script>"
        );
        Ok((format!("Browse {topic}/{partition}"), body))
    }.await;
    render(&p, &name, r)
}

/// A message and its trace.
pub async fn message(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((name, topic, partition, offset)): Path<(String, String, u32, u64)>,
    Query(q): Query<TraceQuery>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let at = Coord { topic: topic.clone(), partition, offset };
        let t = trace::trace_json(&c, &at, &q, s.config.scan_budget_bytes).await?;
        let rec = &t["record"];
        let cn = seg(&name);
        let mut body = format!(
            "<h2>Record</h2><p>timestamp {} · leader now {}</p><p>key</p><pre id=\"key\">{}</pre><p>value</p><pre id=\"value\">{}</pre><p>headers</p><pre>{}</pre>",
            rec["timestamp"], esc(&text(&t["produced"]["leader_now"])), esc(&text(&rec["key"])), esc(&text(&rec["value"])),
            esc(&serde_json::to_string_pretty(&rec["headers"]).unwrap_or_default())
        );
        let pr = &t["produced"];
        let written_to = if pr["leader"].is_null() { "a leader the cluster does not record".to_owned() } else { esc(&text(&pr["leader"])) };
        body += &format!(
            "<p id=\"produced\">written in partition epoch {} to {} · producer id {} epoch {} · batch at offset {}</p>",
            pr["partition_epoch"], written_to, pr["producer_id"], pr["producer_epoch"], pr["batch_base_offset"]
        );
        let tx = &t["transaction"];
        if !tx.is_null() {
            body += &format!(
                "<p id=\"transaction\">From transaction <b>{}</b> of producer group {}: <b>{}</b> (decided by {}). {}</p>",
                esc(&text(&tx["txn_id"])), esc(&text(&tx["group"])), esc(&text(&tx["state"])), esc(&text(&tx["decided_by"])),
                esc(&text(&tx["lookup_error"]))
            );
        }
        if !t["mirror"].is_null() {
            body += &format!("<p>Mirrored from <b>{}</b> topic {} at the same offset.</p>", esc(&text(&t["mirror"]["source_cluster"])), esc(&text(&t["mirror"]["source_topic"])));
        }
        body += "<h2>Trace</h2>";
        for g in t["groups"].as_array().cloned().unwrap_or_default() {
            body += &format!("<h3>group {} · {} · delivered {} time(s)</h3>", esc(&text(&g["group"])), esc(&text(&g["status"])), g["delivery_count"]);
            let hist = g["history"].as_array().cloned().unwrap_or_default();
            body += &table(&["at (ms)", "event", "member", "delivery", "error", "detail"], hist.iter().map(|h| vec![
                text(&h["at_ms"]), esc(&text(&h["event"])), esc(&text(&h["member_id"])), text(&h["delivery_count"]),
                esc(&text(&h["error"])), esc(&text(&h["detail"]))]).collect());
        }
        let link = |x: &Value| format!("<a href=\"/c/{cn}/message/{}/{}/{}\">{}/{}/{}</a>", seg(&text(&x["topic"])), x["partition"], x["offset"],
            esc(&text(&x["topic"])), x["partition"], x["offset"]);
        let mut steps = Vec::new();
        for x in t["lineage"]["origins"].as_array().cloned().unwrap_or_default() {
            steps.push(vec!["origin".into(), link(&x), esc(&text(&x["kind"])), esc(&text(&x["from"])), esc(&text(&x["error"]))]);
        }
        steps.push(vec!["this".into(), format!("{}/{partition}/{offset}", esc(&topic)), String::new(), String::new(), String::new()]);
        for x in t["lineage"]["derived"].as_array().cloned().unwrap_or_default() {
            steps.push(vec![format!("derived ({})", x["depth"]), link(&x), esc(&text(&x["kind"])), esc(&text(&x["from"])), esc(&text(&x["error"]))]);
        }
        body += "<h3>Lineage</h3>";
        body += &table(&["step", "record", "how", "from", "error"], steps);
        body += &format!(
            "<h2>Edit and resend</h2><p class=\"muted\">Writes a new record naming this one; nothing changes in place.</p>\
             <textarea id=\"newvalue\" rows=\"4\" cols=\"80\">{}</textarea><br><button id=\"resend\" onclick=\"act('/api/v1/clusters/{cn}/resend',\
             {{topic:{}, partition:{partition}, offset:{offset}, value:document.getElementById('newvalue').value}}, 'Write a new record from this one?')\">Resend</button>\
             <pre id=\"result\"></pre>",
            esc(&text(&rec["value"])), esc(&serde_json::to_string(&topic).unwrap_or_default())
        );
        Ok((format!("Message {topic}/{partition}/{offset}"), body))
    }.await;
    render(&p, &name, r)
}

/// The groups.
pub async fn groups(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    Query(q): Query<GroupsQuery>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let g = read::groups_json(&c, q.names.as_deref()).await?;
        let cn = seg(&name);
        let mut body = String::from("<h2>Message-model groups</h2>");
        let mg = g["message_groups"].as_array().cloned().unwrap_or_default();
        body += &table(
            &["group", "mode", "members", "backlog", "redeliveries", "lock expiries", "dead-lettered"],
            mg.iter()
                .map(|x| {
                    vec![
                        format!(
                            "<a href=\"/c/{cn}/groups/{}\">{}</a>",
                            seg(&text(&x["group"])),
                            esc(&text(&x["group"]))
                        ),
                        esc(&text(&x["mode"])),
                        x["members"].as_array().map_or(0, Vec::len).to_string(),
                        text(&x["backlog"]),
                        text(&x["redeliveries"]),
                        text(&x["lock_expiries"]),
                        text(&x["dead_lettered"]),
                    ]
                })
                .collect(),
        );
        body += "<h2>Partitioned groups</h2>";
        let pg = g["partitioned"].as_array().cloned().unwrap_or_default();
        body += &table(
            &["group", "members", "generation"],
            pg.iter()
                .map(|x| {
                    vec![
                        format!(
                            "<a href=\"/c/{cn}/groups/{}\">{}</a>",
                            seg(&text(&x["group"])),
                            esc(&text(&x["group"]))
                        ),
                        text(&x["members"]),
                        text(&x["generation"]),
                    ]
                })
                .collect(),
        );
        Ok((format!("Groups · {name}"), body))
    }
    .await;
    render(&p, &name, r)
}

const REDRIVE_SCRIPT: &str = r#"
async function watch(url){
  const el = document.getElementById('job');
  for(;;){ const r = await fetch(url); const j = await r.json();
    el.textContent = j.state+': '+j.copied+' of '+(j.end_offset-j.from_offset)+' copied'+(j.dry_run?' (dry run)':'')+(j.error?' · '+j.error:'');
    if(j.state!=='RUNNING') break; await new Promise(res=>setTimeout(res,500)); }
}
"#;

/// A group.
pub async fn group(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((name, group)): Path<(String, String)>,
) -> Response {
    let r = async {
        cluster(&s, &name)?;
        let axum::Json(g) = read::group(State(s.clone()), Path((name.clone(), group.clone()))).await?;
        let (cn, gn) = (seg(&name), seg(&group));
        let mut body = String::new();
        if let Some(m) = g["message_group"].as_object() {
            body += &format!("<p>mode <b>{}</b> · lock timeout {} ms · window {} · redeliveries {} · lock expiries {} · dead-lettered {}</p>",
                esc(&text(&m["mode"])), m["lock_timeout_ms"], m["window"], m["redeliveries"], m["lock_expiries"], m["dead_lettered"]);
            let series: Vec<crate::core::history::Sample> = serde_json::from_value(m["history"].clone()).unwrap_or_default();
            body += &format!(
                "<p>backlog over the last hour ({} samples, latest {}): {}</p><p>redeliveries {:.1}/min · lock expiries {:.1}/min</p>",
                series.len(), series.last().map_or(0, |s| s.backlog), crate::core::history::sparkline(&series, 360, 48),
                m["rates"]["redeliveries_per_min"].as_f64().unwrap_or(0.0), m["rates"]["lock_expiries_per_min"].as_f64().unwrap_or(0.0)
            );
            body += &table(&["member", "client", "active", "in flight"], m["members"].as_array().cloned().unwrap_or_default().iter().map(|x| vec![
                esc(&text(&x["member_id"])), esc(&text(&x["client_id"])), text(&x["active"]), text(&x["in_flight"])]).collect());
            body += &table(&["topic", "partition", "waiting", "in progress", "failed", "dead-lettered", "lag"], m["partitions"].as_array().cloned().unwrap_or_default().iter().map(|x| vec![
                esc(&text(&x["topic"])), text(&x["partition"]), text(&x["waiting"]), text(&x["in_flight"]), text(&x["failed"]),
                text(&x["dead_lettered"]), text(&x["lag"])]).collect());
            let dlq = esc(&text(&g["dlq_topic"]));
            body += &format!(
                "<h2>Dead letters</h2><p><a href=\"/c/{cn}/browse/{}/0?newest=true\">browse {dlq}</a></p>\
                 <p>rate (records/s, 0 unlimited) <input id=\"rate\" value=\"0\" size=\"6\"> <label><input type=\"checkbox\" id=\"dry\"> dry run</label> \
                 <button id=\"redrive\" onclick=\"act('/api/v1/clusters/{cn}/groups/{gn}/redrive',{{rate:+document.getElementById('rate').value,dry_run:document.getElementById('dry').checked}},\
                 'Start a redrive of {dlq}?').then(j=>j&&watch('/api/v1/clusters/{cn}/groups/{gn}/redrive'))\">Redrive</button></p>\
                 <p id=\"job\"></p><pre id=\"result\"></pre><script>{REDRIVE_SCRIPT}</script>",
                seg(&text(&g["dlq_topic"]))
            );
        }
        if let Some(pg) = g["partitioned"].as_object() {
            body += "<h2>Partitioned group</h2>";
            body += &table(&["member", "client", "assignment"], pg["members"].as_array().cloned().unwrap_or_default().iter().map(|x| vec![
                esc(&text(&x["member_id"])), esc(&text(&x["client_id"])), esc(&text(&x["assignment"]))]).collect());
            body += &table(&["topic", "partition", "committed"], pg["offsets"].as_array().cloned().unwrap_or_default().iter().map(|x| vec![
                esc(&text(&x["topic"])), text(&x["partition"]), text(&x["offset"])]).collect());
            body += &format!(
                "<h2>Reset offsets</h2><p>topic <input id=\"rtopic\"> to <select id=\"rto\"><option>earliest</option><option>latest</option></select> \
                 <button onclick=\"act('/api/v1/clusters/{cn}/groups/{gn}/offsets',{{topic:document.getElementById('rtopic').value,to:document.getElementById('rto').value}},'Reset the offsets of this group?')\">Reset</button></p><pre id=\"result\"></pre>"
            );
        }
        Ok((format!("Group {group}"), body))
    }.await;
    render(&p, &name, r)
}

/// Transactions.
pub async fn transactions(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Response {
    let r = async {
        let c = cluster(&s, &name)?;
        let t = read::transactions_json(&c).await?;
        let cn = seg(&name);
        let list = t["transactions"].as_array().cloned().unwrap_or_default();
        let mut body = table(&["group", "transaction", "state", "age (ms)", "checks", "messages", "decided by", "resolve"], list.iter().map(|x| {
            let args = format!("{{group:{},txn_id:{}", esc(&x["group"].to_string()), esc(&x["txn_id"].to_string()));
            let actions = if text(&x["state"]) == "pending" {
                format!("<button onclick=\"act('/api/v1/clusters/{cn}/transactions/resolve',{args},outcome:'commit'}},'Commit this transaction?')\">commit</button> \
                         <button onclick=\"act('/api/v1/clusters/{cn}/transactions/resolve',{args},outcome:'rollback'}},'Roll back this transaction?')\">roll back</button>")
            } else { String::new() };
            vec![esc(&text(&x["group"])), esc(&text(&x["txn_id"])), esc(&text(&x["state"])), text(&x["age_ms"]), text(&x["checks"]),
                 text(&x["messages"]), esc(&text(&x["decided_by"])), actions]
        }).collect());
        body += "<pre id=\"result\"></pre>";
        Ok((format!("Transactions · {name}"), body))
    }.await;
    render(&p, &name, r)
}
