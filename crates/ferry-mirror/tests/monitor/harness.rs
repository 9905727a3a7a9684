//! The fixture of the monitor tests: a `MirrorHandle` built in-process with known state (partitions, topics,
//! rates on a manual clock, events), the monitor server over it, and an HTTP client whose answers are checked
//! against docs/openapi.yaml.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ferry_mirror::config::{ClusterKind, HealthConfig, MonitorConfig, Route, Secret, SourceConfig, SwitchBack};
use ferry_mirror::egress::EgressHandle;
use ferry_mirror::events::{Details, DivergedFacts, Event, EventBus, EventKind};
use ferry_mirror::metrics::Metrics;
use ferry_mirror::state::{MeterClock, PartitionState, PartitionStatus, Shared, SideRates};
use ferry_mirror::target_watch::TargetHealth;
use ferry_mirror::{MirrorHandle, monitor};
use ferry_testkit::reserve_ports;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::openapi::OpenApi;

/// The monitor token of the tests.
pub const TOKEN: &str = "t0ken-for-tests-only";
/// The egress probe interval of the test handles.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// docs/openapi.yaml, loaded once.
pub static API: LazyLock<OpenApi> = LazyLock::new(OpenApi::load);

pub fn source_config(routes: &[(&str, String)], cluster_id: Option<&str>) -> SourceConfig {
    SourceConfig {
        cluster: "dc-a".into(),
        cluster_id: cluster_id.map(str::to_owned),
        kind: ClusterKind::Ferry,
        token_file: None,
        token: None,
        tls: None,
        routes: routes
            .iter()
            .map(|(name, addr)| Route {
                name: (*name).to_owned(),
                brokers: vec![addr.clone()],
                bind: None,
                listener: None,
            })
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
pub fn unused_routes() -> SourceConfig {
    let [a, b] = reserve_ports::<2>().unwrap();
    let (a, b) = (format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}"));
    source_config(&[("primary", a), ("backup", b)], Some("dc-a"))
}

pub fn build_handle(source: &SourceConfig) -> MirrorHandle {
    let metrics = Metrics::new();
    let events = EventBus::new(metrics.clone());
    let egress =
        EgressHandle::new(source, &ferry_mirror::egress::ferry_routes(source, false, 4 << 20), None, events.clone())
            .unwrap();
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
        links: Arc::new(ferry_mirror::sync::LinkMap::default()),
        target_health: Arc::new(TargetHealth::default()),
        failover: Default::default(),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn add_partition(
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
pub fn populate(h: &MirrorHandle) {
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
pub fn set_meter_second(h: &MirrorHandle, second: u64) {
    match h.shared.source_rates.records.clock() {
        MeterClock::Manual(s) => s.store(second, Ordering::Relaxed),
        MeterClock::Since(_) => panic!("the test handle's meters run on a manual clock"),
    }
}

/// A monitor server on 127.0.0.1:0 over a test handle, with its audit log in a temp dir.
pub struct Monitor {
    pub addr: SocketAddr,
    pub base: String,
    pub handle: MirrorHandle,
    pub dir: tempfile::TempDir,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    pub async fn start(handle: MirrorHandle, token: Option<&str>) -> Monitor {
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

    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    pub fn audit(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).expect("audit lines are JSON")).collect()
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap()
}

/// One HTTP answer: status, content type and body text.
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// Asserts the answer matches docs/openapi.yaml for the operation, and returns its JSON.
    pub fn checked(&self, method: &str, template: &str) -> Value {
        let body = self.json();
        API.check(method, template, self.status, &self.content_type, &body);
        body
    }

    /// Asserts an error answer: status, code, and the shape of every error.
    pub fn error(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text);
        assert!(self.content_type.starts_with("application/json"), "{}", self.content_type);
        let body = self.json();
        API.check_component("Error", &body);
        assert_eq!(body["code"], code, "{body}");
        body
    }
}

pub async fn call(method: &str, url: &str, auth: Option<&str>, body: Option<String>) -> Answer {
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

pub async fn get(m: &Monitor, path: &str) -> Answer {
    call("GET", &format!("{}{path}", m.base), None, None).await
}

pub async fn post(m: &Monitor, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    call("POST", &format!("{}{path}", m.base), auth.as_deref(), body.map(|b| b.to_string())).await
}

pub fn partition_json(
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
           "latency_ms": latency, "probed_source_offset": 0, "rpo_seconds": 0.0,
           "verify": {"enabled": false, "pass_start_offset": 0, "pass_end_offset": 0, "verified_to_offset": 0,
                      "passes_completed": 0, "last_pass_completed_ms": null, "mismatch": null}})
}

/// Checks the RPO figures of a document and sets them to 0, so the rest compares exactly: the RPO clock runs on
/// the real monotonic clock from when `populate` set the offsets, so a partition with lag has waited a little (less
/// than a minute in any test), one without lag not at all. Covers `partitions[].rpo_seconds`,
/// `topics[].rpo_max_seconds` and `totals.rpo_max_seconds`.
pub fn rpo_checked(mut doc: Value) -> Value {
    fn check(v: &mut Value, key: &str, waiting: bool) {
        let rpo = v[key].as_f64().unwrap_or_else(|| panic!("{key} is a number in {v}"));
        if waiting {
            assert!((0.0..60.0).contains(&rpo), "{key} {rpo} in {v}");
        } else {
            assert_eq!(rpo, 0.0, "{key} without lag in {v}");
        }
        v[key] = json!(0.0);
    }
    for p in doc.get_mut("partitions").and_then(Value::as_array_mut).into_iter().flatten() {
        let waiting = p["lag"].as_u64() != Some(0);
        check(p, "rpo_seconds", waiting);
    }
    for t in doc.get_mut("topics").and_then(Value::as_array_mut).into_iter().flatten() {
        let waiting = t["lag"].as_u64() != Some(0);
        check(t, "rpo_max_seconds", waiting);
    }
    if let Some(totals) = doc.get_mut("totals") {
        let waiting = totals["lag"].as_u64() != Some(0);
        check(totals, "rpo_max_seconds", waiting);
    }
    doc
}

pub fn expected_partitions() -> Vec<Value> {
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
