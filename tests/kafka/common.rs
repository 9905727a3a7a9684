//! Helpers of the Kafka end-to-end tests: Ferry DCs, a mirror config for any pair of kinds, Ferry-side loads and
//! exact reads, and the monitor.

#![allow(dead_code)]

use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use ferry_batch::Record;
use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, MirrorProcess, deadline};

use crate::kafka_support::{Tansu, consume};

#[path = "../support/read.rs"]
mod read;

/// How long the debug-built processes may need for one test's data load on a loaded 2-core machine; waits use
/// three times this.
pub const IO_BUDGET: Duration = Duration::from_secs(40);

/// Deadline of data waits.
pub fn io_deadline() -> Duration {
    deadline(&[IO_BUDGET])
}

/// A Ferry DC: one broker.
pub struct Ferry {
    pub name: String,
    pub broker: BrokerProcess,
    pub client: BrokerClient,
    pub admin: Admin,
}

impl Ferry {
    /// Starts a broker whose cluster id is `name`.
    pub async fn start(name: &str) -> anyhow::Result<Ferry> {
        ferry_testkit::init_tracing();
        let broker = BrokerProcess::builder().cluster_id(name).start().await?;
        let client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?;
        Ok(Ferry { name: name.to_owned(), admin: Admin::new(client.clone()), client, broker })
    }

    pub fn addr(&self) -> String {
        self.broker.addr().to_string()
    }

    pub async fn create_topic(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
        self.admin.create_topic(topic, partitions, TopicConfig::default(), None).await?;
        Ok(())
    }

