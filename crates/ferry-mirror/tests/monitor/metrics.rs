//! The Prometheus exposition: the contract metric names and values, agreement with `/api/v1/partitions`, and
//! the queries of the shipped Grafana dashboard and alert rules against the series actually served.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::harness::{API, Monitor, TOKEN, build_handle, get, populate, unused_routes};

/// This process's user + system CPU time in clock ticks, from `/proc/self/stat` (fields 14 and 15, counted after
/// the parenthesised command name).
fn own_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `getconf CLK_TCK`: the unit of `/proc/self/stat`'s CPU times.
fn clock_ticks_per_second() -> f64 {
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output().expect("getconf runs");
    String::from_utf8(out.stdout).unwrap().trim().parse().expect("CLK_TCK is a number")
}

/// Parses `name{labels} value` lines of an exposition into (name{labels}, value).
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(f64::NAN))))
        .collect()
}

#[tokio::test]
async fn metrics_use_the_contract_names_and_agree_with_partitions() {
    let h = build_handle(&unused_routes());
    populate(&h);
    h.metrics.received(600, 60_000);
    h.metrics.appended(540, 54_000, Some(0.042));
    h.metrics.route("primary", true, false);
    h.metrics.route("backup", false, false);
    h.metrics.alarm("ops", "sent");
    let m = Monitor::start(h, Some(TOKEN)).await;

    // The process gauges sample this test process (the monitor runs in it): its CPU time brackets the value.
    // Spin until the process has used a first tick, so that a gauge stuck at 0 cannot pass.
    while own_cpu_ticks() == 0 {}
    let cpu_before = own_cpu_ticks();
    let a = get(&m, "/metrics").await;
    let cpu_after = own_cpu_ticks();
    assert_eq!(a.status, 200);
    API.check_media("get", "/metrics", 200, &a.content_type);
    let text = &a.text;
    for name in [
        "ferry_mirror_partition_lag_records",
        "ferry_mirror_records_total",
        "ferry_mirror_bytes_total",
        "ferry_mirror_replication_latency_seconds",
        "ferry_mirror_route_active",
        "ferry_mirror_route_healthy",
        "ferry_alarms_total",
        "ferry_mirror_process_resident_memory_bytes",
        "ferry_mirror_process_cpu_seconds",
    ] {
        assert!(text.lines().any(|l| l.starts_with(name)), "no {name} in\n{text}");
    }
    let s = samples(text);
    let value = |key: &str| s.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    assert_eq!(value("ferry_mirror_records_total{direction=\"in\"}"), Some(600.0));
    assert_eq!(value("ferry_mirror_bytes_total{direction=\"out\"}"), Some(54000.0));
    assert_eq!(value("ferry_mirror_route_active{route=\"primary\"}"), Some(1.0));
    assert_eq!(value("ferry_mirror_route_healthy{route=\"backup\"}"), Some(0.0));
    assert_eq!(value("ferry_mirror_partitions{state=\"halted\"}"), Some(1.0));
    assert_eq!(value("ferry_mirror_partitions{state=\"mirroring\"}"), Some(2.0));
    assert!(value("ferry_mirror_process_resident_memory_bytes").unwrap() > 0.0);
    let exact_ticks = value("ferry_mirror_process_cpu_seconds").unwrap() * clock_ticks_per_second();
    let cpu_ticks = exact_ticks.round();
    assert!((exact_ticks - cpu_ticks).abs() < 1e-6, "whole clock ticks: {exact_ticks}");
    assert!(
        (cpu_before as f64..=cpu_after as f64).contains(&cpu_ticks),
        "CPU ticks {cpu_ticks}, the process's own reading {cpu_before}..={cpu_after}"
    );

    // The per-partition series agree with /api/v1/partitions, partition by partition.
    let parts = get(&m, "/api/v1/partitions").await.checked("get", "/api/v1/partitions");
    let parts = parts["partitions"].as_array().unwrap();
    let lag_series = s.iter().filter(|(k, _)| k.starts_with("ferry_mirror_partition_lag_records{")).count();
    assert_eq!(lag_series, parts.len());
    let mut rpo_max = 0.0f64;
    for p in parts {
        let labels = format!("topic=\"{}\",partition=\"{}\"", p["topic"].as_str().unwrap(), p["partition"]);
        // The RPO runs on: the scrape came first, so the partitions document reads at least as much.
        let rpo = value(&format!("ferry_mirror_rpo_seconds{{{labels}}}")).unwrap_or(f64::NAN);
        let later = p["rpo_seconds"].as_f64().unwrap();
        assert!((0.0..=later).contains(&rpo), "rpo of {labels}: {rpo} scraped, {later} after");
        if p["lag"] == 0 {
            assert_eq!(rpo, 0.0, "rpo of {labels} without lag");
        }
        rpo_max = rpo_max.max(rpo);
        assert_eq!(
            value(&format!("ferry_mirror_partition_lag_records{{{labels}}}")),
            p["lag"].as_f64(),
            "lag of {labels}"
        );
        for kind in ["source", "cache", "commit", "target"] {
            assert_eq!(
                value(&format!("ferry_mirror_partition_offset{{{labels},kind=\"{kind}\"}}")),
                p[format!("{kind}_offset")].as_f64(),
                "{kind} offset of {labels}"
            );
        }
    }

    assert_eq!(value("ferry_mirror_rpo_max_seconds"), Some(rpo_max));
    assert_eq!(value("ferry_mirror_verified_bytes_total"), Some(0.0));
    assert_eq!(value("ferry_mirror_verify_mismatch_total"), Some(0.0));

    // The route gauges follow the Egress at scrape time: a manual switch shows at once, not a probe round later.
    m.handle.egress.switch("backup", true).unwrap();
    let s = samples(&get(&m, "/metrics").await.text);
    let value = |key: &str| s.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    assert_eq!(value("ferry_mirror_route_active{route=\"primary\"}"), Some(0.0));
    assert_eq!(value("ferry_mirror_route_active{route=\"backup\"}"), Some(1.0));
}

