//! A broker with its Kafka listener, the Python client driver, and the records the tests expect.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use bytes::Bytes;
use ferry_batch::Record;
use ferry_client::{Admin, BrokerClient, ClientConfig};
use ferry_testkit::{BrokerProcess, deadline};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

#[path = "../support/read.rs"]
mod read;

/// How long one client step (a produce, a group settling, a consume) may take with debug-built processes on a
/// loaded 2-core machine; waits use three times this.
pub const STEP: Duration = Duration::from_secs(20);

/// Deadline of a client step.
pub fn step_deadline() -> Duration {
    deadline(&[STEP])
}

/// A broker with its Kafka listener on.
pub struct Wire {
    pub broker: BrokerProcess,
    /// The Kafka listener's `host:port`.
    pub kafka: String,
    pub client: BrokerClient,
    pub admin: Admin,
}

impl Wire {
    /// Starts a broker whose Kafka listener auto-creates topics.
    pub async fn start() -> anyhow::Result<Wire> {
        Wire::start_with("", None).await
    }

    /// Starts a broker with `extra` config (`[kafka]` keys first, then other sections); the gRPC client presents
    /// `token`.
    pub async fn start_with(extra: &str, token: Option<&str>) -> anyhow::Result<Wire> {
        ferry_testkit::init_tracing();
        let port = ferry_testkit::reserve_port()?;
        let kafka = format!("127.0.0.1:{port}");
        let broker = BrokerProcess::builder()
            .config(format!("[kafka]\nlisten = \"{kafka}\"\nauto_create_topics = true\n{extra}"))
            .start()
            .await?;
        ferry_testkit::wait_until("the Kafka listener to accept", step_deadline(), async || {
            Ok::<_, anyhow::Error>(tokio::net::TcpStream::connect(&kafka).await.is_ok())
        })
        .await?;
        let mut config = ClientConfig::new([broker.addr().to_string()]);
        config.token = token.map(str::to_owned);
        let client = BrokerClient::new(config)?;
        Ok(Wire { admin: Admin::new(client.clone()), client, broker, kafka })
    }

    /// Every record of a partition, read through Ferry's gRPC API.
    pub async fn read_grpc(&self, topic: &str, partition: u32) -> anyhow::Result<Vec<Record>> {
        Ok(read::read_partition(&self.client, topic, partition, None).await?.records)
    }
}

/// Every record of a partition of any broker, read through gRPC.
pub async fn read_all(client: &BrokerClient, topic: &str, partition: u32) -> anyhow::Result<Vec<Record>> {
    Ok(read::read_partition(client, topic, partition, None).await?.records)
}

/// The driver of `lib`: `client.js` under node for kafkajs (installed by scripts/test.sh under target/npm),
/// `client.py` under python3 for the others.
pub fn driver(lib: &str) -> tokio::process::Command {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka_wire");
    if lib == "kafkajs" {
        let mut c = tokio::process::Command::new("node");
        c.arg(dir.join("client.js")).env("NODE_PATH", ferry_testkit::workspace_root().join("target/npm/node_modules"));
        c
    } else {
        let mut c = tokio::process::Command::new("python3");
        c.arg(dir.join("client.py"));
        c
    }
}

/// Runs the driver of `lib` with `BOOTSTRAP ARGS...` to its end; its JSON lines. Fails on a non-zero exit or an
/// `{"error": ...}` line.
pub async fn run_client(lib: &str, bootstrap: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let lines = run_client_lines(lib, bootstrap, args).await?;
    ensure!(!lines.iter().any(|l| l.get("error").is_some()), "client {lib} {args:?} reported errors: {lines:?}");
    Ok(lines)
}

/// As [`run_client`], but its error lines are returned with the others.
pub async fn run_client_lines(lib: &str, bootstrap: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    run_client_with(lib, bootstrap, args, &Value::Null).await
}

