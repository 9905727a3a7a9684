//! Helpers shared by ferryctl's test binaries: run the real `ferryctl` binary with a clean environment and a
//! generous bound on its run time, and build mirror topics on a target broker by hand.
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use ferry_batch::{self as batch, BatchIter, Compression, ProducerInfo};
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};

/// What a ferryctl run printed and how it exited.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs ferryctl with `args` and `envs` (no FERRY_* variables inherited), bounded by `limit` so a hang fails.
pub async fn ferryctl_with(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferryctl"));
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    for var in ["FERRY_TOKEN", "FERRY_BROKER", "FERRY_MONITOR", "FERRY_MONITOR_TOKEN", "RUST_LOG"] {
        cmd.env_remove(var);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("ferryctl {args:?} did not finish within {limit:?}"))
        .expect("run ferryctl");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs ferryctl with a 120 s bound.
pub async fn ferryctl(args: &[&str]) -> Output {
    ferryctl_with(args, &[], Duration::from_secs(120)).await
}

/// A client for one broker.
pub fn client(addr: std::net::SocketAddr) -> BrokerClient {
    BrokerClient::new(ClientConfig::new([addr.to_string()])).expect("client")
}

/// Produces `rounds` batches of `per_round` records to each partition of `topic`, flushing after each round so
/// every round is its own batch. Values are `value-p{P}-o{I}` padded with `x`; keys `key-{I % 5}`; two headers with
/// the same key. Returns how many records each partition got.
pub async fn produce(client: &BrokerClient, topic: &str, partitions: u32, rounds: u32, per_round: u32) -> u64 {
    // A long linger: only flush() closes a batch, so batch boundaries are exactly the rounds.
    let config = ProducerConfig { linger: Duration::from_secs(30), ..ProducerConfig::default() };
    let producer = Producer::new(client.clone(), config).await.expect("producer");
    for round in 0..rounds {
        let mut deliveries = Vec::new();
        for p in 0..partitions {
            for j in 0..per_round {
                let i = round * per_round + j;
                let value = format!("value-p{p}-o{i}-{}", "x".repeat(40));
                let record = ProducerRecord::new(topic, Bytes::from(value))
                    .with_key(Bytes::from(format!("key-{}", i % 5)))
                    .with_partition(p)
                    .with_header("h", Bytes::from_static(b"1"))
                    .with_header("h", Bytes::from(format!("round-{round}")));
                deliveries.push(producer.send(record).await.expect("send"));
            }
        }
        producer.flush().await;
        for d in deliveries {
            d.await.expect("acknowledged");
        }
    }
    producer.close().await;
    u64::from(rounds * per_round)
}

/// Every batch of a partition as stored, read with raw Fetch from the log start to the log end.
pub async fn read_batches(client: &BrokerClient, topic: &str, partition: u32) -> (u64, Vec<Bytes>) {
    let mut out = Vec::new();
    let mut offset = 0u64;
    loop {
        let request = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: topic.into(),
                partition,
                offset,
                max_bytes: 1 << 20,
                leader_epoch: None,
            }],
            max_wait_ms: 0,
            max_bytes: 1 << 20,
        };
        let data = client.fetch(request).await.expect("fetch").partitions.remove(0);
        assert_eq!(data.error, 0, "{}", data.message);
        let log_start = data.log_start_offset;
        for b in BatchIter::new(&data.batches) {
            let (h, bytes) = b.expect("whole batch");
            out.push(data.batches.slice_ref(bytes));
            offset = h.next_offset();
        }
        if offset >= data.log_end_offset {
            return (log_start, out);
        }
    }
}

/// Creates `target_topic` on `target` as a mirror of `source_topic` and copies every batch with append-with-offsets,
/// the mirror's own path. With `split`, every source batch of more than one record is appended as two batches
/// holding the same records, offsets, timestamps and epoch (as the mirror does with oversized batches).
pub async fn mirror_by_hand(
    source: &BrokerClient,
    source_cluster_id: &str,
    source_topic: &str,
    target: &BrokerClient,
    target_topic: &str,
    split: bool,
) {
    let desc = Admin::new(source.clone()).describe_topic(source_topic).await.expect("describe source");
    let mark = MirrorSource {
        source_cluster_id: source_cluster_id.into(),
        source_topic_id: desc.topic.topic_id.clone(),
        source_topic: source_topic.into(),
        source_cluster: "dc-a".into(),
    };
    let target_admin = Admin::new(target.clone());
    target_admin
        .create_topic(target_topic, desc.topic.partitions, TopicConfig::default(), Some(mark))
        .await
        .expect("create mirror topic");
    for p in 0..desc.topic.partitions {
        let (log_start, batches) = read_batches(source, source_topic, p).await;
        for b in batches {
            let pieces = if split { split_batch(&b) } else { vec![b] };
            for piece in pieces {
                let answer = target_admin
                    .append_with_offsets(target_topic, p, &desc.topic.topic_id, log_start, piece)
                    .await
                    .expect("append with offsets");
                assert_eq!(answer.error, 0, "{}", answer.message);
            }
        }
    }
}

fn split_batch(b: &Bytes) -> Vec<Bytes> {
    let header = batch::verify(b).expect("good batch");
    let records = batch::decode_records(b).expect("records");
    if records.len() < 2 {
        return vec![b.clone()];
    }
    let (first, second) = records.split_at(records.len() / 2);
    [first, second]
        .iter()
        .map(|half| batch::encode_records(half, header.epoch, Compression::None, ProducerInfo::NONE))
        .collect()
}
