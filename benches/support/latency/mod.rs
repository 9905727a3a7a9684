//! A produce-to-consume latency harness that measures the server, not itself.
//!
//! The load generator and the consumer each run in a process of their own (this bench binary started again with
//! `FERRY_BENCH_ROLE` set) with one task per side, so their CPU is counted apart from the server's and printed beside
//! every figure (Ferry's roles run on one thread; the NATS client's connection is a task of its own, so its roles get
//! two):
//!
//! - the Ferry producer sends pre-built batches straight through the `Produce` RPC: one template per batch size,
//!   built once; per batch it copies the template, stamps the send time (µs since the Unix epoch) into the first
//!   record's value and recomputes the CRC. Nothing is allocated per record;
//! - the Ferry consumer long-polls one `Fetch` over every partition and reads only batch headers and the stamp;
//! - the NATS producer publishes each record (JetStream has no batches) with one shared payload per tick, the stamp
//!   in its first 8 bytes, acknowledgements awaited in a bounded window;
//! - the NATS consumer reads every stream through an ordered push consumer (no acks), all streams in one task.
//!
//! Both producers pace to the same absolute rate: every millisecond they send what is due (at most four ticks' worth;
//! a producer more than a second behind its schedule stops, and the rate counts as not sustained). A record's
//! latency is the consumer's clock minus the stamp (one machine, one clock); the producers also time each
//! acknowledgement, which splits a record's latency into the server's append and the consumer's delivery. Each role
//! prints one JSON line at the end.

mod roles;

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use roles::{client_consume, client_produce, ferry_consume, ferry_produce, nats_consume, nats_produce};

/// The environment variable that turns the bench binary into one side of the harness.
pub const ROLE_VAR: &str = "FERRY_BENCH_ROLE";
/// One run's parameters, passed to the role processes through the environment.
#[derive(Debug, Clone)]
pub struct Load {
    /// `host:port` of the Ferry broker or the NATS server.
    pub addr: String,
    /// Topic (Ferry) or subject prefix and stream name prefix (NATS).
    pub topic: String,
    /// Partitions (Ferry) or streams (NATS).
    pub partitions: u32,
    /// Records per second, over all partitions.
    pub rate: f64,
    /// Bytes of every record's value.
    pub record_bytes: usize,
    /// How long the producer sends.
    pub run: Duration,
}

impl Load {
    fn total(&self) -> usize {
        (self.rate * self.run.as_secs_f64()) as usize
    }

    fn to_env(&self, role: &str) -> Vec<(&'static str, String)> {
        vec![
            (ROLE_VAR, role.to_owned()),
            ("FERRY_BENCH_ADDR", self.addr.clone()),
            ("FERRY_BENCH_TOPIC", self.topic.clone()),
            ("FERRY_BENCH_PARTITIONS", self.partitions.to_string()),
            ("FERRY_BENCH_RATE", self.rate.to_string()),
            ("FERRY_BENCH_RECORD", self.record_bytes.to_string()),
            ("FERRY_BENCH_RUN_MS", self.run.as_millis().to_string()),
        ]
    }

    fn from_env() -> anyhow::Result<Load> {
        let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
        Ok(Load {
            addr: var("FERRY_BENCH_ADDR")?,
            topic: var("FERRY_BENCH_TOPIC")?,
            partitions: var("FERRY_BENCH_PARTITIONS")?.parse()?,
            rate: var("FERRY_BENCH_RATE")?.parse()?,
            record_bytes: var("FERRY_BENCH_RECORD")?.parse()?,
            run: Duration::from_millis(var("FERRY_BENCH_RUN_MS")?.parse()?),
        })
    }
}

/// Which server a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// Ferry through the lean roles (raw RPCs, pre-built batches).
    Ferry,
    /// Ferry through the client library (`Producer::send` per record, `Consumer::poll`), in the same processes'
    /// shape: what an application sees, the client's per-record path included.
    FerryClient,
    /// NATS JetStream.
    Nats,
}

impl System {
    fn role(self, side: &str) -> String {
        let system = match self {
            System::Ferry => "ferry",
            System::FerryClient => "client",
            System::Nats => "nats",
        };
        format!("{system}-{side}")
    }
}

/// What one paced run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Records the producer sent and had acknowledged.
    pub sent: u64,
    /// Records the consumer received.
    pub received: u64,
    /// The producer's achieved rate (records/s over its sending time).
    pub achieved: f64,
    /// Latency percentiles, ms.
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    /// Cores busy (CPU seconds per wall second): server, producer, consumer.
    pub server_cores: f64,
    pub producer_cores: f64,
    pub consumer_cores: f64,
    /// The machine's idle share during the run.
    pub idle: f64,
    /// The producer's worst lag behind its schedule, ms (a producer that cannot keep pace shows here).
    pub schedule_lag_ms: f64,
    /// Send-to-acknowledgement time of the produce calls (publishes), p50 and p99, ms, weighted by records: the
    /// server's append (and its queueing); the rest of a record's latency is the consumer's delivery.
    pub ack_p50: f64,
    pub ack_p99: f64,
}