/// As [`run_client_lines`], with `config` (a JSON object) added to every confluent-kafka client's settings.
pub async fn run_client_with(lib: &str, bootstrap: &str, args: &[&str], config: &Value) -> anyhow::Result<Vec<Value>> {
    let mut cmd = driver(lib);
    if !config.is_null() {
        cmd.env("KAFKA_CLIENT_CONFIG", config.to_string());
    }
    let run = cmd.arg(lib).arg(bootstrap).args(args).kill_on_drop(true).output();
    let out = tokio::time::timeout(step_deadline(), run)
        .await
        .with_context(|| format!("client {lib} {args:?} did not finish"))??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "client {lib} {args:?} failed ({}): {stderr}", out.status);
    parse(&String::from_utf8_lossy(&out.stdout))
}

fn parse(text: &str) -> anyhow::Result<Vec<Value>> {
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).context("a JSON line")).collect()
}

/// A group member running in its own process until told to stop.
pub struct Member {
    child: tokio::process::Child,
    stop: PathBuf,
    lines: Arc<Mutex<Vec<Value>>>,
    _dir: tempfile::TempDir,
}

impl Member {
    /// Starts `client.py LIB BOOTSTRAP member TOPIC GROUP STOPFILE`.
    pub fn start(lib: &str, bootstrap: &str, topic: &str, group: &str) -> anyhow::Result<Member> {
        Member::spawn(lib, bootstrap, &["member", topic, group], &[])
    }

