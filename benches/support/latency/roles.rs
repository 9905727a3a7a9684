//! The role processes of the latency harness: the paced producers and the consumers of Ferry (lean and through the
//! client library) and NATS JetStream, and what they share (the pacer, the latency tally, the batch templates).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use bytes::{Bytes, BytesMut};
use ferry_batch::{BatchBuilder, BatchHeader, CRC_START, Compression, ProducerInfo, compute_crc};
use ferry_proto::broker_client::BrokerClient as RawClient;
use ferry_proto::{FetchRequest, PartitionFetch, ProduceRequest};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

use super::Load;

/// The most bytes one pre-built batch holds (below the broker's default 1 MiB `max_batch_bytes`, header and record
/// framing included); a tick's share of a partition beyond it is split.
const MAX_BATCH_BYTES: usize = 960 * 1024;
/// Produce calls or publish acknowledgements a producer keeps outstanding.
const IN_FLIGHT: usize = 256;
/// The pacing tick.
const TICK: Duration = Duration::from_millis(1);
/// How far behind its schedule a producer may fall before it stops: the rate is then not sustained, and going on
/// would only queue more.
const GIVE_UP_LAG: Duration = Duration::from_secs(1);
/// How long a consumer waits for more once records stopped coming (the producer gave up or is done).
const QUIET: Duration = Duration::from_secs(2);
/// Bytes marking where the stamp goes in a template (replaced before anything is sent).
const MARK: [u8; 8] = [0xA5, 0x5A, 0xC3, 0x3C, 0x96, 0x69, 0x0F, 0xF0];

fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// CPU seconds this process has used.
fn own_cpu() -> f64 {
    super::super::cpu_seconds(std::process::id())
}

/// The value every record carries: `len` incompressible bytes, the first 8 the stamp's place.
fn value(len: usize, marked: bool) -> Vec<u8> {
    let mut v = super::super::noise(len.max(8));
    v[..8].copy_from_slice(if marked { &MARK } else { &[0; 8] });
    v
}

/// A batch of `n` records whose first record's value starts with [`MARK`], and where that mark sits.
fn template(n: usize, record_bytes: usize) -> (Vec<u8>, usize) {
    let mut builder = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
    let (marked, plain) = (value(record_bytes, true), value(record_bytes, false));
    let ts = (now_micros() / 1000) as i64;
    for i in 0..n {
        builder.push(i as u32, ts, None, Some(if i == 0 { &marked } else { &plain }), &[]);
    }
    let batch = builder.build(0, 0).to_vec();
    let at = batch.windows(8).position(|w| w == MARK).expect("the mark is in the batch");
    (batch, at)
}

/// Takes every acknowledgement still pending into `acks`.
async fn drain<F, E>(pending: &mut FuturesUnordered<F>, acks: &mut Latencies, what: &'static str) -> anyhow::Result<()>
where
    F: Future<Output = Result<(Duration, u32), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    while let Some(done) = pending.next().await {
        acks.note(done.context(what)?);
    }
    Ok(())
}

/// Latencies by batch: (µs, records), summarised as weighted percentiles.
struct Latencies(Vec<(u64, u32)>);

impl Latencies {
    fn with_capacity(load: &Load) -> Latencies {
        Latencies(Vec::with_capacity(load.total() + 1024))
    }

    /// One acknowledgement: how long it took, for how many records.
    fn note(&mut self, (took, records): (Duration, u32)) {
        self.0.push((took.as_micros() as u64, records));
    }

    /// (p50, p99) in ms.
    fn p50_p99(mut self) -> (f64, f64) {
        let s = self.summary_sorted(0.0);
        (s["p50_ms"].as_f64().unwrap_or(0.0), s["p99_ms"].as_f64().unwrap_or(0.0))
    }

    fn summary(mut self, cpu_s: f64) -> serde_json::Value {
        self.summary_sorted(cpu_s)
    }

