//! Kafka MirrorMaker throughput, printed as ratios measured side by side in one run (never asserted):
//!
//! 1. ferry -> ferry: the yardstick;
//! 2. kafka -> ferry: tansu 0.6 as the source (the same backlog, loaded with confluent-kafka);
//! 3. ferry -> kafka: the ferry source of (1) into tansu (idempotent transactional producers, provenance headers).
//!
//! Each run starts a mirror on a backlog of 1 KiB records over 8 partitions and clocks, from the moment the mirror
//! reports the partitions until it has copied everything (the cache offsets from `/api/v1/partitions`), the
//! steady-state rate (10%..90% of the records).
//!
//! Run: `cargo build --release -p ferry-broker -p ferry-mirror && cargo bench --bench kafka`. `FERRY_BIN_DIR`
//! overrides where the binaries are (e.g. target/debug for a quick look); `FERRY_BENCH_MB` the backlog size
//! (default 64). tansu and confluent-kafka come from scripts/test.sh.

#[path = "../crates/ferry-mirror/tests/kafka_support/mod.rs"]
mod kafka_support;

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ferry::{Admin, BrokerClient, ClientConfig, ProducerConfig};
use ferry_testkit::MirrorProcess;
use kafka_support::{Tansu, create_topic, tool};
use support::{Steady, bin_dir, broker};

mod support;

const RECORD: usize = 1024;
const PARTITIONS: u32 = 8;
const TOPIC: &str = "bench";

/// Loads `count` 1 KiB keyed records over the partitions of a new Ferry topic.
async fn load_ferry(addr: &str, count: usize) -> Result<()> {
    let client = BrokerClient::new(ClientConfig::new([addr.to_owned()]))?;
    Admin::new(client).create_topic(TOPIC, PARTITIONS, Default::default(), None).await?;
    support::produce_keyed(addr, TOPIC, count, RECORD, PARTITIONS, ProducerConfig::default().linger).await?;
    Ok(())
}

fn config(source: (&str, &str), target: (&str, &str)) -> String {
    support::MirrorToml {
        source_cluster: "src",
        source_extra: &format!("kind = {:?}", source.0),
        source: &[source.1.to_owned()],
        target_cluster: "dst",
        target_extra: &format!("kind = {:?}", target.0),
        target: &[target.1.to_owned()],
        include: &format!("^{TOPIC}$"),
        ..Default::default()
    }
    .render()
}

/// Records copied so far (sum of the cache offsets) and how many partitions the mirror reports.
async fn copied(mirror: &MirrorProcess) -> Result<(u64, usize)> {
    let url = format!("{}/api/v1/partitions", mirror.monitor_url());
    let v: serde_json::Value = serde_json::from_str(&reqwest::get(&url).await?.text().await?)?;
    let list = v["partitions"].as_array().cloned().unwrap_or_default();
    Ok((list.iter().filter_map(|p| p["cache_offset"].as_u64()).sum(), list.len()))
}

/// Runs a mirror with `toml` until it copied `expected` records; returns the steady-state MB/s.
async fn run(name: &str, toml: String, expected: u64) -> Result<f64> {
    let mut mirror = MirrorProcess::builder(toml).program(bin_dir().join("ferry-mirror")).start().await?;
    let deadline = Instant::now() + Duration::from_secs(900);
    while copied(&mirror).await?.1 < PARTITIONS as usize {
        if Instant::now() > deadline {
            bail!("{name}: the mirror never reported the partitions:\n{}", mirror.logs());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut clock = Steady::start(expected);
    loop {
        let (done, _) = copied(&mirror).await?;
        if clock.observe(done) {
            break;
        }
        if Instant::now() > deadline {
            bail!("{name}: the mirror did not finish ({done} of {expected}):\n{}", mirror.logs());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (steady, total) = clock.finish();
    mirror.terminate(Duration::from_secs(30)).await?;
    let mb = expected as f64 * RECORD as f64 / (1 << 20) as f64;
    let rate = mb / steady;
    println!("{name:<16} {rate:8.1} MB/s steady   ({mb:.0} MB in {total:.1} s wall)");
    Ok(rate)
}

async fn bench() -> Result<()> {
    let mb: usize = std::env::var("FERRY_BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let count = mb * (1 << 20) / RECORD;
    println!("Kafka mirror throughput: {count} records of {RECORD} B over {PARTITIONS} partitions ({mb} MB)");

    let ferry_src = broker("ferry-src").await?;
    let src_addr = ferry_src.addr().to_string();
    load_ferry(&src_addr, count).await?;
    let ferry_dst = broker("ferry-dst").await?;
    let ferry_ferry =
        run("ferry -> ferry", config(("ferry", &src_addr), ("ferry", &ferry_dst.addr().to_string())), count as u64)
            .await?;

    let kafka_src = Tansu::start("kafka-src").await;
    create_topic(&kafka_src, TOPIC, PARTITIONS).await;
    tool(&["load", &kafka_src.bootstrap(), TOPIC, &PARTITIONS.to_string(), &count.to_string(), &RECORD.to_string()])
        .await;
    let ferry_dst2 = broker("ferry-dst2").await?;
    let kafka_ferry = run(
        "kafka -> ferry",
        config(("kafka", &kafka_src.bootstrap()), ("ferry", &ferry_dst2.addr().to_string())),
        count as u64,
    )
    .await?;

    let kafka_dst = Tansu::start("kafka-dst").await;
    let ferry_kafka =
        run("ferry -> kafka", config(("ferry", &src_addr), ("kafka", &kafka_dst.bootstrap())), count as u64).await?;

    println!();
    println!("kafka -> ferry / ferry -> ferry: {:.2}", kafka_ferry / ferry_ferry);
    println!("ferry -> kafka / ferry -> ferry: {:.2}", ferry_kafka / ferry_ferry);
    Ok(())
}

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}
