//! raft3 against single, side by side in one run: three release `ferry-broker`s under a real etcd on loopback,
//! one topic of each mode on the same members, driven by the Rust client.
//!
//! ```text
//! cargo build --release -p ferry-broker
//! cargo bench --bench cluster
//! ```
//!
//! The broker binary is `$FERRY_BIN_DIR/ferry-broker` when `FERRY_BIN_DIR` is set, else
//! `target/release/ferry-broker`; etcd is Debian's `etcd-server` (`apt-get install -y etcd-server`). Both modes
//! flush asynchronously (the brokers' default), with 1 KiB records on one partition.
//!
//! What is printed:
//! - produce throughput of each mode, records sent as fast as the client takes them (five batches in flight, the
//!   producer's default), timed to the last acknowledgement, and `RATIO raft3 / single produce` (target >= 0.6);
//!   The two modes alternate, two runs each, averaged;
//! - the cores each broker and the producer kept busy, and the CPU each mode spends per GB produced: on two cores
//!   both runs are CPU-bound, and `RATIO single / raft3 CPU per GB` is the throughput ratio the machine allows;
//! - the brokers' CPU per acknowledged byte, raft3 against single (target <= 2.5), in all, and split into user and
//!   system time;
//! - what this machine charges in system time for a GB of new file data where the brokers keep their logs, into
//!   pages free for 3 s or more and into pages just freed. raft3 writes every byte three times. Under a hypervisor
//!   that takes back the guest's free pages (Linux free page reporting), filling free pages costs a host fault per
//!   page, and that system time can be most of the brokers' CPU: it is a property of the machine, not of the code;
//! - acknowledgement latency p50 and p99 of each mode with the producer paced at half that mode's maximum (one record
//!   in 64 timed, so the timing costs the load generator little CPU);
//! - failover time, from `kill -9` of the raft3 leader to the next acknowledged write of a paced producer, for
//!   several rounds, as a multiple of the lease TTL (target <= 3x);
//! - what self-fencing and the failsafe cost in steady state: raft3 produce on this cluster against the same on a
//!   second cluster whose members run with fencing off (`FERRY_BENCH_NO_FENCING=1`, a benchmark-only switch),
//!   alternating rounds, throughput and CPU per GB side by side, `RATIO fenced / unfenced`.
//!
//! Numbers are printed, never asserted: the machine is shared and noisy.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::producer::MAX_IN_FLIGHT;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, EtcdProcess, deadline, wait_until};
use futures::StreamExt;
use futures::stream::FuturesUnordered;

mod support;