    fn summary_sorted(&mut self, cpu_s: f64) -> serde_json::Value {
        self.0.sort_unstable();
        let received: u64 = self.0.iter().map(|&(_, n)| u64::from(n)).sum();
        let pick = |q: f64| {
            let want = ((received as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0u64;
            for &(us, n) in &self.0 {
                seen += u64::from(n);
                if seen >= want {
                    return us as f64 / 1000.0;
                }
            }
            0.0
        };
        json!({"received": received, "p50_ms": pick(0.5), "p99_ms": pick(0.99), "p999_ms": pick(0.999), "cpu_s": cpu_s})
    }
}

/// Sends what is due every tick, as `send(partition, records, stamp)` calls; returns (sent, achieved rate, worst lag).
struct Pacer {
    tick: tokio::time::Interval,
    start: Instant,
    sent: usize,
    total: usize,
    rate: f64,
    worst_lag: Duration,
}

impl Pacer {
    fn new(load: &Load) -> Pacer {
        Pacer {
            tick: tokio::time::interval(TICK),
            start: Instant::now(),
            sent: 0,
            total: load.total(),
            rate: load.rate,
            worst_lag: Duration::ZERO,
        }
    }

    /// Waits for the next tick and returns the records due then ([`Pacer::due`]), noting acknowledgements into
    /// `acks` as they come meanwhile. They are taken with this task's own waker: polling the pending set without it
    /// (`now_or_never` each tick) re-polls futures that are not ready, a cost that grows with the number in flight.
    async fn next_due<F, E>(
        &mut self,
        pending: &mut FuturesUnordered<F>,
        acks: &mut Latencies,
        what: &'static str,
    ) -> anyhow::Result<usize>
    where
        F: Future<Output = Result<(Duration, u32), E>>,
        E: std::error::Error + Send + Sync + 'static,
    {
        loop {
            tokio::select! {
                biased;
                Some(done) = pending.next(), if !pending.is_empty() => acks.note(done.context(what)?),
                _ = self.tick.tick() => return Ok(self.due()),
            }
        }
    }

    /// Records due now and not yet sent, at most four ticks' worth: a producer that fell behind does not catch up
    /// in one burst (its lag grows instead, and past [`GIVE_UP_LAG`] it stops: the rate is not sustained).
    fn due(&mut self) -> usize {
        let elapsed = self.start.elapsed().as_secs_f64();
        let due = ((elapsed * self.rate) as usize).min(self.total);
        if due > self.sent {
            // How far behind its schedule the oldest unsent record is.
            let scheduled = self.sent as f64 / self.rate;
            self.worst_lag = self.worst_lag.max(Duration::from_secs_f64((elapsed - scheduled).max(0.0)));
        }
        let burst = ((self.rate * TICK.as_secs_f64() * 4.0) as usize).max(1);
        (due - self.sent.min(due)).min(burst)
    }

    /// All sent, or so far behind that the rate is not sustained.
    fn done(&self) -> bool {
        self.sent >= self.total || self.worst_lag > GIVE_UP_LAG
    }

    fn report(&self, cpu_s: f64, acks: Latencies) -> serde_json::Value {
        let took = self.start.elapsed().as_secs_f64();
        let (ack_p50, ack_p99) = acks.p50_p99();
        json!({
            "ack_p50_ms": ack_p50,
            "ack_p99_ms": ack_p99,
            "sent": self.sent,
            "achieved": self.sent as f64 / took,
            "schedule_lag_ms": self.worst_lag.as_secs_f64() * 1e3,
            "cpu_s": cpu_s,
        })
    }
}

async fn connect(addr: &str) -> anyhow::Result<RawClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true).connect().await?;
    Ok(RawClient::new(channel).max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20))
}

pub(super) async fn ferry_produce(load: &Load) -> anyhow::Result<serde_json::Value> {
    let client = connect(&load.addr).await?;
    let mut acks = Latencies::with_capacity(load);
    let mut templates: HashMap<usize, (Vec<u8>, usize)> = HashMap::new();
    let mut calls = FuturesUnordered::new();
    let mut pacer = Pacer::new(load);
    let mut next_partition = 0u32;
    let max_batch = (MAX_BATCH_BYTES / (load.record_bytes + 16)).max(1);
    while !pacer.done() {
        let mut due = pacer.next_due(&mut calls, &mut acks, "produce").await?;
        let stamp = now_micros().to_be_bytes();
        // The due records spread over the partitions in turn, one batch per partition per tick.
        let per = due.div_ceil(load.partitions as usize).clamp(1, max_batch);
        while due > 0 {
            let n = per.min(due);
            let (batch, at) = templates.entry(n).or_insert_with(|| template(n, load.record_bytes));
            let mut buf = BytesMut::from(&batch[..]);
            buf[*at..*at + 8].copy_from_slice(&stamp);
            let crc = compute_crc(&buf);
            buf[CRC_START - 4..CRC_START].copy_from_slice(&crc.to_be_bytes());
            let request = ProduceRequest {
                topic: load.topic.clone(),
                partition: Some(next_partition),
                key: None,
                batches: buf.freeze(),
            };
            next_partition = (next_partition + 1) % load.partitions;
            let mut client = client.clone();
            let sent_at = Instant::now();
            calls.push(async move { client.produce(request).await.map(|_| (sent_at.elapsed(), n as u32)) });
            while calls.len() >= IN_FLIGHT {
                acks.note(calls.next().await.context("in flight")?.context("produce")?);
            }
            due -= n;
            pacer.sent += n;
        }
    }
    drain(&mut calls, &mut acks, "produce").await?;
    Ok(pacer.report(own_cpu(), acks))
}

