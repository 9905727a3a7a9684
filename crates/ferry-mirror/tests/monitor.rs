//! The Monitor over real HTTP: a `MirrorHandle` built in-process with known state (no brokers, except where a
//! healthy route needs a real one), the server on 127.0.0.1:0, and every answer checked for exact values and
//! against docs/openapi.yaml.

#[path = "monitor/openapi.rs"]
mod openapi;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ferry_mirror::config::{ClusterKind, HealthConfig, MonitorConfig, Route, Secret, SourceConfig, SwitchBack};
use ferry_mirror::egress::EgressHandle;
use ferry_mirror::events::{Details, DivergedFacts, Event, EventBus, EventKind};
use ferry_mirror::metrics::Metrics;
use ferry_mirror::state::{MeterClock, PartitionState, PartitionStatus, Shared, SideRates};
use ferry_mirror::target_watch::TargetHealth;
use ferry_mirror::{MirrorConfig, MirrorHandle, RunOptions, monitor};
use ferry_testkit::{deadline, reserve_port, wait_until};
use openapi::OpenApi;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "t0ken-for-tests-only";
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

static API: LazyLock<OpenApi> = LazyLock::new(OpenApi::load);

fn source_config(routes: &[(&str, String)], cluster_id: Option<&str>) -> SourceConfig {
    SourceConfig {
        cluster: "dc-a".into(),
        cluster_id: cluster_id.map(str::to_owned),
        kind: ClusterKind::Ferry,
        token_file: None,
        token: None,
        tls: None,
        routes: routes
            .iter()
            .map(|(name, addr)| Route { name: (*name).to_owned(), brokers: vec![addr.clone()], bind: None })
            .collect(),
        health: HealthConfig {
            check_interval: PROBE_INTERVAL,
            timeout: Duration::from_millis(500),
            failure_threshold: 3,
            switch_after: Duration::from_secs(60),
            switch_back: SwitchBack::Manual,
            min_switch_interval: Duration::from_secs(60),
        },
        kafka: Default::default(),
    }
}

/// Two routes to loopback ports nothing listens on: never probed here, so both stay unhealthy.
fn unused_routes() -> SourceConfig {
    let a = format!("127.0.0.1:{}", reserve_port().unwrap());
    let b = format!("127.0.0.1:{}", reserve_port().unwrap());
    source_config(&[("primary", a), ("backup", b)], Some("dc-a"))
}

fn build_handle(source: &SourceConfig) -> MirrorHandle {
    let metrics = Metrics::new();
    let events = EventBus::new(metrics.clone());
    let egress =
        EgressHandle::new(source, &ferry_mirror::egress::ferry_routes(source, false), None, events.clone()).unwrap();
    MirrorHandle {
        name: "dc-a_to_dc-b".into(),
        source_cluster: "dc-a".into(),
        target_cluster: "dc-b".into(),
        // The rate meters run on a clock moved by hand (second 0 here; see `populate`), so the rates are exact.
        shared: Arc::new({
            let clock = MeterClock::Manual(Arc::new(AtomicU64::new(0)));
            Shared {
                source_rates: SideRates::with_clock(clock.clone()),
                target_rates: SideRates::with_clock(clock),
                ..Shared::default()
            }
        }),
        egress,
        events,
        metrics,
        links: Arc::new(dashmap::DashMap::new()),
        target_health: Arc::new(TargetHealth::default()),
    }
}

#[allow(clippy::too_many_arguments)]
fn add_partition(
    h: &MirrorHandle,
    topic: &str,
    partition: u32,
    log: (u64, u64),
    cache: u64,
    commit: u64,
    target: u64,
    state: PartitionState,
) -> Arc<PartitionStatus> {
    let s = Arc::new(PartitionStatus::new(topic, topic, partition));
    s.set_source(log.0, log.1);
    s.set_cache(cache);
    s.set_commit(commit);
    s.set_target(target);
    s.set_state(state);
    h.shared.partitions.insert(ferry_mirror::tp::SourceTp::new(topic, partition), Arc::clone(&s));
    s
}