const RECORD_BYTES: usize = 1024;
/// Records per throughput run: `FERRY_BENCH_CLUSTER_RECORDS`, 300,000 by default (about a second of raft3 load,
/// long enough that start-up and the last acknowledgement do not dominate).
fn records() -> usize {
    std::env::var("FERRY_BENCH_CLUSTER_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(300_000)
}
/// How long a paced latency run lasts.
const LATENCY_RUN: Duration = Duration::from_secs(5);
/// One record in this many is timed in a latency run.
const SAMPLE_EVERY: usize = 64;
/// The members' lease TTL.
const LEASE_TTL: Duration = Duration::from_secs(2);
/// Failover rounds.
const FAILOVERS: usize = 3;
/// Throughput runs of each mode, alternating.
const ROUNDS: usize = 2;
/// What the page-cache fill measurement writes, twice.
const FILL_BYTES: u64 = 512 << 20;

fn main() -> ExitCode {
    support::block_on_main(run())
}

fn member_config(etcd: &EtcdProcess, id: u32) -> String {
    format!(
        "[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"{}s\"\nreplica_lag_max = \"2s\"\n\
         ack_timeout = \"10s\"\n\n[broker]\nmax_batch_bytes = \"1MiB\"\n",
        etcd.url(),
        LEASE_TTL.as_secs()
    )
}

async fn run() -> anyhow::Result<()> {
    let program = support::bin_dir().join(ferry_testkit::BROKER_BIN);
    if !program.is_file() {
        bail!("{} not found: build it with `cargo build --release -p ferry-broker`", program.display());
    }
    println!("cluster benchmark: 3 members, {} records of {RECORD_BYTES} B per throughput run, async flush", records());
    let etcd = EtcdProcess::start().await?;
    let mut brokers = Vec::new();
    for id in 1..=3 {
        let b = BrokerProcess::builder()
            .program(&program)
            .env("RUST_LOG", "warn")
            .cluster_id("bench")
            .config(member_config(&etcd, id))
            .start()
            .await?;
        brokers.push(b);
    }
    let addrs: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
    let client = BrokerClient::new(ClientConfig::new(addrs.clone()))?;
    let payload = Bytes::from(vec![0x5au8; RECORD_BYTES]);

    // The single topic lives on the broker the client talks to; the raft3 topic's leader is wherever placement
    // put it. Both on the same three processes.
    let admin = Admin::new(BrokerClient::new(ClientConfig::new([addrs[0].clone()]))?);
    admin.create_topic("single", 1, TopicConfig::default(), None).await?;
    admin.create_replicated_topic("raft3", 1, "raft3").await?;
    let single_client = BrokerClient::new(ClientConfig::new([addrs[0].clone()]))?;
    wait_for_isr(&client, 3).await?;

    // Where the two cores went in each run: each broker, this process (the producer), and idle. raft3 writes every
    // record three times and sends it twice more over loopback, on the same two cores.
    let pids: Vec<u32> = brokers.iter().map(|b| b.pid()).collect();
    // One batch in flight per partition, as before the producer pipelined: the gain of pipelining, per mode.
    for (mode, c) in [("single", &single_client), ("raft3", &client)] {
        let one = busy(&pids, throughput(c, mode, &payload, 1)).await?;
        println!("{mode} produce, 1 partition, 1 batch in flight: {:.1} MB/s; {}", one.0.0, one.1);
    }
    // The two modes alternate, ROUNDS runs each, so that neither runs only on a fresher or a warmer machine.
    let (mut single_runs, mut raft3_runs) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let run = busy(&pids, throughput(&single_client, "single", &payload, MAX_IN_FLIGHT)).await?;
        println!("single produce, 1 partition: {:.1} MB/s ({:.0} records/s); {}", run.0.0, run.0.1, run.1);
        single_runs.push(run);
        let run = busy(&pids, throughput(&client, "raft3", &payload, MAX_IN_FLIGHT)).await?;
        println!("raft3 produce, 1 partition: {:.1} MB/s ({:.0} records/s); {}", run.0.0, run.0.1, run.1);
        raft3_runs.push(run);
    }
    let (single, raft3) = (Run::mean(&single_runs), Run::mean(&raft3_runs));
    // On a machine whose cores are all busy, throughput is the cores over the CPU each GB costs: the ratio of the
    // two modes' costs is what the throughput ratio can be here.
    println!(
        "CPU per GB produced: single {:.2} core-s (brokers {:.2}, producer {:.2}), raft3 {:.2} core-s (brokers {:.2}, \
         producer {:.2})",
        single.total, single.brokers, single.producer, raft3.total, raft3.brokers, raft3.producer,
    );
    println!(
        "RATIO single / raft3 CPU per GB: {:.2}  (the ratio a CPU-bound machine allows)",
        single.total / raft3.total
    );
    println!(
        "RATIO raft3 / single brokers' CPU per acknowledged byte: {:.2}  (target <= 2.5; three copies written, two sent)",
        raft3.brokers / single.brokers
    );
    // The kernel's share, and what this machine charges for new file data, which raft3 writes three times.
    println!(
        "brokers' CPU per GB produced by kind: single user {:.2} + system {:.2} core-s, raft3 user {:.2} + system \
         {:.2} core-s",
        single.user, single.system, raft3.user, raft3.system
    );
    println!(
        "RATIO raft3 / single brokers' user CPU per acknowledged byte: {:.2}; system CPU: {:.2}",
        raft3.user / single.user,
        raft3.system / single.system
    );
    match support::page_cache_fill_cost(&std::env::temp_dir(), FILL_BYTES) {
        Ok((fresh, again)) => println!(
            "this machine's system CPU to write 1 GB of new file data (where the brokers keep their logs): {fresh:.2} \
             core-s into pages free for 3 s or more, {again:.2} core-s into the pages that write freed"
        ),
        Err(e) => println!("this machine's page-cache fill cost: not measured ({e})"),
    }
    println!("RATIO raft3 / single produce: {:.2}  (target >= 0.6)", raft3.mb / single.mb);

    for (mode, c, max) in [("single", &single_client, single.records), ("raft3", &client, raft3.records)] {
        let l = latency(c, mode, max / 2.0, &payload).await?;
        println!(
            "{mode} acknowledgement latency at {:.0} records/s (50% of max), {} records timed: p50 {:.2} ms, p99 {:.2} ms",
            max / 2.0,
            l.2,
            l.0.as_secs_f64() * 1e3,
            l.1.as_secs_f64() * 1e3
        );
    }

    let mut worst: f64 = 0.0;
    for round in 1..=FAILOVERS {
        let leader = leader_of(&client).await?;
        let took = failover(&client, &mut brokers[leader as usize - 1], &payload).await?;
        let ttls = took.as_secs_f64() / LEASE_TTL.as_secs_f64();
        worst = worst.max(ttls);
        println!(
            "failover {round}: kill -9 of leader {leader} to the next acknowledged write: {:.2} s = {ttls:.2}x the lease TTL",
            took.as_secs_f64()
        );
        brokers[leader as usize - 1].restart().await?;
        wait_for_isr(&client, 3).await?;
    }
    println!("RATIO worst failover / lease TTL: {worst:.2}  (target <= 3)");
    drop(brokers);
    fencing_cost(&program, &payload).await
}

