//! The soak's independent oracle: what the producer had acknowledged, what a reader of the target saw over time,
//! what the fault schedule did (broker crashes and the tails they cut), and what the mirrors logged about
//! divergence. None of it asks the mirror how it is doing; the checks at the end hold the brokers' final data
//! against these records.
//!
//! Times are microseconds since the Unix epoch, from the one system clock the test, the brokers and the mirrors
//! share (the mirrors' log lines carry it too). An observation is bracketed by the time its request left and the
//! time its answer came back; a change between two observations is explained only by a truncation or a crash
//! whose own time bracket overlaps the time between them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use ferry_client::batch::{self, BatchIter, LOG_OVERHEAD};
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, Producer, ProducerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::{PartitionData, Rec, as_stored, record, records_digest};

/// Records per chunk of the load; the producer waits for a chunk's acknowledgements before the next.
const CHUNK: u64 = 20;
/// At most one chunk per this period: the load stays small (a few hundred records a second), so the final reads
/// and the reader's rounds stay cheap in a debug build.
const LOAD_PERIOD: Duration = Duration::from_millis(25);
/// Value size of the load's records.
const VALUE_SIZE: usize = 100;
/// How long a record may take to be acknowledged, retries included. A broker crash lasts well under a second;
/// a record still not acknowledged after this is counted as failed (it may or may not be in the log).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between the reader's rounds over every partition.
const READ_PERIOD: Duration = Duration::from_millis(100);
/// Each round re-reads this many records below where the last round stopped, so that a change to a recent
/// record is seen while it happens. A crash cuts at most [`super::faults::MAX_CUT_BYTES`] (some 50 records of this
/// load) and a truncation after divergence goes back no further than such a cut; the final comparison covers
/// everything older.
const REREAD: u64 = 200;

/// Now, in microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The digest of one record as stored: offset, timestamp, key, value and headers.
pub fn digest_of(r: &Rec) -> String {
    records_digest(std::slice::from_ref(r))
}

fn rec_of(r: batch::Record) -> Rec {
    Rec {
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key,
        value: r.value,
        headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
    }
}

/// Which broker a crash hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The source broker.
    Source,
    /// The target broker.
    Target,
}

/// A broker crash with tail loss, as the fault schedule did it.
#[derive(Debug, Clone)]
pub struct Crash {
    pub side: Side,
    /// Just before the SIGKILL.
    pub down_us: u64,
    /// Just after the restarted broker accepted connections again.
    pub up_us: u64,
    /// Per partition cut: the log end offset the cut left (records at or above it are gone).
    pub cuts: BTreeMap<u32, u64>,
}

/// The crashes done so far, shared with the fault schedule.
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<Vec<Crash>>>);

impl History {
    pub fn record(&self, crash: Crash) {
        self.0.lock().expect("history lock").push(crash);
    }

    pub fn crashes(&self) -> Vec<Crash> {
        self.0.lock().expect("history lock").clone()
    }
}

/// Cuts up to `bytes` off the end of the newest segment of the partition in `dir`, mid-batch or not, as a power
/// loss under async flush would. Returns the log end offset recovery will find: one past the last whole batch
/// with a good CRC left in the file (or the segment's base offset when none is left); `None` when the partition
/// has no segment yet.
pub fn cut_tail(dir: &Path, bytes: u64) -> anyhow::Result<Option<u64>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(None) };
    let mut newest: Option<(u64, std::path::PathBuf)> = None;
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(base) = name.strip_suffix(".log").and_then(|b| b.parse::<u64>().ok()) else { continue };
        if newest.as_ref().is_none_or(|(b, _)| base > *b) {
            newest = Some((base, path));
        }
    }
    let Some((base, path)) = newest else { return Ok(None) };
    let data = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
    let keep = (data.len() as u64).saturating_sub(bytes);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(keep))
        .with_context(|| format!("cut {} to {keep} bytes", path.display()))?;
    let kept = &data[..keep as usize];
    let (mut pos, mut leo) = (0usize, base);
    while pos + LOG_OVERHEAD <= kept.len() {
        let length = u32::from_be_bytes(kept[pos + 8..pos + 12].try_into()?) as usize;
        let end = pos + LOG_OVERHEAD + length;
        let Some(whole) = kept.get(pos..end) else { break };
        let Ok(header) = batch::verify(whole) else { break };
        leo = header.next_offset();
        pos = end;
    }
    Ok(Some(leo))
}