/// orders/0 lag 100, orders/1 lag 500, orders/2 paused lag 0, payments/0 halted lag 30: total 630.
fn populate(h: &MirrorHandle) {
    {
        let mut topics = h.shared.topics.lock();
        topics.insert("orders".into(), "orders".into());
        topics.insert("payments".into(), "payments".into());
    }
    add_partition(h, "orders", 0, (0, 1000), 900, 850, 900, PartitionState::Mirroring).set_latency_ms(42);
    add_partition(h, "orders", 1, (100, 2000), 1500, 1400, 1500, PartitionState::Mirroring);
    add_partition(h, "orders", 2, (0, 300), 300, 300, 300, PartitionState::Paused);
    add_partition(h, "payments", 0, (0, 50), 20, 20, 20, PartitionState::Mirroring)
        .halt("diverged at offset 20: the source reused offsets");
    h.shared.source_rates.add(600, 60_000);
    h.shared.target_rates.add(540, 54_000);
    // The second of the additions is complete: the 1 s, 10 s and 60 s windows hold 600 / 1, / 10 and / 60 source
    // records a second (540 on the target) for as long as the test runs.
    set_meter_second(h, 1);
    h.events.emit(Event::new(EventKind::AddTopic, "orders is mirrored").topic("orders"));
    h.events.emit(
        Event::new(EventKind::PartitionDiverged, "payments/0 diverged at offset 20").partition("payments", 0).with(
            Details::Diverged(DivergedFacts {
                offset: 20,
                cache_offset: 25,
                reason: "the target holds different data".into(),
                policy: "halt".into(),
            }),
        ),
    );
}

/// Moves the manual clock of the handle's rate meters to `second`.
fn set_meter_second(h: &MirrorHandle, second: u64) {
    match h.shared.source_rates.records.clock() {
        MeterClock::Manual(s) => s.store(second, Ordering::Relaxed),
        MeterClock::Since(_) => panic!("the test handle's meters run on a manual clock"),
    }
}

struct Monitor {
    addr: SocketAddr,
    base: String,
    handle: MirrorHandle,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    async fn start(handle: MirrorHandle, token: Option<&str>) -> Monitor {
        let dir = tempfile::tempdir().unwrap();
        let config = MonitorConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            token_file: None,
            token: token.map(Secret::new),
            tls: None,
            audit_log: Some(dir.path().join("audit.log")),
        };
        let shutdown = CancellationToken::new();
        let (addr, task) = monitor::start(handle.clone(), &config, shutdown.clone()).await.unwrap();
        assert!(addr.ip().is_loopback() && addr.port() != 0, "bound {addr}");
        Monitor { addr, base: format!("http://{addr}"), handle, dir, shutdown, task }
    }

    fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    fn audit(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).expect("audit lines are JSON")).collect()
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap()
}

struct Answer {
    status: u16,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// Asserts the answer matches docs/openapi.yaml for the operation, and returns its JSON.
    fn checked(&self, method: &str, template: &str) -> Value {
        let body = self.json();
        API.check(method, template, self.status, &self.content_type, &body);
        body
    }

    /// Asserts an error answer: status, code, and the shape of every error.
    fn error(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text);
        assert!(self.content_type.starts_with("application/json"), "{}", self.content_type);
        let body = self.json();
        API.check_component("Error", &body);
        assert_eq!(body["code"], code, "{body}");
        body
    }
}

async fn call(method: &str, url: &str, auth: Option<&str>, body: Option<String>) -> Answer {
    let mut req = client().request(method.parse().unwrap(), url);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let r = req.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = r.status().as_u16();
    let content_type = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    Answer { status, content_type, text: r.text().await.unwrap() }
}

async fn get(m: &Monitor, path: &str) -> Answer {
    call("GET", &format!("{}{path}", m.base), None, None).await
}

async fn post(m: &Monitor, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    call("POST", &format!("{}{path}", m.base), auth.as_deref(), body.map(|b| b.to_string())).await
}

fn partition_json(
    topic: &str,
    p: u32,
    log: (u64, u64),
    offsets: (u64, u64, u64),
    state: &str,
    error: Option<&str>,
    latency: u64,
) -> Value {
    json!({"topic": topic, "partition": p, "target_topic": topic, "source_offset": log.1,
           "source_log_start_offset": log.0, "cache_offset": offsets.0, "commit_offset": offsets.1,
           "target_offset": offsets.2, "lag": log.1 - offsets.0, "state": state, "last_error": error,
           "latency_ms": latency})
}

fn expected_partitions() -> Vec<Value> {
    vec![
        partition_json("orders", 0, (0, 1000), (900, 850, 900), "mirroring", None, 42),
        partition_json("orders", 1, (100, 2000), (1500, 1400, 1500), "mirroring", None, 0),
        partition_json("orders", 2, (0, 300), (300, 300, 300), "paused", None, 0),
        partition_json(
            "payments",
            0,
            (0, 50),
            (20, 20, 20),
            "halted",
            Some("diverged at offset 20: the source reused offsets"),
            0,
        ),
    ]
}