    /// Log end offsets, in partition order (empty when the topic does not exist yet).
    pub async fn leos(&self, topic: &str) -> Vec<u64> {
        match self.admin.describe_topic(topic).await {
            Ok(d) => d.partitions.iter().map(|p| p.log_end_offset).collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Record `i` of a Ferry-side load: key, value, three headers (one key repeated), a timestamp.
pub fn ferry_record(topic: &str, partition: u32, tag: &str, i: u64) -> ProducerRecord {
    ProducerRecord::new(topic, Bytes::from(format!("{tag}-value-{i}-{}", "v".repeat((i % 50) as usize))))
        .with_key(format!("{tag}-key-{}", i % 13))
        .with_header("seq", i.to_string())
        .with_header("tag", tag.to_owned())
        .with_header("seq", format!("again-{i}"))
        .with_timestamp(1_750_000_000_000 + i as i64)
        .with_partition(partition)
}

/// Produces records `from..to` of `tag` to one partition of a Ferry topic, in acknowledged chunks of 50 (so the
/// source log holds many small batches), and waits for every acknowledgement.
pub async fn produce_ferry(
    dc: &Ferry,
    topic: &str,
    partition: u32,
    tag: &str,
    from: u64,
    to: u64,
) -> anyhow::Result<()> {
    let p = Producer::new(dc.client.clone(), ProducerConfig::default()).await?;
    let mut at = from;
    while at < to {
        let end = (at + 50).min(to);
        let mut pending = Vec::new();
        for i in at..end {
            pending.push(p.send(ferry_record(topic, partition, tag, i)).await?);
        }
        p.flush().await;
        for d in pending {
            d.await.context("a record was not acknowledged")?;
        }
        at = end;
    }
    p.close().await;
    Ok(())
}

/// Every record of a Ferry partition from its log start to its log end, checking batch CRCs and that offsets
/// strictly increase.
pub async fn read_ferry(dc: &Ferry, topic: &str, partition: u32) -> anyhow::Result<Vec<Record>> {
    Ok(read::read_partition(&dc.client, topic, partition, None).await?.records)
}

/// Waits until a Ferry partition's log end reaches `leo`.
pub async fn wait_ferry_leo(dc: &Ferry, topic: &str, partition: u32, leo: u64) -> anyhow::Result<()> {
    ferry_testkit::wait_until(
        &format!("{topic}/{partition} on {} to reach {leo}", dc.name),
        io_deadline(),
        async || Ok::<_, anyhow::Error>(dc.leos(topic).await.get(partition as usize).is_some_and(|&l| l >= leo)),
    )
    .await
}

/// Waits until a Kafka partition holds at least `n` visible records; returns them.
pub async fn wait_kafka_records(k: &Tansu, topic: &str, partition: u32, n: usize) -> anyhow::Result<Vec<Record>> {
    ferry_testkit::wait_for(&format!("{n} records in Kafka {topic}/{partition}"), io_deadline(), async || {
        let got = consume(k, topic, partition, 0).await;
        Ok::<_, anyhow::Error>((got.len() >= n).then_some(got))
    })
    .await
}

/// One side of a mirror config.
#[derive(Debug, Clone)]
pub struct SideConf {
    pub cluster: String,
    /// "ferry" or "kafka".
    pub kind: &'static str,
    /// (route name, brokers); the target uses the first.
    pub routes: Vec<(String, Vec<String>)>,
}

impl SideConf {
    pub fn new(cluster: &str, kind: &'static str, brokers: &str) -> SideConf {
        SideConf { cluster: cluster.to_owned(), kind, routes: vec![("primary".into(), vec![brokers.to_owned()])] }
    }
}

fn list(items: &[String]) -> String {
    format!("[{}]", items.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", "))
}

/// A whole mirror config; `sync_extra` adds `key = value` lines to `[sync]`.
pub fn mirror_toml(
    name: &str,
    source: &SideConf,
    target: &SideConf,
    rename: &str,
    include: &str,
    sync_extra: &str,
) -> String {
    let routes: String = source
        .routes
        .iter()
        .map(|(n, b)| format!("[[source.routes]]\nname = \"{n}\"\nbrokers = {}\n\n", list(b)))
        .collect();
    format!(
        r#"[mirror]
name = "{name}"

[source]
cluster = "{src}"
kind = "{src_kind}"

{routes}[source.health]
check_interval = "500ms"
timeout = "2s"
failure_threshold = 2
switch_after = "1s"
min_switch_interval = "1s"

[target]
cluster = "{dst}"
kind = "{dst_kind}"
brokers = {dst_brokers}

[topics]
include = ["{include}"]
exclude = ["^__"]
rename = "{rename}"
discovery_interval = "1s"
start_position = "earliest"

[sync]
commit_interval = "1s"
shutdown_timeout = "10s"
group_session_timeout = "6s"
{sync_extra}

[monitor]
listen = "127.0.0.1:0"
"#,
        src = source.cluster,
        src_kind = source.kind,
        dst = target.cluster,
        dst_kind = target.kind,
        dst_brokers = list(&target.routes[0].1),
    )
}

/// Starts a mirror with `toml`.
pub async fn start_mirror(toml: &str) -> anyhow::Result<MirrorProcess> {
    Ok(MirrorProcess::builder(toml.to_owned()).start().await?)
}

/// GETs `path` from the mirror's monitor.
pub async fn monitor_get(mirror: &MirrorProcess, path: &str) -> anyhow::Result<serde_json::Value> {
    let url = format!("{}{path}", mirror.monitor_url());
    let body = reqwest::get(&url).await?.error_for_status()?.text().await?;
    serde_json::from_str(&body).with_context(|| format!("GET {url}: not JSON: {body}"))
}

/// The mirror's recent events of `kind` (newest first).
pub async fn events(mirror: &MirrorProcess, kind: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let v = monitor_get(mirror, "/api/v1/events?limit=200").await?;
    let all = v.get("events").and_then(|e| e.as_array()).context("no \"events\" array")?;
    Ok(all.iter().filter(|e| e["kind"] == kind).cloned().collect())
}

/// How a Ferry-produced record reads back at `offset` (its headers as given, in order).
pub fn as_stored(offset: u64, r: ProducerRecord) -> Record {
    Record {
        offset,
        timestamp: r.timestamp.expect("test records carry a timestamp"),
        key: r.key,
        value: r.value,
        headers: r.headers,
    }
}
