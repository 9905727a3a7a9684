//! Hostile batches that pass the framing checks: each is refused with its own status and a message that names the
//! numbers involved (never the broker's paths), nothing is written, and well-formed batches are still accepted.

use bytes::Bytes;
use ferry_batch::{self as batch, Compression, ProducerInfo, Record};
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_client::{ClientError, Code, OffsetSpec};

use crate::common::{
    Rec, assert_same_records, assert_status, connect, leos, plain_batch, read_partition, start_broker,
};

const TS0: i64 = 1_700_000_000_000;
/// Byte positions of the header fields these tests rewrite (the table in ferry-batch's crate docs).
const OFF_CRC: usize = 17;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_LENGTH: usize = 8;
const OFF_FIRST_TS: usize = 27;
const OFF_MAX_TS: usize = 35;
const OFF_RECORD_COUNT: usize = 57;

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
    let want: Vec<Rec> = kept.iter().map(|r| Rec::from_batch_record(0, r)).collect();
    assert_same_records("dc-a.compacted/0", &want, &read_partition(&client, "dc-a.compacted", 0).await);
    Ok(())
}

/// A zstd frame of `blocks` RLE blocks of 128 KiB of zeros each: 4 bytes per block on the wire.
fn rle_frame(blocks: usize) -> Vec<u8> {
    // Magic; a frame header without content size, checksum or dictionary; a 2^17-byte window.
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 7 << 3];
    for i in 0..blocks {
        let block_header = (128 * 1024) << 3 | (1 << 1) | u32::from(i + 1 == blocks);
        f.extend_from_slice(&block_header.to_le_bytes()[..3]);
        f.push(0);
    }
    f
}