pub(super) async fn ferry_consume(load: &Load) -> anyhow::Result<serde_json::Value> {
    let mut client = connect(&load.addr).await?;
    let (_, at) = template(1, load.record_bytes);
    let mut offsets = vec![0u64; load.partitions as usize];
    let mut latencies = Latencies::with_capacity(load);
    let mut received = 0u64;
    let total = load.total() as u64;
    println!("ready");
    let mut last = Instant::now() + load.run;
    while received < total && last.elapsed() < QUIET {
        let request = FetchRequest {
            partitions: (0..load.partitions)
                .map(|p| PartitionFetch {
                    topic: load.topic.clone(),
                    partition: p,
                    offset: offsets[p as usize],
                    max_bytes: 4 << 20,
                    leader_epoch: None,
                })
                .collect(),
            max_wait_ms: 500,
            max_bytes: 32 << 20,
        };
        let answer = client.fetch(request).await.context("fetch")?.into_inner();
        let now = now_micros();
        if answer.partitions.iter().any(|d| !d.batches.is_empty()) {
            last = Instant::now();
        }
        for data in answer.partitions {
            let mut buf = &data.batches[..];
            while !buf.is_empty() {
                let header = BatchHeader::parse(buf)?;
                let len = header.total_len();
                if header.base_offset >= offsets[data.partition as usize] && buf.len() >= at + 8 {
                    let stamp = u64::from_be_bytes(buf[at..at + 8].try_into()?);
                    latencies.0.push((now.saturating_sub(stamp), header.record_count));
                    received += u64::from(header.record_count);
                }
                buf = &buf[len.min(buf.len())..];
            }
            if data.error != 0 {
                bail!("fetch of partition {}: error {} {}", data.partition, data.error, data.message);
            }
            offsets[data.partition as usize] = offsets[data.partition as usize].max(data.next_offset);
        }
    }
    Ok(latencies.summary(own_cpu()))
}

fn nats_subject(load: &Load, stream: u32) -> String {
    format!("{}.s{stream}", load.topic)
}

fn nats_stream(load: &Load, stream: u32) -> String {
    format!("{}_{stream}", load.topic.to_uppercase())
}

