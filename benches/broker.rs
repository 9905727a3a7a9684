//! End-to-end broker benchmark: a release-built `ferry-broker` on loopback, driven by the Rust client, with NATS
//! JetStream (file storage) under the same produce load as the yardstick.
//!
//! ```text
//! cargo build --release -p ferry-broker
//! cargo bench --bench broker
//! ```
//!
//! The broker binary is `$FERRY_BIN_DIR/ferry-broker` when `FERRY_BIN_DIR` is set, else `target/release/ferry-broker`.
//! NATS runs when `nats-server` is on the PATH or in `/usr/sbin` or `/usr/bin` (Debian: `apt-get install -y
//! nats-server`); without it the NATS lines are skipped.
//!
//! What is measured, all with 1 KiB records and both systems flushing asynchronously (Ferry's default
//! `flush = "async"`; JetStream's file store syncs every two minutes by default):
//! - produce throughput on 1 and 8 partitions (Ferry) / streams (JetStream): records sent as fast as the client
//!   takes them, timed until the last acknowledgement;
//! - consume throughput: a consumer reading each topic from the start to the end;
//! - produce-to-consume latency (p50, p99, p99.9) with the producer paced at 25%, 50% (the headline) and 75% of the
//!   measured 8-partition produce rate, for 5 s each;
//! - the Ferry / JetStream produce ratios on 1 and 8 partitions / streams, and the headline
//!   `RATIO ferry / jetstream produce, 1 partition` (target >= 2).
//!
//! Numbers are printed, never asserted: the machine is shared and noisy.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::{
    Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, StartAt,
};
use ferry_testkit::{BROKER_BIN, BrokerProcess, deadline, workspace_root};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use support::nats::{self, NatsServer};

mod support;

/// Size of every record's value.
const RECORD_BYTES: usize = 1024;
/// Records per produce run.
const RECORDS: usize = 300_000;
/// How long the paced latency run lasts.
const LATENCY_RUN: Duration = Duration::from_secs(5);
/// Loads of the latency runs, as fractions of the measured 8-partition produce maximum.
const LATENCY_LOADS: [f64; 3] = [0.25, 0.50, 0.75];
/// The load of the headline latency figure.
const HEADLINE_LOAD: f64 = 0.50;

fn main() -> ExitCode {
    support::block_on_main(run())
}

/// One throughput measurement.
#[derive(Debug, Clone, Copy)]
struct Rate {
    records: usize,
    bytes: usize,
    elapsed: Duration,
}

impl Rate {
    fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64()
    }

    fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what:<44} {:>8.1} MB/s {:>10.0} records/s  ({} records in {:.2} s)",
            self.mb_per_sec(),
            self.records_per_sec(),
            self.records,
            self.elapsed.as_secs_f64()
        )
    }
}

