//! Fenced failover time (issue 29): 100 topics of 10 partitions mirrored from a lone source broker to a lone target
//! broker, the mirror caught up; then `ferryctl failover --confirm` runs, and the time from the command's start to
//! its end (the last promotion, then the job's `done`, which only pauses the topics) is printed, with the job's own
//! account (`finished_ms - started_ms`) and the ratio to one lease TTL (the default `cluster.lease_ttl`, 10 s): the
//! time an operator waits compared with the time a cluster takes to replace a lost leader. Printed, never asserted.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench failover`. `FERRY_BIN_DIR` overrides where
//! the release binaries are; `FERRY_BENCH_ROUNDS` how many runs (default 3; the median is the figure).

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{MirrorProcess, deadline, wait_until};
use support::bin_dir;

mod support;

const TOPICS: u32 = 100;
const PARTITIONS: u32 = 10;
const LEASE_TTL: Duration = Duration::from_secs(10);
const TOKEN: &str = "bench-monitor-token-0123456789";

fn main() -> ExitCode {
    support::block_on_main(run())
}

fn topic(t: u32) -> String {
    format!("bulk.{t:03}")
}

/// One failover of TOPICS x PARTITIONS: (wall time of the command, the job's own duration).
async fn round() -> anyhow::Result<(Duration, Duration)> {
    let a = support::broker("dc-a").await?;
    let b = support::broker("dc-b").await?;
    let admin_a = Admin::new(BrokerClient::new(ClientConfig::new([a.addr().to_string()]))?);
    let admin_b = Admin::new(BrokerClient::new(ClientConfig::new([b.addr().to_string()]))?);
    for t in 0..TOPICS {
        admin_a.create_topic(&topic(t), PARTITIONS, Default::default(), None).await?;
    }
    let p =
        Producer::new(BrokerClient::new(ClientConfig::new([a.addr().to_string()]))?, ProducerConfig::default()).await?;
    let mut acks = Vec::new();
    for t in 0..TOPICS {
        for q in 0..PARTITIONS {
            for i in 0..10 {
                let r = ProducerRecord::new(topic(t), format!("value-{i}")).with_partition(q).with_key(format!("k{i}"));
                acks.push(p.send(r).await?);
            }
        }
    }
    for a in acks {
        a.await?;
    }
    p.close().await;
    let config = format!(
        "[mirror]\nname = \"bench\"\n[source]\ncluster = \"dc-a\"\n[[source.routes]]\nname = \"primary\"\nbrokers = \
         [\"{}\"]\n[target]\ncluster = \"dc-b\"\nbrokers = [\"{}\"]\n[topics]\ninclude = [\"^bulk\\\\..*$\"]\n\
         rename = \"identity\"\n[monitor]\nlisten = \"127.0.0.1:0\"\n",
        a.addr(),
        b.addr()
    );
    let mirror = MirrorProcess::builder(config)
        .program(bin_dir().join("ferry-mirror"))
        .env("FERRY_MONITOR_TOKEN", TOKEN)
        .start()
        .await?;
    wait_until("the mirror caught up", deadline(&[Duration::from_secs(60)]), async || -> anyhow::Result<bool> {
        for t in 0..TOPICS {
            let Ok(d) = admin_b.describe_topic(&topic(t)).await else { return Ok(false) };
            if d.partitions.iter().map(|p| p.log_end_offset).sum::<u64>() != u64::from(PARTITIONS) * 10 {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    let started = Instant::now();
    let out = tokio::process::Command::new(bin_dir().join("ferryctl"))
        .args(["--token", TOKEN, "failover", "--mirror", &mirror.monitor_url(), "--topics", "bulk\\..*"])
        .args(["--confirm", "--poll", "20ms", "--format", "json"])
        .stdin(Stdio::null())
        .output()
        .await?;
    let wall = started.elapsed();
    if !out.status.success() {
        bail!("ferryctl failover failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).context("the job as JSON")?;
    let took = job["finished_ms"].as_i64().unwrap_or(0) - job["started_ms"].as_i64().unwrap_or(0);
    let promoted = job["partitions"].as_array().map_or(0, Vec::len);
    if promoted != (TOPICS * PARTITIONS) as usize {
        bail!("the report covers {promoted} partitions, not {}", TOPICS * PARTITIONS);
    }
    Ok((wall, Duration::from_millis(took.max(0) as u64)))
}

async fn run() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("FERRY_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let mut walls = Vec::new();
    let mut jobs = Vec::new();
    for r in 0..rounds {
        let (wall, job) = round().await?;
        println!("round {r}: command {:.2} s, job {:.2} s", wall.as_secs_f64(), job.as_secs_f64());
        walls.push(wall);
        jobs.push(job);
    }
    walls.sort();
    jobs.sort();
    let (wall, job) = (walls[walls.len() / 2], jobs[jobs.len() / 2]);
    println!(
        "fenced failover of {TOPICS} topics x {PARTITIONS} partitions: command {:.2} s (job {:.2} s), {:.3} of one \
         lease TTL ({} s)",
        wall.as_secs_f64(),
        job.as_secs_f64(),
        wall.as_secs_f64() / LEASE_TTL.as_secs_f64(),
        LEASE_TTL.as_secs()
    );
    Ok(())
}
