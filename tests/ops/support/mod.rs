//! Helpers of the operations tests: the mirror config they vary (routes, health intervals, alarm channels, the
//! monitor token and audit log), calls to the monitor that return the status with the body, the real `ferryctl`,
//! reading samples out of the Prometheus text, and [`hold_while`], the one fixed-span wait.

pub mod hook;
pub mod smtp;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_testkit::{MirrorProcess, deadline};
use serde_json::Value;

use crate::common::{DISCOVERY, Dc, SHUTDOWN_TIMEOUT, dur};

/// The monitor token of every mirror these tests start (passed as `FERRY_MONITOR_TOKEN`).
pub const TOKEN: &str = "ops-monitor-token-never-logged";

/// `source.health` of the failover tests: short, so a cut is seen and acted on within a few seconds.
#[derive(Debug, Clone)]
pub struct Health {
    pub check_interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub switch_after: Duration,
    pub min_switch_interval: Duration,
}

impl Health {
    /// check_interval 200ms, timeout 300ms, failure_threshold 2, switch_after 1s, min_switch_interval 0s.
    pub fn fast() -> Health {
        Health {
            check_interval: Duration::from_millis(200),
            timeout: Duration::from_millis(300),
            failure_threshold: 2,
            switch_after: Duration::from_secs(1),
            min_switch_interval: Duration::ZERO,
        }
    }

    /// The deadline for a route failure to be noticed and acted on (an alarm, a switch): the failed probes
    /// (each at most a check interval plus the timeout), `switch_after`, and the webhook's delivery, with the 3x
    /// margin. The fetch stream's keepalive (1 s) and silence limits are below this too.
    pub fn reaction(&self) -> Duration {
        let probes = (self.check_interval + self.timeout) * (self.failure_threshold + 1);
        deadline(&[probes, self.switch_after, Duration::from_secs(2)])
    }
}

/// One `[[source.routes]]`.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub broker: String,
}

impl Route {
    pub fn new(name: &str, broker: impl ToString) -> Route {
        Route { name: name.to_owned(), broker: broker.to_string() }
    }
}

/// The fields of the mirror config these tests vary; [`OpsConf::toml`] writes the whole file.
#[derive(Debug, Clone)]
pub struct OpsConf {
    pub name: String,
    pub source_cluster: String,
    pub source_cluster_id: Option<String>,
    pub routes: Vec<Route>,
    pub health: Health,
    pub target_cluster: String,
    pub target_brokers: String,
    /// `[[alarms.webhook]]`: (name, url).
    pub webhooks: Vec<(String, String)>,
    /// `[[alarms.email]]` without TLS or auth: (name, port on 127.0.0.1).
    pub emails: Vec<(String, u16)>,
    /// `monitor.audit_log`, relative to the mirror's directory.
    pub audit_log: Option<String>,
}

impl OpsConf {
    /// A mirror of every topic from `source` (one route, "primary", straight to its broker) to `target`.
    pub fn new(source: &Dc, target: &Dc) -> OpsConf {
        OpsConf {
            name: format!("{}_to_{}", source.name, target.name),
            source_cluster: source.name.clone(),
            source_cluster_id: None,
            routes: vec![Route::new("primary", source.addr())],
            health: Health::fast(),
            target_cluster: target.name.clone(),
            target_brokers: target.addr(),
            webhooks: Vec::new(),
            emails: Vec::new(),
            audit_log: None,
        }
    }

