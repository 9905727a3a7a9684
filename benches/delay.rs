//! Delayed delivery benchmark: a release-built `ferry-broker` on loopback, driven by the Rust client.
//!
//! ```text
//! cargo build --release -p ferry-broker
//! cargo bench --bench delay
//! ```
//!
//! The broker binary is `$FERRY_BIN_DIR/ferry-broker` when `FERRY_BIN_DIR` is set, else `target/release/ferry-broker`.
//!
//! What is measured, with 100 B records in requests of 2,000 to one partition:
//! - delayed produce throughput and plain produce throughput side by side, and their ratio;
//! - with 1,000,000 records pending (800,000 due in an hour, 200,000 due within one second over 4 partitions):
//!   how fast the timer moves the 200,000 (records per second from their first due time to the last one readable),
//!   and their lateness as a poller sees it (p50, p99): a burst far above any steady rate;
//! - a light load's lateness: 20,000 records due evenly over 10 s, as a poller sees it (p50, p99), and the broker's
//!   own lateness quantiles (`ferry_broker_delay_lateness_ms`).
//!
//! Numbers are printed, never asserted: the machine is shared and noisy.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use ferry_batch::{BatchBuilder, BatchIter, Compression, ProducerInfo};
use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, ClientConfig};
use ferry_testkit::{BROKER_BIN, BrokerProcess, workspace_root};

mod support;

const VALUE_BYTES: usize = 100;
const PER_REQUEST: usize = 2_000;
const THROUGHPUT_RECORDS: usize = 200_000;
const PENDING: usize = 1_000_000;
const NEAR: usize = 200_000;
const NEAR_PARTITIONS: u32 = 4;
const LIGHT: usize = 20_000;
const LIGHT_SPREAD_MS: i64 = 10_000;

fn main() -> ExitCode {
    support::block_on_main(run())
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn broker_binary() -> anyhow::Result<std::path::PathBuf> {
    let dir = match std::env::var_os("FERRY_BIN_DIR").filter(|d| !d.is_empty()) {
        Some(d) => std::path::PathBuf::from(d),
        None => workspace_root().join("target").join("release"),
    };
    let path = dir.join(BROKER_BIN);
    if !path.is_file() {
        bail!("{} not found: build it with `cargo build --release -p ferry-broker`", path.display());
    }
    Ok(path)
}

/// One request's batch: `n` records of `VALUE_BYTES` numbered from `first`.
fn batch(first: usize, n: usize) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
    let ts = now_ms();
    for i in 0..n {
        let value = format!("{:0width$}", first + i, width = VALUE_BYTES);
        b.push(i as u32, ts, None, Some(value.as_bytes()), &[]);
    }
    b.build(0, 0)
}

fn produce(topic: &str, partition: u32, batches: Bytes) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: topic.into(), partition: Some(partition), key: None, batches }
}

