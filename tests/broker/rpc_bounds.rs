//! Every RPC of `ferry.v1.Broker` with out-of-range or hostile fields, against one broker with small limits: each
//! refusal has its documented (gRPC code, `ferry-reason`) pair, or its per-partition `ErrorCode` where the answer
//! carries one, and a message naming the field or value. Afterwards a well-formed request of every kind is
//! accepted, the logs hold exactly what the well-formed requests wrote, and the broker process still serves.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_batch::{self as batch, Compression, ProducerInfo, Record};
use ferry_client::proto::list_offsets_partition::Spec;
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_client::{BrokerClient, ClientError, Code};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::common::{Rec, assert_same_records, connect, leos, plain_batch, read_partition, start_broker};

mod requests;

use self::requests::*;

/// Small limits, so each is cheap to reach.
const CONFIG: &str = r#"
[broker]
max_batch_bytes = "4KiB"
max_fetch_wait = "300ms"
[storage]
max_timestamp_ahead = "1h"
producer_id_expiration = "1s"
[groups]
max_id_bytes = 64
max_members = 2
[limits]
max_topics = 4
max_partitions = 8
max_subscribe_partitions = 3
"#;

/// The documented contract (docs/broker.md, "## Errors"): the gRPC code of each `ferry-reason` refused here.
/// [`check_reasons_against_the_docs`] holds it to the doc's own table.
const REASONS: &[(Code, &[&str])] = &[
    (Code::NotFound, &["unknown_topic", "unknown_partition"]),
    (Code::InvalidArgument, &["invalid_name", "invalid_argument", "malformed_batch"]),
    (Code::DataLoss, &["corrupt_batch"]),
    (Code::ResourceExhausted, &["batch_too_large", "limit_reached"]),
    (Code::AlreadyExists, &["topic_exists"]),
    (Code::FailedPrecondition, &["partitions_only_grow", "mirror_topic_read_only", "not_a_mirror_topic"]),
    (Code::FailedPrecondition, &["producer_fenced", "out_of_sequence", "producer_expired"]),
    (Code::FailedPrecondition, &["group_has_members", "unknown_member", "stale_generation"]),
];
const TS0: i64 = 1_700_000_000_000;
const SOURCE_ID: &str = "3c9d1e7a-5b2f-4a80-9e61-0d4c8b7a2f15";
const RESERVED: &str = "reserved for the broker's internal partitions";
/// Batch header positions (the table in ferry-batch's crate docs).
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_FIRST_TS: usize = 27;
const OFF_RECORD_COUNT: usize = 57;

/// Holds [`REASONS`] to the reason table of docs/broker.md, whose codes are written `INVALID_ARGUMENT`.
fn check_reasons_against_the_docs() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/broker.md")).expect("the docs");
    let rows = doc.lines().skip_while(|l| !l.starts_with("| `ferry-reason` |")).skip(2);
    let mut documented = BTreeMap::new();
    for cells in rows.take_while(|l| l.starts_with('|')).map(|l| l.split('|').map(str::trim).collect::<Vec<_>>()) {
        let words = cells[2].trim_matches('`').split('_');
        let code: String = words.map(|w| w[..1].to_owned() + &w[1..].to_lowercase()).collect();
        for reason in cells[1].split(',') {
            documented.insert(reason.trim().trim_matches('`').to_owned(), code.clone());
        }
    }
    for (code, reasons) in REASONS {
        for reason in *reasons {
            assert_eq!(
                documented.get(*reason),
                Some(&format!("{code:?}")),
                "docs/broker.md on {reason}: {documented:?}"
            );
        }
    }
}

fn code_of(reason: &str) -> Code {
    REASONS
        .iter()
        .find(|(_, reasons)| reasons.contains(&reason))
        .unwrap_or_else(|| panic!("{reason} is not in REASONS"))
        .0
}

/// Asserts that `result` is exactly the status `expected` (code, reason), with a message naming every needle.
#[track_caller]
fn refusal<T: Debug>(what: &str, result: Result<T, ClientError>, expected: (Code, Option<&str>), needles: &[&str]) {
    let err = match result {
        Ok(v) => panic!("{what}: expected {expected:?}, the broker accepted it: {v:?}"),
        Err(e) => e,
    };
    let ClientError::Status { message, .. } = &err else { panic!("{what}: expected a status, got {err:?}") };
    assert_eq!((err.code(), err.reason()), (Some(expected.0), expected.1), "{what}: {message}");
    for n in needles {
        assert!(message.contains(n), "{what}: the message {message:?} should name {n:?}");
    }
}

/// Rows `rpc(request) => "reason", needles...;` on `client`: each request is sent in turn and must be refused with
/// the reason, its documented code and a message naming every needle.
macro_rules! refused {
    ($client:ident; $($rpc:ident($request:expr) => $reason:literal $(, $needle:expr)*;)*) => {$(
        let what = concat!(stringify!($rpc), "(", stringify!($request), ")");
        refusal(what, $client.$rpc($request).await, (code_of($reason), Some($reason)), &[$($needle),*]);
    )*};
}

