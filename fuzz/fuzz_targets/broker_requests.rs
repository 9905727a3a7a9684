//! Random sequences of broker requests with hostile fields, against an in-process broker on the simulated file
//! system: the real service (`BrokerService`, the handlers behind the gRPC methods), the real core, partitions and
//! group coordinator, called directly without a socket.
//!
//! Every request is built from the fuzzer's input: names from a pool that holds good, reserved, empty, overlong
//! and malformed names; partition indexes and counts, offsets, epochs, timestamps and session timeouts anywhere in
//! their ranges; batches that are well formed, or well formed and then damaged (bytes flipped, cut short, header
//! fields rewritten with or without a fixed CRC), or raw bytes.
//!
//! It asserts:
//! - no panic, and no answer with an `INTERNAL` status: on a healthy (simulated) disk, a client's input is never
//!   the broker's own failure;
//! - bounded memory: run it with `-rss_limit_mb` and `-malloc_limit_mb` (below), so that an input making the
//!   broker allocate past them fails;
//! - after the sequence, the broker's data directory reopens cleanly, and every record the broker acknowledged
//!   (produced, or appended with offsets) and that was not deleted or truncated since is there at its offset, with
//!   its timestamp, key, value and headers. A batch whose body does not decode (a zstd section damaged under a
//!   fixed CRC) is acknowledged too, by design: produce checks headers and the CRC, never bodies; such a batch must
//!   be there byte for byte.
//!
//! Subscribe (a client-streaming call) is left out: its requests need a gRPC stream, not a value.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run broker_requests -- -max_total_time=600 -rss_limit_mb=1024 \
//!       -malloc_limit_mb=256 -timeout=30
#![no_main]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::Bytes;
use ferry_batch::{self as batch, BatchBuilder, BatchIter, Compression, ProducerInfo};
use ferry_broker::core::{BrokerCore, Limits};
use ferry_broker::groups::GroupCoordinator;
use ferry_broker::service::BrokerService;
use ferry_proto::{self as pb, broker_server::Broker};
use ferry_storage::LogConfig;
use ferry_storage::fs::SimFs;
use libfuzzer_sys::fuzz_target;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request};

const DATA_DIR: &str = "/data";
const MAX_OPS: usize = 48;

/// Names: a mirror topic's, good ones, a reserved one, an empty one, an overlong one, and ones the rules refuse.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Name {
    T0,
    T1,
    Mirror,
    Reserved,
    Empty,
    Long,
    Slash,
    Dots,
}

impl Name {
    fn text(self) -> String {
        match self {
            Name::T0 => "t0".into(),
            Name::T1 => "t1".into(),
            Name::Mirror => "dc-a.m".into(),
            Name::Reserved => "__ferry_offsets".into(),
            Name::Empty => String::new(),
            Name::Long => "x".repeat(300),
            Name::Slash => "a/b".into(),
            Name::Dots => "..".into(),
        }
    }
}

/// A partition index: usually a small one, sometimes anything.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Index {
    Small(u8),
    Any(u32),
}

impl Index {
    fn get(self) -> u32 {
        match self {
            Index::Small(i) => u32::from(i % 4),
            Index::Any(i) => i,
        }
    }
}

#[derive(Debug, Clone, Arbitrary)]
struct RecordSpec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    header: Option<(String, Option<Vec<u8>>)>,
    ts_delta: i16,
}

/// Damage done to a well-formed batch.
#[derive(Debug, Clone, Arbitrary)]
enum Damage {
    None,
    Flip { at: u16, mask: u8, fix_crc: bool },
    Cut { keep: u16 },
    LastOffsetDelta { value: u32, fix_crc: bool },
    RecordCount { value: u32, fix_crc: bool },
    Length { value: u32 },
    MaxTimestamp { value: i64, fix_crc: bool },
}

#[derive(Debug, Clone, Arbitrary)]
enum BatchSpec {
    Built {
        records: Vec<RecordSpec>,
        zstd: bool,
        /// The first record's timestamp: near now, or anywhere.
        ts: Option<i64>,
        producer: Option<(i64, i16, i32)>,
        base: u64,
        epoch: u32,
        damage: Damage,
    },
    Raw(Vec<u8>),
}