/// One acknowledged record.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Its index in the load (its key, value and timestamp derive from it).
    pub index: u64,
    pub partition: u32,
    pub offset: u64,
    pub digest: String,
    /// When the acknowledgement reached the producer.
    pub acked_us: u64,
}

/// What the producer did.
#[derive(Debug, Default)]
pub struct Load {
    pub acked: Vec<Acked>,
    /// Records whose send or delivery failed (during a source crash); they may or may not be in the log.
    pub failed: u64,
}

/// Produces keyed records to `topic` (spread by the key partitioner) until `stop`, and records every
/// acknowledged one. Acknowledgements are awaited concurrently, so each is timed when it arrives, not when the
/// slowest of its chunk does.
pub fn spawn_producer(client: BrokerClient, topic: &str, stop: CancellationToken) -> JoinHandle<anyhow::Result<Load>> {
    let topic = topic.to_owned();
    tokio::spawn(async move {
        let config = ProducerConfig { delivery_timeout: DELIVERY_TIMEOUT, ..ProducerConfig::default() };
        let producer = Producer::new(client, config).await?;
        let mut load = Load::default();
        let mut tick = tokio::time::interval(LOAD_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next = 0u64;
        while !stop.is_cancelled() {
            tick.tick().await;
            let mut deliveries = Vec::new();
            for index in next..next + CHUNK {
                let r = record(&topic, "soak", index, VALUE_SIZE);
                match producer.send(r.clone()).await {
                    Ok(delivery) => deliveries.push(async move {
                        let outcome = delivery.await;
                        (index, r, outcome, now_us())
                    }),
                    Err(e) => {
                        tracing::debug!(index, error = %e, "send failed");
                        load.failed += 1;
                    }
                }
            }
            next += CHUNK;
            for (index, r, outcome, acked_us) in futures::future::join_all(deliveries).await {
                match outcome {
                    Ok(meta) => {
                        let digest = digest_of(&as_stored(meta.offset, r));
                        load.acked.push(Acked {
                            index,
                            partition: meta.partition,
                            offset: meta.offset,
                            digest,
                            acked_us,
                        });
                    }
                    Err(e) => {
                        tracing::debug!(index, error = %e, "delivery failed");
                        load.failed += 1;
                    }
                }
            }
        }
        producer.close().await;
        Ok(load)
    })
}

/// The last value the reader read at an offset, and when (the start of that fetch).
#[derive(Debug, Clone)]
pub struct Seen {
    pub digest: String,
    pub read_us: u64,
}

/// What the reader knows of one partition.
#[derive(Debug, Clone, Default)]
pub struct PartView {
    pub records: BTreeMap<u64, Seen>,
    /// The last log end observed and when (the start of that request).
    pub leo: Option<(u64, u64)>,
    /// Where the last round's reading stopped.
    pub read_to: u64,
}

/// Something the reader saw that a truncation or a target crash must explain.
#[derive(Debug, Clone)]
pub enum Anomaly {
    /// The record at `offset` is not the one read there before (`after` is `None` when it is gone).
    Changed { partition: u32, offset: u64, before: String, after: Option<String>, since_us: u64, seen_us: u64 },
    /// The log end went down.
    LeoDown { partition: u32, from: u64, to: u64, since_us: u64, seen_us: u64 },
}

impl std::fmt::Display for Anomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Anomaly::Changed { partition, offset, before, after, since_us, seen_us } => write!(
                f,
                "{partition}/{offset} held record {before} at {since_us} us, then {} at {seen_us} us",
                after.as_deref().unwrap_or("nothing")
            ),
            Anomaly::LeoDown { partition, from, to, since_us, seen_us } => {
                write!(f, "{partition}: log end {from} at {since_us} us, then {to} at {seen_us} us")
            }
        }
    }
}

