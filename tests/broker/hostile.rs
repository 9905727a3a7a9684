//! Hostile batches that pass the framing checks: each is refused with its own status and a message that names the
//! numbers involved (never the broker's paths), nothing is written, and well-formed batches are still accepted.

use bytes::Bytes;
use ferry_batch::{self as batch, Compression, ProducerInfo, Record};
use ferry_client::Code;
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::proto::{self as pb, ErrorCode};

use crate::common::{
    Rec, assert_same_records, assert_status, connect, leos, plain_batch, read_partition, start_broker,
};

const TS0: i64 = 1_700_000_000_000;
/// Byte positions of the header fields these tests rewrite (the table in ferry-batch's crate docs).
const OFF_CRC: usize = 17;
const OFF_LAST_OFFSET_DELTA: usize = 23;

fn produce(topic: &str, batches: Bytes) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: topic.into(), partition: Some(0), key: None, batches }
}

/// `good` with its header's `last_offset_delta` replaced and the CRC made valid again, so that only the offset
/// span is wrong.
fn with_last_offset_delta(good: &Bytes, delta: u32) -> Bytes {
    let mut b = good.to_vec();
    b[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&delta.to_be_bytes());
    let crc = batch::compute_crc(&b);
    b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

fn rec(offset: u64, value: &str, ts: i64, key: &str) -> Rec {
    Rec {
        partition: 0,
        offset,
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
        headers: vec![],
        timestamp: ts,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_refuses_a_batch_whose_offset_span_is_not_its_record_count() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("plain", 1, TopicConfig::default(), None).await?;
    client.produce(produce("plain", plain_batch(&["a", "b", "c"], TS0))).await?;
    assert_eq!(leos(&admin, "plain").await, vec![3]);

    // The reviewer's batch: one record claiming a span of 2^32 offsets. It passes framing and CRC.
    let one = plain_batch(&["x"], TS0);
    let hostile = with_last_offset_delta(&one, u32::MAX);
    assert!(batch::verify(&hostile).is_ok(), "only the offset span is wrong");
    let data_dir = broker.data_dir().display().to_string();
    for batches in [hostile.clone(), Bytes::from([plain_batch(&["ok"], TS0), hostile.clone()].concat())] {
        let message = assert_status(
            client.produce(produce("plain", batches)).await,
            Code::InvalidArgument,
            &["last_offset_delta 4294967295 for 1 records", "last_offset_delta = record_count - 1 (0)"],
        );
        assert!(!message.contains(&data_dir), "the message shows the broker's data dir: {message}");
        // Nothing written, not even the good batch before the hostile one.
        assert_eq!(leos(&admin, "plain").await, vec![3]);
    }
    // A span one past the count is refused the same way; one short of it fails the header check before.
    let three = plain_batch(&["p", "q", "r"], TS0);
    for (delta, needle) in [(3, "last_offset_delta 3 for 3 records"), (1, "record count exceeds the offset span")] {
        let message = assert_status(
            client.produce(produce("plain", with_last_offset_delta(&three, delta))).await,
            Code::InvalidArgument,
            &[needle],
        );
        assert!(!message.contains(&data_dir), "the message shows the broker's data dir: {message}");
    }
    assert_eq!(leos(&admin, "plain").await, vec![3]);

    // A well-formed batch is still accepted, right at the unchanged log end.
    let r = client.produce(produce("plain", plain_batch(&["d", "e"], TS0 + 10))).await?;
    assert_eq!((r.base_offset, r.last_offset), (3, 4));
    let want = vec![
        rec(0, "a", TS0, "k0"),
        rec(1, "b", TS0 + 1, "k1"),
        rec(2, "c", TS0 + 2, "k2"),
        rec(3, "d", TS0 + 10, "k0"),
        rec(4, "e", TS0 + 11, "k1"),
    ];
    assert_same_records("plain/0", &want, &read_partition(&client, "plain", 0).await);

    // Append-with-offsets keeps taking sparse batches: a compacted source has them.
    let source = MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: "5a0f3c2e-1d4b-4e8a-9c7f-3b2a1d0e9f87".into(),
        source_topic: "compacted".into(),
        source_cluster: "dc-a".into(),
    };
    admin.create_topic("dc-a.compacted", 1, TopicConfig::default(), Some(source.clone())).await?;
    let kept = [(0u64, "k-a"), (7, "k-b"), (20, "k-c")]
        .map(|(o, v)| Record {
            offset: o,
            timestamp: TS0 + o as i64,
            key: Some(Bytes::from_static(b"key")),
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: vec![],
        })
        .to_vec();
    let sparse = batch::encode_records(&kept, 0, Compression::None, ProducerInfo::NONE);
    let r = admin.append_with_offsets("dc-a.compacted", 0, &source.source_topic_id, 0, sparse).await?;
    assert_eq!(
        (ErrorCode::try_from(r.error).ok(), r.written_batches, r.log_end_offset),
        (Some(ErrorCode::None), 1, 21)
    );
    let want: Vec<Rec> = kept
        .iter()
        .map(|r| Rec {
            partition: 0,
            offset: r.offset,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: vec![],
            timestamp: r.timestamp,
        })
        .collect();
    assert_same_records("dc-a.compacted/0", &want, &read_partition(&client, "dc-a.compacted", 0).await);
    Ok(())
}