/// Three members of a cluster of their own under `etcd`, with `env` set.
async fn members(
    etcd: &EtcdProcess,
    program: &std::path::Path,
    env: &[(&str, &str)],
) -> anyhow::Result<Vec<BrokerProcess>> {
    let mut brokers = Vec::new();
    for id in 1..=3 {
        let mut b = BrokerProcess::builder().program(program).env("RUST_LOG", "warn").cluster_id("bench");
        for (k, v) in env {
            b = b.env(*k, *v);
        }
        brokers.push(b.config(member_config(etcd, id)).start().await?);
    }
    Ok(brokers)
}

/// raft3 produce with self-fencing on and off, each on its own cluster, alternating rounds; one cluster runs at a
/// time (the other idles), so both see the same machine.
async fn fencing_cost(program: &std::path::Path, payload: &Bytes) -> anyhow::Result<()> {
    const ROUNDS: usize = 2;
    let mut runs = Vec::new();
    for env in [&[][..], &[(ferry_broker_no_fencing(), "1")][..]] {
        let etcd = EtcdProcess::start().await?;
        let brokers = members(&etcd, program, env).await?;
        let addrs: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
        let client = BrokerClient::new(ClientConfig::new(addrs))?;
        Admin::new(client.clone()).create_replicated_topic("raft3", 1, "raft3").await?;
        wait_for_isr(&client, 3).await?;
        runs.push((etcd, brokers, client));
    }
    let (mut mb, mut cost) = ([0.0f64; 2], [0.0f64; 2]);
    for _ in 0..ROUNDS {
        for (i, (_, brokers, client)) in runs.iter().enumerate() {
            let pids: Vec<u32> = brokers.iter().map(|b| b.pid()).collect();
            let run = busy(&pids, throughput(client, "raft3", payload, MAX_IN_FLIGHT)).await?;
            mb[i] += run.0.0 / ROUNDS as f64;
            cost[i] += run.1.brokers() / (run.0.0 / 1e3) / ROUNDS as f64;
        }
    }
    println!(
        "raft3 produce with self-fencing: {:.1} MB/s, brokers' CPU {:.2} core-s per GB; without: {:.1} MB/s, {:.2} core-s per GB ({ROUNDS} alternating rounds each)",
        mb[0], cost[0], mb[1], cost[1]
    );
    println!(
        "RATIO fenced / unfenced raft3 produce: {:.2}  (target ~1.0: fencing costs nothing measurable)",
        mb[0] / mb[1]
    );
    println!("RATIO unfenced / fenced brokers' CPU per GB: {:.2}  (target ~1.0)", cost[1] / cost[0]);
    Ok(())
}