impl Anomaly {
    /// (partition, the lowest offset a removal must reach down to, since, seen).
    fn needs(&self) -> (u32, u64, u64, u64) {
        match *self {
            Anomaly::Changed { partition, offset, since_us, seen_us, .. } => (partition, offset, since_us, seen_us),
            Anomaly::LeoDown { partition, to, since_us, seen_us, .. } => (partition, to, since_us, seen_us),
        }
    }
}

/// What the reader did.
#[derive(Debug, Default)]
pub struct ReaderLog {
    pub views: Vec<PartView>,
    pub anomalies: Vec<Anomaly>,
    pub rounds: u64,
}

impl ReaderLog {
    fn observe_leo(&mut self, partition: u32, leo: u64, sent_us: u64, answered_us: u64) {
        let view = &mut self.views[partition as usize];
        if let Some((before, since_us)) = view.leo
            && leo < before
        {
            self.anomalies.push(Anomaly::LeoDown { partition, from: before, to: leo, since_us, seen_us: answered_us });
        }
        view.leo = Some((leo, sent_us));
    }

    fn observe_record(&mut self, partition: u32, rec: Rec, sent_us: u64, answered_us: u64) {
        let digest = digest_of(&rec);
        let view = &mut self.views[partition as usize];
        if let Some(seen) = view.records.get(&rec.offset)
            && seen.digest != digest
        {
            self.anomalies.push(Anomaly::Changed {
                partition,
                offset: rec.offset,
                before: seen.digest.clone(),
                after: Some(digest.clone()),
                since_us: seen.read_us,
                seen_us: answered_us,
            });
        }
        view.records.insert(rec.offset, Seen { digest, read_us: sent_us });
    }

    /// Reads `partition` from a little below where the last round stopped up to the log end just observed.
    async fn read(&mut self, client: &BrokerClient, topic: &str, partition: u32) -> anyhow::Result<()> {
        let view = &self.views[partition as usize];
        let Some((end, _)) = view.leo else { return Ok(()) };
        let mut position = view.read_to.min(end).saturating_sub(REREAD);
        while position < end {
            let sent_us = now_us();
            let response = client
                .fetch(pb::FetchRequest {
                    partitions: vec![pb::PartitionFetch {
                        topic: topic.to_owned(),
                        partition,
                        offset: position,
                        max_bytes: 1 << 20,
                        leader_epoch: None,
                    }],
                    max_wait_ms: 0,
                    max_bytes: 2 << 20,
                })
                .await?;
            let answered_us = now_us();
            let data = response.partitions.first().context("a fetch answer per partition")?;
            if data.error != pb::ErrorCode::None as i32 {
                // Truncated meanwhile (offset out of range) or restarting: the next round looks again.
                break;
            }
            if data.batches.is_empty() {
                break;
            }
            for item in BatchIter::new(&data.batches) {
                let (header, bytes) = item.context("whole batches")?;
                batch::verify(bytes).context("a batch read from the target has a bad CRC")?;
                for r in batch::decode_records(bytes).context("decodable batch")? {
                    if r.offset < end {
                        self.observe_record(partition, rec_of(r), sent_us, answered_us);
                    }
                }
                position = position.max(header.next_offset());
            }
        }
        self.views[partition as usize].read_to = position;
        Ok(())
    }

    /// Compares everything read with the partitions' final data (read after the mirrors caught up): a record
    /// that differs now, or is gone, is an anomaly as if a last round had seen it at `now_us`.
    pub fn compare_final(&mut self, final_data: &[PartitionData], now_us: u64) {
        for (p, data) in final_data.iter().enumerate() {
            let now: BTreeMap<u64, String> = data.records.iter().map(|r| (r.offset, digest_of(r))).collect();
            for (&offset, seen) in &self.views[p].records {
                let after = now.get(&offset);
                if after != Some(&seen.digest) {
                    self.anomalies.push(Anomaly::Changed {
                        partition: p as u32,
                        offset,
                        before: seen.digest.clone(),
                        after: after.cloned(),
                        since_us: seen.read_us,
                        seen_us: now_us,
                    });
                }
            }
        }
    }