#[tokio::test]
async fn read_endpoints_report_the_exact_state() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;

    let a = get(&m, "/healthz").await;
    assert_eq!((a.status, a.checked("get", "/healthz")), (200, json!({"status": "ok"})));

    // Partitions: exact offsets, lag = source - cache, sorted by topic and partition.
    let a = get(&m, "/api/v1/partitions").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.checked("get", "/api/v1/partitions"), json!({"partitions": expected_partitions()}));
    let a = get(&m, "/api/v1/partitions?topic=payments").await;
    assert_eq!(a.checked("get", "/api/v1/partitions"), json!({"partitions": [expected_partitions()[3]]}));
    let a = get(&m, "/api/v1/partitions?topic=nope").await;
    a.checked("get", "/api/v1/partitions");
    assert!(a.error(404, "unknown_topic")["reason"].as_str().unwrap().contains("\"nope\""));

    // Topics: sums per source topic and the state summary.
    let a = get(&m, "/api/v1/topics").await;
    assert_eq!(a.status, 200);
    let states = |st: u64, mi: u64, sl: u64, pa: u64, ha: u64| json!({"starting": st, "mirroring": mi, "stalled": sl, "paused": pa, "halted": ha});
    assert_eq!(
        a.checked("get", "/api/v1/topics"),
        json!({"topics": [
            {"topic": "orders", "target_topic": "orders", "partitions": 3, "lag": 600, "source_offset": 3300,
             "cache_offset": 2700, "commit_offset": 2550, "target_offset": 2700, "states": states(0, 2, 0, 1, 0),
             "paused": false},
            {"topic": "payments", "target_topic": "payments", "partitions": 1, "lag": 30, "source_offset": 50,
             "cache_offset": 20, "commit_offset": 20, "target_offset": 20, "states": states(0, 0, 0, 0, 1),
             "paused": false},
        ]})
    );

    // Status: identity, route, totals; rates once the second of the additions is complete.
    let a = get(&m, "/api/v1/status").await;
    assert_eq!(a.status, 200);
    let s = a.checked("get", "/api/v1/status");
    assert_eq!(
        (&s["mirror"], &s["source_cluster"], &s["target_cluster"], &s["active_route"], &s["pinned"]),
        (&json!("dc-a_to_dc-b"), &json!("dc-a"), &json!("dc-b"), &json!("primary"), &json!(false))
    );
    assert_eq!(s["target_down"], false);
    assert_eq!(
        s["totals"],
        json!({"records_in": 600, "bytes_in": 60000, "records_out": 540, "bytes_out": 54000, "topics": 2,
               "partitions": 4, "partitions_by_state": states(0, 2, 0, 1, 1), "lag": 630})
    );
    assert_eq!(s["paused_topics"], json!([]));
    // The meters count complete seconds only; the second of the additions is complete (`populate`).
    assert_eq!(
        s["rates"],
        json!({
            "source": {"records_per_sec": {"1s": 600.0, "10s": 60.0, "60s": 10.0},
                       "bytes_per_sec": {"1s": 60000.0, "10s": 6000.0, "60s": 1000.0}},
            "target": {"records_per_sec": {"1s": 540.0, "10s": 54.0, "60s": 9.0},
                       "bytes_per_sec": {"1s": 54000.0, "10s": 5400.0, "60s": 900.0}},
        })
    );
    // A second later the 1 s window is empty and the longer ones still hold the records.
    set_meter_second(&m.handle, 2);
    let s = get(&m, "/api/v1/status").await.checked("get", "/api/v1/status");
    assert_eq!(s["rates"]["source"]["records_per_sec"], json!({"1s": 0.0, "10s": 60.0, "60s": 10.0}));
    assert_eq!(s["rates"]["target"]["bytes_per_sec"], json!({"1s": 0.0, "10s": 5400.0, "60s": 900.0}));

    // Egress: both routes, never probed, the first active.
    let a = get(&m, "/api/v1/egress").await;
    assert_eq!(a.status, 200);
    let e = a.checked("get", "/api/v1/egress");
    assert_eq!(
        (&e["active"], &e["pinned"], &e["expected_cluster_id"]),
        (&json!("primary"), &json!(false), &json!("dc-a"))
    );
    let names: Vec<(&Value, &Value, &Value)> =
        e["routes"].as_array().unwrap().iter().map(|r| (&r["name"], &r["active"], &r["healthy"])).collect();
    assert_eq!(
        names,
        [(&json!("primary"), &json!(true), &json!(false)), (&json!("backup"), &json!(false), &json!(false))]
    );

    // Events: newest first, with the severity of the shipped rules; limit applies.
    let a = get(&m, "/api/v1/events").await;
    assert_eq!(a.status, 200);
    let ev = a.checked("get", "/api/v1/events");
    let kinds: Vec<&Value> = ev["events"].as_array().unwrap().iter().map(|e| &e["kind"]).collect();
    assert_eq!(kinds, [&json!("partition_diverged"), &json!("add_topic")]);
    assert_eq!(ev["events"][0]["severity"], "critical");
    assert_eq!((&ev["events"][0]["topic"], &ev["events"][0]["partition"]), (&json!("payments"), &json!(0)));
    assert_eq!(
        ev["events"][0]["details"],
        json!({"offset": 20, "cache_offset": 25, "reason": "the target holds different data", "policy": "halt"})
    );
    let a = get(&m, "/api/v1/events?limit=1").await;
    assert_eq!(a.checked("get", "/api/v1/events")["events"].as_array().unwrap().len(), 1);
    let a = get(&m, "/api/v1/events?limit=lots").await;
    a.checked("get", "/api/v1/events");
    a.error(400, "bad_request");

    // Readiness: the route was never probed healthy and payments/0 is halted.
    let a = get(&m, "/readyz").await;
    assert_eq!(a.status, 503);
    let r = a.checked("get", "/readyz");
    assert_eq!(r["ready"], false);
    assert_eq!(r["reasons"], json!(["partition_halted", "route_unhealthy"]));
    let halted = r["details"].as_array().unwrap().iter().find(|d| d["reason"] == "partition_halted").unwrap();
    assert_eq!((&halted["topic"], &halted["partition"]), (&json!("payments"), &json!(0)));

    // The dashboard is the compiled-in page with the ids the browser test reads.
    let a = get(&m, "/").await;
    assert_eq!(a.status, 200);
    API.check_media("get", "/", 200, &a.content_type);
    for id in ["source-rate", "target-rate", "total-lag", "active-route", "rate-chart", "partitions", "events"] {
        assert!(a.text.contains(&format!("id=\"{id}\"")), "dashboard lacks id {id}");
    }
}