/// The reviewer's bomb: an 8 KiB zstd batch claiming u32::MAX records (dense, so it passes every header check
/// of produce) whose records section inflates to 256 MiB of zeros; its timestamps are `ts`.
fn bomb(ts: i64) -> Bytes {
    let mut b = batch::BatchBuilder::new(Compression::Zstd, ProducerInfo::NONE);
    b.push(0, ts, None, Some(b"v"), &[]);
    let mut out = b.build(0, 0)[..batch::HEADER_LEN].to_vec();
    out.extend_from_slice(&rle_frame(2048));
    let length = u32::try_from(out.len() - 12).expect("small");
    out[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&length.to_be_bytes());
    out[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&(u32::MAX - 1).to_be_bytes());
    out[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    out[OFF_FIRST_TS..OFF_FIRST_TS + 8].copy_from_slice(&ts.to_be_bytes());
    out[OFF_MAX_TS..OFF_MAX_TS + 8].copy_from_slice(&ts.to_be_bytes());
    let crc = batch::compute_crc(&out);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(out)
}

/// The broker's peak resident set (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the broker's /proc status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("a VmHWM line");
    line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("VmHWM in kB") * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decompression_bomb_looked_up_by_timestamp_is_refused_without_inflating() -> anyhow::Result<()> {
    // Default max_batch_bytes (1 MiB): each decode holds at most 4 MiB; decode_concurrency 2.
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("bombed", 1, TopicConfig::default(), None).await?;
    client.produce(produce("bombed", plain_batch(&["before"], TS0))).await?;
    let bomb = bomb(TS0 + 1000);
    assert!(bomb.len() < 9 * 1024, "{} bytes", bomb.len());
    // Produce checks headers only (bodies stay off the hot path), and the bomb's header is consistent.
    let r = client.produce(produce("bombed", bomb)).await?;
    assert_eq!((r.base_offset, r.last_offset), (1, u64::from(u32::MAX)));
    let mut after = batch::BatchBuilder::new(Compression::Zstd, ProducerInfo::NONE);
    after.push(0, TS0 + 2000, Some(b"k"), Some(b"after the bomb"), &[]);
    let r = client.produce(produce("bombed", after.build(0, 0))).await?;
    let after_offset = u64::from(u32::MAX) + 1;
    assert_eq!(r.base_offset, after_offset);

    let data_dir = broker.data_dir().display().to_string();
    let before = peak_rss(broker.pid());
    // Ten concurrent lookups whose timestamp falls in the bomb: each must decode it.
    let lookups = (0..10).map(|_| admin.list_offset("bombed", 0, OffsetSpec::Timestamp(TS0 + 500)));
    let results = futures::future::join_all(lookups).await;
    let grew = peak_rss(broker.pid()).saturating_sub(before);
    // Two decodes at a time, 4 MiB of output and a 128 KiB window each; unbounded, each would inflate 256 MiB.
    assert!(grew < 64 * 1024 * 1024, "the broker's peak RSS grew by {grew} bytes");
    for result in results {
        match result {
            Err(ClientError::Partition { code, message, .. }) => {
                assert_eq!(code, ErrorCode::StorageError, "{message}");
                assert!(
                    message.contains("(batch offset 1): records section inflates past the 4194304-byte decode limit"),
                    "{message}"
                );
                assert!(!message.contains(&data_dir), "the message shows the broker's data dir: {message}");
                assert!(!message.contains(".log"), "the message names a segment file: {message}");
            }
            other => panic!("expected the bomb to be refused, got {other:?}"),
        }
    }

    // Lookups that do not land in the bomb still answer, and the broker keeps serving.
    assert_eq!(admin.list_offset("bombed", 0, OffsetSpec::Timestamp(TS0)).await?.offset, Some(0));
    assert_eq!(admin.list_offset("bombed", 0, OffsetSpec::Timestamp(TS0 + 1500)).await?.offset, Some(after_offset));
    assert_eq!(admin.list_offset("bombed", 0, OffsetSpec::Timestamp(TS0 + 5000)).await?.offset, None);
    Ok(())
}

/// Open descriptors of process `pid` on files inside `dir`.
fn open_files_in(pid: u32, dir: &std::path::Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the broker's /proc fd list")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_mirrored_batches_that_roll_every_append_keep_the_partitions_open_files_bounded() -> anyhow::Result<()> {
    let broker = start_broker("[storage]\nmax_open_segments = 4\n").await?;
    let (client, admin) = connect(&broker);
    let source = MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: "1f6e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b".into(),
        source_topic: "compacted".into(),
        source_cluster: "dc-a".into(),
    };
    admin.create_topic("dc-a.compacted", 1, TopicConfig::default(), Some(source.clone())).await?;
    let dir = broker.data_dir().join("dc-a.compacted").join("0");
    // Each batch keeps the first and last record of a span of 2^32 offsets: every append rolls a segment.
    let span = 1u64 << 32;
    let mut kept = Vec::new();
    let mut peak = 0;
    for i in 0..200u64 {
        let records: Vec<Record> = [(i * span, "first"), (i * span + span - 1, "last")]
            .map(|(offset, v)| Record {
                offset,
                timestamp: TS0 + i as i64,
                key: Some(Bytes::from_static(b"key")),
                value: Some(Bytes::from(format!("{v}-{i}"))),
                headers: vec![],
            })
            .to_vec();
        let b = batch::encode_records(&records, 0, Compression::None, ProducerInfo::NONE);
        let r = admin.append_with_offsets("dc-a.compacted", 0, &source.source_topic_id, 0, b).await?;
        assert_eq!((ErrorCode::try_from(r.error).ok(), r.log_end_offset), (Some(ErrorCode::None), (i + 1) * span));
        kept.extend(records);
        peak = peak.max(open_files_in(broker.pid(), &dir));
    }
    let segments = std::fs::read_dir(&dir)?
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension() == Some("log".as_ref())))
        .count();
    assert_eq!(segments, 200);
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
    // The reads went through sealed segments, so the cache is full: its 4 files and the active segment's .log and
    // .index. Before the cache, every one of the 200 segments kept its file open.
    assert_eq!(open_files_in(broker.pid(), &dir), 4 + 2);
    assert!(peak <= 4 + 2, "the partition held {peak} files open between appends");
    Ok(())
}
