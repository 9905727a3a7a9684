//! The broker's Kafka listener against its own gRPC API and against tansu, in one run on one machine, printed as
//! ratios (never asserted):
//!
//! 1. confluent-kafka (librdkafka) producing 1 KiB records (idempotent, acks=all) to 8 partitions through Ferry's
//!    Kafka listener, then one consumer reading them all back;
//! 2. the same load through Ferry's gRPC API, with Ferry's Rust client;
//! 3. the same confluent-kafka load against tansu 0.6 (in-memory storage).
//!
//! Run: `cargo build --release -p ferry-broker && cargo bench --bench kafka_wire`. `FERRY_BIN_DIR` overrides where
//! the broker binary is; `FERRY_BENCH_RECORDS` the record count (default 200000). confluent-kafka and tansu come
//! from scripts/test.sh.

#[path = "../crates/ferry-mirror/tests/kafka_support/mod.rs"]
mod kafka_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, ProducerConfig, StartAt};
use ferry_testkit::{BrokerProcess, workspace_root};
use kafka_support::{Tansu, create_topic};
use support::bin_dir;

mod support;

const RECORD: usize = 1024;
const PARTITIONS: u32 = 8;

fn main() -> std::process::ExitCode {
    support::block_on_main(run())
}

fn script() -> PathBuf {
    workspace_root().join("benches/support/kafka_wire_bench.py")
}

/// Runs the confluent-kafka load; the seconds it reports.
async fn python(args: &[&str]) -> Result<Duration> {
    let out = tokio::process::Command::new("python3").arg(script()).args(args).output().await?;
    if !out.status.success() {
        bail!("kafka_wire_bench.py {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let secs: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().context("seconds")?;
    Ok(Duration::from_secs_f64(secs))
}

/// Produce then consume `count` records through confluent-kafka against `bootstrap` (topic `topic` exists).
async fn kafka_load(bootstrap: &str, topic: &str, count: usize) -> Result<(Duration, Duration)> {
    let (parts, n, size) = (PARTITIONS.to_string(), count.to_string(), RECORD.to_string());
    let produce = python(&[bootstrap, "produce", topic, &parts, &n, &size]).await?;
    let consume = python(&[bootstrap, "consume", topic, &parts, &n]).await?;
    Ok((produce, consume))
}

/// The same load through Ferry's gRPC API.
async fn grpc_load(addr: &str, topic: &str, count: usize) -> Result<(Duration, Duration)> {
    let produce =
        support::produce_keyed(addr, topic, count, RECORD, PARTITIONS, ProducerConfig::default().linger).await?;
    let client = BrokerClient::new(ClientConfig::new([addr.to_owned()]))?;
    let mut consumer = Consumer::new(client, ConsumerConfig::default())?;
    consumer.assign((0..PARTITIONS).map(|p| (topic.to_owned(), p, StartAt::Earliest)).collect())?;
    let start = Instant::now();
    let mut n = 0;
    while n < count {
        n += consumer.poll(Duration::from_millis(500)).await?.len();
    }
    Ok((produce, start.elapsed()))
}

fn rate(count: usize, d: Duration) -> f64 {
    count as f64 / d.as_secs_f64()
}

async fn run() -> Result<()> {
    let count: usize = std::env::var("FERRY_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let port = ferry_testkit::reserve_port()?;
    let kafka = format!("127.0.0.1:{port}");
    let broker = BrokerProcess::builder()
        .program(bin_dir().join("ferry-broker"))
        .cluster_id("bench")
        .config(format!(
            "[broker]\nmax_batch_bytes = \"1MiB\"\n[storage]\nflush = \"async\"\n[kafka]\nlisten = \"{kafka}\"\n"
        ))
        .start()
        .await?;
    let admin = Admin::new(BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?);
    for t in ["over_kafka", "over_grpc"] {
        admin.create_topic(t, PARTITIONS, TopicConfig::default(), None).await?;
    }
    let (kp, kc) = kafka_load(&kafka, "over_kafka", count).await?;
    let (gp, gc) = grpc_load(&broker.addr().to_string(), "over_grpc", count).await?;
    drop(broker);
    let tansu = Tansu::start("bench-tansu").await;
    create_topic(&tansu, "bench", PARTITIONS).await;
    let (tp, tc) = kafka_load(&tansu.bootstrap(), "bench", count).await?;
    tansu.stop().await;

    println!("{count} records of {RECORD} B over {PARTITIONS} partitions; records/s:");
    let line = |what: &str, d: Duration| println!("  {what:<52} {:>10.0}", rate(count, d));
    line("ferry Kafka listener, confluent-kafka produce", kp);
    line("ferry Kafka listener, confluent-kafka consume", kc);
    line("ferry gRPC API, Rust client produce", gp);
    line("ferry gRPC API, Rust client consume", gc);
    line("tansu 0.6, confluent-kafka produce", tp);
    line("tansu 0.6, confluent-kafka consume", tc);
    let ratio =
        |what: &str, a: Duration, b: Duration| println!("RATIO {what:<46} {:>6.2}", b.as_secs_f64() / a.as_secs_f64());
    ratio("kafka listener / gRPC API, produce", kp, gp);
    ratio("kafka listener / gRPC API, consume", kc, gc);
    ratio("kafka listener / tansu, produce", kp, tp);
    ratio("kafka listener / tansu, consume", kc, tc);
    Ok(())
}