const OFF_LENGTH: usize = 8;
const OFF_CRC: usize = 17;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_MAX_TS: usize = 35;
const OFF_RECORD_COUNT: usize = 57;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl BatchSpec {
    fn bytes(&self) -> Bytes {
        match self {
            BatchSpec::Raw(raw) => Bytes::from(raw.clone()),
            BatchSpec::Built { records, zstd, ts, producer, base, epoch, damage } => {
                let info = producer.map_or(ProducerInfo::NONE, |(producer_id, producer_epoch, base_sequence)| {
                    ProducerInfo { producer_id, producer_epoch, base_sequence }
                });
                let compression = if *zstd { Compression::Zstd } else { Compression::None };
                let mut b = BatchBuilder::new(compression, info);
                let ts0 = ts.unwrap_or_else(now_ms);
                for (i, r) in records.iter().take(8).enumerate() {
                    let headers: Vec<ferry_batch::Header> = r
                        .header
                        .iter()
                        .map(|(k, v)| ferry_batch::Header {
                            key: k.chars().take(16).collect(),
                            value: v.as_ref().map(|v| Bytes::copy_from_slice(&v[..v.len().min(32)])),
                        })
                        .collect();
                    let key = r.key.as_ref().map(|k| &k[..k.len().min(32)]);
                    let value = r.value.as_ref().map(|v| &v[..v.len().min(256)]);
                    b.push(i as u32, ts0.saturating_add(i64::from(r.ts_delta)), key, value, &headers);
                }
                let mut out = b.build(*base, *epoch).to_vec();
                let fix = |out: &mut Vec<u8>| {
                    if out.len() > OFF_CRC + 4 {
                        let crc = batch::compute_crc(out);
                        out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
                    }
                };
                match damage {
                    Damage::None => {}
                    Damage::Flip { at, mask, fix_crc } => {
                        let at = usize::from(*at) % out.len();
                        out[at] ^= mask;
                        if *fix_crc {
                            fix(&mut out);
                        }
                    }
                    Damage::Cut { keep } => out.truncate(usize::from(*keep) % out.len()),
                    Damage::LastOffsetDelta { value, fix_crc } => {
                        out[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&value.to_be_bytes());
                        if *fix_crc {
                            fix(&mut out);
                        }
                    }
                    Damage::RecordCount { value, fix_crc } => {
                        out[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&value.to_be_bytes());
                        if *fix_crc {
                            fix(&mut out);
                        }
                    }
                    Damage::Length { value } => out[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&value.to_be_bytes()),
                    Damage::MaxTimestamp { value, fix_crc } => {
                        out[OFF_MAX_TS..OFF_MAX_TS + 8].copy_from_slice(&value.to_be_bytes());
                        if *fix_crc {
                            fix(&mut out);
                        }
                    }
                }
                Bytes::from(out)
            }
        }
    }
}

#[derive(Debug, Clone, Arbitrary)]
struct Config {
    flush: Option<bool>,
    retention_ms: Option<u64>,
    segment_bytes: Option<u64>,
    segment_ms: Option<u64>,
    flush_interval_ms: Option<u64>,
}

impl Config {
    fn proto(&self) -> pb::TopicConfig {
        pb::TopicConfig {
            flush: self.flush.map(|s| if s { "sync".into() } else { "async".into() }),
            retention_ms: self.retention_ms,
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            flush_interval_ms: self.flush_interval_ms,
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Arbitrary)]
enum Op {
    Create { name: Name, partitions: Index, config: Config, mirror: bool },
    Delete { name: Name },
    Describe { name: Name },
    List,
    Metadata,
    AlterPartitions { name: Name, partitions: Index },
    AlterConfig { name: Name, config: Config },
    Promote { name: Name },
    InitProducer,
    Produce { name: Name, partition: Option<Index>, key: Option<Vec<u8>>, batches: Vec<BatchSpec> },
    Append { name: Name, partition: Index, right_id: bool, source_log_start: u64, batches: Vec<BatchSpec> },
    EpochEnd { name: Name, partition: Index, epoch: u32 },
    Truncate { name: Name, partition: Index, offset: u64 },
    Fetch { parts: Vec<(Name, Index, u64, u64)>, max_bytes: u64 },
    ListOffsets { name: Name, partition: Index, spec: Option<Option<i64>> },
    Join { group: Name, member: String, topics: Vec<Name>, session_ms: u32, client: String },
    Heartbeat { group: Name, member: String, generation: u64 },
    Leave { group: Name, member: String },
    Commit { group: Name, member: String, generation: u64, offsets: Vec<(Name, Index, u64, String)> },
    FetchCommitted { group: Name, parts: Vec<(Name, Index)> },
    ListGroups,
    DescribeGroup { group: Name },
}

const SOURCE_TOPIC_ID: &str = "7d5c2f4e-93a1-4c39-9f3b-2b8f7a1e0c11";

/// One acknowledged record, as the client sent it.
type Digest = (i64, Option<Bytes>, Option<Bytes>, Vec<ferry_batch::Header>);

/// What the broker acknowledged: per topic partition, offset -> record; and the batches whose bodies do not decode
/// (a zstd section damaged under a fixed CRC: produce checks headers, not bodies, by design), base offset -> the
/// bytes the CRC covers.
#[derive(Default)]
struct Oracle {
    acked: BTreeMap<(String, u32), BTreeMap<u64, Digest>>,
    raw: BTreeMap<(String, u32), BTreeMap<u64, Bytes>>,
}

impl Oracle {
    /// Records the batches of an acknowledged request, placed from `base` on (`None`: at their own offsets).
    fn record(&mut self, topic: &str, partition: u32, batches: &Bytes, base: Option<u64>) {
        let mut next = base;
        for (header, bytes) in BatchIter::new(batches).flatten() {
            let at = next.unwrap_or(header.base_offset);
            next = next.map(|_| at + u64::from(header.last_offset_delta) + 1);
            let Ok(records) = batch::decode_records(bytes) else {
                let raw = self.raw.entry((topic.to_owned(), partition)).or_default();
                raw.insert(at, Bytes::copy_from_slice(&bytes[batch::CRC_START..]));
                continue;
            };
            let entry = self.acked.entry((topic.to_owned(), partition)).or_default();
            for r in records {
                let offset = at + (r.offset - header.base_offset);
                entry.insert(offset, (r.timestamp, r.key, r.value, r.headers));
            }
        }
    }

