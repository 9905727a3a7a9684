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
//! - the ratio filter scan / raw consume. A scan request reads at most 4 GiB (the console's largest budget), so a
//!   larger partition is scanned by requests that resume where the last one stopped, all timed together;
//! - on a second broker, `FERRY_BENCH_CONSOLE_TOPICS` topics (default 1000, 0 skips it) of
//!   `FERRY_BENCH_CONSOLE_TOPIC_PARTITIONS` partitions each (default 8) plus one topic of 1,000 partitions, 9,000
//!   in all (the broker holds two open files per partition; 10 per topic needs `ulimit -n` above 20,000): the
//!   latency of the overview, the first topics page, and the topic page of the 1,000-partition topic (default page of 100 partitions, and all 1,000 in one page), through the JSON API
//!   and as HTML pages, median and worst of 10. `FERRY_BENCH_CONSOLE_MIB=0` skips the big partition.
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

async fn filter_scan(http: &reqwest::Client, url: &str, end: u64) -> anyhow::Result<(Duration, usize)> {
    let start = Instant::now();
    let (mut scanned, mut from, mut requests) = (0u64, 0u64, 0usize);
    loop {
        let text = http.get(format!("{url}&from_offset={from}")).bearer_auth(TOKEN).send().await?.text().await?;
        requests += 1;
        let done: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or("{}"))?;
        scanned += done["scanned_records"].as_u64().unwrap_or(0);
        match done["stop"].as_str() {
            Some("end") => break,
            Some("budget") => from = done["resume"][0]["next_offset"].as_u64().unwrap_or(end),
            _ => anyhow::bail!("the scan stopped early: {done}"),
        }
    }
    let elapsed = start.elapsed();
    anyhow::ensure!(scanned == end, "the scan read {scanned} of {end} records");
    Ok((elapsed, requests))
}

async fn latency(http: &reqwest::Client, url: &str, check: impl Fn(&str) -> bool) -> anyhow::Result<(f64, f64)> {
    let mut times = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        let r = http.get(url).bearer_auth(TOKEN).send().await?;
        anyhow::ensure!(r.status() == 200, "{url}: {}", r.status());
        let body = r.text().await?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(check(&body), "{url}: unexpected answer ({} bytes)", body.len());
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[times.len() - 1]))
}

/// What a page's answer must hold.
type Check = Box<dyn Fn(&str) -> bool>;

/// Many topics and partitions on their own broker: the pages that list them.
async fn many_topics(topics: usize, per_topic: u32) -> anyhow::Result<()> {
    let broker = support::broker("bench-console-topics").await?;
    let addr = broker.addr().to_string();
    let config = format!(
        "listen = \"127.0.0.1:0\"\n[[clusters]]\nname = \"b\"\nbrokers = [\"{addr}\"]\n\
         [[tokens]]\nname = \"bench\"\ntoken_file = \"t\"\nscope = \"read\"\n"
    );
    let console =
        ConsoleProcess::start_program(support::bin_dir().join("ferry-console"), &config, &[("t", TOKEN)]).await?;
    let admin = Admin::new(BrokerClient::new(ClientConfig::new([addr.clone()]))?);
    let start = Instant::now();
    for i in 0..topics {
        admin.create_topic(&format!("t{i:04}"), per_topic, TopicConfig::default(), None).await?;
    }
    admin.create_topic("wide", 1000, TopicConfig::default(), None).await?;
    println!(
        "{topics} topics x {per_topic} partitions + 1 topic x 1,000 partitions = {} partitions (created in {:.1}s)",
        topics * per_topic as usize + 1000,
        start.elapsed().as_secs_f64()
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    let (api, page) = (format!("{}/api/v1/clusters/b", console.url()), format!("{}/c/b", console.url()));
    let total = topics + 1;
    let json_has = |key: &'static str, want: usize| {
        move |body: &str| {
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            v[key].as_u64() == Some(want as u64) || v[key].as_array().map(Vec::len) == Some(want)
        }
    };
    let cases: Vec<(&str, String, Check)> = vec![
        ("overview (API)", format!("{api}/overview"), Box::new(json_has("topics", total))),
        ("overview (page)", page.clone(), Box::new(|b: &str| b.contains("</html>"))),
        ("topics, first 100 (API)", format!("{api}/topics?limit=100"), Box::new(json_has("topics", 100))),
        ("topics, first 100 (page)", format!("{page}/topics"), Box::new(|b: &str| b.contains("next page"))),
        ("1,000-partition topic, 100 (API)", format!("{api}/topics/wide"), Box::new(json_has("partitions", 100))),
        (
            "1,000-partition topic, all (API)",
            format!("{api}/topics/wide?partitions_limit=1000"),
            Box::new(json_has("partitions", 1000)),
        ),
        (
            "1,000-partition topic, 100 (page)",
            format!("{page}/topics/wide"),
            Box::new(|b: &str| b.contains("id=\"next\"")),
        ),
        (
            "1,000-partition topic, all (page)",
            format!("{page}/topics/wide?partitions_limit=1000"),
            Box::new(|b: &str| b.contains("partitions 0..1000 of 1000")),
        ),
    ];
    for (what, url, check) in cases {
        let (median, worst) = latency(&http, &url, check).await?;
        println!("{what:<36} median {median:>7.1} ms   worst {worst:>7.1} ms");
    }
    Ok(())
}

fn topics() -> usize {
    std::env::var("FERRY_BENCH_CONSOLE_TOPICS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

async fn run() -> anyhow::Result<()> {
    if topics() > 0 {
        let per_topic = std::env::var("FERRY_BENCH_CONSOLE_TOPIC_PARTITIONS").ok().and_then(|v| v.parse().ok());
        many_topics(topics(), per_topic.unwrap_or(8)).await?;
    }
    if mib() > 0 {
        big_partition().await?;
    }
    Ok(())
}

async fn big_partition() -> anyhow::Result<()> {
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
    let mut requests = 0;
    for _ in 0..2 {
        raw = raw.min(raw_consume(&client, end).await?);
        let (took, n) = filter_scan(&http, &scan, end).await?;
        (filter, requests) = (filter.min(took), n);
    }
    let mbs = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
    println!("raw consume (Consumer, whole partition)      {:>8.1} MB/s", mbs(raw));
    println!("filter scan (console, value, no match)       {:>8.1} MB/s   ({requests} request(s))", mbs(filter));
    println!("RATIO filter scan / raw consume              {:>8.3}", mbs(filter) / mbs(raw));
    Ok(())
}