    /// Whether the reader ever saw `digest` at `offset` of `partition` on the target.
    pub fn saw(&self, partition: u32, offset: u64, digest: &str) -> bool {
        self.views[partition as usize].records.get(&offset).is_some_and(|s| s.digest == digest)
            || self.anomalies.iter().any(|a| {
                matches!(a, Anomaly::Changed { partition: p, offset: o, before, .. }
                    if *p == partition && *o == offset && before == digest)
            })
    }
}

/// Reads the target until `stop`: each round observes every partition's log end, then reads its new records and
/// re-reads the last [`REREAD`] before them, recording every change it sees.
pub fn spawn_reader(
    client: BrokerClient,
    topic: &str,
    partitions: u32,
    stop: CancellationToken,
) -> JoinHandle<anyhow::Result<ReaderLog>> {
    let topic = topic.to_owned();
    tokio::spawn(async move {
        let admin = Admin::new(client.clone());
        let mut log = ReaderLog { views: vec![PartView::default(); partitions as usize], ..ReaderLog::default() };
        let mut tick = tokio::time::interval(READ_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let sent_us = now_us();
            // Errors (the target restarting, the topic not created yet) leave this round out.
            let Ok(described) = admin.describe_topic(&topic).await else { continue };
            let answered_us = now_us();
            for p in &described.partitions {
                if p.partition < partitions {
                    log.observe_leo(p.partition, p.log_end_offset, sent_us, answered_us);
                }
            }
            for p in 0..partitions {
                if let Err(e) = log.read(&client, &topic, p).await {
                    tracing::debug!(partition = p, error = %e, "reader round incomplete");
                }
            }
            log.rounds += 1;
        }
        Ok(log)
    })
}

/// A `partition_diverged` a mirror raised under `on_divergence = "truncate"`, and the truncation that followed.
#[derive(Debug, Clone)]
pub struct Truncation {
    pub mirror: usize,
    pub partition: u32,
    /// The divergence offset of the event.
    pub at: u64,
    /// When the event was logged (before the truncation was asked for).
    pub event_us: u64,
    /// When the mirror logged the truncation done, and the log end it left; `None` when that line is missing
    /// (the mirror was killed in between, and the truncation may or may not have happened).
    pub done: Option<(u64, u64)>,
}

/// The time at the start of a log line (`2026-01-01T00:00:00.123456Z ...`).
fn log_time_us(line: &str) -> anyhow::Result<u64> {
    let stamp = line.split_whitespace().next().context("an empty log line")?;
    let t = humantime::parse_rfc3339(stamp).with_context(|| format!("no timestamp in {line:?}"))?;
    Ok(t.duration_since(UNIX_EPOCH)?.as_micros() as u64)
}

/// The number right after the first `key` in `line`.
fn number_after(line: &str, key: &str) -> anyhow::Result<u64> {
    number_at(line, line.find(key), key)
}

/// The number right after the last `key` in `line`: a field, which follows the message (whose text may hold
/// anything, e.g. a broker's answer).
fn field(line: &str, key: &str) -> anyhow::Result<u64> {
    number_at(line, line.rfind(key), key)
}

