//! The mirror between clusters against the mirror between single brokers, side by side in one run (printed, never
//! asserted): a raft3 topic on a three-member source cluster copied to a three-member target cluster (its mirror
//! topic raft3 as well, `target.replication = "source"`), and a single topic on a lone source broker copied to a
//! lone target broker, the same backlog of 1 KiB records over 8 partitions each time. The copies alternate for
//! `FERRY_BENCH_ROUNDS` rounds (default 3); each round's pair gives a ratio, the median is the figure. Throughput is
//! the steady-state rate (10%..90% of the records), with the CPU seconds per 100 MB of the mirror and of the
//! brokers of both sides: the brokers' figure shows where the machine's two cores go.
//!
//! Run: `cargo build --release -p ferry-broker -p ferry-mirror && cargo bench --bench mirror_cluster`.
//! `FERRY_BIN_DIR` overrides where the release binaries are; `FERRY_BENCH_MB` the backlog per copy in MiB (default
//! 128). etcd is Debian's `etcd-server` (`apt-get install -y etcd-server`). All eight brokers, both etcds and the
//! mirror share the machine: on two cores a raft3 target writes every record three times, which is most of what
//! the ratio shows.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry::{Admin, BrokerClient, ClientConfig};
use ferry_client::admin::TopicConfig;
use ferry_testkit::{BrokerProcess, EtcdProcess, MirrorProcess, deadline, wait_until};
use support::{Steady, bin_dir, cpu_seconds};

mod support;

const RECORD: usize = 1024;
const PARTITIONS: u32 = 8;
const LEASE_TTL: Duration = Duration::from_secs(3);

fn main() -> ExitCode {
    support::block_on_main(run())
}

/// Either side of a copy: its brokers' addresses and process ids.
struct Side {
    addrs: Vec<String>,
    pids: Vec<u32>,
}

impl Side {
    /// Records `topic` holds, summed over its partitions: each partition's highest end over the members (the
    /// leader's high watermark; a follower's is never above it).
    async fn total(&self, topic: &str) -> anyhow::Result<u64> {
        let mut ends = vec![0u64; PARTITIONS as usize];
        for addr in &self.addrs {
            let admin = Admin::new(BrokerClient::new(ClientConfig::new([addr.clone()]))?);
            let Ok(d) = admin.describe_topic(topic).await else { continue };
            for p in d.partitions {
                if let Some(e) = ends.get_mut(p.partition as usize) {
                    *e = (*e).max(p.log_end_offset);
                }
            }
        }
        Ok(ends.iter().sum())
    }
}

/// A release broker; `cluster` is the `[cluster]` section of a member, empty for a lone broker.
async fn broker(name: &str, cluster: &str) -> anyhow::Result<BrokerProcess> {
    Ok(BrokerProcess::builder()
        .program(bin_dir().join(ferry_testkit::BROKER_BIN))
        .env("RUST_LOG", "warn")
        .cluster_id(name)
        .config(format!("{cluster}\n[broker]\nmax_batch_bytes = \"1MiB\"\n[storage]\nflush = \"async\"\n"))
        .start()
        .await?)
}

/// An etcd and three members named `name`.
async fn cluster(name: &str) -> anyhow::Result<(EtcdProcess, Vec<BrokerProcess>, Side)> {
    let etcd = EtcdProcess::start().await?;
    let mut members = Vec::new();
    for id in 1..=3 {
        let section = format!(
            "[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"{}s\"\nreplica_lag_max = \"3s\"\n\
             ack_timeout = \"15s\"\n",
            etcd.url(),
            LEASE_TTL.as_secs()
        );
        members.push(broker(name, &section).await?);
    }
    let addrs = members.iter().map(|b| b.addr().to_string()).collect();
    let pids = members.iter().map(|b| b.pid()).collect();
    Ok((etcd, members, Side { addrs, pids }))
}

fn mirror_config(source: &Side, target: &Side, topic: &str) -> String {
    support::MirrorToml {
        name: &format!("bench-{topic}"),
        source_cluster: if source.addrs.len() > 1 { "dc-a" } else { "single-a" },
        source: &source.addrs,
        target_cluster: if target.addrs.len() > 1 { "dc-b" } else { "single-b" },
        target: &target.addrs,
        target_extra: r#"replication = "source""#,
        include: &format!("^{topic}$"),
        ..Default::default()
    }
    .render()
}

/// CPU seconds the brokers of both sides used so far.
fn brokers_cpu(source: &Side, target: &Side) -> f64 {
    source.pids.iter().chain(&target.pids).map(|&pid| cpu_seconds(pid)).sum()
}