    /// Starts `client.py LIB BOOTSTRAP ARGS... STOPFILE` with `env` added.
    pub fn spawn(lib: &str, bootstrap: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Member> {
        let dir = tempfile::tempdir()?;
        let stop = dir.path().join("stop");
        let mut child = driver(lib)
            .arg(lib)
            .arg(bootstrap)
            .args(args)
            .arg(&stop)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().context("stdout")?;
        let sink = Arc::clone(&lines);
        tokio::spawn(async move {
            let mut rd = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = rd.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Ok(Member { child, stop, lines, _dir: dir })
    }

    /// Every line it printed so far.
    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// The partitions of its latest assignment (`None` before the first).
    pub fn assigned(&self) -> Option<Vec<u32>> {
        let lines = self.lines.lock().unwrap();
        let last = lines.iter().rev().find_map(|l| l.get("assigned"))?;
        Some(last.as_array()?.iter().filter_map(|p| p.as_u64().map(|p| p as u32)).collect())
    }

    /// The records it consumed so far.
    pub fn records(&self) -> Vec<Rec> {
        self.lines.lock().unwrap().iter().filter_map(|l| l.get("rec")).map(Rec::of).collect()
    }

    /// Its error lines.
    pub fn errors(&self) -> Vec<Value> {
        self.lines.lock().unwrap().iter().filter(|l| l.get("error").is_some()).cloned().collect()
    }

    /// Waits for its clean exit on its own and for its `last` line; every line it printed.
    pub async fn finish(mut self, last: &str) -> anyhow::Result<Vec<Value>> {
        let status =
            tokio::time::timeout(step_deadline(), self.child.wait()).await.context("client did not exit")??;
        ensure!(status.success(), "client exited with {status}");
        ferry_testkit::wait_until("the client's last lines", step_deadline(), async || {
            Ok::<_, anyhow::Error>(self.lines.lock().unwrap().iter().any(|l| l.get(last).is_some()))
        })
        .await?;
        Ok(self.lines())
    }

    /// Kills it (SIGKILL): it leaves nothing behind but its session, which the group expires.
    pub async fn kill(mut self) -> anyhow::Result<Vec<Rec>> {
        self.child.kill().await?;
        Ok(self.records())
    }

    /// Tells it to leave the group and waits for its clean exit.
    pub async fn stop(mut self) -> anyhow::Result<Vec<Rec>> {
        std::fs::write(&self.stop, b"stop")?;
        let status =
            tokio::time::timeout(step_deadline(), self.child.wait()).await.context("member did not exit")??;
        ensure!(status.success(), "member exited with {status}");
        // The reader task drains stdout to its end right after the exit.
        ferry_testkit::wait_until("the member's last lines", step_deadline(), async || {
            Ok::<_, anyhow::Error>(self.lines.lock().unwrap().iter().any(|l| l.get("closed").is_some()))
        })
        .await?;
        ensure!(self.errors().is_empty(), "member reported errors: {:?}", self.errors());
        Ok(self.records())
    }
}

/// A consumed record as a client reported it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rec {
    pub partition: u32,
    pub offset: u64,
    pub key: Option<String>,
    pub value: Option<String>,
    pub headers: Vec<(String, Option<String>)>,
    pub timestamp: i64,
}

impl Rec {
    /// From a `{"rec": ...}` line's object.
    pub fn of(v: &Value) -> Rec {
        let s = |x: &Value| x.as_str().map(str::to_owned);
        Rec {
            partition: v["p"].as_u64().unwrap_or(u64::MAX) as u32,
            offset: v["o"].as_u64().unwrap_or(u64::MAX),
            key: s(&v["k"]),
            value: s(&v["v"]),
            headers: v["h"]
                .as_array()
                .map(|hs| hs.iter().map(|h| (h[0].as_str().unwrap_or("").to_owned(), s(&h[1]))).collect())
                .unwrap_or_default(),
            timestamp: v["ts"].as_i64().unwrap_or(i64::MIN),
        }
    }

    /// From a record read through gRPC.
    pub fn of_ferry(partition: u32, r: &Record) -> Rec {
        let s = |b: &Option<Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        Rec {
            partition,
            offset: r.offset,
            key: s(&r.key),
            value: s(&r.value),
            headers: r.headers.iter().map(|h| (h.key.clone(), s(&h.value))).collect(),
            timestamp: r.timestamp,
        }
    }
}

/// Record `i` of `tag` as client.py writes it, at the offset it gets in a fresh topic of `partitions`
/// partitions when records `0..` are written in order.
pub fn expected(tag: &str, partitions: u32, i: u64) -> Rec {
    Rec {
        partition: (i % u64::from(partitions)) as u32,
        offset: i / u64::from(partitions),
        key: Some(format!("{tag}-k{}", i % 7)),
        value: Some(format!("{tag}-v{i}-{}", "x".repeat((i % 13) as usize))),
        headers: vec![
            ("seq".into(), Some(i.to_string())),
            ("seq".into(), Some(format!("again-{i}"))),
            ("tag".into(), Some(tag.to_owned())),
        ],
        timestamp: 1_750_000_000_000 + i as i64,
    }
}

/// Records `from..to` of `tag`, sorted by partition and offset.
pub fn expected_range(tag: &str, partitions: u32, from: u64, to: u64) -> Vec<Rec> {
    let mut v: Vec<Rec> = (from..to).map(|i| expected(tag, partitions, i)).collect();
    v.sort();
    v
}

/// Record `i` of `tag` as a Ferry producer record (the same fields `expected` gives).
pub fn ferry_record(topic: &str, tag: &str, partitions: u32, i: u64) -> ferry_client::ProducerRecord {
    let e = expected(tag, partitions, i);
    let mut r = ferry_client::ProducerRecord::new(topic, Bytes::from(e.value.unwrap_or_default()))
        .with_key(e.key.unwrap_or_default())
        .with_timestamp(e.timestamp)
        .with_partition(e.partition);
    for (k, v) in e.headers {
        r = r.with_header(k, v.unwrap_or_default());
    }
    r
}

/// A SHA-256 digest of records, for the failure messages and the log.
pub fn digest(recs: &[Rec]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for r in recs {
        h.update(format!("{r:?}\n").as_bytes());
    }
    format!("{:x}", h.finalize())
}

/// Asserts two record lists are the same, by count and digest first.
pub fn assert_same(what: &str, got: &[Rec], want: &[Rec]) {
    assert_eq!(
        (got.len(), digest(got)),
        (want.len(), digest(want)),
        "{what}: count and digest differ; first difference: {:?}",
        got.iter().zip(want).find(|(g, w)| g != w)
    );
}