#[tokio::test]
async fn mutating_calls_need_the_token_and_are_audited() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h.clone(), Some(TOKEN)).await;
    let switch = |route: &str, force: bool| Some(json!({"route": route, "force": force}));

    // No token, wrong token, wrong scheme: 401, nothing changes.
    let a = post(&m, "/api/v1/egress/switch", None, switch("backup", true)).await;
    a.checked("post", "/api/v1/egress/switch");
    a.error(401, "unauthorized");
    post(&m, "/api/v1/egress/switch", Some("not-the-token"), switch("backup", true)).await.error(401, "unauthorized");
    let basic =
        call("POST", &format!("{}/api/v1/topics/orders/pause", m.base), Some(&format!("Basic {TOKEN}")), None).await;
    basic.error(401, "unauthorized");
    assert_eq!(h.egress.active().name, "primary");
    assert!(!h.shared.is_paused("orders"));

    // Right token: unknown route 404, unhealthy route 409 without force, 200 and pinned with force.
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), switch("nowhere", false)).await;
    a.checked("post", "/api/v1/egress/switch");
    assert!(a.error(404, "unknown_route")["reason"].as_str().unwrap().contains("primary, backup"));
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), switch("backup", false)).await;
    a.checked("post", "/api/v1/egress/switch");
    a.error(409, "route_unhealthy");
    assert_eq!(h.egress.active().name, "primary");
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), switch("backup", true)).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let e = a.checked("post", "/api/v1/egress/switch");
    assert_eq!((&e["active"], &e["pinned"]), (&json!("backup"), &json!(true)));
    assert_eq!(h.egress.active().name, "backup");
    let switched = h.events.recent().last().unwrap().clone();
    assert_eq!(switched.kind, EventKind::SourceNetBeSwitched);
    assert_eq!(switched.details.value("from"), "primary");

    // Unpin: automatic switching applies again (no route is healthy, so it stays where it is).
    let a = post(&m, "/api/v1/egress/unpin", Some(TOKEN), None).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.checked("post", "/api/v1/egress/unpin")["pinned"], false);

    // Pause and resume: unknown topic 404; a mirrored one is paused, shown in the status, then resumed.
    let a = post(&m, "/api/v1/topics/nope/pause", Some(TOKEN), None).await;
    a.checked("post", "/api/v1/topics/{topic}/pause");
    a.error(404, "unknown_topic");
    post(&m, "/api/v1/topics/nope/resume", Some(TOKEN), None).await.error(404, "unknown_topic");
    let a = post(&m, "/api/v1/topics/orders/pause", Some(TOKEN), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.checked("post", "/api/v1/topics/{topic}/pause"), json!({"topic": "orders", "paused": true}));
    let s = get(&m, "/api/v1/status").await.checked("get", "/api/v1/status");
    assert_eq!(s["paused_topics"], json!(["orders"]));
    let t = get(&m, "/api/v1/topics").await.checked("get", "/api/v1/topics");
    assert_eq!(t["topics"][0]["paused"], true);
    let a = post(&m, "/api/v1/topics/orders/resume", Some(TOKEN), None).await;
    assert_eq!(a.checked("post", "/api/v1/topics/{topic}/resume"), json!({"topic": "orders", "paused": false}));
    assert!(!h.shared.is_paused("orders"));

    // One more call over a raw socket, so the audited peer can be compared with a known local address.
    let mut tcp = tokio::net::TcpStream::connect(m.addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let req = format!(
        "POST /api/v1/egress/unpin HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n",
        m.addr
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");

    // The audit log: one JSON line per mutating call, in order, with the outcome; never the token.
    let text = std::fs::read_to_string(m.audit_path()).unwrap();
    assert!(!text.contains(TOKEN), "the audit log must not contain the token");
    let lines = m.audit();
    let got: Vec<(String, String, String, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["action"].as_str().unwrap().to_owned(),
                l["path"].as_str().unwrap().to_owned(),
                l["outcome"].as_str().unwrap().to_owned(),
                l["status"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("egress.switch", "/api/v1/egress/switch", "unauthorized", 401),
        ("egress.switch", "/api/v1/egress/switch", "unauthorized", 401),
        ("topic.pause", "/api/v1/topics/orders/pause", "unauthorized", 401),
        ("egress.switch", "/api/v1/egress/switch", "unknown_route", 404),
        ("egress.switch", "/api/v1/egress/switch", "route_unhealthy", 409),
        ("egress.switch", "/api/v1/egress/switch", "ok", 200),
        ("egress.unpin", "/api/v1/egress/unpin", "ok", 200),
        ("topic.pause", "/api/v1/topics/nope/pause", "unknown_topic", 404),
        ("topic.resume", "/api/v1/topics/nope/resume", "unknown_topic", 404),
        ("topic.pause", "/api/v1/topics/orders/pause", "ok", 200),
        ("topic.resume", "/api/v1/topics/orders/resume", "ok", 200),
        ("egress.unpin", "/api/v1/egress/unpin", "ok", 200),
    ];
    let want: Vec<(String, String, String, u64)> =
        want.iter().map(|(a, p, o, s)| ((*a).into(), (*p).into(), (*o).into(), *s)).collect();
    assert_eq!(got, want);
    for l in &lines {
        assert_eq!(l["method"], "POST");
        let peer: SocketAddr = l["peer"].as_str().unwrap().parse().expect("peer is ip:port");
        assert!(peer.ip().is_loopback(), "{peer}");
        assert!(humantime::parse_rfc3339(l["timestamp"].as_str().unwrap()).is_ok(), "{l}");
    }
    assert_eq!(lines.last().unwrap()["peer"], local.to_string());
    assert_eq!(lines[5]["detail"], json!({"route": "backup", "force": true}));
    assert_eq!(lines[9]["detail"], json!({"topic": "orders"}));
    assert_eq!(lines[0]["detail"], Value::Null);
}

#[tokio::test]
async fn without_a_configured_token_every_mutation_is_refused_with_a_hint() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h.clone(), None).await;
    for (path, body) in [
        ("/api/v1/egress/switch", Some(json!({"route": "backup", "force": true}))),
        ("/api/v1/egress/unpin", None),
        ("/api/v1/topics/orders/pause", None),
        ("/api/v1/topics/orders/resume", None),
    ] {
        // Even a request that carries some bearer token.
        let a = post(&m, path, Some(""), body).await;
        let reason = a.error(401, "unauthorized")["reason"].as_str().unwrap().to_owned();
        assert!(reason.contains("FERRY_MONITOR_TOKEN") && reason.contains("monitor.token_file"), "{reason}");
    }
    assert_eq!(h.egress.active().name, "primary");
    assert!(!h.shared.is_paused("orders"));
    assert_eq!(m.audit().len(), 4);
    // Reads need no token.
    assert_eq!(get(&m, "/api/v1/status").await.status, 200);
}