/// One copy: (MiB/s at the steady rate, mirror CPU seconds per 100 MB, brokers' CPU seconds per 100 MB).
async fn copy(source: &Side, target: &Side, topic: &str, records: u64, mb: f64) -> anyhow::Result<(f64, f64, f64)> {
    let config = mirror_config(source, target, topic);
    let mut mirror = MirrorProcess::builder(config).program(bin_dir().join("ferry-mirror")).start().await?;
    let limit = Instant::now() + Duration::from_secs(900);
    let mut clock: Option<Steady> = None;
    let (cpu0, brokers0) = (cpu_seconds(mirror.pid()), brokers_cpu(source, target));
    loop {
        let done = target.total(topic).await?;
        // The clock starts once the mirror topic exists on the target (discovery done).
        let c = clock.get_or_insert_with(|| Steady::start(records));
        if c.observe(done) {
            break;
        }
        if Instant::now() > limit {
            bail!("the copy of {topic} did not finish ({done} of {records}):\n{}", mirror.logs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (steady, _) = clock.expect("observed").finish();
    let (cpu, brokers) = (cpu_seconds(mirror.pid()) - cpu0, brokers_cpu(source, target) - brokers0);
    mirror.terminate(Duration::from_secs(30)).await?;
    Ok((mb / steady, cpu / mb * 100.0, brokers / mb * 100.0))
}

async fn run() -> anyhow::Result<()> {
    for bin in [ferry_testkit::BROKER_BIN, ferry_testkit::MIRROR_BIN] {
        if !bin_dir().join(bin).is_file() {
            bail!(
                "{bin} not found in {}: run `cargo build --release -p ferry-broker -p ferry-mirror`",
                bin_dir().display()
            );
        }
    }
    let mb: usize = std::env::var("FERRY_BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
    let rounds: usize = std::env::var("FERRY_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let records = (mb * 1024 * 1024 / RECORD) as u64;
    println!("mirror across clusters: {mb} MiB of {RECORD}-byte records over {PARTITIONS} partitions per copy");

    let (single_a, single_b) = (broker("single-a", "").await?, broker("single-b", "").await?);
    let lone = |b: &BrokerProcess| Side { addrs: vec![b.addr().to_string()], pids: vec![b.pid()] };
    let (sa, sb) = (lone(&single_a), lone(&single_b));
    let (_etcd_a, _members_a, ca) = cluster("dc-a").await?;
    let (_etcd_b, _members_b, cb) = cluster("dc-b").await?;
    let source_client = BrokerClient::new(ClientConfig::new(ca.addrs.clone()))?;
    wait_until("both clusters to be up", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        let (a, b) = (source_client.metadata().await?, BrokerClient::new(ClientConfig::new(cb.addrs.clone()))?);
        anyhow::Ok(a.brokers.len() == 3 && b.metadata().await?.brokers.len() == 3)
    })
    .await?;

    let (mut ratios, mut lines, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (single_topic, raft3_topic) = (format!("single{round}"), format!("raft3{round}"));
        Admin::new(BrokerClient::new(ClientConfig::new(sa.addrs.clone()))?)
            .create_topic(&single_topic, PARTITIONS, TopicConfig::default(), None)
            .await?;
        Admin::new(source_client.clone()).create_replicated_topic(&raft3_topic, PARTITIONS, "raft3").await?;
        wait_until("the raft3 source topic in sync", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
            let parts = source_client.metadata_for(vec![raft3_topic.clone()]).await?.partitions;
            anyhow::Ok(parts.len() == PARTITIONS as usize && parts.iter().all(|p| p.isr.len() == 3))
        })
        .await?;
        for (side, topic) in [(&sa, &single_topic), (&ca, &raft3_topic)] {
            support::produce_keyed(
                &side.addrs[0],
                topic,
                records as usize,
                RECORD,
                PARTITIONS,
                Duration::from_millis(5),
            )
            .await
            .with_context(|| format!("the backlog of {topic}"))?;
        }
        // Which copies first alternates, so neither always runs right after its own backlog was written.
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        let mut pair = [(0.0, 0.0, 0.0); 2];
        for i in order {
            pair[i] = match i {
                0 => copy(&sa, &sb, &single_topic, records, mb as f64).await?,
                _ => copy(&ca, &cb, &raft3_topic, records, mb as f64).await?,
            };
        }
        let line = format!(
            "round {round}: single -> single {:7.1} MiB/s (CPU s per 100 MB: mirror {:.2}, brokers {:.2}), \
             raft3 -> raft3 {:7.1} MiB/s (mirror {:.2}, brokers {:.2})",
            pair[0].0, pair[0].1, pair[0].2, pair[1].0, pair[1].1, pair[1].2
        );
        println!("{line}");
        lines.push(line);
        ratios.push(pair[1].0 / pair[0].0);
        cpus.push((pair[0].2, pair[1].2));
    }
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    let (single_cpu, raft3_cpu): (Vec<f64>, Vec<f64>) = cpus.iter().copied().unzip();
    ratios.sort_by(f64::total_cmp);
    println!(
        "RATIO mirror raft3 -> raft3 / single -> single: {:.3} median of [{}]",
        ratios[ratios.len() / 2],
        shown.join(", ")
    );
    println!(
        "RATIO brokers' CPU per byte, single -> single / raft3 -> raft3: {:.3} (mean {:.2} / {:.2} CPU s per 100 MB)",
        mean(&single_cpu) / mean(&raft3_cpu),
        mean(&single_cpu),
        mean(&raft3_cpu)
    );
    Ok(())
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}
