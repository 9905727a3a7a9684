//! Pieces the end-to-end benchmarks share: where the release binaries are, a release broker, a keyed load, the
//! steady-state clock of a mirror run, finding a program on the PATH, and NATS JetStream servers ([`nats`]).

#![allow(dead_code)]

pub mod latency;
pub mod nats;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry::{BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::BrokerProcess;

/// Runs a benchmark's `run` on a multi-threaded runtime: exit code 0, or 1 with the error printed.
pub fn block_on_main(run: impl std::future::Future<Output = anyhow::Result<()>>) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(run) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Where the release binaries are: `FERRY_BIN_DIR`, else `target/release`.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("FERRY_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| ferry_testkit::workspace_root().join("target/release"))
}

/// Where `program` is on the PATH (`which`), if it is.
pub fn which(program: &str) -> Option<PathBuf> {
    let out = std::process::Command::new("which").arg(program).stderr(Stdio::null()).output().ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !path.is_empty()).then(|| path.into())
}

/// A release `ferry-broker` with 1 MiB batches and async flush.
pub async fn broker(id: &str) -> anyhow::Result<BrokerProcess> {
    Ok(BrokerProcess::builder()
        .program(bin_dir().join("ferry-broker"))
        .cluster_id(id)
        .config("[broker]\nmax_batch_bytes = \"1MiB\"\n[storage]\nflush = \"async\"\n")
        .start()
        .await?)
}

/// Produces `count` records of `record` bytes, keyed `key-{i}` and dealt over `partitions` in turn, into an
/// existing `topic`; returns the elapsed time.
pub async fn produce_keyed(
    addr: &str,
    topic: &str,
    count: usize,
    record: usize,
    partitions: u32,
    linger: Duration,
) -> anyhow::Result<Duration> {
    let client = BrokerClient::new(ClientConfig::new([addr.to_owned()]))?;
    let producer = Producer::new(client, ProducerConfig { linger, ..Default::default() }).await?;
    let value = Bytes::from(vec![b'x'; record]);
    let start = Instant::now();
    let mut pending = Vec::with_capacity(count);
    for i in 0..count {
        let rec = ProducerRecord::new(topic, value.clone())
            .with_key(Bytes::from(format!("key-{i}")))
            .with_partition(i as u32 % partitions);
        pending.push(producer.send(rec).await?);
    }
    for p in pending {
        p.await?;
    }
    producer.close().await;
    Ok(start.elapsed())
}

/// The clock of a backlog copy. The steady-state rate uses the time between 10% and 90% of the records arriving,
/// which leaves out start-up round trips (discovery, resume lookups, opening the stream) that a long link
/// multiplies.
#[derive(Debug)]
pub struct Steady {
    expected: u64,
    start: Instant,
    t10: Option<Instant>,
    t90: Option<Instant>,
}

impl Steady {
    /// Starts the clock for `expected` records.
    pub fn start(expected: u64) -> Steady {
        Steady { expected, start: Instant::now(), t10: None, t90: None }
    }

    /// Records that `done` records arrived; true once all have.
    pub fn observe(&mut self, done: u64) -> bool {
        if self.t10.is_none() && done * 10 >= self.expected {
            self.t10 = Some(Instant::now());
        }
        if self.t90.is_none() && done * 10 >= self.expected * 9 {
            self.t90 = Some(Instant::now());
        }
        done >= self.expected
    }

    /// (seconds the whole backlog takes at the steady rate, wall seconds since the start).
    pub fn finish(&self) -> (f64, f64) {
        let total = self.start.elapsed().as_secs_f64();
        let steady = match (self.t10, self.t90) {
            (Some(a), Some(b)) if b > a => b.duration_since(a).as_secs_f64() / 0.8,
            _ => total,
        };
        (steady, total)
    }
}

/// The machine's CPU ticks from `/proc/stat`: (idle including I/O wait, total). Zeros where it cannot be read.
pub fn cpu_idle_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return (0, 0) };
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (idle, ticks.iter().sum())
}

/// The share of the machine's CPU time that was idle since `start` (from [`cpu_idle_ticks`]).
pub fn cpu_idle_share(start: (u64, u64)) -> f64 {
    let (idle, total) = cpu_idle_ticks();
    let total = total.saturating_sub(start.1);
    if total == 0 { 0.0 } else { idle.saturating_sub(start.0) as f64 / total as f64 }
}