fn number_at(line: &str, at: Option<usize>, key: &str) -> anyhow::Result<u64> {
    let rest = &line[at.with_context(|| format!("no {key:?} in {line:?}"))? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().with_context(|| format!("no number after {key:?} in {line:?}"))
}

/// The divergences and truncations of `topic` in one mirror's log (all of its runs).
pub fn truncations(mirror: usize, logs: &str, topic: &str) -> anyhow::Result<Vec<Truncation>> {
    let mut out: Vec<Truncation> = Vec::new();
    let event_topic = format!("topic=\"{topic}\"");
    let truncated_topic = format!("topic={topic} ");
    for line in logs.lines() {
        // The event itself (the alarm that follows it logs the same message from another module).
        if line.contains(" ferry_mirror::events: ")
            && line.contains("event=\"partition_diverged\"")
            && line.contains(&event_topic)
        {
            out.push(Truncation {
                mirror,
                partition: u32::try_from(field(line, " partition=")?)?,
                at: number_after(line, "diverged at offset ")?,
                event_us: log_time_us(line)?,
                done: None,
            });
        } else if line.contains("target truncated after divergence") && line.contains(&truncated_topic) {
            let (partition, at) = (u32::try_from(field(line, " partition=")?)?, field(line, " at=")?);
            let done = (log_time_us(line)?, field(line, " leo=")?);
            match out.iter_mut().rev().find(|t| t.partition == partition && t.at == at && t.done.is_none()) {
                Some(t) => t.done = Some(done),
                None => bail!("mirror {mirror} logged a truncation without its partition_diverged event: {line}"),
            }
        }
    }
    Ok(out)
}

/// What explained a change on the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Explanation {
    /// A target crash with tail loss the schedule did.
    TargetCrash,
    /// A truncation a mirror did after `partition_diverged`.
    Truncation,
}

/// What may explain a change on the target: the target crashes with their cuts, and the mirrors' truncations.
pub struct Explainers<'a> {
    pub crashes: &'a [Crash],
    pub truncations: &'a [Truncation],
}

impl Explainers<'_> {
    /// What explains `anomaly`: a target crash or a truncation of its partition that happened between the two
    /// observations and removed everything from an offset at or below the one the anomaly needs.
    pub fn explain(&self, anomaly: &Anomaly) -> Option<Explanation> {
        let (partition, down_to, since_us, seen_us) = anomaly.needs();
        let crash = self.crashes.iter().any(|c| {
            c.side == Side::Target
                && c.down_us < seen_us
                && c.up_us > since_us
                && c.cuts.get(&partition).is_some_and(|&leo| leo <= down_to)
        });
        let truncation = self.truncations.iter().any(|t| {
            t.partition == partition
                && t.event_us < seen_us
                // Without the "done" line the extent is unknown (at most from `at` down): it may explain it.
                && t.done.is_none_or(|(done_us, leo)| done_us > since_us && leo <= down_to)
        });
        match (crash, truncation) {
            (true, _) => Some(Explanation::TargetCrash),
            (false, true) => Some(Explanation::Truncation),
            (false, false) => None,
        }
    }
}

/// The acknowledged records the source no longer holds (at their offset, with their digest), each of which a
/// source crash cut: it was acknowledged before that crash's restart, at or above the offset the cut left. An
/// acknowledged record missing without such a crash is returned as a violation.
pub fn lost_records<'a>(load: &'a Load, source: &[PartitionData], crashes: &[Crash]) -> (Vec<&'a Acked>, Vec<String>) {
    let now: Vec<BTreeMap<u64, String>> =
        source.iter().map(|p| p.records.iter().map(|r| (r.offset, digest_of(r))).collect()).collect();
    let (mut lost, mut violations) = (Vec::new(), Vec::new());
    for a in &load.acked {
        if now[a.partition as usize].get(&a.offset) == Some(&a.digest) {
            continue;
        }
        let cut_by = crashes.iter().any(|c| {
            c.side == Side::Source
                && a.acked_us < c.up_us
                && c.cuts.get(&a.partition).is_some_and(|&leo| leo <= a.offset)
        });
        if cut_by {
            lost.push(a);
        } else {
            violations.push(format!(
                "acknowledged record {} at {}/{} is not on the source, and no source crash cut it",
                a.index, a.partition, a.offset
            ));
        }
    }
    (lost, violations)
}

/// Partitions with at least one `partition_diverged`, for the summary.
pub fn truncated_partitions(truncations: &[Truncation]) -> BTreeSet<u32> {
    truncations.iter().map(|t| t.partition).collect()
}
