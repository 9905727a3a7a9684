//! `ferryctl mirror status|partitions|egress|pause|resume` against a running mirror's monitor (`--monitor`).
//!
//! Text output is for people: a summary, or aligned tables. `--format json` prints the monitor's JSON body as
//! received, so scripts see exactly the documented API (docs/openapi.yaml). Refusals are restated as one sentence
//! naming what was asked: an unknown route or topic, an unhealthy route without `--force`, a missing or wrong token.
//! Every failure exits 1; clap's usage errors exit 2.

use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use anyhow::anyhow;
use serde_json::json;

use clap::{Args, Subcommand};

use crate::common::GlobalOpts;
use crate::monitor::{ControlDoc, EgressDoc, MonitorClient, MonitorError, PartitionDoc, PartitionsDoc, StatusDoc};
use crate::output::{Format, Table};
use crate::verify::VerifyArgs;

/// `mirror` options.
#[derive(Args)]
pub struct MirrorArgs {
    /// Output format (json passes the monitor's JSON through, for scripts).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// What to do.
    #[command(subcommand)]
    pub command: MirrorCommand,
}

/// `mirror` subcommands.
#[derive(Subcommand)]
pub enum MirrorCommand {
    /// Mirror identity, active route, partition states, lag, rates and totals.
    Status,
    /// Per-partition offsets, lag and state.
    Partitions {
        /// Only this source topic.
        #[arg(long)]
        topic: Option<String>,
        /// Redraw every second until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// Source routes (egress), or switch and unpin them.
    Egress {
        /// Switch or unpin; without one, list the routes.
        #[command(subcommand)]
        action: Option<EgressAction>,
    },
    /// Pause a mirrored source topic (its partitions stop appending and keep their positions).
    Pause {
        /// Source topic.
        topic: String,
    },
    /// Resume a paused (or halted) source topic.
    Resume {
        /// Source topic.
        topic: String,
    },
    /// Compare every mirror topic on the target with its source, batch by batch; exit 1 on any difference.
    Verify(VerifyArgs),
}

/// `mirror egress` subcommands.
#[derive(Subcommand)]
pub enum EgressAction {
    /// Switch the source route by hand; it stays pinned until `mirror egress unpin`.
    Switch {
        /// Route name.
        route: String,
        /// Switch even when the route is unhealthy.
        #[arg(long)]
        force: bool,
    },
    /// Remove the pin of a manual switch, so automatic failover applies again.
    Unpin,
}

/// Runs a `mirror` subcommand (`verify` talks to brokers, not the monitor: it has its own module).
pub async fn run(cmd: MirrorCommand, format: Format, global: &GlobalOpts) -> anyhow::Result<()> {
    if let MirrorCommand::Verify(args) = cmd {
        return crate::verify::run(args, format, global).await;
    }
    let monitor = MonitorClient::new(global)?;
    match cmd {
        MirrorCommand::Status => {
            let (body, status) = monitor.get::<StatusDoc>(&["api", "v1", "status"], None).await?;
            emit(format, &body, || status_text(&status, monitor.addr()));
        }
        MirrorCommand::Partitions { topic, watch: false } => {
            let (body, doc) = partitions(&monitor, topic.as_deref()).await?;
            emit(format, &body, || partitions_text(&doc.partitions));
        }
        MirrorCommand::Partitions { topic, watch: true } => {
            watch_partitions(&monitor, topic.as_deref(), format).await?
        }
        MirrorCommand::Egress { action: None } => {
            let (body, doc) = monitor.get::<EgressDoc>(&["api", "v1", "egress"], None).await?;
            emit(format, &body, || egress_text(&doc));
        }
        MirrorCommand::Egress { action: Some(EgressAction::Switch { route, force }) } => {
            let answer = monitor
                .post::<EgressDoc>(&["api", "v1", "egress", "switch"], Some(json!({"route": route, "force": force})))
                .await;
            let (body, doc) = match answer {
                Ok(ok) => ok,
                Err(e) => return Err(switch_refused(&monitor, &route, e).await),
            };
            emit(format, &body, || {
                format!(
                    "route {:?} is active and pinned; \"ferryctl mirror egress unpin\" lets automatic failover choose \
                     again\n",
                    doc.active
                )
            });
        }
        MirrorCommand::Egress { action: Some(EgressAction::Unpin) } => {
            let (body, doc) = monitor.post::<EgressDoc>(&["api", "v1", "egress", "unpin"], None).await?;
            emit(format, &body, || {
                format!("unpinned: the active route is {:?} and automatic failover applies again\n", doc.active)
            });
        }
        MirrorCommand::Pause { topic } => control(&monitor, &topic, true, format).await?,
        MirrorCommand::Resume { topic } => control(&monitor, &topic, false, format).await?,
        MirrorCommand::Verify(_) => {}
    }
    Ok(())
}

/// Prints the JSON body as received, or the text.
fn emit(format: Format, body: &str, text: impl FnOnce() -> String) {
    match format {
        Format::Json => println!("{}", body.trim_end()),
        Format::Text => print!("{}", text()),
    }
}

/// `GET /api/v1/partitions[?topic=T]`, with an unknown topic as one sentence.
async fn partitions(monitor: &MonitorClient, topic: Option<&str>) -> anyhow::Result<(String, PartitionsDoc)> {
    let query = topic.map(|t| ("topic", t));
    monitor.get::<PartitionsDoc>(&["api", "v1", "partitions"], query).await.map_err(|e| match (e, topic) {
        (MonitorError::Api { code, .. }, Some(t)) if code == "unknown_topic" => {
            anyhow!("topic {t:?} is not mirrored by the mirror at {}", monitor.addr())
        }
        (e, _) => e.into(),
    })
}

/// Turns a refused switch into one sentence: 404 names the route, 409 says why it is unhealthy.
async fn switch_refused(monitor: &MonitorClient, route: &str, e: MonitorError) -> anyhow::Error {
    match e {
        MonitorError::Api { code, reason, .. } if code == "unknown_route" => {
            let known = reason.split_once("configured routes: ").map(|(_, k)| k.to_owned());
            match known {
                Some(k) if !k.is_empty() => anyhow!("no route named {route:?} (configured routes: {k})"),
                _ => anyhow!("no route named {route:?}"),
            }
        }
        MonitorError::Api { code, reason, .. } if code == "route_unhealthy" => {
            // The route's own last error is the clearest reason; the monitor's sentence is the fallback.
            let why = match monitor.get::<EgressDoc>(&["api", "v1", "egress"], None).await {
                Ok((_, doc)) => doc
                    .routes
                    .into_iter()
                    .find(|r| r.name == route)
                    .map(|r| r.last_error.unwrap_or_else(|| "not probed successfully yet".into())),
                Err(_) => None,
            };
            let why = why.unwrap_or(reason);
            anyhow!("route {route:?} is unhealthy ({why}); pass --force to switch anyway")
        }
        other => other.into(),
    }
}

async fn control(monitor: &MonitorClient, topic: &str, pause: bool, format: Format) -> anyhow::Result<()> {
    let action = if pause { "pause" } else { "resume" };
    let (body, doc) =
        monitor.post::<ControlDoc>(&["api", "v1", "topics", topic, action], None).await.map_err(|e| match e {
            MonitorError::Api { code, .. } if code == "unknown_topic" => {
                anyhow!("topic {topic:?} is not mirrored by the mirror at {}", monitor.addr())
            }
            e => e.into(),
        })?;
    emit(format, &body, || {
        if doc.paused {
            format!("paused topic {topic:?}: its partitions stop appending and keep their positions\n")
        } else {
            format!("resumed topic {topic:?}\n")
        }
    });
    Ok(())
}

/// Redraws the partitions every second until Ctrl-C. The first fetch must succeed (a wrong address fails at once);
/// later failures are shown in place and retried, as `watch` does.
async fn watch_partitions(monitor: &MonitorClient, topic: Option<&str>, format: Format) -> anyhow::Result<()> {
    let first = partitions(monitor, topic).await?;
    let terminal = std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut latest = Ok(first);
    tick.tick().await; // The first tick is immediate.
    loop {
        let frame = match (&latest, format) {
            (Ok((body, _)), Format::Json) => format!("{}\n", body.trim_end()),
            (Ok((_, doc)), Format::Text) => partitions_text(&doc.partitions),
            (Err(e), _) => format!("error: {e}\n"),
        };
        let mut out = std::io::stdout().lock();
        let written = if terminal && format == Format::Text {
            // Clear the screen and draw from the top, like watch(1).
            write!(out, "\x1b[H\x1b[2J{} partitions every 1s (Ctrl-C to stop)\n\n{frame}", monitor.addr())
        } else if format == Format::Text {
            writeln!(out, "{frame}")
        } else {
            write!(out, "{frame}")
        };
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(()); // stdout closed (piped into head): done.
        }
        drop(out);
        tokio::select! {
            biased;
            _ = &mut ctrl_c => return Ok(()),
            _ = tick.tick() => {}
        }
        latest = partitions(monitor, topic).await;
    }
}

fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

/// The partitions table; a TARGET_TOPIC column appears when a target name differs from its source name.
pub fn partitions_text(parts: &[PartitionDoc]) -> String {
    if parts.is_empty() {
        return "no partitions are mirrored by this process yet\n".into();
    }
    let renamed = parts.iter().any(|p| !p.target_topic.is_empty() && p.target_topic != p.topic);
    let mut header = vec!["TOPIC", "PARTITION"];
    if renamed {
        header.push("TARGET_TOPIC");
    }
    header.extend(["SOURCE", "CACHE", "COMMIT", "TARGET", "LAG", "RPO_S", "STATE", "LAST_ERROR"]);
    let mut table = Table::new(&header);
    for p in parts {
        let mut row = vec![p.topic.clone(), p.partition.to_string()];
        if renamed {
            row.push(p.target_topic.clone());
        }
        row.extend([
            p.source_offset.to_string(),
            p.cache_offset.to_string(),
            p.commit_offset.to_string(),
            p.target_offset.to_string(),
            p.lag.to_string(),
            format!("{:.1}", p.rpo_seconds),
            p.state.name().to_owned(),
            or_dash(p.last_error.as_deref()),
        ]);
        table.row(row);
    }
    table.render()
}

/// The routes table with the active route and pin on top.
pub fn egress_text(doc: &EgressDoc) -> String {
    let mut out = String::new();
    let pin = if doc.pinned {
        "pinned by a manual switch; \"ferryctl mirror egress unpin\" releases it"
    } else {
        "not pinned: automatic failover"
    };
    out.push_str(&format!("Active route:  {} ({pin})\n", doc.active));
    out.push_str(&format!("Pinned:        {}\n", if doc.pinned { "yes" } else { "no" }));
    out.push_str(&format!("Cluster id:    {}\n\n", or_dash(doc.expected_cluster_id.as_deref())));
    let mut table = Table::new(&["NAME", "ACTIVE", "HEALTHY", "FAILURES", "CLUSTER_ID", "BROKERS", "LAST_ERROR"]);
    for r in &doc.routes {
        let failures = if r.stream_failures > 0 {
            format!("{} (+{} fetch)", r.consecutive_failures, r.stream_failures)
        } else {
            r.consecutive_failures.to_string()
        };
        table.row(vec![
            r.name.clone(),
            yes_no(r.active),
            yes_no(r.healthy),
            failures,
            or_dash(r.cluster_id.as_deref()),
            r.brokers.join(","),
            or_dash(r.last_error.as_deref()),
        ]);
    }
    out.push_str(&table.render());
    out
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// The status summary.
pub fn status_text(s: &StatusDoc, addr: &str) -> String {
    let mut out = String::new();
    let uptime = humantime::format_duration(Duration::from_secs(s.uptime_seconds));
    out.push_str(&format!("Mirror:        {} ({} -> {}) at {addr}\n", s.mirror, s.source_cluster, s.target_cluster));
    out.push_str(&format!("Uptime:        {uptime}\n"));
    let pin = if s.pinned { "pinned" } else { "automatic" };
    out.push_str(&format!("Source route:  {} ({pin})\n", s.active_route));
    out.push_str(&format!("Target:        {}\n", if s.target_down { "DOWN" } else { "reachable" }));
    let paused = if s.paused_topics.is_empty() { "none".to_owned() } else { s.paused_topics.join(", ") };
    out.push_str(&format!("Topics:        {} mirrored, paused: {paused}\n", s.totals.topics));
    if let Some(f) = &s.failover {
        let state = match (&f.error, f.running) {
            (_, true) => "running".to_owned(),
            (Some(e), false) => format!("stopped: {e}; run the failover command again to resume"),
            (None, false) => "not running".to_owned(),
        };
        out.push_str(&format!(
            "Failover:      {} at step {} ({} topics, fence epoch {}), {state}\n",
            f.job, f.step, f.topics, f.fence_epoch
        ));
    }
    let states: Vec<String> =
        s.totals.partitions_by_state.iter().filter(|(_, n)| **n > 0).map(|(state, n)| format!("{n} {state}")).collect();
    let states = if states.is_empty() { String::new() } else { format!(" ({})", states.join(", ")) };
    out.push_str(&format!("Partitions:    {}{states}\n", s.totals.partitions));
    out.push_str(&format!("Lag:           {} records\n", s.totals.lag));
    out.push_str(&format!(
        "RPO:           {:.1} s (the longest any record not yet on the target has waited)\n",
        s.totals.rpo_max_seconds
    ));
    let side = |r: &crate::monitor::SideRatesDoc| {
        format!("{:.0} records/s, {:.2} MB/s", r.records_per_sec.w10, r.bytes_per_sec.w10 / 1e6)
    };
    out.push_str(&format!("Source rate:   {} (10s average)\n", side(&s.rates.source)));
    out.push_str(&format!("Target rate:   {} (10s average)\n", side(&s.rates.target)));
    out.push_str(&format!(
        "Since start:   {} records in, {} out; {:.2} MB in, {:.2} MB out\n",
        s.totals.records_in,
        s.totals.records_out,
        s.totals.bytes_in as f64 / 1e6,
        s.totals.bytes_out as f64 / 1e6
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_mirror::egress::RouteView as RouteDoc;

    fn part(topic: &str, target: &str, p: u32, state: &str, err: Option<&str>) -> PartitionDoc {
        PartitionDoc {
            topic: topic.into(),
            partition: p,
            target_topic: target.into(),
            source_offset: 120,
            cache_offset: 100,
            commit_offset: 90,
            target_offset: 100,
            lag: 20,
            state: ferry_mirror::state::PartitionState::from_name(state).expect("a state name"),
            last_error: err.map(Into::into),
            rpo_seconds: 2.25,
            ..Default::default()
        }
    }

    #[test]
    fn partitions_table_is_aligned_with_the_documented_columns() {
        let text = partitions_text(&[
            part("orders", "orders", 0, "mirroring", None),
            part("orders", "orders", 1, "halted", Some("diverged at 5")),
        ]);
        assert_eq!(
            text,
            "TOPIC   PARTITION  SOURCE  CACHE  COMMIT  TARGET  LAG  RPO_S  STATE      LAST_ERROR\n\
             orders  0          120     100    90      100     20   2.2    mirroring  -\n\
             orders  1          120     100    90      100     20   2.2    halted     diverged at 5\n"
        );
        let text = partitions_text(&[part("orders", "dc-a.orders", 0, "paused", None)]);
        assert!(text.starts_with("TOPIC   PARTITION  TARGET_TOPIC  SOURCE"), "{text}");
        assert_eq!(partitions_text(&[]), "no partitions are mirrored by this process yet\n");
    }

    #[test]
    fn egress_table_shows_routes_and_the_pin() {
        let doc = EgressDoc {
            active: "backup".into(),
            pinned: true,
            expected_cluster_id: Some("cid-a".into()),
            routes: vec![
                RouteDoc {
                    name: "primary".into(),
                    brokers: vec!["10.0.0.1:7411".into()],
                    healthy: false,
                    consecutive_failures: 4,
                    stream_failures: 1,
                    last_error: Some("connection refused".into()),
                    ..Default::default()
                },
                RouteDoc {
                    name: "backup".into(),
                    brokers: vec!["10.9.0.1:7411".into()],
                    active: true,
                    healthy: true,
                    cluster_id: Some("cid-a".into()),
                    ..Default::default()
                },
            ],
        };
        let text = egress_text(&doc);
        assert!(text.starts_with("Active route:  backup (pinned by a manual switch;"), "{text}");
        assert!(text.contains("Pinned:        yes\nCluster id:    cid-a\n"), "{text}");
        assert!(text.ends_with(
            "NAME     ACTIVE  HEALTHY  FAILURES      CLUSTER_ID  BROKERS        LAST_ERROR\n\
             primary  no      no       4 (+1 fetch)  -           10.0.0.1:7411  connection refused\n\
             backup   yes     yes      0             cid-a       10.9.0.1:7411  -\n"
        ));
    }

    #[test]
    fn status_summary_names_the_essentials() {
        let s: StatusDoc = serde_json::from_value(json!({
            "mirror": "a_to_b", "source_cluster": "dc-a", "target_cluster": "dc-b", "uptime_seconds": 3725,
            "active_route": "primary", "pinned": false, "target_down": false,
            "rates": {"source": {"records_per_sec": {"1s": 1.0, "10s": 2500.0, "60s": 3.0},
                                 "bytes_per_sec": {"1s": 0.0, "10s": 1500000.0, "60s": 0.0}}},
            "totals": {"records_in": 10, "records_out": 9, "bytes_in": 2000000, "bytes_out": 1000000, "topics": 2,
                       "partitions": 5, "partitions_by_state": {"mirroring": 4, "paused": 1, "halted": 0}, "lag": 7,
                       "rpo_max_seconds": 12.345},
            "paused_topics": ["payments"]
        }))
        .unwrap();
        let text = status_text(&s, "127.0.0.1:9300");
        assert!(text.starts_with("Mirror:        a_to_b (dc-a -> dc-b) at 127.0.0.1:9300\nUptime:        1h 2m 5s\n"));
        assert!(text.contains("Source route:  primary (automatic)\nTarget:        reachable\n"), "{text}");
        assert!(text.contains("Topics:        2 mirrored, paused: payments\n"), "{text}");
        assert!(text.contains("Partitions:    5 (4 mirroring, 1 paused)\nLag:           7 records\n"), "{text}");
        assert!(text.contains("\nRPO:           12.3 s (the longest any record not yet on the target has waited)\n"));
        assert!(text.contains("Source rate:   2500 records/s, 1.50 MB/s (10s average)\n"), "{text}");
        assert!(text.ends_with("Since start:   10 records in, 9 out; 2.00 MB in, 1.00 MB out\n"), "{text}");
    }
}