/// The broker's benchmark-only switch that turns self-fencing off (`cluster::serving::NO_FENCING_VAR`).
fn ferry_broker_no_fencing() -> &'static str {
    "FERRY_BENCH_NO_FENCING"
}

/// Cores kept busy during a run: by each broker, by this process (the producer), and the machine's idle share.
struct Busy {
    per_broker: Vec<f64>,
    /// The brokers' cores, user and system.
    user: f64,
    system: f64,
    producer: f64,
    idle: f64,
}

impl Busy {
    fn brokers(&self) -> f64 {
        self.per_broker.iter().sum()
    }

    fn cores_total(&self) -> f64 {
        self.brokers() + self.producer
    }
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let brokers: Vec<String> = self.per_broker.iter().map(|c| format!("{c:.2}")).collect();
        write!(
            f,
            "cores busy: brokers {}, producer {:.2}; machine idle {:.0}%",
            brokers.join(" + "),
            self.producer,
            self.idle * 100.0
        )
    }
}

/// Runs `work`, and says how many cores each broker and this process kept busy meanwhile, and how idle the
/// machine was.
async fn busy<T>(pids: &[u32], work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<(T, Busy)> {
    let stat = |p: &u32| support::cpu_user_system(&format!("/proc/{p}/stat"));
    let (idle0, started) = (support::cpu_idle_ticks(), Instant::now());
    let before: Vec<(f64, f64)> = pids.iter().map(stat).collect();
    let own0 = support::cpu_seconds(std::process::id());
    let out = work.await?;
    let wall = started.elapsed().as_secs_f64();
    let after: Vec<(f64, f64)> = pids.iter().map(stat).collect();
    let used: Vec<(f64, f64)> =
        after.iter().zip(&before).map(|(a, b)| ((a.0 - b.0) / wall, (a.1 - b.1) / wall)).collect();
    let producer = (support::cpu_seconds(std::process::id()) - own0) / wall;
    Ok((
        out,
        Busy {
            per_broker: used.iter().map(|(u, s)| u + s).collect(),
            user: used.iter().map(|u| u.0).sum(),
            system: used.iter().map(|u| u.1).sum(),
            producer,
            idle: support::cpu_idle_share(idle0),
        },
    ))
}

/// A mode's throughput runs, averaged: MB/s, records/s and core-seconds per GB produced.
struct Run {
    mb: f64,
    records: f64,
    total: f64,
    brokers: f64,
    producer: f64,
    user: f64,
    system: f64,
}

impl Run {
    fn mean(runs: &[((f64, f64), Busy)]) -> Run {
        let n = runs.len().max(1) as f64;
        let per_gb = |f: &dyn Fn(&Busy) -> f64| runs.iter().map(|((mb, _), b)| f(b) / (mb / 1e3)).sum::<f64>() / n;
        Run {
            mb: runs.iter().map(|r| r.0.0).sum::<f64>() / n,
            records: runs.iter().map(|r| r.0.1).sum::<f64>() / n,
            total: per_gb(&|b| b.cores_total()),
            brokers: per_gb(&|b| b.brokers()),
            producer: per_gb(&|b| b.producer),
            user: per_gb(&|b| b.user),
            system: per_gb(&|b| b.system),
        }
    }
}

async fn leader_of(client: &BrokerClient) -> anyhow::Result<u32> {
    let meta = client.metadata_for(vec!["raft3".into()]).await?;
    meta.partitions.first().map(|p| p.leader_id).filter(|l| *l != 0).context("the raft3 partition has no leader")
}

async fn wait_for_isr(client: &BrokerClient, n: usize) -> anyhow::Result<()> {
    wait_until(
        "the raft3 partition fully in sync",
        deadline(&[LEASE_TTL, LEASE_TTL, Duration::from_secs(20)]),
        async || {
            let meta = client.metadata_for(vec!["raft3".into()]).await?;
            anyhow::Ok(meta.partitions.first().is_some_and(|p| p.isr.len() == n))
        },
    )
    .await
}

fn record(topic: &str, payload: &Bytes) -> ProducerRecord {
    ProducerRecord { topic: topic.to_owned(), partition: Some(0), value: Some(payload.clone()), ..Default::default() }
}

/// (MB/s, records/s) of RECORDS records sent as fast as the producer takes them, `in_flight` batches at most in
/// flight.
async fn throughput(
    client: &BrokerClient,
    topic: &str,
    payload: &Bytes,
    in_flight: usize,
) -> anyhow::Result<(f64, f64)> {
    let config = ProducerConfig { max_in_flight: in_flight, ..ProducerConfig::default() };
    let producer = Producer::new(client.clone(), config).await?;
    let start = Instant::now();
    let records = records();
    let mut deliveries = Vec::with_capacity(records);
    for _ in 0..records {
        deliveries.push(producer.send(record(topic, payload)).await?);
    }
    futures::future::try_join_all(deliveries).await.context("a produce failed")?;
    let secs = start.elapsed().as_secs_f64();
    producer.close().await;
    Ok(((records * RECORD_BYTES) as f64 / 1e6 / secs, records as f64 / secs))
}

/// (p50, p99, samples) of send-to-acknowledgement times with the producer paced at `rate` records/s.
async fn latency(
    client: &BrokerClient,
    topic: &str,
    rate: f64,
    payload: &Bytes,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let total = (rate * LATENCY_RUN.as_secs_f64()) as usize;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let start = Instant::now();
    let mut pending = FuturesUnordered::new();
    let mut times = Vec::with_capacity(total);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0;
    while sent < total {
        // Acknowledgements are taken as they come, with this task's waker (re-polling the pending set each tick
        // without it costs the load generator CPU that grows with what is in flight).
        tokio::select! {
            biased;
            Some(done) = pending.next(), if !pending.is_empty() => {
                times.push(done?);
                continue;
            }
            _ = tick.tick() => {}
        }
        let due = ((start.elapsed().as_secs_f64() * rate) as usize).min(total);
        while sent < due {
            let delivery = producer.send(record(topic, payload)).await?;
            // Every SAMPLE_EVERY-th record is timed; the others are left to the producer (a dropped delivery future
            // still delivers), so that tracking them costs the load generator no CPU the brokers need.
            if sent % SAMPLE_EVERY == 0 {
                let at = Instant::now();
                pending.push(async move { delivery.await.map(|_| at.elapsed()) });
            }
            sent += 1;
        }
    }
    while let Some(done) = pending.next().await {
        times.push(done?);
    }
    producer.flush().await;
    producer.close().await;
    times.sort();
    let pick = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    Ok((pick(0.50), pick(0.99), times.len()))
}

/// Kills the leader with a producer sending one record every 5 ms, each awaited in turn; returns the time from
/// the kill to the first acknowledgement of a record sent after it.
async fn failover(client: &BrokerClient, leader: &mut BrokerProcess, payload: &Bytes) -> anyhow::Result<Duration> {
    let config = ProducerConfig { delivery_timeout: Duration::from_secs(60), ..ProducerConfig::default() };
    let producer = Producer::new(client.clone(), config).await?;
    for _ in 0..20 {
        producer.send(record("raft3", payload)).await?.await?;
    }
    let killed = Instant::now();
    leader.kill9().await?;
    loop {
        let sent = Instant::now();
        producer.send(record("raft3", payload)).await?.await?;
        if sent >= killed {
            let took = killed.elapsed();
            producer.close().await;
            return Ok(took);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