async fn run() -> anyhow::Result<()> {
    let program = broker_binary()?;
    let payload = Bytes::from(noise(RECORD_BYTES));
    println!("broker benchmark: {RECORDS} records of {RECORD_BYTES} B per run, async flush on both systems");
    println!("ferry-broker: {}", program.display());

    let broker = BrokerProcess::builder().program(&program).env("RUST_LOG", "warn").start().await?;
    let client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?;
    let admin = Admin::new(client.clone());

    let mut ferry = Vec::new();
    for partitions in [1u32, 8] {
        let topic = format!("bench-{partitions}");
        admin.create_topic(&topic, partitions, TopicConfig::default(), None).await?;
        let rate = ferry_produce(&client, &topic, partitions, &payload).await?;
        println!("{}", rate.line(&format!("ferry produce, {partitions} partition(s)")));
        ferry.push((partitions, rate));
    }
    for partitions in [1u32, 8] {
        let topic = format!("bench-{partitions}");
        let rate = ferry_consume(&client, &topic, partitions).await?;
        println!("{}", rate.line(&format!("ferry consume, {partitions} partition(s)")));
    }
    // Latency at a quarter, half (the headline) and three quarters of the 8-partition maximum (producer, consumer
    // and broker share the machine's cores). A load the consumer cannot keep up with is reported, not fatal.
    let max8 = ferry.iter().find(|(p, _)| *p == 8).map(|(_, r)| r.records_per_sec()).unwrap_or(0.0);
    for fraction in LATENCY_LOADS {
        let topic = format!("latency-{}", (fraction * 100.0) as u32);
        admin.create_topic(&topic, 8, TopicConfig::default(), None).await?;
        let rate = max8 * fraction;
        let what = format!(
            "ferry produce-to-consume latency, 8 partitions at {rate:.0} records/s ({:.0}% of max{})",
            fraction * 100.0,
            if fraction == HEADLINE_LOAD { ", headline" } else { "" }
        );
        // Where the machine's two cores went during the run: the broker, this process (the paced producer and the
        // consumer), and idle. A run with no idle time left measures queueing for the CPU, not the broker.
        let (idle0, started) = (support::cpu_idle_ticks(), Instant::now());
        let (broker0, own0) = (support::cpu_seconds(broker.pid()), support::cpu_seconds(std::process::id()));
        let result = ferry_latency(&client, &topic, 8, rate, &payload).await;
        let wall = started.elapsed().as_secs_f64();
        let cores = |cpu: f64| cpu / wall;
        let busy = format!(
            "cores busy: broker {:.2}, load generator and consumer {:.2}; machine idle {:.0}%",
            cores(support::cpu_seconds(broker.pid()) - broker0),
            cores(support::cpu_seconds(std::process::id()) - own0),
            support::cpu_idle_share(idle0) * 100.0
        );
        match result {
            Ok(l) => println!(
                "{what}, {} records: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms ({busy})",
                l.samples,
                l.p50.as_secs_f64() * 1e3,
                l.p99.as_secs_f64() * 1e3,
                l.p999.as_secs_f64() * 1e3
            ),
            Err(e) => println!("{what}: not measured: {e:#} ({busy})"),
        }
    }
    drop(broker);

    match nats::server_binary() {
        None => {
            println!(
                "nats-server not found on PATH: skipping NATS JetStream (install it: apt-get install -y nats-server)"
            );
        }
        Some(program) => {
            let server = NatsServer::start(&program).await?;
            let mut ratio1 = None;
            for partitions in [1u32, 8] {
                let rate = nats_produce(&server.url, partitions, &payload).await?;
                println!("{}", rate.line(&format!("nats jetstream publish, {partitions} stream(s)")));
                if let Some((_, f)) = ferry.iter().find(|(p, _)| *p == partitions) {
                    let ratio = f.mb_per_sec() / rate.mb_per_sec();
                    println!("ratio ferry / jetstream produce, {partitions} partition(s)/stream(s): {ratio:.2}x");
                    if partitions == 1 {
                        ratio1 = Some(ratio);
                    }
                }
            }
            if let Some(ratio) = ratio1 {
                println!("RATIO ferry / jetstream produce, 1 partition: {ratio:.2}  (target >= 2)");
            }
        }
    }
    Ok(())
}

