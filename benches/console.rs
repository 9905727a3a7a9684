//! The web console against the raw client, side by side on one release broker and one release console:
//!
//! ```text
//! cargo build --release -p ferry-broker -p ferry-console
//! cargo bench --bench console            # FERRY_BENCH_CONSOLE_MIB=1024 by default: a 1 GiB partition
//! ```
//!
//! - one partition filled with `FERRY_BENCH_CONSOLE_MIB` MiB of 1 KiB records (default 1024: 1 GiB, what this
//!   machine's disk allows beside the other builds; the issue's target is stated for 10 GiB);
//! - the first browse page (50 records) from the oldest offset, the newest first and from the middle offset: the
//!   latency of `GET .../records` over HTTP, median and worst of 20;
//! - a filter scan that matches nothing (so it reads everything) of the whole partition, in MB/s of log bytes,
//!   against a raw consume of the same partition by the client's `Consumer`, in the same run, each the best of two;
//! - the ratio filter scan / raw consume.
//!
//! Numbers are printed, never asserted.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferry::{BrokerClient, ClientConfig};
use ferry_client::admin::{Admin, TopicConfig};
use ferry_client::{Consumer, ConsumerConfig, StartAt};
use ferry_testkit::ConsoleProcess;

mod support;

const RECORD_BYTES: usize = 1024;
const TOKEN: &str = "bench-console-token";

fn main() -> ExitCode {
    support::block_on_main(run())
}

fn mib() -> u64 {
    std::env::var("FERRY_BENCH_CONSOLE_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024)
}

async fn page_latency(http: &reqwest::Client, url: &str) -> anyhow::Result<(f64, f64)> {
    let mut times = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let r = http.get(url).bearer_auth(TOKEN).send().await?;
        anyhow::ensure!(r.status() == 200, "{url}: {}", r.status());
        let v: serde_json::Value = r.json().await?;
        anyhow::ensure!(v["records"].as_array().map_or(0, Vec::len) == 50, "{url}: not a full page");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[times.len() - 1]))
}

async fn raw_consume(client: &BrokerClient, end: u64) -> anyhow::Result<Duration> {
    let mut c = Consumer::new(client.clone(), ConsumerConfig::default())?;
    c.assign(vec![("big".into(), 0, StartAt::Offset(0))])?;
    let start = Instant::now();
    let mut seen = 0u64;
    while seen < end {
        seen += c.poll(Duration::from_millis(500)).await?.len() as u64;
    }
    let elapsed = start.elapsed();
    c.close().await?;
    Ok(elapsed)
}

async fn filter_scan(http: &reqwest::Client, url: &str, end: u64) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let text = http.get(url).bearer_auth(TOKEN).send().await?.text().await?;
    let elapsed = start.elapsed();
    let done: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or("{}"))?;
    anyhow::ensure!(done["stop"] == "end" && done["scanned_records"] == end, "the scan did not read it all: {done}");
    Ok(elapsed)
}

async fn run() -> anyhow::Result<()> {
    let broker = support::broker("bench-console").await?;
    let addr = broker.addr().to_string();
    let config = format!(
        "listen = \"127.0.0.1:0\"\n[[clusters]]\nname = \"b\"\nbrokers = [\"{addr}\"]\n\
         [[tokens]]\nname = \"bench\"\ntoken_file = \"t\"\nscope = \"read\"\n"
    );
    let console =
        ConsoleProcess::start_program(support::bin_dir().join("ferry-console"), &config, &[("t", TOKEN)]).await?;
    let client = BrokerClient::new(ClientConfig::new([addr.clone()]))?;
    let admin = Admin::new(client.clone());
    admin.create_topic("big", 1, TopicConfig::default(), None).await?;
    let count = (mib() * 1024 * 1024) as usize / RECORD_BYTES;
    let filled = support::produce_keyed(&addr, "big", count, RECORD_BYTES, 1, Duration::from_millis(5)).await?;
    let part = admin.describe_topic("big").await?.partitions[0].clone();
    let (bytes, end) = (part.size_bytes, part.log_end_offset);
    println!(
        "partition: {:.2} GiB on disk, {end} records of {RECORD_BYTES} B (filled in {:.1}s)",
        bytes as f64 / (1u64 << 30) as f64,
        filled.as_secs_f64()
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    let base = format!("{}/api/v1/clusters/b/topics/big/partitions/0/records", console.url());
    for (what, url) in [
        ("oldest", format!("{base}?offset=0&limit=50")),
        ("newest first", format!("{base}?newest=true&limit=50")),
        ("from the middle offset", format!("{base}?offset={}&limit=50", end / 2)),
    ] {
        let (median, worst) = page_latency(&http, &url).await?;
        println!("first browse page, 50 records, {what:<24} median {median:>7.1} ms   worst {worst:>7.1} ms");
    }
    let scan = format!(
        "{}/api/v1/clusters/b/topics/big/scan?partition=0&value=no-such-value&limit=1&budget_bytes={}",
        console.url(),
        (bytes * 2).min(4 << 30)
    );
    let mut raw = Duration::MAX;
    let mut filter = Duration::MAX;
    for _ in 0..2 {
        raw = raw.min(raw_consume(&client, end).await?);
        filter = filter.min(filter_scan(&http, &scan, end).await?);
    }
    let mbs = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
    println!("raw consume (Consumer, whole partition)      {:>8.1} MB/s", mbs(raw));
    println!("filter scan (console, value, no match)       {:>8.1} MB/s", mbs(filter));
    println!("RATIO filter scan / raw consume              {:>8.3}", mbs(filter) / mbs(raw));
    Ok(())
}