/// Sends `total` records to `topic`/`partition` as delayed produces due at `due(request index)` (or plainly when
/// `due` is `None`); returns the seconds taken.
async fn send(
    client: &BrokerClient,
    topic: &str,
    partitions: u32,
    total: usize,
    due: Option<&dyn Fn(usize) -> i64>,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    for (k, first) in (0..total).step_by(PER_REQUEST).enumerate() {
        let request = produce(topic, k as u32 % partitions, batch(first, PER_REQUEST.min(total - first)));
        match due {
            None => {
                client.produce(request).await?;
            }
            Some(due) => {
                let r = client
                    .produce_delayed(pb::ProduceDelayedRequest {
                        produce: Some(request),
                        deliver_at_ms: Some(due(k)),
                        delay_ms: None,
                    })
                    .await?;
                if r.written.is_some() {
                    bail!("a delayed request was due before it was sent: the production took too long");
                }
            }
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Polls `topic`'s partitions until `expected` records were seen; returns each record's lateness (seen − its
/// timestamp, which is its due time) in ms and when the last was seen.
async fn watch(
    client: &BrokerClient,
    topic: &str,
    partitions: u32,
    expected: usize,
) -> anyhow::Result<(Vec<i64>, i64)> {
    let mut next = vec![0u64; partitions as usize];
    let (mut late, mut last_seen) = (Vec::with_capacity(expected), 0);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    while late.len() < expected {
        if Instant::now() > deadline {
            bail!("only {} of {expected} records became readable", late.len());
        }
        tick.tick().await;
        for p in 0..partitions {
            let r = client
                .fetch(pb::FetchRequest {
                    partitions: vec![pb::PartitionFetch {
                        topic: topic.into(),
                        partition: p,
                        offset: next[p as usize],
                        max_bytes: 8 << 20,
                        leader_epoch: None,
                    }],
                    max_wait_ms: 0,
                    max_bytes: 8 << 20,
                })
                .await?;
            let seen = now_ms();
            for item in BatchIter::new(&r.partitions[0].batches) {
                let (_, bytes) = item.context("whole batches")?;
                for rec in ferry_batch::decode_records(bytes)? {
                    if rec.offset >= next[p as usize] {
                        next[p as usize] = rec.offset + 1;
                        late.push(seen - rec.timestamp);
                        last_seen = seen;
                    }
                }
            }
        }
    }
    late.sort_unstable();
    Ok((late, last_seen))
}

fn pct(sorted: &[i64], q: f64) -> i64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

async fn run() -> anyhow::Result<()> {
    let program = broker_binary()?;
    println!(
        "delay benchmark: {VALUE_BYTES} B records, {PER_REQUEST} per request; ferry-broker: {}",
        program.display()
    );
    let broker = BrokerProcess::builder().program(&program).env("RUST_LOG", "warn").start().await?;
    let client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?;
    let admin = Admin::new(client.clone());
    for (topic, partitions) in [("plain", 1), ("far", 1), ("near", NEAR_PARTITIONS), ("light", 1)] {
        admin.create_topic(topic, partitions, TopicConfig::default(), None).await?;
    }

    // Side by side: the same records, plainly and delayed by an hour.
    let hour = now_ms() + 3_600_000;
    let plain = send(&client, "plain", 1, THROUGHPUT_RECORDS, None).await?;
    let delayed = send(&client, "far", 1, THROUGHPUT_RECORDS, Some(&|_| hour)).await?;
    let (plain_rate, delayed_rate) = (THROUGHPUT_RECORDS as f64 / plain, THROUGHPUT_RECORDS as f64 / delayed);
    println!("plain produce                 {plain_rate:>10.0} records/s ({THROUGHPUT_RECORDS} in {plain:.2} s)");
    println!("delayed produce               {delayed_rate:>10.0} records/s ({THROUGHPUT_RECORDS} in {delayed:.2} s)");
    println!("RATIO delayed / plain produce {:.2}", delayed_rate / plain_rate);

    // Up to a million pending: more far records, then the near burst, due within one second after it is all sent.
    let far_more = PENDING - NEAR - THROUGHPUT_RECORDS;
    send(&client, "far", 1, far_more, Some(&|_| hour)).await?;
    let estimate = (NEAR as f64 / delayed_rate * 1.5 + 3.0) * 1000.0;
    let t0 = now_ms() + estimate as i64;
    let requests = NEAR.div_ceil(PER_REQUEST) as i64;
    send(&client, "near", NEAR_PARTITIONS, NEAR, Some(&|k| t0 + k as i64 * 1000 / requests)).await?;
    let (late, last) = watch(&client, "near", NEAR_PARTITIONS, NEAR).await?;
    let took = (last - t0).max(1) as f64 / 1000.0;
    println!(
        "moves with {PENDING} pending: {NEAR} due within 1 s moved in {took:.2} s from the first due time: {:.0} moves/s; \
         lateness p50 {} ms, p99 {} ms",
        NEAR as f64 / took,
        pct(&late, 0.5),
        pct(&late, 0.99)
    );

    // A light load: due evenly over ten seconds.
    let t1 = now_ms() + 3_000;
    let requests = (LIGHT / 200) as i64;
    let started = Instant::now();
    for k in 0..requests {
        let r = produce("light", 0, batch(k as usize * 200, 200));
        let due = t1 + k * LIGHT_SPREAD_MS / requests;
        client
            .produce_delayed(pb::ProduceDelayedRequest { produce: Some(r), deliver_at_ms: Some(due), delay_ms: None })
            .await?;
    }
    anyhow::ensure!(started.elapsed() < Duration::from_secs(3), "the light load took too long to send");
    let (late, _) = watch(&client, "light", 1, LIGHT).await?;
    println!(
        "lateness, {LIGHT} records due over {} s, seen by a 5 ms poller: p50 {} ms, p99 {} ms",
        LIGHT_SPREAD_MS / 1000,
        pct(&late, 0.5),
        pct(&late, 0.99)
    );
    if let Some(addr) = broker.metrics_addr() {
        let text = reqwest::get(format!("http://{addr}/metrics")).await?.text().await?;
        for line in text
            .lines()
            .filter(|l| l.starts_with("ferry_broker_delay_lateness_ms") || l.starts_with("ferry_broker_delay_moves"))
        {
            println!("broker metric: {line}");
        }
    }
    Ok(())
}