/// The release broker: `$FERRY_BIN_DIR/ferry-broker`, else `target/release/ferry-broker`.
fn broker_binary() -> anyhow::Result<std::path::PathBuf> {
    let dir = match std::env::var_os("FERRY_BIN_DIR").filter(|d| !d.is_empty()) {
        Some(d) => std::path::PathBuf::from(d),
        None => workspace_root().join("target").join("release"),
    };
    let path = dir.join(BROKER_BIN);
    if !path.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p ferry-broker` (or set FERRY_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}

/// `len` bytes that do not compress (xorshift).
fn noise(len: usize) -> Vec<u8> {
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

/// Sends RECORDS records round the partitions as fast as the producer takes them; timed to the last ack.
async fn ferry_produce(client: &BrokerClient, topic: &str, partitions: u32, payload: &Bytes) -> anyhow::Result<Rate> {
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let start = Instant::now();
    let mut deliveries = Vec::with_capacity(RECORDS);
    for i in 0..RECORDS {
        let record = ProducerRecord {
            topic: topic.to_owned(),
            partition: Some(i as u32 % partitions),
            value: Some(payload.clone()),
            ..ProducerRecord::default()
        };
        deliveries.push(producer.send(record).await?);
    }
    futures::future::try_join_all(deliveries).await.context("a produce failed")?;
    let elapsed = start.elapsed();
    producer.close().await;
    Ok(Rate { records: RECORDS, bytes: RECORDS * RECORD_BYTES, elapsed })
}

/// Reads every record of `topic` from the start with one consumer.
async fn ferry_consume(client: &BrokerClient, topic: &str, partitions: u32) -> anyhow::Result<Rate> {
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default())?;
    consumer.assign((0..partitions).map(|p| (topic.to_owned(), p, StartAt::Earliest)).collect())?;
    let start = Instant::now();
    let (mut records, mut bytes) = (0usize, 0usize);
    while records < RECORDS {
        for r in consumer.poll(Duration::from_millis(500)).await? {
            records += 1;
            bytes += r.value.map_or(0, |v| v.len());
        }
    }
    Ok(Rate { records, bytes, elapsed: start.elapsed() })
}

fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Produce-to-consume latencies of one paced run.
#[derive(Debug, Clone, Copy)]
struct Latency {
    p50: Duration,
    p99: Duration,
    p999: Duration,
    samples: usize,
}

/// Paces the producer at `rate` records/s for LATENCY_RUN while a consumer reads the topic; each record carries
/// its send time, and the consumer notes how long it took to arrive.
async fn ferry_latency(
    client: &BrokerClient,
    topic: &str,
    partitions: u32,
    rate: f64,
    payload: &Bytes,
) -> anyhow::Result<Latency> {
    if rate < 1.0 {
        bail!("no produce rate to pace the latency run at");
    }
    let total = (rate * LATENCY_RUN.as_secs_f64()) as usize;
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default())?;
    consumer.assign((0..partitions).map(|p| (topic.to_owned(), p, StartAt::Earliest)).collect())?;
    let mut reader = tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(total);
        while latencies.len() < total {
            for r in consumer.poll(Duration::from_millis(100)).await? {
                let sent = r
                    .headers
                    .iter()
                    .find(|h| h.key == "t")
                    .and_then(|h| h.value.as_deref())
                    .map(|v| u64::from_be_bytes(v.try_into().expect("8-byte send time")));
                if let Some(sent) = sent {
                    latencies.push(Duration::from_micros(now_micros().saturating_sub(sent)));
                }
            }
        }
        anyhow::Ok(latencies)
    });
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let start = Instant::now();
    let mut deliveries = FuturesUnordered::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0usize;
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate) as usize).min(total);
        while sent < due {
            let record = ProducerRecord {
                topic: topic.to_owned(),
                partition: Some(sent as u32 % partitions),
                value: Some(payload.clone()),
                ..ProducerRecord::default()
            }
            .with_header("t", now_micros().to_be_bytes().to_vec());
            deliveries.push(producer.send(record).await?);
            sent += 1;
        }
        while let Some(Some(done)) = futures::FutureExt::now_or_never(deliveries.next()) {
            done?;
        }
    }
    while let Some(done) = deliveries.next().await {
        done?;
    }
    producer.close().await;
    // A consumer that fell behind is stopped here, not left polling through the runs that follow.
    let waited = tokio::time::timeout(deadline(&[LATENCY_RUN]), &mut reader).await;
    if waited.is_err() {
        reader.abort();
    }
    let mut latencies = waited.context("the consumer fell behind")???;
    latencies.sort();
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok(Latency { p50: pick(0.50), p99: pick(0.99), p999: pick(0.999), samples: latencies.len() })
}

/// Publishes RECORDS messages round `streams` file-backed streams (one subject each) with up to
/// [`nats::ACK_WINDOW`] acknowledgements outstanding; timed to the last acknowledgement.
async fn nats_produce(url: &str, streams: u32, payload: &Bytes) -> anyhow::Result<Rate> {
    use async_nats::jetstream::{self, stream};
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client);
    let subjects: Vec<String> = (0..streams).map(|s| format!("bench{streams}.s{s}")).collect();
    for (s, subject) in subjects.iter().enumerate() {
        js.create_stream(stream::Config {
            name: format!("BENCH{streams}_{s}"),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    }
    let elapsed = nats::publish_acked(&js, &subjects, RECORDS, payload).await?;
    Ok(Rate { records: RECORDS, bytes: RECORDS * RECORD_BYTES, elapsed })
}
