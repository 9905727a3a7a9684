//! Shared helpers of the broker's end-to-end tests: starting a broker, clients, the exact-data digest, reading a
//! whole partition straight from the log, and status assertions.
//!
//! Every scenario compares data as [`Rec`]s: (partition, offset, key, value, headers, timestamp). Two record sets
//! are equal when their counts and SHA-256 digests over the sorted records are equal; on a mismatch
//! [`assert_same_records`] names the first differing records instead of dumping thousands.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use ferry_batch::{self as batch, Header};
use ferry_client::{
    Admin, BrokerClient, ClientConfig, ClientError, Code, ConsumerRecord, ProducerRecord, RecordMetadata,
};
use ferry_testkit::BrokerProcess;
use sha2::{Digest, Sha256};

#[path = "../support/read.rs"]
mod read;

/// How long the debug-built broker may need for one test's whole data load (thousands of records through one
/// process on a loaded 2-core machine). Waits on data use `deadline(&[IO_BUDGET])`, i.e. three times this.
pub const IO_BUDGET: Duration = Duration::from_secs(20);

/// The grace period a broker gets to stop after SIGTERM in these tests (its `shutdown_timeout` is 30 s, but with
/// no long polls open it stops at once).
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// Starts a broker with `config` (TOML) and tracing for the test process.
pub async fn start_broker(config: &str) -> anyhow::Result<BrokerProcess> {
    ferry_testkit::init_tracing();
    Ok(BrokerProcess::builder().config(config).start().await?)
}

/// A client of the broker at `addr` (`host:port`).
pub fn client_for(addr: impl ToString) -> BrokerClient {
    BrokerClient::new(ClientConfig::new([addr.to_string()])).expect("a loopback address is a valid client config")
}

/// A client and an admin for `broker`.
pub fn connect(broker: &BrokerProcess) -> (BrokerClient, Admin) {
    let client = client_for(broker.addr());
    (client.clone(), Admin::new(client))
}

/// One record, as everything in these tests compares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rec {
    pub partition: u32,
    pub offset: u64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    pub timestamp: i64,
}

impl Rec {
    /// A produced record as the log holds it, at the partition and offset its acknowledgement names.
    pub fn acked(ack: &RecordMetadata, r: ProducerRecord) -> Rec {
        Rec {
            partition: ack.partition,
            offset: ack.offset,
            key: r.key,
            value: r.value,
            headers: headers(&r.headers),
            timestamp: r.timestamp.expect("the test's records carry timestamps"),
        }
    }

    /// From a consumed record.
    pub fn from_consumed(r: &ConsumerRecord) -> Rec {
        Rec {
            partition: r.partition,
            offset: r.offset,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: headers(&r.headers),
            timestamp: r.timestamp,
        }
    }

    /// A record of a batch the test encoded itself, as partition `partition` holds it.
    pub fn from_batch_record(partition: u32, r: &batch::Record) -> Rec {
        Rec {
            partition,
            offset: r.offset,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: headers(&r.headers),
            timestamp: r.timestamp,
        }
    }

    /// The value as text (test values are ASCII).
    pub fn value_str(&self) -> &str {
        std::str::from_utf8(self.value.as_deref().unwrap_or_default()).expect("test values are UTF-8")
    }
}

/// Headers as plain pairs.
pub fn headers(h: &[Header]) -> Vec<(String, Option<Bytes>)> {
    h.iter().map(|h| (h.key.clone(), h.value.clone())).collect()
}

/// Count and SHA-256 over the records sorted by (partition, offset), with every field length-prefixed so that no
/// two different record sets hash alike.
pub fn digest(records: &[Rec]) -> (usize, String) {
    let mut sorted: Vec<&Rec> = records.iter().collect();
    sorted.sort();
    let mut h = Sha256::new();
    let bytes = |h: &mut Sha256, b: &Option<Bytes>| match b {
        None => h.update(u64::MAX.to_be_bytes()),
        Some(b) => {
            h.update((b.len() as u64).to_be_bytes());
            h.update(b);
        }
    };
    for r in sorted {
        h.update(r.partition.to_be_bytes());
        h.update(r.offset.to_be_bytes());
        bytes(&mut h, &r.key);
        bytes(&mut h, &r.value);
        h.update((r.headers.len() as u64).to_be_bytes());
        for (k, v) in &r.headers {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k.as_bytes());
            bytes(&mut h, v);
        }
        h.update(r.timestamp.to_be_bytes());
    }
    let hex = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    (records.len(), hex)
}