    /// The config file text.
    pub fn toml(&self) -> String {
        let h = &self.health;
        let mut out = format!(
            "[mirror]\nname = {name:?}\n\n[source]\ncluster = {source:?}\n",
            name = self.name,
            source = self.source_cluster
        );
        if let Some(id) = &self.source_cluster_id {
            out += &format!("cluster_id = {id:?}\n");
        }
        for r in &self.routes {
            out += &format!("\n[[source.routes]]\nname = {:?}\nbrokers = [{:?}]\n", r.name, r.broker);
        }
        out += &format!(
            r#"
[source.health]
check_interval = "{check}"
timeout = "{timeout}"
failure_threshold = {threshold}
switch_after = "{switch_after}"
switch_back = "manual"
min_switch_interval = "{min_switch}"

[target]
cluster = {target:?}
brokers = [{target_brokers:?}]

[topics]
include = [".*"]
exclude = ["^__"]
discovery_interval = "{discovery}"
start_position = "earliest"

[sync]
commit_interval = "1s"
shutdown_timeout = "{shutdown}"
stall_check_interval = "200ms"

[monitor]
listen = "127.0.0.1:0"
"#,
            check = dur(h.check_interval),
            timeout = dur(h.timeout),
            threshold = h.failure_threshold,
            switch_after = dur(h.switch_after),
            min_switch = dur(h.min_switch_interval),
            target = self.target_cluster,
            target_brokers = self.target_brokers,
            discovery = dur(DISCOVERY),
            shutdown = dur(SHUTDOWN_TIMEOUT),
        );
        if let Some(audit) = &self.audit_log {
            out += &format!("audit_log = {audit:?}\n");
        }
        out += "\n[alarms]\nqueue_size = 1000\n";
        for (name, url) in &self.webhooks {
            out += &format!("\n[[alarms.webhook]]\nname = {name:?}\nurl = {url:?}\ntimeout = \"5s\"\nretries = 3\n");
        }
        for (name, port) in &self.emails {
            out += &format!(
                "\n[[alarms.email]]\nname = {name:?}\nsmtp = \"127.0.0.1:{port}\"\ntls = \"none\"\n\
                 from = \"Ferry Alarms <ferry@example.org>\"\nto = [\"oncall@example.org\"]\ntimeout = \"5s\"\n"
            );
        }
        out
    }

    /// Starts the mirror with this config and [`TOKEN`].
    pub async fn start(&self) -> anyhow::Result<MirrorProcess> {
        Ok(MirrorProcess::builder(self.toml()).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?)
    }
}

/// The bearer token a call carries.
#[derive(Debug, Clone, Copy)]
pub enum Auth<'a> {
    None,
    Bearer(&'a str),
    /// A raw `Authorization` header value.
    Header(&'a str),
}

/// One answer of the monitor.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub www_authenticate: Option<String>,
    /// The body as JSON (`Value::String` of the text when it is not JSON).
    pub body: Value,
}

impl Answer {
    /// The error code of an error answer.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }
}

/// Calls the monitor: `method` on `path`, with `auth` and an optional raw body (sent as JSON).
pub async fn call(
    mirror: &MirrorProcess,
    method: reqwest::Method,
    path: &str,
    auth: Auth<'_>,
    body: Option<&str>,
) -> anyhow::Result<Answer> {
    let url = format!("{}{path}", mirror.monitor_url());
    let mut req = reqwest::Client::new().request(method.clone(), &url);
    req = match auth {
        Auth::None => req,
        Auth::Bearer(t) => req.bearer_auth(t),
        Auth::Header(h) => req.header("authorization", h),
    };
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_owned());
    }
    let response = req.send().await.with_context(|| format!("{method} {url}"))?;
    let status = response.status().as_u16();
    let www_authenticate = response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = response.text().await?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(Answer { status, www_authenticate, body })
}

/// GETs `path` and requires 200.
pub async fn get_json(mirror: &MirrorProcess, path: &str) -> anyhow::Result<Value> {
    let a = call(mirror, reqwest::Method::GET, path, Auth::None, None).await?;
    if a.status != 200 {
        bail!("GET {path}: {} {}", a.status, a.body);
    }
    Ok(a.body)
}

/// POSTs to `path` with `auth` and an optional JSON body.
pub async fn post(mirror: &MirrorProcess, path: &str, auth: Auth<'_>, body: Option<&str>) -> anyhow::Result<Answer> {
    call(mirror, reqwest::Method::POST, path, auth, body).await
}

/// `/api/v1/egress`.
pub async fn egress(mirror: &MirrorProcess) -> anyhow::Result<Value> {
    get_json(mirror, "/api/v1/egress").await
}

/// The route named `name` in an egress document.
pub fn route<'a>(egress: &'a Value, name: &str) -> &'a Value {
    egress["routes"].as_array().and_then(|rs| rs.iter().find(|r| r["name"] == name)).unwrap_or(&Value::Null)
}

