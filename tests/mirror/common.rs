//! Shared helpers of the mirror's end-to-end tests: two brokers as DCs, a mirror config from a few fields, a keyed
//! load, whole partitions read from the log, and the exact comparison of a topic with its mirror.
//!
//! Two partitions are identical when their log start, log end, record count, first and last offsets, the SHA-256
//! digest over every record (offset, timestamp, key, value, headers) and the digest over every batch's (base
//! offset, last offset, epoch, CRC) are equal. Reading a partition asserts that offsets strictly increase (no
//! duplicates); the comparison asserts that they are contiguous from the log start (no gaps) unless the test says
//! otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, MirrorProcess, deadline, wait_for, wait_until};
use sha2::{Digest, Sha256};

#[path = "monitor_api.rs"]
mod monitor_api;
#[path = "../support/read.rs"]
mod read;

pub use monitor_api::*;

/// How long the debug-built processes may need for one test's whole data load on a loaded 2-core machine (a
/// one-broker crate test or unit tests may run beside it). Waits on data use `deadline(&[IO_BUDGET])`, three times
/// this.
pub const IO_BUDGET: Duration = Duration::from_secs(40);

/// The mirrors' graceful stop budget in these tests (`sync.shutdown_timeout`).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Discovery period used by the tests (`topics.discovery_interval`).
pub const DISCOVERY: Duration = Duration::from_secs(1);

/// Scale-out session on the target (`sync.group_session_timeout`): a killed mirror's partitions move after this.
pub const SESSION: Duration = Duration::from_secs(3);

/// The broker config used unless a test needs more: the defaults, with retention checked often.
pub const BROKER_CONFIG: &str = "[storage]\nretention_check_interval = \"200ms\"\n";

/// One datacenter: a broker and clients of it.
pub struct Dc {
    /// Cluster alias, also its cluster id.
    pub name: String,
    /// The broker.
    pub broker: BrokerProcess,
    /// A client.
    pub client: BrokerClient,
    /// Admin over `client`.
    pub admin: Admin,
}

impl Dc {
    /// Starts a broker named `name` (its cluster id too) with `config`.
    pub async fn start_with(name: &str, config: &str) -> anyhow::Result<Dc> {
        ferry_testkit::init_tracing();
        let broker = BrokerProcess::builder().cluster_id(name).config(config).start().await?;
        let client = client_for(broker.addr());
        Ok(Dc { name: name.to_owned(), admin: Admin::new(client.clone()), client, broker })
    }

    /// Starts a broker named `name` with [`BROKER_CONFIG`].
    pub async fn start(name: &str) -> anyhow::Result<Dc> {
        Dc::start_with(name, BROKER_CONFIG).await
    }

    /// `host:port` of the broker.
    pub fn addr(&self) -> String {
        self.broker.addr().to_string()
    }

    /// Creates `topic` with `partitions` and the broker's default config.
    pub async fn create_topic(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
        self.admin
            .create_topic(topic, partitions, TopicConfig::default(), None)
            .await
            .with_context(|| format!("create {topic} on {}", self.name))?;
        Ok(())
    }

    /// Names of every topic.
    pub async fn topic_names(&self) -> anyhow::Result<Vec<String>> {
        let mut names: Vec<String> = self.admin.list_topics().await?.into_iter().map(|t| t.name).collect();
        names.sort();
        Ok(names)
    }

    /// Whether `topic` exists.
    pub async fn has_topic(&self, topic: &str) -> anyhow::Result<bool> {
        Ok(self.topic_names().await?.iter().any(|t| t == topic))
    }

    /// Per partition: (log start, log end), in partition order.
    pub async fn offsets(&self, topic: &str) -> anyhow::Result<Vec<(u64, u64)>> {
        let d = self.admin.describe_topic(topic).await.with_context(|| format!("describe {topic} on {}", self.name))?;
        Ok(d.partitions.iter().map(|p| (p.log_start_offset, p.log_end_offset)).collect())
    }

    /// Log end offsets, in partition order.
    pub async fn leos(&self, topic: &str) -> anyhow::Result<Vec<u64>> {
        Ok(self.offsets(topic).await?.into_iter().map(|(_, end)| end).collect())
    }
}

/// A client of the broker at `addr`.
pub fn client_for(addr: impl ToString) -> BrokerClient {
    BrokerClient::new(ClientConfig::new([addr.to_string()])).expect("a loopback address is a valid client config")
}

