//! The mirror's write path through the real gRPC API: every append-with-offsets outcome, and the read-only mirror
//! topic until `Promote`.

use bytes::Bytes;
use ferry_batch::{Compression, Header, ProducerInfo, Record, encode_records};
use ferry_client::admin::{AppendWithOffsetsResponse, MirrorSource, TopicConfig};
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_client::{Admin, AppendWithOffsetsParts, Code};

use crate::common::{
    Rec, assert_same_records, assert_status, connect, epochs, plain_batch, read_partition, start_broker,
};

const SOURCE_TOPIC_ID: &str = "7d5c2f4e-93a1-4c39-9f3b-2b8f7a1e0c11";
const TS0: i64 = 1_700_000_000_000;

fn source() -> MirrorSource {
    MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: SOURCE_TOPIC_ID.into(),
        source_topic: "orders".into(),
        source_cluster: "dc-a".into(),
    }
}

/// Source records `base..base+n` as the source would hold them.
fn records(base: u64, n: u64) -> Vec<Record> {
    (base..base + n)
        .map(|o| Record {
            offset: o,
            timestamp: TS0 + o as i64,
            key: Some(Bytes::from(format!("key-{}", o % 3))),
            value: Some(Bytes::from(format!("source-record-{o}"))),
            headers: vec![Header { key: "origin".into(), value: Some(Bytes::from_static(b"dc-a")) }],
        })
        .collect()
}

/// One source batch of records `base..base+n` written in `epoch`.
fn batch(base: u64, n: u64, epoch: u32) -> Bytes {
    encode_records(&records(base, n), epoch, Compression::None, ProducerInfo::NONE)
}

fn concat(parts: &[Bytes]) -> Bytes {
    Bytes::from(parts.concat())
}

fn as_recs(partition: u32, records: &[Record]) -> Vec<Rec> {
    records
        .iter()
        .map(|r| Rec {
            partition,
            offset: r.offset,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: crate::common::headers(&r.headers),
            timestamp: r.timestamp,
        })
        .collect()
}

struct Target<'a> {
    admin: &'a Admin,
    topic: &'a str,
}

impl Target<'_> {
    async fn append(&self, partition: u32, source_log_start: u64, batches: Bytes) -> AppendWithOffsetsResponse {
        self.admin
            .append_with_offsets(self.topic, partition, SOURCE_TOPIC_ID, source_log_start, batches)
            .await
            .expect("append-with-offsets answers outcomes, not errors")
    }

    async fn partition(&self, partition: u32) -> pb::PartitionInfo {
        self.admin.describe_topic(self.topic).await.expect("describe").partitions[partition as usize].clone()
    }
}