/// CPU seconds (user + system) a process has used so far, from `/proc/PID/stat`; 0 where it cannot be read.
pub fn cpu_seconds(pid: u32) -> f64 {
    let (user, system) = cpu_user_system(&format!("/proc/{pid}/stat"));
    user + system
}

/// CPU seconds (user, system) from a `stat` file of `/proc` (a process's or a thread's); zeros where it cannot be
/// read.
pub fn cpu_user_system(stat_path: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(stat_path).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map(|(_, r)| r.split(' ').collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (ticks(11), ticks(12))
}

/// How long this probe leaves free memory alone before its first write: longer than the delay after which a guest
/// kernel reports its free pages to the hypervisor (`PAGE_REPORTING_DELAY`, 2 s in Linux).
const REPORTING_DELAY: Duration = Duration::from_secs(3);

/// The system CPU seconds this machine spends per GB to write new data into the page cache of `dir`'s
/// filesystem: `bytes` written to a scratch file twice on one thread, each file deleted after it was written.
/// Returns (first write, second write). The first starts after [`REPORTING_DELAY`] and takes pages that have been
/// free at least that long; the second mostly takes the pages the first one freed a moment before. Under a
/// hypervisor that takes back the guest's free pages (virtio-balloon free page reporting), the first pays a fault
/// on the host for each page and the second does not: their difference is what new file data costs on such a
/// machine beyond the copy itself. (On this test machine, 1 GiB written with `dd` cost 3.1 to 3.2 s of system
/// time into pages free for 3 s or more, and 0.23 to 0.25 s into pages freed 1 s before.)
pub fn page_cache_fill_cost(dir: &Path, bytes: u64) -> std::io::Result<(f64, f64)> {
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        std::thread::sleep(REPORTING_DELAY);
        let chunk = vec![0x5au8; 1 << 20];
        let mut costs = [0.0f64; 2];
        for cost in &mut costs {
            let path = dir.join(format!("ferry-bench-fill-{}", std::process::id()));
            let before = cpu_user_system("/proc/thread-self/stat").1;
            let mut file = std::fs::File::create(&path)?;
            let mut written = 0u64;
            while written < bytes {
                std::io::Write::write_all(&mut file, &chunk)?;
                written += chunk.len() as u64;
            }
            drop(file);
            *cost = (cpu_user_system("/proc/thread-self/stat").1 - before) / (written as f64 / 1e9);
            std::fs::remove_file(&path)?;
        }
        Ok((costs[0], costs[1]))
    })
    .join()
    .map_err(|_| std::io::Error::other("the page-cache fill thread panicked"))?
}

/// A bench mirror's config: one route ("primary"), health checks every second, no compression, commits every 5 s,
/// discovery every 500 ms, the monitor on a free port.
#[derive(Debug, Default)]
pub struct MirrorToml<'a> {
    /// `mirror.name`; "bench" when empty.
    pub name: &'a str,
    /// `source.cluster`.
    pub source_cluster: &'a str,
    /// Extra `[source]` lines, such as `kind = "kafka"`.
    pub source_extra: &'a str,
    /// The route's broker addresses.
    pub source: &'a [String],
    /// `target.cluster`.
    pub target_cluster: &'a str,
    /// Extra `[target]` lines.
    pub target_extra: &'a str,
    /// `target.brokers`.
    pub target: &'a [String],
    /// The one `topics.include` pattern.
    pub include: &'a str,
    /// Extra `[sync]` lines.
    pub sync_extra: &'a str,
}

impl MirrorToml<'_> {
    /// The config file text.
    pub fn render(&self) -> String {
        let list = |addrs: &[String]| addrs.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ");
        let name = if self.name.is_empty() { "bench" } else { self.name };
        format!(
            r#"[mirror]
name = "{name}"
[source]
cluster = "{source_cluster}"
{source_extra}
[[source.routes]]
name = "primary"
brokers = [{source}]
[source.health]
check_interval = "1s"
timeout = "2s"
[target]
cluster = "{target_cluster}"
brokers = [{target}]
{target_extra}
[topics]
include = [{include:?}]
discovery_interval = "500ms"
[sync]
compression = "none"
commit_interval = "5s"
{sync_extra}
[monitor]
listen = "127.0.0.1:0"
"#,
            source_cluster = self.source_cluster,
            source_extra = self.source_extra,
            source = list(self.source),
            target_cluster = self.target_cluster,
            target = list(self.target),
            target_extra = self.target_extra,
            include = self.include,
            sync_extra = self.sync_extra,
        )
    }
}

/// `len` bytes that do not compress (xorshift).
pub fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
