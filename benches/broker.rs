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
//! - produce-to-consume latency (p50, p99, p99.9) at 25%, 50% (the headline), 75% and 100% of the measured
//!   8-partition produce rate, 5 s each, for Ferry and then for JetStream at the same absolute rates (8 streams). The
//!   load generator and the consumer run in processes of their own (support/latency.rs: pre-built batches, one task
//!   per side), and each figure prints the cores the server, the producer and the consumer used, so a reader sees
//!   whether the run measured the server or queueing for the CPU. The table ends with the p99 ratio at the highest
//!   rate both sustain;
//! - the Ferry / JetStream produce ratios on 1 and 8 partitions / streams, and the headline
//!   `RATIO ferry / jetstream produce, 1 partition` (target >= 2).
//!
//! `FERRY_BENCH_LATENCY_ONLY=RATE` runs only Ferry's latency line at RATE records/s (8 partitions, 1 KiB, 5 s): for
//! comparing broker settings, which the broker takes from the environment (`FERRY_BROKER__STORAGE__FLUSH_BYTES=...`).
//!
//! Numbers are printed, never asserted: the machine is shared and noisy.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::{
    Admin, BrokerClient, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, StartAt,
};
use ferry_testkit::{BROKER_BIN, BrokerProcess, workspace_root};
use support::latency::{self, Load, RunResult, System};
use support::nats::{self, NatsServer};

mod support;

/// Size of every record's value.
const RECORD_BYTES: usize = 1024;
/// Records per produce run.
const RECORDS: usize = 300_000;
/// How long the paced latency run lasts.
const LATENCY_RUN: Duration = Duration::from_secs(5);
/// Loads of the latency runs, as fractions of the measured 8-partition produce maximum.
const LATENCY_LOADS: [f64; 6] = [0.05, 0.10, 0.25, 0.50, 0.75, 1.0];
/// The load of the headline latency figure.
const HEADLINE_LOAD: f64 = 0.50;

fn main() -> ExitCode {
    if let Some(code) = latency::run_role_if_asked() {
        return code;
    }
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
    let payload = Bytes::from(support::noise(RECORD_BYTES));
    println!("broker benchmark: {RECORDS} records of {RECORD_BYTES} B per run, async flush on both systems");
    println!("ferry-broker: {}", program.display());

    let broker = BrokerProcess::builder().program(&program).env("RUST_LOG", "warn").start().await?;
    let client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?;
    let admin = Admin::new(client.clone());

    if let Some(rate) = std::env::var("FERRY_BENCH_LATENCY_ONLY").ok().and_then(|r| r.parse::<f64>().ok()) {
        admin.create_topic("latency-only", 8, TopicConfig::default(), None).await?;
        let load = latency_load(broker.addr().to_string(), "latency-only".into(), rate);
        let result = latency::run(System::Ferry, &load, broker.pid()).await;
        match &result {
            Ok(r) => println!("ferry produce-to-consume latency, 8 partitions at {rate:.0} records/s: {}", r.line()),
            Err(e) => println!("ferry produce-to-consume latency at {rate:.0} records/s: not measured: {e:#}"),
        }
        return Ok(());
    }
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
    // Latency, measured by the harness in support::latency: producer and consumer in processes of their own, at a
    // quarter, half (the headline), three quarters and all of the 8-partition maximum measured above.
    let max8 = ferry.iter().find(|(p, _)| *p == 8).map(|(_, r)| r.records_per_sec()).unwrap_or(0.0);
    let mut ferry_runs = Vec::new();
    for fraction in LATENCY_LOADS {
        let topic = format!("latency-{}", (fraction * 100.0) as u32);
        admin.create_topic(&topic, 8, TopicConfig::default(), None).await?;
        let load = latency_load(broker.addr().to_string(), topic, max8 * fraction);
        let result = latency::run(System::Ferry, &load, broker.pid()).await;
        print_latency("ferry", fraction, &load, &result);
        ferry_runs.push((fraction, load, result.ok()));
    }
    // The same loads through the client library, for what an application sees (the client's per-record path).
    for fraction in LATENCY_LOADS {
        let topic = format!("client-latency-{}", (fraction * 100.0) as u32);
        admin.create_topic(&topic, 8, TopicConfig::default(), None).await?;
        let load = latency_load(broker.addr().to_string(), topic, max8 * fraction);
        let result = latency::run(System::FerryClient, &load, broker.pid()).await;
        print_latency("ferry client library (producer defaults, 5 ms linger)", fraction, &load, &result);
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
            let mut nats_runs = Vec::new();
            for (fraction, load, _) in &ferry_runs {
                let load = Load {
                    topic: format!("lat{}", (fraction * 100.0) as u32),
                    addr: server.url.clone(),
                    ..load.clone()
                };
                latency::nats_streams(&load).await?;
                let result = latency::run(System::Nats, &load, server.pid()).await;
                print_latency("nats jetstream", *fraction, &load, &result);
                nats_runs.push(result.ok());
            }
            compare_latency(&ferry_runs, &nats_runs);
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

/// A paced latency run's parameters: 8 partitions of 1 KiB records at `rate` records/s for LATENCY_RUN.
fn latency_load(addr: String, topic: String, rate: f64) -> Load {
    Load { addr, topic, partitions: 8, rate, record_bytes: RECORD_BYTES, run: LATENCY_RUN }
}

fn print_latency(system: &str, fraction: f64, load: &Load, result: &anyhow::Result<RunResult>) {
    let what = format!(
        "{system} produce-to-consume latency, 8 partitions at {:.0} records/s ({:.0}% of ferry's max{})",
        load.rate,
        fraction * 100.0,
        if fraction == HEADLINE_LOAD { ", headline" } else { "" }
    );
    match result {
        Ok(r) => println!("{what}: {}{}", r.line(), if r.sustained(load) { "" } else { "; NOT SUSTAINED" }),
        Err(e) => println!("{what}: not measured: {e:#}"),
    }
}

/// The side-by-side table: both systems at each rate, the p99 ratio where both sustained it, the headline, and the
/// highest rate both sustain.
fn compare_latency(ferry: &[(f64, Load, Option<RunResult>)], nats: &[Option<RunResult>]) {
    let mut both = None;
    for ((fraction, load, f), n) in ferry.iter().zip(nats) {
        let (Some(f), Some(n)) = (f, n) else { continue };
        let sustained = f.sustained(load) && n.sustained(load);
        println!(
            "latency at {:.0} records/s ({:.0}%): ferry p50/p99/p99.9 {:.2}/{:.2}/{:.2} ms, jetstream {:.2}/{:.2}/{:.2} ms, \
             p99 ferry / jetstream {:.2}{}",
            load.rate,
            fraction * 100.0,
            f.p50,
            f.p99,
            f.p999,
            n.p50,
            n.p99,
            n.p999,
            f.p99 / n.p99,
            if sustained { "" } else { " (not sustained by both)" }
        );
        if *fraction == HEADLINE_LOAD {
            println!("HEADLINE ferry p99 at 50% of its 8-partition max: {:.2} ms  (target <= 20 ms)", f.p99);
        }
        if sustained {
            both = Some((load.rate, f.p99 / n.p99));
        }
    }
    match both {
        Some((rate, ratio)) => println!(
            "RATIO ferry p99 / jetstream p99 at the highest rate both sustain ({rate:.0} records/s): {ratio:.2}  (target <= 1)"
        ),
        None => println!("no rate was sustained by both systems"),
    }
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