/// Source records `base..base+n` of the mirror topic, tagged so that two offers of the same offsets can differ.
fn records(base: u64, n: u64, tag: &str) -> Vec<Record> {
    let value = |o: u64| Some(Bytes::from(format!("{tag}-{o}")));
    (base..base + n)
        .map(|o| Record { offset: o, timestamp: TS0 + o as i64, key: None, value: value(o), headers: vec![] })
        .collect()
}

fn mirrored(base: u64, n: u64, epoch: u32, tag: &str) -> Bytes {
    batch::encode_records(&records(base, n, tag), epoch, Compression::None, ProducerInfo::NONE)
}

fn idempotent(producer_id: i64, producer_epoch: i16, base_sequence: i32, values: &[&str], ts: i64) -> Bytes {
    let mut b =
        batch::BatchBuilder::new(Compression::None, ProducerInfo { producer_id, producer_epoch, base_sequence });
    for (i, v) in values.iter().enumerate() {
        b.push(i as u32, ts, None, Some(v.as_bytes()), &[]);
    }
    b.build(0, 0)
}

/// `good` with `bytes` written at header position `at` and the CRC made valid again.
fn patched(good: &Bytes, at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut b = good.to_vec();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    let crc = batch::compute_crc(&b);
    b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

fn rec(partition: u32, offset: u64, key: Option<&str>, value: &str, timestamp: i64) -> Rec {
    let key = key.map(|k| Bytes::copy_from_slice(k.as_bytes()));
    Rec { partition, offset, key, value: Some(Bytes::copy_from_slice(value.as_bytes())), headers: vec![], timestamp }
}

/// The records of `partition` in whole batches `batches`.
fn decode(partition: u32, batches: &[u8]) -> Vec<Rec> {
    let mut out = Vec::new();
    for (_, bytes) in batch::BatchIter::new(batches).map(|b| b.expect("whole batches")) {
        for r in batch::decode_records(bytes).expect("a decodable batch") {
            let headers = crate::common::headers(&r.headers);
            out.push(Rec { partition, offset: r.offset, key: r.key, value: r.value, headers, timestamp: r.timestamp });
        }
    }
    out
}

/// A subscribe start of (topic, partition, offset)s, each with 1 MiB of credit and seat 7.
fn start(partitions: &[(&str, u32, u64)]) -> pb::SubscribeRequest {
    let mut start =
        pb::SubscribeStart { partitions: vec![], max_response_bytes: 0, idle_heartbeat_ms: 50, changed_beats: false };
    for &(topic, partition, offset) in partitions {
        let topic = topic.into();
        start.partitions.push(pb::PartitionStart {
            topic,
            partition,
            offset,
            credit_bytes: 1 << 20,
            seat: 7,
            leader_epoch: None,
        });
    }
    pb::SubscribeRequest { kind: Some(pb::subscribe_request::Kind::Start(start)) }
}

/// A stream of subscribe responses, its status as a [`ClientError`].
trait Responses: Stream<Item = Result<pb::SubscribeResponse, ClientError>> + Unpin {}
impl<S: Stream<Item = Result<pb::SubscribeResponse, ClientError>> + Unpin> Responses for S {}

/// A subscribe stream opened with `first`, and the sender of its later messages.
async fn subscribe(
    client: &BrokerClient,
    first: pb::SubscribeRequest,
) -> anyhow::Result<(mpsc::Sender<pb::SubscribeRequest>, impl Responses)> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await?;
    let requests = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let stream = client.raw().await?.subscribe(requests).await?.into_inner();
    Ok((tx, stream.map(|r| r.map_err(|status| ClientError::from_status(&status, "the broker")))))
}

/// The next message of a stream: data, or the status it ended with.
async fn next(stream: &mut impl Responses) -> Result<pb::SubscribeResponse, ClientError> {
    let message = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
    message.expect("a subscribe message within 10 s").expect("the stream to end with a status")
}