#[tokio::test]
async fn every_error_has_the_code_and_reason_shape() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;

    let a = get(&m, "/api/v2/nothing").await;
    assert!(a.error(404, "not_found")["reason"].as_str().unwrap().contains("/api/v2/nothing"));
    get(&m, "/api/v1/topics/orders").await.error(404, "not_found");
    // Wrong method on a known path, read or write.
    call("DELETE", &format!("{}/healthz", m.base), None, None).await.error(405, "method_not_allowed");
    get(&m, "/api/v1/egress/switch").await.error(405, "method_not_allowed");
    post(&m, "/api/v1/status", Some(TOKEN), None).await.error(405, "method_not_allowed");

    // Oversized body: 413 (after the token check), and nothing switched.
    let big = json!({"route": "x".repeat(20 * 1024), "force": true});
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), Some(big)).await;
    a.checked("post", "/api/v1/egress/switch");
    assert!(a.error(413, "payload_too_large")["reason"].as_str().unwrap().contains("16384"));

    // Malformed bodies: 400.
    for body in ["{\"route\": ", "{\"route\": 5}", "{\"route\": \"backup\", \"forse\": true}", ""] {
        let a = call(
            "POST",
            &format!("{}/api/v1/egress/switch", m.base),
            Some(&format!("Bearer {TOKEN}")),
            Some(body.to_owned()),
        )
        .await;
        a.checked("post", "/api/v1/egress/switch");
        a.error(400, "bad_request");
    }
    let outcomes: Vec<Value> = m.audit().iter().map(|l| l["outcome"].clone()).collect();
    assert_eq!(
        outcomes,
        [
            json!("payload_too_large"),
            json!("bad_request"),
            json!("bad_request"),
            json!("bad_request"),
            json!("bad_request")
        ]
    );
    assert_eq!(m.handle.egress.active().name, "primary");
}