impl RunResult {
    /// True when the run kept its rate: every record arrived and the producer kept within 5% of the rate.
    pub fn sustained(&self, load: &Load) -> bool {
        self.received >= load.total() as u64 && self.achieved >= load.rate * 0.95
    }

    /// The figures as one line.
    pub fn line(&self) -> String {
        format!(
            "p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms (acknowledged after p50 {:.2} ms, p99 {:.2} ms); {} of {} received at {:.0} records/s; cores busy: server {:.2}, \
             producer {:.2}, consumer {:.2}; machine idle {:.0}%; producer behind schedule at worst {:.1} ms",
            self.p50,
            self.p99,
            self.p999,
            self.ack_p50,
            self.ack_p99,
            self.received,
            self.sent,
            self.achieved,
            self.server_cores,
            self.producer_cores,
            self.consumer_cores,
            self.idle * 100.0,
            self.schedule_lag_ms
        )
    }
}

/// Runs the role this process was started for, if any: `Some(exit code)` when it was a role process.
pub fn run_role_if_asked() -> Option<std::process::ExitCode> {
    let role = std::env::var(ROLE_VAR).ok()?;
    // Ferry's roles are one task on one thread. The NATS client runs its connection in a task of its own, so its
    // roles get two threads: the publishing loop and the connection then do not take turns.
    let mut builder = if role.starts_with("nats") {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return Some(std::process::ExitCode::from(1));
        }
    };
    let result = runtime.block_on(async {
        let load = Load::from_env()?;
        let out = match role.as_str() {
            "ferry-produce" => ferry_produce(&load).await?,
            "ferry-consume" => ferry_consume(&load).await?,
            "nats-produce" => nats_produce(&load).await?,
            "nats-consume" => nats_consume(&load).await?,
            "client-produce" => client_produce(&load).await?,
            "client-consume" => client_consume(&load).await?,
            other => bail!("unknown {ROLE_VAR} {other:?}"),
        };
        println!("{out}");
        anyhow::Ok(())
    });
    Some(match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {role}: {e:#}");
            std::process::ExitCode::from(1)
        }
    })
}

/// Runs one paced load against `system`: the consumer first (until it says it is reading), then the producer; both
/// in processes of their own. `server_pid` is the broker's or the NATS server's.
pub async fn run(system: System, load: &Load, server_pid: u32) -> anyhow::Result<RunResult> {
    let exe = std::env::current_exe().context("cannot find this bench binary")?;
    let spawn = |role: String| {
        let mut command = tokio::process::Command::new(&exe);
        command.envs(load.to_env(&role)).stdout(std::process::Stdio::piped()).kill_on_drop(true);
        command.spawn().with_context(|| format!("cannot start the {role} process"))
    };
    let mut consumer = spawn(system.role("consume"))?;
    let mut consumer_out = BufReader::new(consumer.stdout.take().context("consumer stdout")?).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), consumer_out.next_line()).await;
    if !matches!(ready, Ok(Ok(Some(ref l))) if l == "ready") {
        bail!("the consumer did not start: {ready:?}");
    }
    let (idle0, started) = (super::cpu_idle_ticks(), Instant::now());
    let server0 = super::cpu_seconds(server_pid);
    let producer = spawn(system.role("produce"))?;
    let (producer_pid, consumer_pid) = (producer.id().unwrap_or(0), consumer.id().unwrap_or(0));
    // Each role reports its own CPU time with its result (read from /proc just before it exits).
    let produced = producer.wait_with_output().await?;
    if !produced.status.success() {
        bail!("the producer failed ({producer_pid})");
    }
    let produced: serde_json::Value = serde_json::from_slice(&produced.stdout).context("producer result")?;
    let consumed = tokio::time::timeout(load.run * 3 + Duration::from_secs(10), consumer_out.next_line()).await;
    let consumed: serde_json::Value = match consumed {
        Ok(Ok(Some(line))) => serde_json::from_str(&line).context("consumer result")?,
        other => bail!("the consumer ({consumer_pid}) gave no result: {other:?}"),
    };
    let _ = consumer.wait().await;
    let wall = started.elapsed().as_secs_f64();
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    Ok(RunResult {
        sent: f(&produced, "sent") as u64,
        received: f(&consumed, "received") as u64,
        achieved: f(&produced, "achieved"),
        p50: f(&consumed, "p50_ms"),
        p99: f(&consumed, "p99_ms"),
        p999: f(&consumed, "p999_ms"),
        server_cores: (super::cpu_seconds(server_pid) - server0) / wall,
        producer_cores: f(&produced, "cpu_s") / wall,
        consumer_cores: f(&consumed, "cpu_s") / wall,
        idle: super::cpu_idle_share(idle0),
        schedule_lag_ms: f(&produced, "schedule_lag_ms"),
        ack_p50: f(&produced, "ack_p50_ms"),
        ack_p99: f(&produced, "ack_p99_ms"),
    })
}

/// Creates a NATS run's streams (file storage, one subject each) before its roles start.
pub async fn nats_streams(load: &Load) -> anyhow::Result<()> {
    roles::nats_streams(load).await
}