/// Reads a stream to the status it ends with.
async fn ended(stream: &mut impl Responses) -> Result<(), ClientError> {
    loop {
        next(stream).await?;
    }
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_out_of_range_fields_with_its_documented_status_and_keeps_serving() -> anyhow::Result<()> {
    use ErrorCode::{Diverged, EpochRegressed, GapRefused, NotAMirrorTopic, OffsetOutOfRange, StraddlesEnd};
    use ErrorCode::{TopicIdMismatch, UnknownTopicOrPartition as Unknown};
    check_reasons_against_the_docs();
    let mut broker = start_broker(CONFIG).await?;
    let (client, admin) = connect(&broker);
    let c = &client;
    let meta = c.metadata().await?;
    assert_eq!((meta.max_batch_bytes, meta.max_message_bytes), (4096, 2 * 4096 + (1 << 20)));

    // Four topics (the limit) with five partitions (of eight), some data, and a full group of two.
    for request in
        [create("t", 2), mirror_of("dc-a.m", SOURCE_ID), mirror_of("dc-a.p", SOURCE_ID), create("scratch", 1)]
    {
        c.create_topic(request).await?;
    }
    c.produce(produce("t", 0, plain_batch(&["a", "b", "c"], TS0))).await?;
    // t/1: producer 1 (epoch 1), then a batch 1001 ms of batch time later, which expires producer 1; producer 2.
    let p1 = c.init_producer(pb::InitProducerRequest {}).await?.producer_id;
    let p2 = c.init_producer(pb::InitProducerRequest {}).await?.producer_id;
    c.produce(produce("t", 1, idempotent(p1, 1, 0, &["p0", "p1"], TS0))).await?;
    c.produce(produce("t", 1, plain_batch(&["late"], TS0 + 1001))).await?;
    c.produce(produce("t", 1, idempotent(p2, 0, 0, &["q0"], TS0 + 1001))).await?;
    let r = c.append_with_offsets(append("dc-a.m", 0, SOURCE_ID, mirrored(0, 3, 2, "src"))).await?;
    assert_eq!((r.error, r.log_end_offset), (ErrorCode::None as i32, 3), "{}", r.message);
    c.join_group(join("workers", "m1", "", &["t"])).await?;
    let generation = c.join_group(join("workers", "m2", "", &["t"])).await?.generation;
    assert_eq!(leos(&admin, "t").await, vec![3, 4]);

    let (long, group256, id65) = ("x".repeat(201), "g".repeat(256), "i".repeat(65));
    let one = plain_batch(&["x"], TS0);
    let big = plain_batch(&[&"v".repeat(5000)], TS0);
    let mut crc = one.to_vec();
    *crc.last_mut().expect("a batch") ^= 1;
    let crc = Bytes::from(crc);
    let (late, ahead) = (TS0 + 1001, wall_ms() + 2 * 3_600_000);
    let ahead_msg = format!("t/0: a batch's newest record timestamp {ahead} is more than storage.max_timestamp_ahead");
    let stale = format!("stale generation {} (current {generation})", generation + 7);
    let m = |batches: Bytes| append("dc-a.m", 0, SOURCE_ID, batches);
    let unordered = [mirrored(3, 2, 2, "src"), mirrored(4, 2, 2, "src")].concat();
    refused! { c;
        create_topic(create("", 1)) => "invalid_name", "cannot be empty";
        create_topic(create(&long, 1)) => "invalid_name", "is at most 200 characters";
        create_topic(create("a/b", 1)) => "invalid_name", "\"a/b\"", "may only hold A-Z a-z 0-9 . _ -";
        create_topic(create("..", 1)) => "invalid_name", "cannot be . or ..";
        create_topic(create("__ferry_offsets", 1)) => "invalid_name", "__ferry are reserved";
        create_topic(create("new", 0)) => "invalid_argument", "partitions must be between 1 and 100000, not 0";
        create_topic(create("new", u32::MAX)) => "invalid_argument", "between 1 and 100000, not 4294967295";
        create_topic(create_with("new", |c| c.flush = Some("never".into()))) => "invalid_argument", "not \"never\"";
        create_topic(create_with("new", |c| c.segment_bytes = Some(1))) => "invalid_argument", "segment_bytes 1 is";
        create_topic(create_with("new", |c| c.segment_ms = Some(0))) => "invalid_argument", "segment_ms 0 is below";
        create_topic(create_with("new", |c| c.flush_interval_ms = Some(0))) => "invalid_argument", "flush_interval_ms";
        create_topic(mirror_of("dc-a.x", "")) => "invalid_argument", "needs its source_cluster_id and source_topic_id";
        create_topic(create("t", 1)) => "topic_exists", "topic \"t\" already exists";
        create_topic(create("extra", 1)) => "limit_reached", "would pass the broker's 4 topics", "limits.max_topics";
        delete_topic(delete("__ferry_offsets")) => "invalid_name", RESERVED;
        delete_topic(delete("missing")) => "unknown_topic", "topic \"missing\" does not exist";
        delete_topic(delete("")) => "unknown_topic", "topic \"\" does not exist";
        describe_topic(describe("missing")) => "unknown_topic", "\"missing\" does not exist";
        describe_topic(describe("__ferry_offsets")) => "unknown_topic", "\"__ferry_offsets\" does not exist";
        alter_partitions(grow("t", 1)) => "partitions_only_grow", "\"t\" has 2, asked for 1";
        alter_partitions(grow("t", 0)) => "partitions_only_grow", "\"t\" has 2, asked for 0";
        alter_partitions(grow("t", u32::MAX)) => "invalid_argument", "at most 100000 partitions";
        alter_partitions(grow("t", 6)) => "limit_reached",
            "4 more partitions for topic \"t\" would pass the broker's 8 partitions (5 exist)", "limits.max_partitions";
        alter_partitions(grow("__ferry_offsets", 2)) => "invalid_name", RESERVED;
        alter_partitions(grow("missing", 2)) => "unknown_topic", "\"missing\" does not exist";
        alter_topic_config(alter("__ferry_offsets", |_| ())) => "invalid_name", RESERVED;
        alter_topic_config(alter("missing", |c| c.retention_ms = Some(1))) => "unknown_topic", "\"missing\"";
        alter_topic_config(alter("t", |c| c.flush = Some("never".into()))) => "invalid_argument", "not \"never\"";
        alter_topic_config(alter("t", |c| c.segment_bytes = Some(1))) => "invalid_argument", "segment_bytes 1 is";
        alter_topic_config(alter("t", |c| c.segment_ms = Some(999))) => "invalid_argument", "segment_ms 999 is";
        promote(promote("__ferry_offsets")) => "invalid_name", RESERVED;
        promote(promote("missing")) => "unknown_topic", "\"missing\" does not exist";
        produce(produce("__ferry_offsets", 0, one.clone())) => "invalid_name", RESERVED;
        produce(produce("missing", 0, one.clone())) => "unknown_topic", "ferryctl topic create missing";
        produce(produce("t", 2, one.clone())) => "unknown_partition", "partition 2 does not exist", "has 2 partitions";
        produce(produce("t", u32::MAX, one.clone())) => "unknown_partition", "partition 4294967295 does not exist";
        produce(produce("dc-a.m", 0, one.clone())) => "mirror_topic_read_only", "\"dc-a.m\" mirrors dc-a; promote";
        produce(produce("t", 0, Bytes::new())) => "malformed_batch", "the request holds no batch";
        produce(produce("t", 0, one.slice(..one.len() - 3))) => "malformed_batch", "batch truncated: needs";
        produce(produce("t", 0, vec![0xab; 100])) => "malformed_batch", "unknown batch format version 171";
        produce(produce("t", 0, patched(&one, OFF_RECORD_COUNT, &[0; 4]))) => "malformed_batch", "holds no records";
        produce(produce("t", 0, patched(&one, OFF_ATTRIBUTES, &[0, 7]))) => "malformed_batch", "compression code 7";
        produce(produce("t", 0, patched(&one, OFF_LAST_OFFSET_DELTA, &[0xff; 4])))
            => "malformed_batch", "last_offset_delta 4294967295 for 1 records";
        produce(produce("t", 0, crc.clone())) => "corrupt_batch", "t/0: CRC mismatch";
        produce(produce("t", 0, [&one[..], &crc].concat())) => "corrupt_batch", "t/0: CRC mismatch";
        produce(produce("t", 0, big.clone())) => "batch_too_large", "exceeds max_batch_bytes (4096)";
        produce(produce("t", 0, plain_batch(&["z"], ahead))) => "invalid_argument", &ahead_msg;
        produce(produce("t", 0, plain_batch(&["z"], i64::MAX - 1)))
            => "invalid_argument", "timestamp 9223372036854775806 is more than storage.max_timestamp_ahead";
        produce(produce("t", 1, idempotent(p1, 0, 2, &["f"], late))) => "producer_fenced", "epoch 0 is fenced by epoch 1";
        produce(produce("t", 1, idempotent(p1, 1, 2, &["e"], late)))
            => "producer_expired", "expired", "storage.producer_id_expiration (1000 ms)";
        produce(produce("t", 1, idempotent(p2, 0, 5, &["s"], late))) => "out_of_sequence", "expected 1, got 5";
        produce(produce("t", 0, patched(&one, OFF_FIRST_TS, &ahead.to_be_bytes())))
            => "malformed_batch", &format!("first_timestamp {ahead} is above max_timestamp {TS0}");
        append_with_offsets(append("__ferry_offsets", 0, SOURCE_ID, one.clone())) => "invalid_name", RESERVED;
        append_with_offsets(append("missing", 0, SOURCE_ID, one.clone())) => "unknown_topic", "\"missing\"";
        append_with_offsets(append("dc-a.m", 1, SOURCE_ID, one.clone())) => "unknown_partition", "partition 1 does";
        append_with_offsets(m(vec![0xab; 100].into())) => "malformed_batch", "unknown batch format version 171";
        append_with_offsets(m(crc.clone())) => "corrupt_batch", "dc-a.m/0: CRC mismatch";
        append_with_offsets(m(big.clone())) => "batch_too_large", "exceeds max_batch_bytes (4096)";
        append_with_offsets(m(unordered.into())) => "malformed_batch", "offsets must increase";
        append_with_offsets(m(mirrored(u64::MAX - 1, 1, 2, "src"))) => "invalid_argument", "pass the largest offset";
        append_with_offsets(pb::AppendWithOffsetsRequest { source_log_start_offset: u64::MAX, ..m(Bytes::new()) })
            => "invalid_argument", "a log start) at 18446744073709551615 would pass the largest offset, 2^63 - 2";
        epoch_end(epoch_end("missing", 0, 0)) => "unknown_topic", "\"missing\" does not exist";
        epoch_end(epoch_end("dc-a.m", 1, 0)) => "unknown_partition", "partition 1 does not exist";
        epoch_end(epoch_end("__ferry_offsets", 0, 0)) => "unknown_topic", "\"__ferry_offsets\" does not exist";
        truncate_partition(truncate("__ferry_offsets", 0, 0)) => "invalid_name", RESERVED;
        truncate_partition(truncate("missing", 0, 0)) => "unknown_topic", "\"missing\" does not exist";
        truncate_partition(truncate("t", 0, 0)) => "not_a_mirror_topic", "topic \"t\" is not a mirror topic";
        truncate_partition(truncate("dc-a.m", 1, 0)) => "unknown_partition", "partition 1 does not exist";
        join_group(join("", "", "", &["t"])) => "invalid_argument", "group name \"\" must be 1-255 characters";
        join_group(join(&group256, "", "", &["t"])) => "invalid_argument", "must be 1-255 characters";
        join_group(join("workers", "m3", "", &[])) => "invalid_argument", "a member must subscribe to a topic";
        join_group(join("workers", "m3", "", &["missing"])) => "unknown_topic", "\"missing\" does not exist";
        join_group(join("workers", "m3", "", &["__ferry_offsets"])) => "unknown_topic", "\"__ferry_offsets\"";
        join_group(join("workers", &id65, "", &["t"])) => "invalid_argument", "member id is 65 bytes, above groups";
        join_group(join("workers", "", &id65, &["t"])) => "invalid_argument", "client id is 65 bytes, above groups";
        join_group(join("workers", "m3", "", &["t"])) => "limit_reached", "its 2 members", "groups.max_members";
        commit_offsets(commit("", "", 0, offset("t", 0, 1, ""))) => "invalid_argument", "must be 1-255 characters";
        commit_offsets(commit("tools", "", 0, offset("missing", 0, 1, ""))) => "unknown_topic", "\"missing\"";
        commit_offsets(commit("tools", "", 0, offset("t", 9, 1, ""))) => "unknown_partition", "partition 9 does";
        commit_offsets(commit("tools", "", 0, offset("__ferry_offsets", 0, 1, ""))) => "unknown_topic", "__ferry_";
        commit_offsets(commit("workers", "", 0, offset("t", 0, 1, ""))) => "group_has_members", "has active members";
        commit_offsets(commit("workers", "ghost", generation, offset("t", 0, 1, ""))) => "unknown_member", "ghost";
        commit_offsets(commit("workers", "m1", generation + 7, offset("t", 0, 1, ""))) => "stale_generation", &stale;
    }
    // Over the gRPC message limit (2 x max_batch_bytes + 1 MiB): refused by the gRPC layer, which sends no reason.
    let huge = c.produce(produce("t", 0, vec![0; 2 << 20])).await;
    refusal("produce: 2 MiB", huge, (Code::OutOfRange, None), &["decoded message length too large"]);

    // AppendWithOffsets answers the mirror's outcomes in the response's ErrorCode; nothing is written.
    for (what, request, code, needle) in [
        ("not a mirror", append("t", 0, SOURCE_ID, mirrored(3, 1, 2, "x")), NotAMirrorTopic, "\"t\" is not a mirror"),
        ("other source", append("dc-a.m", 0, "other", mirrored(3, 1, 2, "x")), TopicIdMismatch, "was re-created"),
        ("above the end", m(mirrored(7, 1, 2, "x")), GapRefused, "batch at 7 is above the log end offset 3"),
        ("straddling", m(mirrored(2, 3, 2, "x")), StraddlesEnd, "straddles the log end offset 3"),
        ("older epoch", m(mirrored(3, 1, 1, "x")), EpochRegressed, "epoch 1, below the latest epoch 2"),
        ("other data", m(mirrored(0, 3, 2, "forged")), Diverged, "differs from the offered batches at offset 0"),
    ] {
        let r = c.append_with_offsets(request).await?;
        let got = (ErrorCode::try_from(r.error), r.written_batches, r.log_end_offset, r.diverged_at);
        assert_eq!(got, (Ok(code), 0, 3, (code == Diverged).then_some(0)), "append: {what}: {}", r.message);
        assert!(r.message.contains(needle), "append: {what}: {:?} should name {needle:?}", r.message);
    }
    // Fetch answers per-partition ErrorCodes; the good partition of the same fetch is served, within the response
    // limit (2 x max_batch_bytes) whatever the budgets ask.
    let want = [
        (at("t", 0, 4), OffsetOutOfRange, "offset 4 is out of range for t/0: the log holds [0, 3)"),
        (at("t", 0, u64::MAX), OffsetOutOfRange, "offset 18446744073709551615 is out of range for t/0"),
        (at("t", 7, 0), Unknown, "partition 7 does not exist: topic \"t\" has 2 partitions"),
        (at("missing", 0, 0), Unknown, "topic \"missing\" does not exist"),
        (at("__ferry_offsets", 0, 0), Unknown, "topic \"__ferry_offsets\" does not exist"),
        (at("t", 1, 0), ErrorCode::None, ""),
    ];
    let partitions = want.iter().map(|w| w.0.clone()).collect();
    let fetched = c.fetch(pb::FetchRequest { partitions, max_wait_ms: 0, max_bytes: u64::MAX }).await?.partitions;
    assert_eq!(fetched.len(), want.len());
    for (d, (_, code, needle)) in fetched.iter().zip(want) {
        assert_eq!(ErrorCode::try_from(d.error), Ok(code), "fetch {}/{}: {}", d.topic, d.partition, d.message);
        assert!(d.message.contains(needle), "fetch {}/{}: {:?} lacks {needle:?}", d.topic, d.partition, d.message);
    }
    assert!(fetched[5].batches.len() <= 2 * 4096, "{} bytes", fetched[5].batches.len());
    let t1 = [
        rec(1, 0, None, "p0", TS0),
        rec(1, 1, None, "p1", TS0),
        rec(1, 2, Some("k0"), "late", TS0 + 1001),
        rec(1, 3, None, "q0", TS0 + 1001),
        rec(1, 4, None, "q1", TS0 + 1002),
        rec(1, 5, None, "r0", TS0 + 1002),
    ];
    assert_same_records("fetched t/1", &t1[..4], &decode(1, &fetched[5].batches));
    // A long poll of u32::MAX ms waits max_fetch_wait (300 ms), no longer.
    let begun = Instant::now();
    let long_poll = pb::FetchRequest { partitions: vec![at("t", 0, 3)], max_wait_ms: u32::MAX, max_bytes: 0 };
    let idle = c.fetch(long_poll).await?;
    assert!((Duration::from_millis(250)..Duration::from_secs(5)).contains(&begun.elapsed()), "{:?}", begun.elapsed());
    let idle = &idle.partitions[0];
    assert_eq!((idle.error, idle.batches.len(), idle.log_end_offset), (0, 0, 3));
    // ListOffsets: per-partition ErrorCodes; timestamps at both ends of i64 are answered.
    let want = [
        (spec("t", 9, Some(Spec::Latest(true))), Unknown, None, "partition 9 does not exist"),
        (spec("missing", 0, Some(Spec::Earliest(true))), Unknown, None, "topic \"missing\" does not exist"),
        (spec("__ferry_offsets", 0, None), Unknown, None, "topic \"__ferry_offsets\" does not exist"),
        (spec("t", 0, Some(Spec::TimestampMs(i64::MAX))), ErrorCode::None, None, ""),
        (spec("t", 0, Some(Spec::TimestampMs(i64::MIN))), ErrorCode::None, Some(0), ""),
        (spec("t", 0, None), ErrorCode::None, Some(3), ""),
    ];
    let partitions = want.iter().map(|w| w.0.clone()).collect();
    let listed = c.list_offsets(pb::ListOffsetsRequest { partitions, ..Default::default() }).await?.partitions;
    assert_eq!(listed.len(), want.len());
    for (r, (_, code, offset, needle)) in listed.iter().zip(&want) {
        let (what, message) = (format!("list offsets {}/{}", r.topic, r.partition), &r.message);
        assert_eq!((ErrorCode::try_from(r.error), r.offset), (Ok(*code), *offset), "{what}: {message}");
        assert!(message.contains(needle), "{what}: {message:?} lacks {needle:?}");
    }
    let ageless = |rs: Vec<pb::ListOffsetsResult>| -> Vec<pb::ListOffsetsResult> {
        rs.into_iter().map(|r| pb::ListOffsetsResult { log_end_age_ms: None, ..r }).collect()
    };
    // The same asks in columns: each alone (a column ask has one spec), and the three that read the latest in one
    // ask naming "t" twice and "__ferry_offsets" once. The same answers, the errors whole among the failures.
    let mut asks: Vec<(Vec<usize>, Option<Spec>)> = (0..want.len()).map(|i| (vec![i], want[i].0.spec)).collect();
    asks.push((vec![0, 2, 5], Some(Spec::Latest(true))));
    for (rows, spec) in asks {
        let columns = in_columns(rows.iter().map(|&i| &want[i].0), spec);
        let asked: Vec<u32> = columns.partitions.clone();
        let answer = c.list_offsets(pb::ListOffsetsRequest { partitions: vec![], columns: Some(columns) }).await?;
        assert!(answer.partitions.is_empty(), "{answer:?}");
        let answers = answer.columns.expect("answered in columns");
        let failed = rows.iter().filter(|&&i| want[i].1 != ErrorCode::None).count();
        assert_eq!(answers.failures.len(), failed, "rows {rows:?}: {answers:?}");
        let got = answers.into_results(asked).expect("one entry per partition asked");
        let flat: Vec<pb::ListOffsetsResult> =
            rows.iter().map(|&i| pb::ListOffsetsResult { topic: String::new(), ..listed[i].clone() }).collect();
        assert_eq!(ageless(got), ageless(flat), "rows {rows:?}: the answers in columns differ from the flat ones");
    }
    // Counts and leader epochs must add up to the partitions asked.
    for (what, edit, needle) in [
        (
            "a count too many",
            (|c: &mut pb::ListOffsetsColumns| c.counts[0] += 1) as fn(&mut _),
            "counts adding up to 2 for 1",
        ),
        ("epochs for none", |c| c.leader_epochs = vec![1, 2], "2 leader epochs for 1 partitions"),
    ] {
        let mut columns = in_columns([&want[0].0], None);
        edit(&mut columns);
        let refused = c.list_offsets(pb::ListOffsetsRequest { partitions: vec![], columns: Some(columns) }).await;
        refusal(
            &format!("list offsets: {what}"),
            refused,
            (Code::InvalidArgument, Some("invalid_argument")),
            &[needle],
        );
    }
    // EpochEnd past the newest epoch and before the oldest; a truncation at u64::MAX keeps the log (the batch
    // boundary at or below it is the log end).
    let e = c.epoch_end(epoch_end("dc-a.m", 0, u32::MAX)).await?;
    assert_eq!((e.found, e.epoch, e.end_offset), (true, 2, 3));
    let e = c.epoch_end(epoch_end("dc-a.m", 0, 1)).await?;
    assert_eq!((e.found, e.epoch, e.end_offset), (false, 0, 0));
    assert_eq!(c.truncate_partition(truncate("dc-a.m", 0, u64::MAX)).await?.log_end_offset, 3);
    // Heartbeats, leaves and reads of groups or members that do not exist answer "nothing" and change nothing.
    let h = c.heartbeat(heartbeat("nope", "m1", 0)).await?;
    assert_eq!((h.generation, h.assignment.len(), h.member_known), (0, 0, false));
    let h = c.heartbeat(heartbeat("workers", &"x".repeat(10_000), u64::MAX)).await?;
    assert_eq!((h.generation, h.assignment.len(), h.member_known), (generation, 0, false));
    let h = c.heartbeat(heartbeat("workers", "m1", u64::MAX)).await?;
    assert_eq!((h.generation, h.member_known), (generation, true));
    c.leave_group(pb::LeaveGroupRequest { group: "workers".into(), member_id: "ghost".into() }).await?;
    c.leave_group(pb::LeaveGroupRequest { group: String::new(), member_id: "x".repeat(10_000) }).await?;
    let committed = |group: &str, partitions| pb::FetchCommittedOffsetsRequest { group: group.into(), partitions };
    assert_eq!(c.fetch_committed_offsets(committed("", vec![])).await?.offsets, []);
    assert_eq!(c.fetch_committed_offsets(committed(&group256, vec![tp("t", 999)])).await?.offsets, []);
    let d = c.describe_group(pb::DescribeGroupRequest { group: "nope".into() }).await?;
    assert_eq!((d.generation, d.members.len(), d.offsets.len()), (0, 0, 0));
    let d = c.describe_group(pb::DescribeGroupRequest { group: "workers".into() }).await?;
    let members: Vec<&str> = d.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!((d.generation, members), (generation, vec!["m1", "m2"]));
    // Subscribe: a start past limits.max_subscribe_partitions ends the stream with its status; unknown partitions
    // are answered with their ErrorCode (and the seat of their start), and count against the limit.
    let (_tx, mut over) = subscribe(c, start(&[("t", 0, 0), ("t", 1, 0), ("dc-a.m", 0, 0), ("dc-a.p", 0, 0)])).await?;
    let (tx, mut unknown) = subscribe(c, start(&[("missing", 0, 0), ("t", 9, 0), ("__ferry_offsets", 0, 0)])).await?;
    let mut errors = BTreeMap::new();
    while errors.len() < 3 {
        for d in next(&mut unknown).await?.partitions {
            errors.insert((d.topic, d.partition), (ErrorCode::try_from(d.error), d.seat, d.message));
        }
    }
    for ((topic, partition), (code, seat, message)) in &errors {
        assert_eq!((code, *seat), (&Ok(Unknown), 7), "subscribe {topic}/{partition}: {message}");
        assert!(message.contains("does not exist"), "subscribe {topic}/{partition}: {message}");
    }
    tx.send(start(&[("t", 0, 0)])).await?;
    let limit = (Code::ResourceExhausted, Some("limit_reached"));
    let needles =
        ["follows at most 3 partitions; this one follows 0 and asked for 4 more", "limits.max_subscribe_partitions"];
    refusal("subscribe: 4 partitions", ended(&mut over).await, limit, &needles);
    refusal("subscribe: one more", ended(&mut unknown).await, limit, &["this one follows 3 and asked for 1 more"]);

    // A well-formed request of every kind is accepted.
    assert_eq!(c.list_topics(pb::ListTopicsRequest::default()).await?.topics.len(), 4);
    c.delete_topic(delete("scratch")).await?;
    assert_eq!(c.create_topic(create("fresh", 2)).await?.topic.map(|t| t.partitions), Some(2));
    assert_eq!(c.alter_partitions(grow("t", 3)).await?.topic.map(|t| t.partitions), Some(3));
    let altered = c.alter_topic_config(alter("t", |c| c.retention_ms = Some(86_400_000))).await?.topic;
    assert_eq!(altered.and_then(|t| t.config).and_then(|c| c.retention_ms), Some(86_400_000));
    assert!(c.promote(promote("dc-a.p")).await?.was_mirror);
    assert_eq!(c.describe_topic(describe("t")).await?.partitions.len(), 3);
    let r = c.produce(produce("t", 0, plain_batch(&["d", "e"], TS0 + 10))).await?;
    assert_eq!((r.base_offset, r.last_offset, r.log_end_offset), (3, 4, 5));
    let r = c.produce(produce("t", 1, idempotent(p2, 0, 0, &["q0"], TS0 + 1001))).await?;
    assert_eq!((r.base_offset, r.duplicate), (3, true));
    assert_eq!(c.produce(produce("t", 1, idempotent(p2, 0, 1, &["q1"], TS0 + 1002))).await?.base_offset, 4);
    let p3 = c.init_producer(pb::InitProducerRequest {}).await?;
    assert!(p3.producer_id >= 0 && ![p1, p2].contains(&p3.producer_id) && p3.producer_epoch == 0, "{p3:?}");
    assert_eq!(c.produce(produce("t", 1, idempotent(p3.producer_id, 0, 0, &["r0"], TS0 + 1002))).await?.base_offset, 5);
    assert_eq!(c.produce(produce("dc-a.p", 0, plain_batch(&["promoted"], TS0))).await?.base_offset, 0);
    let r = c.append_with_offsets(m(mirrored(3, 2, 2, "src"))).await?;
    assert_eq!((r.error, r.written_batches, r.log_end_offset), (0, 1, 5), "{}", r.message);
    assert_eq!(c.truncate_partition(truncate("dc-a.m", 0, 4)).await?.log_end_offset, 3);
    for (written, present) in [(1, 0), (0, 1)] {
        let r = c.append_with_offsets(m(mirrored(3, 2, 2, "src"))).await?;
        assert_eq!((r.error, r.written_batches, r.present_batches, r.log_end_offset), (0, written, present, 5));
    }
    let e = c.epoch_end(epoch_end("dc-a.m", 0, 2)).await?;
    assert_eq!((e.found, e.epoch, e.end_offset), (true, 2, 5));
    assert_eq!(c.join_group(join("workers", "m1", "", &["t"])).await?.member_id, "m1");
    c.leave_group(pb::LeaveGroupRequest { group: "workers".into(), member_id: "m2".into() }).await?;
    let h = c.heartbeat(heartbeat("workers", "m1", generation)).await?;
    assert_eq!((h.member_known, h.assignment), (true, vec![tp("t", 0), tp("t", 1), tp("t", 2)]));
    assert!(h.generation > generation, "{} after {generation}", h.generation);
    c.commit_offsets(commit("workers", "m1", h.generation, offset("t", 0, 2, "m1-meta"))).await?;
    c.commit_offsets(commit("tools", "", 0, offset("t", 1, 4, ""))).await?;
    assert_eq!(c.fetch_committed_offsets(committed("workers", vec![])).await?.offsets, [offset("t", 0, 2, "m1-meta")]);
    assert_eq!(c.fetch_committed_offsets(committed("tools", vec![tp("t", 1)])).await?.offsets, [offset("t", 1, 4, "")]);
    let mut groups = c.list_groups(pb::ListGroupsRequest {}).await?.groups;
    groups.sort_by(|a, b| a.group.cmp(&b.group));
    let groups: Vec<_> = groups.into_iter().map(|g| (g.group, g.members, g.generation)).collect();
    assert_eq!(groups, [("tools".to_owned(), 0, 0), ("workers".to_owned(), 1, h.generation)]);
    let d = c.describe_group(pb::DescribeGroupRequest { group: "workers".into() }).await?;
    assert_eq!((d.members.len(), d.offsets), (1, vec![offset("t", 0, 2, "m1-meta")]));
    let t0 = [
        rec(0, 0, Some("k0"), "a", TS0),
        rec(0, 1, Some("k1"), "b", TS0 + 1),
        rec(0, 2, Some("k2"), "c", TS0 + 2),
        rec(0, 3, Some("k0"), "d", TS0 + 10),
        rec(0, 4, Some("k1"), "e", TS0 + 11),
    ];
    let (_tx, mut stream) = subscribe(c, start(&[("t", 0, 0)])).await?;
    let mut subscribed = Vec::new();
    while subscribed.len() < t0.len() {
        for d in next(&mut stream).await?.partitions {
            assert_eq!((d.error, d.seat), (0, 7), "{}", d.message);
            subscribed.extend(decode(0, &d.batches));
        }
    }
    assert_same_records("subscribed t/0", &t0, &subscribed);

    // The logs hold exactly what the well-formed requests wrote, and nothing of a refused one.
    assert_same_records("t/0", &t0, &read_partition(c, "t", 0).await);
    assert_same_records("t/1", &t1, &read_partition(c, "t", 1).await);
    let source: Vec<Rec> = (0..5).map(|o| rec(0, o, None, &format!("src-{o}"), TS0 + o as i64)).collect();
    assert_same_records("dc-a.m/0", &source, &read_partition(c, "dc-a.m", 0).await);
    assert_same_records("dc-a.p/0", &[rec(0, 0, Some("k0"), "promoted", TS0)], &read_partition(c, "dc-a.p", 0).await);
    let topics = c.list_topics(pb::ListTopicsRequest::default()).await?.topics;
    let topics: Vec<_> = topics.iter().map(|t| (t.name.as_str(), t.partitions)).collect();
    assert_eq!(topics, [("dc-a.m", 1), ("dc-a.p", 1), ("fresh", 2), ("t", 3)]);
    let mut ends = Vec::new();
    for topic in ["t", "dc-a.m", "dc-a.p", "fresh"] {
        ends.push(leos(&admin, topic).await);
    }
    assert_eq!(ends, [vec![5, 6, 0], vec![5], vec![1], vec![0, 0]]);

    // The broker process is alive and serving.
    assert!(broker.is_running(), "the broker exited");
    assert_eq!(c.metadata().await?.cluster_id, meta.cluster_id);
    assert!(!broker.logs().contains("panicked"), "the broker panicked:\n{}", broker.logs());
    Ok(())
}