/// Starts the two datacenters of most tests, "dc-a" (the source) and "dc-b" (the target), in parallel.
pub async fn two_dcs() -> anyhow::Result<(Dc, Dc)> {
    let (a, b) = tokio::join!(Dc::start("dc-a"), Dc::start("dc-b"));
    Ok((a?, b?))
}

/// A TOML duration ("250ms").
pub fn dur(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A TOML string array of `items`.
fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// The fields of a mirror config the tests vary; [`MirrorConf::toml`] writes the whole file.
#[derive(Debug, Clone)]
pub struct MirrorConf {
    pub name: String,
    pub source_cluster: String,
    pub source_brokers: String,
    pub target_cluster: String,
    pub target_brokers: String,
    pub on_divergence: String,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub rename: String,
    pub start_position: String,
    pub groups_include: Vec<String>,
    pub group_sync_interval: Duration,
    pub commit_interval: Duration,
    /// Extra `key = value` lines of `[sync]` (queue_bytes, max_memory, max_bytes_per_sec, ...).
    pub sync_extra: Vec<String>,
}

/// Where the segment based at `base` of `partition` of `topic` lives in a broker's data dir.
pub fn segment_file(dc: &Dc, topic: &str, partition: u32, base: u64) -> std::path::PathBuf {
    dc.broker.data_dir().join(topic).join(partition.to_string()).join(format!("{base:020}.log"))
}

impl MirrorConf {
    /// A mirror from `source` to `target` of every topic not starting with "__", identity names.
    pub fn new(source: &Dc, target: &Dc) -> MirrorConf {
        MirrorConf::between(&source.name, source.addr(), &target.name, target.addr())
    }

    /// [`MirrorConf::new`] between the clusters so named, at these brokers (each a TOML array's inside).
    pub fn between(source: &str, source_brokers: String, target: &str, target_brokers: String) -> MirrorConf {
        MirrorConf {
            name: format!("{source}_to_{target}"),
            source_cluster: source.to_owned(),
            source_brokers,
            target_cluster: target.to_owned(),
            target_brokers,
            on_divergence: "halt".into(),
            include: vec![".*".into()],
            exclude: vec!["^__".into()],
            rename: "identity".into(),
            start_position: "earliest".into(),
            groups_include: Vec::new(),
            group_sync_interval: Duration::from_secs(1),
            commit_interval: Duration::from_secs(1),
            sync_extra: Vec::new(),
        }
    }

    /// The config file text.
    pub fn toml(&self) -> String {
        let sync_extra = self.sync_extra.join("\n");
        format!(
            r#"[mirror]
name = "{name}"
on_divergence = "{on_divergence}"

[source]
cluster = "{source_cluster}"

[[source.routes]]
name = "primary"
brokers = ["{source_brokers}"]

[source.health]
check_interval = "500ms"
timeout = "1s"

[target]
cluster = "{target_cluster}"
brokers = ["{target_brokers}"]

[topics]
include = {include}
exclude = {exclude}
rename = "{rename}"
discovery_interval = "{discovery}"
start_position = "{start_position}"

[groups]
include = {groups_include}
group_sync_interval = "{group_sync}"

[sync]
commit_interval = "{commit}"
shutdown_timeout = "{shutdown}"
group_session_timeout = "{session}"
{sync_extra}

[monitor]
listen = "127.0.0.1:0"
"#,
            name = self.name,
            on_divergence = self.on_divergence,
            source_cluster = self.source_cluster,
            source_brokers = self.source_brokers,
            target_cluster = self.target_cluster,
            target_brokers = self.target_brokers,
            include = toml_list(&self.include),
            exclude = toml_list(&self.exclude),
            rename = self.rename,
            discovery = dur(DISCOVERY),
            start_position = self.start_position,
            groups_include = toml_list(&self.groups_include),
            group_sync = dur(self.group_sync_interval),
            commit = dur(self.commit_interval),
            shutdown = dur(SHUTDOWN_TIMEOUT),
            session = dur(SESSION),
        )
    }

    /// Starts a mirror process with this config.
    pub async fn start(&self) -> anyhow::Result<MirrorProcess> {
        Ok(MirrorProcess::builder(self.toml()).start().await?)
    }
}

/// A fixed base timestamp, so record timestamps are part of what is compared (ms since the epoch).
pub const BASE_TS: i64 = 1_750_000_000_000;

/// Record `i` of a load tagged `tag`: key, value padded to `value_size`, three headers (one key repeated) and
/// a timestamp derived from `i`.
pub fn record(topic: &str, tag: &str, i: u64, value_size: usize) -> ProducerRecord {
    let mut value = format!("{tag}-value-{i}-").into_bytes();
    if value.len() < value_size {
        let fill = b'a' + (i % 26) as u8;
        value.resize(value_size, fill);
    }
    ProducerRecord::new(topic, Bytes::from(value))
        .with_key(format!("{tag}-key-{i}"))
        .with_header("seq", i.to_string())
        .with_header("tag", tag.to_owned())
        .with_header("seq", format!("again-{i}"))
        .with_timestamp(BASE_TS + i as i64)
}

/// How a produced record reads back at `offset`.
pub fn as_stored(offset: u64, r: ProducerRecord) -> Rec {
    Rec {
        offset,
        timestamp: r.timestamp.expect("test records carry a timestamp"),
        key: r.key,
        value: r.value,
        headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
    }
}

/// A producer with batches up to the broker's limit.
pub async fn producer(dc: &Dc) -> anyhow::Result<Producer> {
    Ok(Producer::new(dc.client.clone(), ProducerConfig::default()).await?)
}

/// Sends `records` and waits until every one is acknowledged.
pub async fn send_all(p: &Producer, records: impl IntoIterator<Item = ProducerRecord>) -> anyhow::Result<()> {
    let mut pending = Vec::new();
    for r in records {
        pending.push(p.send(r).await?);
    }
    p.flush().await;
    for d in pending {
        d.await.context("a record was not acknowledged")?;
    }
    Ok(())
}

/// Produces records `from..to` of `tag` to `topic` (keyed: the broker's key partitioner spreads them) and waits
/// until every one is acknowledged.
pub async fn produce_range(
    p: &Producer,
    topic: &str,
    tag: &str,
    from: u64,
    to: u64,
    value_size: usize,
) -> anyhow::Result<()> {
    send_all(p, (from..to).map(|i| record(topic, tag, i, value_size))).await
}

/// Produces records `from..to` of `tag` to one `partition` of `topic`.
pub async fn produce_to_partition(
    p: &Producer,
    topic: &str,
    partition: u32,
    tag: &str,
    from: u64,
    to: u64,
) -> anyhow::Result<()> {
    send_all(p, (from..to).map(|i| record(topic, tag, i, 64).with_partition(partition))).await
}

/// Produces `count` records of `tag` to `topic`, `value_size` bytes each.
pub async fn produce(dc: &Dc, topic: &str, tag: &str, count: u64, value_size: usize) -> anyhow::Result<()> {
    let p = producer(dc).await?;
    produce_range(&p, topic, tag, 0, count, value_size).await?;
    p.close().await;
    Ok(())
}

/// Keeps producing small chunks of `tag` records to `topic` until `stop`; returns how many were acknowledged.
pub fn background_producer(
    dc: &Dc,
    topic: &str,
    tag: &str,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<anyhow::Result<u64>> {
    let client = dc.client.clone();
    let topic = topic.to_owned();
    let tag = tag.to_owned();
    tokio::spawn(async move {
        let p = Producer::new(client, ProducerConfig::default()).await?;
        let mut next = 0u64;
        while !stop.is_cancelled() {
            produce_range(&p, &topic, &tag, next, next + 200, 100).await?;
            next += 200;
        }
        p.close().await;
        Ok(next)
    })
}

/// One record as the tests compare it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rec {
    pub offset: u64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// One stored batch: (base offset, last offset, epoch, CRC).
pub type BatchId = (u64, u64, u32, u32);

/// A partition as read from the log.
#[derive(Debug, Clone, Default)]
pub struct PartitionData {
    pub log_start: u64,
    pub log_end: u64,
    pub records: Vec<Rec>,
    pub batches: Vec<BatchId>,
}

/// The comparable summary of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub log_start: u64,
    pub log_end: u64,
    pub count: usize,
    pub first: Option<u64>,
    pub last: Option<u64>,
    pub records_digest: String,
    pub batches_digest: String,
}

fn put_bytes(h: &mut Sha256, b: &Option<Bytes>) {
    match b {
        None => h.update(u64::MAX.to_be_bytes()),
        Some(b) => {
            h.update((b.len() as u64).to_be_bytes());
            h.update(b);
        }
    }
}

/// SHA-256 over the records in order, every field length-prefixed.
pub fn records_digest(records: &[Rec]) -> String {
    let mut h = Sha256::new();
    for r in records {
        h.update(r.offset.to_be_bytes());
        h.update(r.timestamp.to_be_bytes());
        put_bytes(&mut h, &r.key);
        put_bytes(&mut h, &r.value);
        h.update((r.headers.len() as u64).to_be_bytes());
        for (k, v) in &r.headers {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k.as_bytes());
            put_bytes(&mut h, v);
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl PartitionData {
    /// The summary compared between source and target.
    pub fn summary(&self) -> Summary {
        let mut h = Sha256::new();
        for (base, last, epoch, crc) in &self.batches {
            h.update(base.to_be_bytes());
            h.update(last.to_be_bytes());
            h.update(epoch.to_be_bytes());
            h.update(crc.to_be_bytes());
        }
        Summary {
            log_start: self.log_start,
            log_end: self.log_end,
            count: self.records.len(),
            first: self.records.first().map(|r| r.offset),
            last: self.records.last().map(|r| r.offset),
            records_digest: records_digest(&self.records),
            batches_digest: h.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// The records at or after `offset`, and the batches that start there or later.
    pub fn starting_at(&self, offset: u64) -> PartitionData {
        PartitionData {
            log_start: offset.max(self.log_start),
            log_end: self.log_end,
            records: self.records.iter().filter(|r| r.offset >= offset).cloned().collect(),
            batches: self.batches.iter().filter(|b| b.0 >= offset).copied().collect(),
        }
    }

    /// Asserts that the offsets run without a hole from the log start to the log end.
    pub fn assert_contiguous(&self, what: &str) {
        let mut next = self.log_start;
        for r in &self.records {
            assert_eq!(r.offset, next, "{what}: a gap before offset {} (expected {next})", r.offset);
            next += 1;
        }
        assert_eq!(next, self.log_end, "{what}: records end at {next}, the log end is {}", self.log_end);
    }
}

/// Reads `topic`/`partition` from its log start up to `until` (default: the log end at the call), with plain
/// fetches, checking each batch's CRC and that offsets strictly increase (no duplicates).
pub async fn read_partition(
    client: &BrokerClient,
    topic: &str,
    partition: u32,
    until: Option<u64>,
) -> anyhow::Result<PartitionData> {
    let read = read::read_partition(client, topic, partition, until).await?;
    let records = read
        .records
        .into_iter()
        .map(|r| Rec {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key,
            value: r.value,
            headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
        })
        .collect();
    Ok(PartitionData { log_start: read.log_start, log_end: read.log_end, records, batches: read.batches })
}

/// Every partition of `topic`, in partition order.
pub async fn read_topic(dc: &Dc, topic: &str) -> anyhow::Result<Vec<PartitionData>> {
    let n = dc.admin.describe_topic(topic).await.with_context(|| format!("describe {topic}"))?.partitions.len();
    let mut out = Vec::with_capacity(n);
    for p in 0..n as u32 {
        out.push(read_partition(&dc.client, topic, p, None).await?);
    }
    Ok(out)
}

/// Asserts that two partitions are the same: log start and end, count, first and last offsets, the records digest
/// and the batches digest. On a mismatch names the first differing record.
pub fn assert_same_partition(what: &str, expected: &PartitionData, got: &PartitionData) {
    let (e, g) = (expected.summary(), got.summary());
    if e == g {
        return;
    }
    let first_diff = expected
        .records
        .iter()
        .zip(&got.records)
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("first differing record: expected {a:?}, got {b:?}"))
        .unwrap_or_else(|| "no differing record in the common prefix".into());
    panic!("{what}: expected {e:?}, got {g:?}; {first_diff}");
}

/// Asserts that the target topic is identical to the source topic, partition by partition, with offsets
/// contiguous on both sides (zero duplicates, zero gaps). Returns the source partitions.
pub async fn assert_identical(
    source: &Dc,
    source_topic: &str,
    target: &Dc,
    target_topic: &str,
) -> anyhow::Result<Vec<PartitionData>> {
    let src = read_topic(source, source_topic).await?;
    let dst = read_topic(target, target_topic).await?;
    assert_eq!(src.len(), dst.len(), "{target_topic}: partition count differs from {source_topic}'s");
    for (p, (s, d)) in src.iter().zip(&dst).enumerate() {
        let what = format!("{}:{source_topic}/{p} vs {}:{target_topic}/{p}", source.name, target.name);
        s.assert_contiguous(&format!("source {what}"));
        d.assert_contiguous(&format!("target {what}"));
        assert_same_partition(&what, s, d);
    }
    Ok(src)
}

/// Waits until every partition of `target_topic` has the log end of the same partition of `source_topic` (the
/// mirror caught up), within `limit`.
pub async fn wait_caught_up(
    source: &Dc,
    source_topic: &str,
    target: &Dc,
    target_topic: &str,
    limit: Duration,
) -> anyhow::Result<()> {
    let what = format!("{}:{target_topic} to reach the log ends of {}:{source_topic}", target.name, source.name);
    wait_until(&what, limit, async || -> anyhow::Result<bool> {
        let s = source.leos(source_topic).await?;
        let t = match target.leos(target_topic).await {
            Ok(t) => t,
            Err(_) => return Ok(false),
        };
        Ok(s == t)
    })
    .await
}

/// Creates the topic `name` on `src` and waits until its mirror `mirrored` exists on `dst`: proof that a discovery
/// round ran after everything done before the call (a round lists every topic, so it saw those too).
pub async fn discovery_round(src: &Dc, dst: &Dc, name: &str, mirrored: &str, limit: Duration) -> anyhow::Result<()> {
    src.create_topic(name, 1).await?;
    wait_until(&format!("{mirrored} on {}", dst.name), limit, async || -> anyhow::Result<bool> {
        dst.has_topic(mirrored).await
    })
    .await
}

/// The deadline for a mirror to copy a test's load.
pub fn io_deadline() -> Duration {
    deadline(&[IO_BUDGET])
}

/// Waits until every partition of `topic` on `dc` has a log end above `beyond` (same partition order).
pub async fn wait_progress_beyond(dc: &Dc, topic: &str, beyond: &[u64], limit: Duration) -> anyhow::Result<()> {
    let what = format!("every partition of {}:{topic} to grow past {beyond:?}", dc.name);
    wait_until(&what, limit, async || -> anyhow::Result<bool> {
        let leos = dc.leos(topic).await?;
        Ok(leos.len() == beyond.len() && leos.iter().zip(beyond).all(|(now, before)| now > before))
    })
    .await
}

/// Every `partition_diverged` line in the mirror's log, over all of its runs (the event history of
/// `/api/v1/events` starts afresh with each run; the log keeps them all).
pub fn diverged_log_lines(mirror: &MirrorProcess) -> Vec<String> {
    mirror.logs().lines().filter(|l| l.contains("event=\"partition_diverged\"")).map(str::to_owned).collect()
}

/// Asserts that the mirror raised no `partition_diverged` (neither in its event history nor in its log) and that
/// none of its partitions is halted.
pub async fn assert_no_divergence_nor_halt(mirror: &MirrorProcess, what: &str) -> anyhow::Result<()> {
    let events = monitor_events(mirror, Some("partition_diverged")).await?;
    assert!(events.is_empty(), "{what}: partition_diverged raised: {events:?}");
    let lines = diverged_log_lines(mirror);
    assert!(lines.is_empty(), "{what}: partition_diverged logged:\n{}", lines.join("\n"));
    let halted: Vec<PartitionRow> =
        monitor_partitions(mirror).await?.into_values().filter(|r| r.state == "halted").collect();
    assert!(halted.is_empty(), "{what}: halted partitions: {halted:?}");
    Ok(())
}

impl MirrorConf {
    /// The config file text of [`MirrorConf::toml`] with its source routes and health section replaced by
    /// `routes_and_health` (any number of `[[source.routes]]` tables and a `[source.health]` table).
    pub fn toml_with_routes(&self, routes_and_health: &str) -> String {
        let text = self.toml();
        let start = text.find("[[source.routes]]").expect("the config has a routes table");
        let end = text.find("[target]").expect("the config has a target table");
        format!("{}{routes_and_health}\n{}", &text[..start], &text[end..])
    }
}