/// Creates the run's streams (file storage, one subject each); the parent calls it before the roles start.
pub(super) async fn nats_streams(load: &Load) -> anyhow::Result<()> {
    use async_nats::jetstream::{self, stream};
    let js = jetstream::new(async_nats::connect(&load.addr).await?);
    for s in 0..load.partitions {
        js.create_stream(stream::Config {
            name: nats_stream(load, s),
            subjects: vec![nats_subject(load, s)],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

pub(super) async fn nats_produce(load: &Load) -> anyhow::Result<serde_json::Value> {
    let js = async_nats::jetstream::new(async_nats::connect(&load.addr).await?);
    let subjects: Vec<String> = (0..load.partitions).map(|s| nats_subject(load, s)).collect();
    let mut payload = value(load.record_bytes, false);
    let mut pending = FuturesUnordered::new();
    let mut acks = Latencies::with_capacity(load);
    let mut pacer = Pacer::new(load);
    let mut next = 0usize;
    while !pacer.done() {
        let due = pacer.next_due(&mut pending, &mut acks, "publish").await?;
        payload[..8].copy_from_slice(&now_micros().to_be_bytes());
        let shared = Bytes::copy_from_slice(&payload);
        for _ in 0..due {
            let sent_at = Instant::now();
            let ack = js.publish(subjects[next].clone(), shared.clone()).await?.into_future();
            next = (next + 1) % subjects.len();
            pending.push(async move { ack.await.map(|_| (sent_at.elapsed(), 1u32)) });
            while pending.len() >= IN_FLIGHT * 32 {
                acks.note(pending.next().await.context("in flight")?.context("publish")?);
            }
            pacer.sent += 1;
        }
    }
    drain(&mut pending, &mut acks, "publish").await?;
    Ok(pacer.report(own_cpu(), acks))
}

pub(super) async fn nats_consume(load: &Load) -> anyhow::Result<serde_json::Value> {
    use async_nats::jetstream::consumer::push;
    let client = async_nats::connect(&load.addr).await?;
    let js = async_nats::jetstream::new(client.clone());
    let mut streams = Vec::new();
    for s in 0..load.partitions {
        let stream = js.get_stream(nats_stream(load, s)).await?;
        let consumer = stream
            .create_consumer(push::OrderedConfig { deliver_subject: client.new_inbox(), ..Default::default() })
            .await?;
        streams.push(consumer.messages().await?);
    }
    let mut all = futures::stream::select_all(streams);
    let mut latencies = Latencies::with_capacity(load);
    let total = load.total() as u64;
    let mut received = 0u64;
    println!("ready");
    let mut quiet = load.run + QUIET;
    while received < total {
        let Ok(next) = tokio::time::timeout(quiet, all.next()).await else { break };
        quiet = QUIET;
        let message = next.context("the consumer's stream ended")??;
        let stamp = u64::from_be_bytes(message.payload[..8].try_into()?);
        latencies.0.push((now_micros().saturating_sub(stamp), 1));
        received += 1;
    }
    Ok(latencies.summary(own_cpu()))
}

pub(super) async fn client_produce(load: &Load) -> anyhow::Result<serde_json::Value> {
    use ferry::{BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
    let producer =
        Producer::new(BrokerClient::new(ClientConfig::new([load.addr.clone()]))?, ProducerConfig::default()).await?;
    let mut payload = value(load.record_bytes, false);
    let mut pending = FuturesUnordered::new();
    let mut acks = Latencies::with_capacity(load);
    let mut pacer = Pacer::new(load);
    let mut next = 0u32;
    while !pacer.done() {
        let due = pacer.next_due(&mut pending, &mut acks, "produce").await?;
        payload[..8].copy_from_slice(&now_micros().to_be_bytes());
        let shared = Bytes::copy_from_slice(&payload);
        for _ in 0..due {
            let sent_at = Instant::now();
            let record = ProducerRecord::new(load.topic.clone(), shared.clone()).with_partition(next);
            next = (next + 1) % load.partitions;
            let delivery = producer.send(record).await?;
            pending.push(async move { delivery.await.map(|_| (sent_at.elapsed(), 1u32)) });
            pacer.sent += 1;
        }
    }
    drain(&mut pending, &mut acks, "produce").await?;
    producer.close().await;
    Ok(pacer.report(own_cpu(), acks))
}

pub(super) async fn client_consume(load: &Load) -> anyhow::Result<serde_json::Value> {
    use ferry::{BrokerClient, ClientConfig, Consumer, ConsumerConfig, StartAt};
    let mut consumer =
        Consumer::new(BrokerClient::new(ClientConfig::new([load.addr.clone()]))?, ConsumerConfig::default())?;
    consumer.assign((0..load.partitions).map(|p| (load.topic.clone(), p, StartAt::Earliest)).collect())?;
    let mut latencies = Latencies::with_capacity(load);
    let total = load.total() as u64;
    let mut received = 0u64;
    println!("ready");
    let mut last = Instant::now() + load.run;
    while received < total && last.elapsed() < QUIET {
        let records = consumer.poll(Duration::from_millis(100)).await?;
        let now = now_micros();
        if !records.is_empty() {
            last = Instant::now();
        }
        for r in records {
            let Some(v) = r.value.filter(|v| v.len() >= 8) else { continue };
            let stamp = u64::from_be_bytes(v[..8].try_into()?);
            latencies.0.push((now.saturating_sub(stamp), 1));
            received += 1;
        }
    }
    Ok(latencies.summary(own_cpu()))
}