#[track_caller]
fn outcome(r: &AppendWithOffsetsResponse, code: ErrorCode, written: u32, present: u32, leo: u64) {
    assert_eq!(
        (ErrorCode::try_from(r.error).ok(), r.written_batches, r.present_batches, r.log_end_offset),
        (Some(code), written, present, leo),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_with_offsets_handles_every_case_against_the_log_end() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("dc-a.orders", 2, TopicConfig::default(), Some(source())).await?;
    let t = Target { admin: &admin, topic: "dc-a.orders" };

    // At the end: written as is, offsets and epochs kept.
    let r = t.append(0, 0, batch(0, 5, 0)).await;
    outcome(&r, ErrorCode::None, 1, 0, 5);
    let r = t.append(0, 0, concat(&[batch(5, 3, 0), batch(8, 2, 0)])).await;
    outcome(&r, ErrorCode::None, 2, 0, 10);

    // Already present: nothing written; present batches followed by a new one write only the new one.
    let r = t.append(0, 0, batch(0, 5, 0)).await;
    outcome(&r, ErrorCode::None, 0, 1, 10);
    let r = t.append(0, 0, concat(&[batch(5, 3, 0), batch(8, 2, 0), batch(10, 2, 0)])).await;
    outcome(&r, ErrorCode::None, 1, 2, 12);

    // DIVERGED: the same range with a different record names the first differing offset; nothing is written.
    let mut changed = records(5, 3);
    changed[1].value = Some(Bytes::from_static(b"rewritten at the source"));
    let r = t
        .append(0, 0, concat(&[encode_records(&changed, 0, Compression::None, ProducerInfo::NONE), batch(12, 1, 0)]))
        .await;
    outcome(&r, ErrorCode::Diverged, 0, 0, 12);
    assert_eq!(r.diverged_at, Some(6));
    assert!(r.message.contains("offset 6"), "{}", r.message);
    // The same records under another epoch diverge too (same CRC, different epoch), at the batch's first offset.
    let r = t.append(0, 0, batch(5, 3, 1)).await;
    outcome(&r, ErrorCode::Diverged, 0, 0, 12);
    assert_eq!(r.diverged_at, Some(5));
    // A present batch before the divergent one is still recognised.
    let r = t
        .append(0, 0, concat(&[batch(0, 5, 0), encode_records(&changed, 0, Compression::None, ProducerInfo::NONE)]))
        .await;
    outcome(&r, ErrorCode::Diverged, 0, 1, 12);
    assert_eq!(r.diverged_at, Some(6));

    // A valid gap: the target LEO (12) is below the source log start (50) and the batch starts at it.
    let r = t.append(0, 50, batch(50, 3, 0)).await;
    outcome(&r, ErrorCode::None, 1, 0, 53);
    let p = t.partition(0).await;
    assert_eq!(p.gaps, vec![pb::OffsetRange { start: 12, end: 50 }]);
    assert_eq!(p.log_start_offset, 0);

    // An invalid gap: the LEO (53) is not below the stated source log start (50).
    let r = t.append(0, 50, batch(70, 2, 0)).await;
    outcome(&r, ErrorCode::GapRefused, 0, 0, 53);
    assert!(r.message.contains("above the log end offset"), "{}", r.message);
    // An invalid gap: the batch starts below the source log start (partition 1 is empty).
    let r = t.append(1, 10, batch(5, 2, 0)).await;
    outcome(&r, ErrorCode::GapRefused, 0, 0, 0);
    // An invalid gap: the batch starts above the source log start, which would skip [10, 20) silently.
    let r = t.append(1, 10, batch(20, 2, 0)).await;
    outcome(&r, ErrorCode::GapRefused, 0, 0, 0);
    assert!(r.message.contains("starts exactly at it"), "{}", r.message);

    // Straddling the LEO: [51, 54] against LEO 53.
    let r = t.append(0, 50, batch(51, 4, 0)).await;
    outcome(&r, ErrorCode::StraddlesEnd, 0, 0, 53);
    assert!(r.message.contains("straddles"), "{}", r.message);

    // A newer source epoch is taken as is; an older one after it is refused.
    let r = t.append(0, 50, batch(53, 2, 3)).await;
    outcome(&r, ErrorCode::None, 1, 0, 55);
    assert_eq!(epochs(&admin, "dc-a.orders").await[0], 3);
    let end = admin.epoch_end("dc-a.orders", 0, 0).await?;
    assert_eq!((end.found, end.epoch, end.end_offset), (true, 0, 53));
    let r = t.append(0, 50, batch(55, 2, 2)).await;
    outcome(&r, ErrorCode::EpochRegressed, 0, 0, 55);
    assert!(r.message.contains("epoch"), "{}", r.message);
    // An epoch older than all a partition knows ended where its known history begins (partition 1's starts with
    // epoch 5 at offset 10); a partition with no history answers its log end.
    let none = admin.epoch_end("dc-a.orders", 1, 0).await?;
    assert_eq!((none.found, none.end_offset), (false, 0));
    let r = t.append(1, 10, batch(10, 2, 5)).await;
    outcome(&r, ErrorCode::None, 1, 0, 12);
    let before = admin.epoch_end("dc-a.orders", 1, 4).await?;
    assert_eq!((before.found, before.end_offset), (false, 10));

    // A different source topic id (the source topic was re-created) is refused before anything else.
    let r = admin
        .append_with_offsets("dc-a.orders", 0, "00000000-0000-0000-0000-000000000000", 50, batch(55, 2, 3))
        .await?;
    outcome(&r, ErrorCode::TopicIdMismatch, 0, 0, 55);
    assert!(r.message.contains(SOURCE_TOPIC_ID), "{}", r.message);

    // Offered batches out of order are a bad request (a status, not an outcome), and write nothing.
    assert_status(
        admin
            .append_with_offsets("dc-a.orders", 0, SOURCE_TOPIC_ID, 50, concat(&[batch(55, 2, 3), batch(56, 2, 3)]))
            .await,
        Code::InvalidArgument,
        &["offsets must increase"],
    );
    assert_eq!(t.partition(0).await.log_end_offset, 55);

    // The target holds exactly the source's records at the source's offsets, with the gap, and nothing refused.
    let mut expected = as_recs(0, &records(0, 12));
    expected.extend(as_recs(0, &records(50, 5)));
    assert_same_records("mirrored partition 0", &expected, &read_partition(&client, "dc-a.orders", 0).await);
    // Partition 1 holds only the epoch-5 batch at the source log start: none of the refused gaps wrote anything.
    let p1 = t.partition(1).await;
    assert_eq!((p1.log_start_offset, p1.log_end_offset, p1.epoch), (10, 12, 5));
    assert_same_records(
        "mirrored partition 1",
        &as_recs(1, &records(10, 2)),
        &read_partition(&client, "dc-a.orders", 1).await,
    );
    Ok(())
}

/// The mirror's appends send each batch from the buffer it was received in (long batches as frames of their own,
/// short ones copied together): the broker answers and stores them exactly as the same batches in one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_sent_from_the_batches_own_buffers_are_answered_and_stored_as_one_message() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("dc-a.orders", 1, TopicConfig::default(), Some(source())).await?;
    // Short, long, short: the long batch is sent uncopied, the short ones copied into frames of their own.
    let parts = vec![batch(0, 3, 0), batch(3, 200, 0), batch(203, 2, 0)];
    assert!(parts[1].len() > 8 << 10 && parts[0].len() < 1 << 10, "{:?}", parts.iter().map(Bytes::len));
    let request = |batches: Vec<Bytes>| AppendWithOffsetsParts {
        topic: "dc-a.orders".into(),
        partition: 0,
        source_topic_id: SOURCE_TOPIC_ID.into(),
        source_log_start_offset: 0,
        batches,
    };
    let r = client.append_with_offsets_parts_once(request(parts.clone())).await?;
    outcome(&r, ErrorCode::None, 3, 0, 205);
    // Sent again: all three recognised as present, as a single-buffer message's would be.
    let r = client.append_with_offsets_parts_once(request(parts.clone())).await?;
    outcome(&r, ErrorCode::None, 0, 3, 205);
    // A refusal the broker answers as a status arrives as that status, and writes nothing.
    assert_status(
        client.append_with_offsets_parts_once(request(vec![batch(205, 200, 0), batch(206, 2, 0)])).await,
        Code::InvalidArgument,
        &["offsets must increase"],
    );
    assert_same_records(
        "appended in parts",
        &as_recs(0, &records(0, 205)),
        &read_partition(&client, "dc-a.orders", 0).await,
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_topic_is_read_only_until_promoted_and_then_refuses_offset_appends() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    let info = admin.create_topic("dc-a.orders", 1, TopicConfig::default(), Some(source())).await?;
    assert_eq!(info.mirror, Some(source()));
    let t = Target { admin: &admin, topic: "dc-a.orders" };
    outcome(&t.append(0, 0, batch(0, 4, 0)).await, ErrorCode::None, 1, 0, 4);

    // Ordinary produce is refused while the topic mirrors dc-a, and writes nothing.
    let produce = pb::ProduceRequest {
        topic: "dc-a.orders".into(),
        partition: Some(0),
        key: None,
        batches: plain_batch(&["local"], TS0),
    };
    assert_status(client.produce(produce.clone()).await, Code::FailedPrecondition, &["dc-a", "promote"]);
    assert_eq!(t.partition(0).await.log_end_offset, 4);

    // Promote clears the mark (once); then produce appends after the mirrored data.
    let promoted = admin.promote("dc-a.orders").await?;
    assert!(promoted.was_mirror);
    assert_eq!(promoted.topic.mirror, None);
    assert!(!admin.promote("dc-a.orders").await?.was_mirror);
    let written = client.produce(produce).await?;
    assert_eq!((written.base_offset, written.last_offset), (4, 4));

    // Offset appends are refused from now on, and write nothing.
    let r = t.append(0, 0, batch(5, 2, 0)).await;
    outcome(&r, ErrorCode::NotAMirrorTopic, 0, 0, 5);
    assert!(r.message.contains("not a mirror topic"), "{}", r.message);
    let mut expected = as_recs(0, &records(0, 4));
    let local = read_partition(&client, "dc-a.orders", 0).await.pop().expect("the local record");
    assert_eq!((local.offset, local.value_str()), (4, "local"));
    expected.push(local);
    assert_same_records("promoted topic", &expected, &read_partition(&client, "dc-a.orders", 0).await);
    Ok(())
}