/// The series of an exposition: metric name -> the label sets of its samples.
fn served_series(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let label = regex::Regex::new(r#"(\w+)="((?:[^"\\]|\\.)*)""#).unwrap();
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = match line[name_end..].strip_prefix('{') {
            Some(rest) => {
                let inner = &rest[..rest.find('}').expect("a closed label set")];
                label.captures_iter(inner).map(|c| (c[1].to_owned(), c[2].to_owned())).collect()
            }
            None => BTreeMap::new(),
        };
        out.entry(line[..name_end].to_owned()).or_default().push(labels);
    }
    out
}

/// Every PromQL query of the Grafana dashboard (panel `expr`s and templating `query`s).
fn dashboard_queries() -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr", Value::String(q)) => out.push(q.clone()),
                        ("query", Value::String(q)) if q.contains('(') => out.push(q.clone()),
                        ("query", Value::Object(o)) => {
                            if let Some(Value::String(q)) = o.get("query") {
                                out.push(q.clone());
                            }
                        }
                        _ => walk(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let path = ferry_testkit::workspace_root().join("alerts/grafana-dashboard.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    walk(&doc, &mut out);
    out
}

/// Every `expr` of the Prometheus alert rules.
fn rule_queries() -> Vec<String> {
    let path = ferry_testkit::workspace_root().join("alerts/prometheus-rules.yaml");
    let doc: Value = serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let groups = doc["groups"].as_array().expect("rule groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| r["expr"].as_str().expect("an expr").to_owned())
        .collect()
}

/// Checks one query against the served series: every `ferry_*` metric it names is served; every literal label
/// matcher (`label="v"`, `label=~"a|b"`) names a label value some sample of that metric has; every `by (...)` label
/// is a label of a metric in the query. `instance` and `job` are Prometheus' own target labels; `le` a histogram's.
fn check_query(query: &str, served: &BTreeMap<String, Vec<BTreeMap<String, String>>>) -> Vec<String> {
    let metric = regex::Regex::new(r"\bferry_[a-z0-9_]+\b").unwrap();
    let selector = regex::Regex::new(r"\b(ferry_[a-z0-9_]+)\s*\{([^}]*)\}").unwrap();
    let matcher = regex::Regex::new(r#"(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
    let by = regex::Regex::new(r"\b(?:by|on)\s*\(([^)]*)\)").unwrap();
    let own = |l: &str| matches!(l, "instance" | "job" | "le");
    let mut problems = Vec::new();
    let names: BTreeSet<&str> = metric.find_iter(query).map(|m| m.as_str()).collect();
    for name in &names {
        if !served.contains_key(*name) {
            problems.push(format!("{query}: {name} is not served"));
        }
    }
    for sel in selector.captures_iter(query) {
        let samples = served.get(&sel[1]).map(Vec::as_slice).unwrap_or_default();
        for m in matcher.captures_iter(&sel[2]) {
            let (label, op, value) = (&m[1], &m[2], &m[3]);
            if own(label) || op.starts_with('!') {
                continue;
            }
            let values: Vec<&str> = if op == "=~" { value.split('|').collect() } else { vec![value] };
            for v in values {
                if !samples.iter().any(|s| s.get(label).map(String::as_str) == Some(v)) {
                    problems.push(format!("{query}: no sample of {} has {label}=\"{v}\"", &sel[1]));
                }
            }
        }
    }
    for clause in by.captures_iter(query) {
        for label in clause[1].split(',').map(str::trim).filter(|l| !l.is_empty() && !own(l)) {
            let known = names.iter().any(|n| served.get(*n).is_some_and(|ss| ss.iter().any(|s| s.contains_key(label))));
            if !known {
                problems.push(format!("{query}: no metric of the query has the label {label:?}"));
            }
        }
    }
    problems
}

#[tokio::test]
async fn the_dashboard_and_the_alert_rules_query_only_series_the_monitor_serves() {
    // A handle as a running mirror has it: partitions in every state of the fixture, both routes, traffic in and
    // out with a latency, an alarm channel (its outcomes are exposed at 0 from its start, as the Alarmer does).
    let h = build_handle(&unused_routes());
    populate(&h);
    h.metrics.received(600, 60_000);
    h.metrics.appended(540, 54_000, Some(0.042));
    for outcome in ["sent", "failed", "suppressed", "dropped"] {
        h.metrics.alarm_by("ops", outcome, 0);
    }
    // Each lane exposes its lost-before-mirroring counter at 0 when it starts.
    h.metrics.lost_before_mirroring("orders", 0, 0);
    let m = Monitor::start(h, Some(TOKEN)).await;
    let served = served_series(&get(&m, "/metrics").await.text);

    let dashboard = dashboard_queries();
    let rules = rule_queries();
    assert_eq!((dashboard.len(), rules.len()), (21, 11), "{dashboard:#?}\n{rules:#?}");
    let problems: Vec<String> = dashboard.iter().chain(&rules).flat_map(|q| check_query(q, &served)).collect();
    assert!(problems.is_empty(), "{problems:#?}\nserved: {:#?}", served.keys().collect::<Vec<_>>());

    // The dashboard shows every contract metric (design §5).
    let all = dashboard.join("\n");
    for name in [
        "ferry_mirror_partition_lag_records",
        "ferry_mirror_records_total",
        "ferry_mirror_bytes_total",
        "ferry_mirror_replication_latency_seconds_bucket",
        "ferry_mirror_route_active",
        "ferry_mirror_route_healthy",
        "ferry_alarms_total",
        "ferry_mirror_rpo_seconds",
        "ferry_mirror_rpo_max_seconds",
        "ferry_mirror_verified_bytes_total",
        "ferry_mirror_verify_mismatch_total",
        "ferry_mirror_records_lost_before_mirroring_total",
    ] {
        assert!(all.contains(name), "the dashboard does not show {name}");
    }
    // Counters the rules take increase() of are served before their first increment, or the first one is lost.
    for (name, label, value) in [
        ("ferry_mirror_events_total", "event", "partition_diverged"),
        ("ferry_alarms_total", "outcome", "failed"),
        ("ferry_alarms_total", "outcome", "dropped"),
        ("ferry_mirror_records_lost_before_mirroring_total", "partition", "0"),
    ] {
        assert!(
            served[name].iter().any(|s| s.get(label).map(String::as_str) == Some(value)),
            "{name}{{{label}=\"{value}\"}} is not served at 0"
        );
    }
}