/// Asserts that two record sets are the same: equal count and digest. On a mismatch, names the first few records
/// that are only on one side.
pub fn assert_same_records(what: &str, expected: &[Rec], got: &[Rec]) {
    if digest(expected) == digest(got) {
        return;
    }
    let mut e: Vec<&Rec> = expected.iter().collect();
    let mut g: Vec<&Rec> = got.iter().collect();
    e.sort();
    g.sort();
    let only_expected: Vec<_> = e.iter().filter(|r| g.binary_search(r).is_err()).take(3).collect();
    let only_got: Vec<_> = g.iter().filter(|r| e.binary_search(r).is_err()).take(3).collect();
    let mut dup = g.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).take(3).peekable();
    let dup_note =
        if dup.peek().is_some() { format!("; duplicated: {:?}", dup.collect::<Vec<_>>()) } else { String::new() };
    panic!(
        "{what}: expected {} records, got {}; missing (first 3): {only_expected:?}; unexpected (first 3): {only_got:?}{dup_note}",
        expected.len(),
        got.len()
    );
}

/// Log start and end offsets of every partition of `topic`, in partition order.
pub async fn offsets(admin: &Admin, topic: &str) -> Vec<(u64, u64)> {
    let d = admin.describe_topic(topic).await.expect("describe the topic");
    d.partitions.iter().map(|p| (p.log_start_offset, p.log_end_offset)).collect()
}

/// Log end offsets of every partition of `topic`.
pub async fn leos(admin: &Admin, topic: &str) -> Vec<u64> {
    offsets(admin, topic).await.into_iter().map(|(_, end)| end).collect()
}

/// Partition epochs of `topic`.
pub async fn epochs(admin: &Admin, topic: &str) -> Vec<u32> {
    let d = admin.describe_topic(topic).await.expect("describe the topic");
    d.partitions.iter().map(|p| p.epoch).collect()
}

/// Reads every record of `topic`/`partition` from the log start to the log end as it is at the call, with plain
/// fetches (no consumer logic), checking each batch's CRC and that offsets strictly increase.
pub async fn read_partition(client: &BrokerClient, topic: &str, partition: u32) -> Vec<Rec> {
    let read = read::read_partition(client, topic, partition, None).await.expect("read the partition");
    read.records
        .into_iter()
        .map(|r| Rec {
            partition,
            offset: r.offset,
            key: r.key,
            value: r.value,
            headers: headers(&r.headers),
            timestamp: r.timestamp,
        })
        .collect()
}

/// Every record of every partition of `topic`.
pub async fn read_topic(client: &BrokerClient, topic: &str) -> Vec<Rec> {
    let admin = Admin::new(client.clone());
    let n = admin.describe_topic(topic).await.expect("describe").partitions.len() as u32;
    let mut all = Vec::new();
    for p in 0..n {
        all.extend(read_partition(client, topic, p).await);
    }
    all
}

/// Records grouped by partition, each group in offset order.
pub fn by_partition(records: &[Rec]) -> BTreeMap<u32, Vec<Rec>> {
    let mut map: BTreeMap<u32, Vec<Rec>> = BTreeMap::new();
    for r in records {
        map.entry(r.partition).or_default().push(r.clone());
    }
    for v in map.values_mut() {
        v.sort_by_key(|r| r.offset);
    }
    map
}

/// Asserts a call failed with a gRPC `code` whose message contains every one of `needles`.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(result: Result<T, ClientError>, code: Code, needles: &[&str]) -> String {
    let err = match result {
        Ok(v) => panic!("expected {code:?}, got success: {v:?}"),
        Err(e) => e,
    };
    let (got, message) = match &err {
        ClientError::Status { code, message, .. } => (*code, message.clone()),
        other => panic!("expected gRPC status {code:?}, got {other:?}"),
    };
    assert_eq!(got, code, "wrong code for: {message}");
    for n in needles {
        assert!(message.contains(n), "message {message:?} should mention {n:?}");
    }
    message
}

/// One batch of plain (non-idempotent) records with the given values, offsets 0.. and timestamps `ts0`...
pub fn plain_batch(values: &[&str], ts0: i64) -> Bytes {
    let mut b = batch::BatchBuilder::new(batch::Compression::None, batch::ProducerInfo::NONE);
    for (i, v) in values.iter().enumerate() {
        b.push(i as u32, ts0 + i as i64, Some(format!("k{i}").as_bytes()), Some(v.as_bytes()), &[]);
    }
    b.build(0, 0)
}

/// Runs `ferry-broker` with `config` (a file), `--cluster-id` and `--data-dir`, on a free port, as a broker that is
/// expected to refuse to start; returns its output once it exits, within `within`.
pub async fn run_to_exit(
    config: &str,
    data_dir: &std::path::Path,
    cluster_id: &str,
    within: Duration,
) -> anyhow::Result<std::process::Output> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("broker.toml");
    std::fs::write(&path, config)?;
    let run = tokio::process::Command::new(ferry_testkit::binary_path(ferry_testkit::BROKER_BIN)?)
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0", "--cluster-id", cluster_id, "--data-dir"])
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .env_remove("FERRY_BROKER_TOKEN")
        .kill_on_drop(true)
        .output();
    Ok(tokio::time::timeout(within, run).await??)
}

/// The `error...` lines a process wrote to stderr.
pub fn error_lines(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("error")).map(str::to_owned).collect()
}