/// The mirror's events of `kind` (newest first) from `/api/v1/events`.
pub async fn events(mirror: &MirrorProcess, kind: &str) -> anyhow::Result<Vec<Value>> {
    let v = get_json(mirror, "/api/v1/events?limit=200").await?;
    let all = v["events"].as_array().context("no events array")?;
    Ok(all.iter().filter(|e| e["kind"] == kind).cloned().collect())
}

/// The text of `/metrics`.
pub async fn metrics_text(mirror: &MirrorProcess) -> anyhow::Result<String> {
    let a = call(mirror, reqwest::Method::GET, "/metrics", Auth::None, None).await?;
    match a.body {
        Value::String(s) if a.status == 200 => Ok(s),
        other => bail!("GET /metrics: {} {other}", a.status),
    }
}

/// The value of the sample `series` (name and labels exactly as exposed, e.g.
/// `ferry_mirror_records_total{direction="in"}`) in a Prometheus text, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// What a `ferryctl` run printed and how it exited.
#[derive(Debug)]
pub struct CtlOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the real `ferryctl` with `args`, without inheriting FERRY_* variables, bounded by two minutes so a hang
/// fails the test.
pub async fn ferryctl(args: &[&str]) -> anyhow::Result<CtlOutput> {
    let program = ferry_testkit::binary_path(ferry_testkit::FERRYCTL_BIN)?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    for var in ["FERRY_TOKEN", "FERRY_BROKER", "FERRY_MONITOR", "FERRY_MONITOR_TOKEN", "RUST_LOG"] {
        cmd.env_remove(var);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .with_context(|| format!("ferryctl {args:?} did not finish within 120 s"))??;
    Ok(CtlOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Per partition, (log start, log end) of `topic` on the broker at `broker`, read with
/// `ferryctl --broker ADDR topic describe TOPIC --format json`: independent of the mirror and its monitor.
pub async fn describe_offsets(broker: &str, topic: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let out = ferryctl(&["--broker", broker, "topic", "describe", topic, "--format", "json"]).await?;
    if out.code != 0 {
        bail!("ferryctl topic describe {topic} on {broker}: exit {}: {}", out.code, out.stderr);
    }
    let v: Value = serde_json::from_str(&out.stdout).with_context(|| format!("not JSON: {}", out.stdout))?;
    let parts = v["partition_info"].as_array().with_context(|| format!("no partition_info in {v}"))?;
    let mut out: Vec<(u32, u64, u64)> = parts
        .iter()
        .map(|p| -> anyhow::Result<_> {
            Ok((
                p["partition"].as_u64().context("partition")? as u32,
                p["log_start_offset"].as_u64().context("log_start_offset")?,
                p["log_end_offset"].as_u64().context("log_end_offset")?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    out.sort();
    Ok(out.into_iter().map(|(_, s, e)| (s, e)).collect())
}

/// Keeps a fault in place for `span` while `check` keeps holding: the one fixed-length wait of this suite, used
/// only where the length of an outage is itself the scenario (an outage that outlasts the mirror's timeouts and
/// back-offs), with the span derived from those intervals. Callers first wait, with deadlines, for the conditions
/// that prove the fault took effect (the alarm arrived); then `check` (the fault's effects: nothing crosses the
/// link, the alarm stays raised) is asserted every [`ferry_testkit::POLL_INTERVAL`] until the span is over, so
/// the wait is itself a test of the outage rather than a sleep.
pub async fn hold_while(
    span: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + span;
    let mut ticks = tokio::time::interval(ferry_testkit::POLL_INTERVAL);
    loop {
        ticks.tick().await;
        anyhow::ensure!(
            check().await?,
            "{what} stopped holding {:?} before the end of the outage",
            until - tokio::time::Instant::now()
        );
        if tokio::time::Instant::now() >= until {
            return Ok(());
        }
    }
}

/// The file of the mirror's audit log when `OpsConf::audit_log` is `name`.
pub fn audit_path(mirror: &MirrorProcess, name: &str) -> PathBuf {
    mirror.dir().join(name)
}