    fn forget_topic(&mut self, topic: &str) {
        self.acked.retain(|(t, _), _| t != topic);
        self.raw.retain(|(t, _), _| t != topic);
    }

    fn truncate(&mut self, topic: &str, partition: u32, offset: u64) {
        if let Some(m) = self.acked.get_mut(&(topic.to_owned(), partition)) {
            m.retain(|o, _| *o < offset);
        }
        if let Some(m) = self.raw.get_mut(&(topic.to_owned(), partition)) {
            m.retain(|o, _| *o < offset);
        }
    }
}

/// A request as the interceptor passes it on a broker without tokens: with the open grant.
fn call<T>(message: T) -> Request<T> {
    let mut req = Request::new(message);
    req.extensions_mut().insert(ferry_broker::auth::Caller(ferry_broker::auth::Grant::open()));
    req
}

fn open(fs: &SimFs) -> (Arc<BrokerCore>, BrokerService) {
    let defaults = LogConfig { segment_bytes: 4096, ..LogConfig::default() };
    let fs_ref: ferry_storage::fs::FsRef = Arc::new(fs.clone());
    let core = BrokerCore::open(fs_ref.clone(), Path::new(DATA_DIR), Some("fuzz"), defaults, Default::default())
        .expect("the data directory opens")
        .with_limits(Limits { max_topics: 4, max_partitions: 16, max_subscribe_partitions: 16 });
    let core = Arc::new(core);
    let groups =
        GroupCoordinator::open(fs_ref, Path::new(DATA_DIR), Duration::from_millis(10), Duration::from_secs(60))
            .expect("the offsets partition opens");
    let service = BrokerService::new(
        Arc::clone(&core),
        Arc::new(groups),
        "127.0.0.1:7411".into(),
        Duration::from_millis(1),
        2,
        CancellationToken::new(),
    );
    (core, service)
}

/// Fails the run on an answer that blames the broker: on a healthy disk, no client input may cause one.
fn check<T>(op: &Op, result: Result<tonic::Response<T>, tonic::Status>) -> Option<T> {
    match result {
        Ok(r) => Some(r.into_inner()),
        Err(status) => {
            assert_ne!(status.code(), Code::Internal, "{op:?} answered INTERNAL: {}", status.message());
            assert_ne!(status.code(), Code::Unknown, "{op:?} answered UNKNOWN: {}", status.message());
            None
        }
    }
}

fn concat(batches: &[BatchSpec]) -> Bytes {
    let mut out = Vec::new();
    for b in batches.iter().take(4) {
        out.extend_from_slice(&b.bytes());
    }
    Bytes::from(out)
}

async fn apply(svc: &BrokerService, oracle: &mut Oracle, op: &Op) {
    match op {
        Op::Create { name, partitions, config, mirror } => {
            let mirror = mirror.then(|| pb::MirrorSource {
                source_cluster_id: "dc-a-cluster".into(),
                source_topic_id: SOURCE_TOPIC_ID.into(),
                source_topic: "m".into(),
                source_cluster: "dc-a".into(),
            });
            let req = pb::CreateTopicRequest {
                name: name.text(),
                partitions: partitions.get(),
                config: Some(config.proto()),
                mirror,
            };
            check(op, svc.create_topic(call(req)).await);
        }
        Op::Delete { name } => {
            if check(op, svc.delete_topic(call(pb::DeleteTopicRequest { name: name.text() })).await).is_some() {
                oracle.forget_topic(&name.text());
            }
        }
        Op::Describe { name } => {
            check(op, svc.describe_topic(call(pb::DescribeTopicRequest { name: name.text(), leader_epochs: Default::default() })).await);
        }
        Op::List => {
            let listed = check(op, svc.list_topics(call(pb::ListTopicsRequest {})).await);
            for t in listed.into_iter().flat_map(|l| l.topics) {
                assert!(!t.name.starts_with("__ferry"), "an internal partition was listed: {}", t.name);
            }
        }
        Op::Metadata => {
            check(op, svc.metadata(call(pb::MetadataRequest {})).await);
        }
        Op::AlterPartitions { name, partitions } => {
            let req = pb::AlterPartitionsRequest { name: name.text(), partitions: partitions.get() };
            check(op, svc.alter_partitions(call(req)).await);
        }
        Op::AlterConfig { name, config } => {
            let req = pb::AlterTopicConfigRequest { name: name.text(), config: Some(config.proto()) };
            check(op, svc.alter_topic_config(call(req)).await);
        }
        Op::Promote { name } => {
            check(op, svc.promote(call(pb::PromoteRequest { name: name.text() })).await);
        }
        Op::InitProducer => {
            check(op, svc.init_producer(call(pb::InitProducerRequest {})).await);
        }
        Op::Produce { name, partition, key, batches } => {
            let bytes = concat(batches);
            let req = pb::ProduceRequest {
                topic: name.text(),
                partition: partition.map(Index::get),
                key: key.as_ref().map(|k| Bytes::copy_from_slice(&k[..k.len().min(32)])),
                batches: bytes.clone(),
            };
            if let Some(r) = check(op, svc.produce(call(req)).await) {
                let headers: Vec<_> = BatchIter::new(&bytes).flatten().map(|(h, _)| h).collect();
                // A duplicate keeps the offsets (and bytes) of the batch written first; a request mixing
                // idempotent batches may hold duplicates among new ones, whose placement the answer does not say.
                let plain = headers.iter().all(|h| !h.is_idempotent());
                if !r.duplicate && (headers.len() == 1 || plain) {
                    oracle.record(&name.text(), r.partition, &bytes, Some(r.base_offset));
                }
            }
        }
        Op::Append { name, partition, right_id, source_log_start, batches } => {
            let bytes = concat(batches);
            let req = pb::AppendWithOffsetsRequest {
                topic: name.text(),
                partition: partition.get(),
                source_topic_id: if *right_id { SOURCE_TOPIC_ID.into() } else { "other".into() },
                source_log_start_offset: *source_log_start,
                batches: bytes.clone(),
            };
            if let Some(r) = check(op, svc.append_with_offsets(call(req)).await)
                && r.error == pb::ErrorCode::None as i32
            {
                // Written or already present: either way the log holds these records at these offsets.
                oracle.record(&name.text(), partition.get(), &bytes, None);
            }
        }
        Op::EpochEnd { name, partition, epoch } => {
            let req = pb::EpochEndRequest { topic: name.text(), partition: partition.get(), epoch: *epoch };
            check(op, svc.epoch_end(call(req)).await);
        }
        Op::Truncate { name, partition, offset } => {
            let req = pb::TruncatePartitionRequest { topic: name.text(), partition: partition.get(), offset: *offset };
            if check(op, svc.truncate_partition(call(req)).await).is_some() {
                oracle.truncate(&name.text(), partition.get(), *offset);
            }
        }
        Op::Fetch { parts, max_bytes } => {
            let req = pb::FetchRequest {
                partitions: parts
                    .iter()
                    .take(8)
                    .map(|(n, p, offset, max)| pb::PartitionFetch {
                        topic: n.text(),
                        partition: p.get(),
                        offset: *offset,
                        max_bytes: *max,
                        leader_epoch: None,
                    })
                    .collect(),
                max_wait_ms: 0,
                max_bytes: *max_bytes,
            };
            check(op, svc.fetch(call(req)).await);
        }
        Op::ListOffsets { name, partition, spec } => {
            let spec = match spec {
                None => pb::list_offsets_partition::Spec::Earliest(true),
                Some(None) => pb::list_offsets_partition::Spec::Latest(true),
                Some(Some(ts)) => pb::list_offsets_partition::Spec::TimestampMs(*ts),
            };
            let req = pb::ListOffsetsRequest {
                partitions: vec![pb::ListOffsetsPartition {
                    topic: name.text(),
                    partition: partition.get(),
                    spec: Some(spec),
                    leader_epoch: None,
                }],
            };
            check(op, svc.list_offsets(call(req)).await);
        }
        Op::Join { group, member, topics, session_ms, client } => {
            let req = pb::JoinGroupRequest {
                group: group.text(),
                member_id: member.clone(),
                topics: topics.iter().take(4).map(|t| t.text()).collect(),
                session_timeout_ms: *session_ms,
                client_id: client.clone(),
            };
            check(op, svc.join_group(call(req)).await);
        }
        Op::Heartbeat { group, member, generation } => {
            let req = pb::HeartbeatRequest { group: group.text(), member_id: member.clone(), generation: *generation };
            check(op, svc.heartbeat(call(req)).await);
        }
        Op::Leave { group, member } => {
            let req = pb::LeaveGroupRequest { group: group.text(), member_id: member.clone() };
            check(op, svc.leave_group(call(req)).await);
        }
        Op::Commit { group, member, generation, offsets } => {
            let req = pb::CommitOffsetsRequest {
                group: group.text(),
                member_id: member.clone(),
                generation: *generation,
                offsets: offsets
                    .iter()
                    .take(8)
                    .map(|(t, p, offset, metadata)| pb::CommittedOffset {
                        topic: t.text(),
                        partition: p.get(),
                        offset: *offset,
                        metadata: metadata.chars().take(64).collect(),
                    })
                    .collect(),
            };
            check(op, svc.commit_offsets(call(req)).await);
        }
        Op::FetchCommitted { group, parts } => {
            let req = pb::FetchCommittedOffsetsRequest {
                group: group.text(),
                partitions: parts
                    .iter()
                    .take(8)
                    .map(|(t, p)| pb::TopicPartition { topic: t.text(), partition: p.get() })
                    .collect(),
            };
            check(op, svc.fetch_committed_offsets(call(req)).await);
        }
        Op::ListGroups => {
            check(op, svc.list_groups(call(pb::ListGroupsRequest {})).await);
        }
        Op::DescribeGroup { group } => {
            check(op, svc.describe_group(call(pb::DescribeGroupRequest { group: group.text() })).await);
        }
    }
}

/// Every record of `topic`/`partition` in the reopened core, by offset; and the CRC-covered bytes of every batch,
/// by base offset.
fn stored(core: &BrokerCore, topic: &str, partition: u32) -> (BTreeMap<u64, Digest>, BTreeMap<u64, Bytes>) {
    let part = core.partition(topic, partition).expect("an acknowledged partition reopens");
    let log = part.log();
    let mut out = BTreeMap::new();
    let mut raw = BTreeMap::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let read = log.read(offset, 1 << 20).expect("the reopened log reads");
        if read.batches.is_empty() {
            break;
        }
        for (header, bytes) in BatchIter::new(&read.batches).flatten() {
            raw.insert(header.base_offset, Bytes::copy_from_slice(&bytes[batch::CRC_START..]));
            for r in batch::decode_records(bytes).into_iter().flatten() {
                out.insert(r.offset, (r.timestamp, r.key, r.value, r.headers));
            }
        }
        offset = read.next_offset;
    }
    (out, raw)
}

fuzz_target!(|ops: Vec<Op>| {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let fs = SimFs::new();
    let mut oracle = Oracle::default();
    runtime.block_on(async {
        let (core, svc) = open(&fs);
        for op in ops.iter().take(MAX_OPS) {
            apply(&svc, &mut oracle, op).await;
        }
        drop(svc);
        drop(core);
    });
    // A clean reopen of the same data directory keeps every acknowledged record.
    let (core, _svc) = runtime.block_on(async { open(&fs) });
    let partitions: std::collections::BTreeSet<_> = oracle.acked.keys().chain(oracle.raw.keys()).cloned().collect();
    for (topic, partition) in partitions {
        let (got, got_raw) = stored(&core, &topic, partition);
        let key = (topic.clone(), partition);
        for (base, bytes) in oracle.raw.get(&key).into_iter().flatten() {
            assert_eq!(
                got_raw.get(base),
                Some(bytes),
                "{topic}/{partition} lost or changed the batch acknowledged at {base}"
            );
        }
        for (offset, record) in oracle.acked.get(&key).into_iter().flatten() {
            assert_eq!(
                got.get(offset),
                Some(record),
                "{topic}/{partition} lost or changed acknowledged offset {offset}"
            );
        }
    }
});