#[tokio::test]
async fn openapi_documents_exactly_the_served_endpoints() {
    let served: BTreeSet<(String, String)> = [
        ("get", "/"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/api/v1/status"),
        ("get", "/api/v1/partitions"),
        ("get", "/api/v1/topics"),
        ("get", "/api/v1/egress"),
        ("get", "/api/v1/events"),
        ("post", "/api/v1/egress/switch"),
        ("post", "/api/v1/egress/unpin"),
        ("post", "/api/v1/topics/{topic}/pause"),
        ("post", "/api/v1/topics/{topic}/resume"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    let documented: BTreeSet<(String, String)> = API.operations().into_iter().collect();
    assert_eq!(documented, served);

    // Every documented path answers (no 404 not_found), so the list above is the router's.
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;
    for (method, path) in &served {
        let path = path.replace("{topic}", "orders");
        let a = call(&method.to_uppercase(), &format!("{}{path}", m.base), None, None).await;
        assert!(a.status != 404 && a.status != 405, "{method} {path}: {} {}", a.status, a.text);
    }

    // Every error code of the implementation is in the documented enum.
    let codes = [
        "bad_request",
        "unauthorized",
        "not_found",
        "unknown_route",
        "unknown_topic",
        "method_not_allowed",
        "route_unhealthy",
        "payload_too_large",
    ];
    for code in codes {
        API.check_component("Error", &json!({"code": code, "reason": "r"}));
    }
}

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
    for p in parts {
        let labels = format!("topic=\"{}\",partition=\"{}\"", p["topic"].as_str().unwrap(), p["partition"]);
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

    // The route gauges follow the Egress at scrape time: a manual switch shows at once, not a probe round later.
    m.handle.egress.switch("backup", true).unwrap();
    let s = samples(&get(&m, "/metrics").await.text);
    let value = |key: &str| s.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    assert_eq!(value("ferry_mirror_route_active{route=\"primary\"}"), Some(0.0));
    assert_eq!(value("ferry_mirror_route_active{route=\"backup\"}"), Some(1.0));
}

#[tokio::test]
async fn readyz_is_200_on_a_healthy_route_and_503_when_a_partition_halts() {
    // A real broker, so the egress probes (gRPC health + metadata, cluster id check) pass.
    let broker = ferry_testkit::BrokerProcess::builder().cluster_id("dc-a").start().await.unwrap_or_else(|e| {
        panic!("cannot start ferry-broker ({e}); build the binaries first: cargo build --workspace --bins")
    });
    let addr = broker.addr().to_string();
    let source = source_config(&[("primary", addr.clone()), ("backup", addr)], Some("dc-a"));
    let h = build_handle(&source);
    h.shared.topics.lock().insert("orders".into(), "orders".into());
    let p0 = add_partition(&h, "orders", 0, (0, 10), 10, 10, 10, PartitionState::Mirroring);
    add_partition(&h, "orders", 1, (0, 5), 3, 3, 3, PartitionState::Mirroring);
    let stop = CancellationToken::new();
    let probes = tokio::spawn(h.egress.clone().run(h.metrics.clone(), stop.clone()));
    let m = Monitor::start(h.clone(), Some(TOKEN)).await;

    let within = deadline(&[PROBE_INTERVAL, Duration::from_millis(500)]);
    let mut last = None;
    wait_until("both routes to pass their probes", within.max(Duration::from_secs(10)), async || {
        let v = h.egress.view();
        let ok = v.routes.iter().all(|r| r.healthy);
        last = Some(v);
        ok
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {last:?}"));

    let a = get(&m, "/readyz").await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.checked("get", "/readyz"), json!({"ready": true, "reasons": [], "details": []}));

    // A switch to a healthy route needs no force; it pins.
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), Some(json!({"route": "backup"}))).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let e = a.checked("post", "/api/v1/egress/switch");
    assert_eq!((&e["active"], &e["pinned"]), (&json!("backup"), &json!(true)));
    assert_eq!(e["routes"][1]["cluster_id"], "dc-a");

    p0.halt("diverged at offset 7");
    let a = get(&m, "/readyz").await;
    assert_eq!(a.status, 503);
    let r = a.checked("get", "/readyz");
    assert_eq!(r["reasons"], json!(["partition_halted"]));
    assert_eq!(r["details"][0]["message"], "partition orders/0 is halted: diverged at offset 7");

    p0.set_state(PartitionState::Mirroring);
    h.target_health.failure(&h.events, "connection refused");
    h.target_health.failure(&h.events, "connection refused");
    h.target_health.failure(&h.events, "connection refused");
    let a = get(&m, "/readyz").await;
    assert_eq!((a.status, &a.checked("get", "/readyz")["reasons"]), (503, &json!(["target_down"])));
    assert_eq!(get(&m, "/api/v1/status").await.checked("get", "/api/v1/status")["target_down"], true);

    stop.cancel();
    probes.await.unwrap();
}

#[tokio::test]
async fn tls_serves_https_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let h = build_handle(&unused_routes());
    populate(&h);
    let config = MonitorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token_file: None,
        token: Some(Secret::new(TOKEN)),
        tls: Some((cert_path.clone(), key_path.clone())),
        audit_log: None,
    };
    let shutdown = CancellationToken::new();
    let (addr, task) = monitor::start(h.clone(), &config, shutdown.clone()).await.unwrap();

    let trusted = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let r = trusted.get(format!("https://{addr}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    let r = trusted.post(format!("https://{addr}/api/v1/topics/orders/pause")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(h.shared.is_paused("orders"));

    // Plain HTTP to the TLS port gets no HTTP answer; an untrusted certificate is refused by the client.
    assert!(client().get(format!("http://{addr}/healthz")).send().await.is_err());
    assert!(client().get(format!("https://{addr}/healthz")).send().await.is_err());

    // Bad files: a clear error naming the file.
    let bad = MonitorConfig { tls: Some((key_path.clone(), key_path.clone())), ..config.clone() };
    let e = monitor::start(h.clone(), &bad, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(e.contains("key.pem") && e.contains("BEGIN CERTIFICATE"), "{e}");
    let missing = MonitorConfig { tls: Some((dir.path().join("none.pem"), key_path)), ..config };
    let e = monitor::start(h, &missing, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(e.contains("none.pem"), "{e}");

    shutdown.cancel();
    tokio::time::timeout(monitor::SHUTDOWN_GRACE * 3, task).await.expect("the server stops on shutdown").unwrap();
}

#[tokio::test]
async fn server_stops_on_shutdown_and_a_taken_port_is_a_clear_error() {
    let h = build_handle(&unused_routes());
    let m = Monitor::start(h.clone(), Some(TOKEN)).await;
    assert_eq!(get(&m, "/healthz").await.status, 200);

    let taken = MonitorConfig { listen: m.addr, token_file: None, token: None, tls: None, audit_log: None };
    let e = monitor::start(h, &taken, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(e.contains(&m.addr.to_string()) && e.contains("monitor.listen"), "{e}");

    m.shutdown.cancel();
    tokio::time::timeout(monitor::SHUTDOWN_GRACE * 3, m.task).await.expect("the server stops on shutdown").unwrap();
    assert!(client().get(format!("{}/healthz", m.base)).send().await.is_err(), "still serving after shutdown");
}

#[tokio::test]
async fn bootstrap_writes_the_bound_monitor_address_and_serves_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (reserve_port().unwrap(), reserve_port().unwrap());
    let config = MirrorConfig::from_toml(
        &format!(
            "[source]\ncluster = \"dc-a\"\n[[source.routes]]\nname = \"primary\"\nbrokers = [\"127.0.0.1:{source}\"]\n\
             [target]\ncluster = \"dc-b\"\nbrokers = [\"127.0.0.1:{target}\"]\n[topics]\ninclude = [\"^orders$\"]\n\
             [monitor]\nlisten = \"127.0.0.1:0\"\naudit_log = \"{}\"\n",
            dir.path().join("audit.log").display()
        ),
        false,
    )
    .unwrap();
    let addr_file = dir.path().join("addr");
    let shutdown = CancellationToken::new();
    let options = RunOptions { addr_file: Some(addr_file.clone()), ..Default::default() };
    let run = tokio::spawn(ferry_mirror::run(config, options, shutdown.clone()));

    let mut addr: Option<SocketAddr> = None;
    wait_until("the monitor address file", Duration::from_secs(30), async || {
        addr = std::fs::read_to_string(&addr_file).ok().and_then(|s| s.trim().parse().ok());
        addr.is_some()
    })
    .await
    .unwrap();
    let addr = addr.unwrap();
    assert_ne!(addr.port(), 0, "the bound port, not the configured 0");
    let r = client().get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Neither side is reachable: not ready, because the route is unhealthy.
    let r = client().get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), run).await.expect("run returns after shutdown");
    result.unwrap().unwrap();
    assert!(client().get(format!("http://{addr}/healthz")).send().await.is_err(), "monitor still serving");
}

fn chromium() -> PathBuf {
    let candidates = std::env::var_os("FERRY_CHROMIUM")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/bin/chromium", "/usr/bin/chromium-browser"].map(PathBuf::from));
    for c in candidates {
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "headless Chromium is needed for the dashboard test and was not found at /usr/bin/chromium: install it with \
         `apt-get install -y chromium` (scripts/test.sh does this), or set FERRY_CHROMIUM to its path"
    );
}

async fn run_chromium(args: &[String], profile: &Path) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-proxy-server",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("chromium finishes within 120 s")
        .expect("chromium runs")
}

/// The text of the first element whose opening tag contains `marker`.
fn element_text<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom.find(marker).unwrap_or_else(|| panic!("no element with {marker} in the DOM:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap();
    &rest[start..start + end]
}

#[tokio::test]
async fn dashboard_shows_the_live_numbers_in_headless_chromium() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;
    let profile = tempfile::tempdir().unwrap();
    let url = format!("{}/", m.base);

    let out =
        run_chromium(&["--virtual-time-budget=5000".into(), "--dump-dom".into(), url.clone()], profile.path()).await;
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "chromium failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));

    // The numbers come from the API after the scripts ran (the page ships "–" placeholders).
    assert_eq!(element_text(&dom, "id=\"total-lag\""), "630");
    assert_eq!(element_text(&dom, "id=\"active-route\""), "primary");
    assert_eq!(element_text(&dom, "id=\"mirror-name\""), "dc-a_to_dc-b");
    assert_eq!(element_text(&dom, "id=\"partition-count\""), "4");
    assert_eq!(element_text(&dom, "id=\"records-in\""), "600");
    assert_eq!(element_text(&dom, "class=\"num lag\" data-topic=\"orders\""), "600");
    assert_eq!(element_text(&dom, "class=\"num lag\" data-topic=\"payments\""), "30");
    assert!(element_text(&dom, "id=\"ready\"").starts_with("not ready: partition_halted"), "{dom}");
    assert!(dom.contains("data-topic=\"payments\" data-partition=\"0\""), "partition table row");
    assert!(dom.contains("data-kind=\"partition_diverged\""), "recent events");
    assert!(dom.contains("data-route=\"backup\""), "route table");
    // The 1 s rates and 10 s averages of the seeded second (`populate`), with one decimal.
    assert_eq!(element_text(&dom, "id=\"source-rate\""), "600.0");
    assert_eq!(element_text(&dom, "id=\"source-rate-10s\""), "60.0");
    assert_eq!(element_text(&dom, "id=\"target-rate\""), "540.0");
    assert_eq!(element_text(&dom, "id=\"target-rate-10s\""), "54.0");
    assert_eq!(element_text(&dom, "id=\"source-bytes-rate\""), "60000.0");
    assert_eq!(element_text(&dom, "id=\"target-bytes-rate\""), "54000.0");

    let shot = m.dir.path().join("dashboard.png");
    let out = run_chromium(
        &[
            "--virtual-time-budget=5000".into(),
            "--hide-scrollbars".into(),
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,900".into(),
            url,
        ],
        profile.path(),
    )
    .await;
    assert!(out.status.success(), "chromium screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "a real PNG, {} bytes", png.len());
    if let Some(copy) = std::env::var_os("FERRY_DASHBOARD_SCREENSHOT") {
        std::fs::copy(&shot, copy).unwrap();
    }
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
    let m = Monitor::start(h, Some(TOKEN)).await;
    let served = served_series(&get(&m, "/metrics").await.text);

    let dashboard = dashboard_queries();
    let rules = rule_queries();
    assert_eq!((dashboard.len(), rules.len()), (16, 8), "{dashboard:#?}\n{rules:#?}");
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
    ] {
        assert!(all.contains(name), "the dashboard does not show {name}");
    }
    // Counters the rules take increase() of are served before their first increment, or the first one is lost.
    for (name, label, value) in [
        ("ferry_mirror_events_total", "event", "partition_diverged"),
        ("ferry_alarms_total", "outcome", "failed"),
        ("ferry_alarms_total", "outcome", "dropped"),
    ] {
        assert!(
            served[name].iter().any(|s| s.get(label).map(String::as_str) == Some(value)),
            "{name}{{{label}=\"{value}\"}} is not served at 0"
        );
    }
}
