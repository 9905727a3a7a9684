//! `KafkaTarget` against a real Kafka-API broker (tansu): appends with provenance, resume from the provenance at
//! the tail after the adapter is dropped (a crash) with zero duplicates, zombie fencing with transactions, the
//! group offset translation, scale-out membership, and its refusals. What the target holds is read back with
//! confluent-kafka (`kafka_tool.py`), not with the code under test.

#![cfg(feature = "kafka")]

mod kafka_support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use ferry_batch::{Batch, Compression, Header, ProducerInfo, Record, encode_records};
use ferry_client::proto as pb;
use ferry_mirror::cluster::{AppendOutcome, TargetCluster};
use ferry_mirror::config::Rename;
use ferry_mirror::kafka::{KafkaTarget, KafkaTargetOptions, PartitionBatcher, TransactionSupport};
use ferry_mirror::tp::TargetTp;
use kafka_support::{Tansu, Zombie, consume, create_topic, digest, header, produce, strip_provenance, tool};

const DEADLINE: Duration = Duration::from_secs(60);

fn target(k: &Tansu, rename: Rename) -> KafkaTarget {
    KafkaTarget::new(KafkaTargetOptions::new(vec![k.bootstrap()], BTreeMap::new(), "m", "dc-a", rename)).unwrap()
}

fn mirror_source(topic: &str) -> pb::MirrorSource {
    pb::MirrorSource {
        source_cluster_id: "dc-a-id".into(),
        source_topic_id: format!("uuid-{topic}"),
        source_topic: topic.into(),
        source_cluster: "dc-a".into(),
    }
}

/// Source records at `offsets`: keys, null keys and values, repeated and null headers, timestamps.
fn source_records(offsets: impl IntoIterator<Item = u64>) -> Vec<Record> {
    offsets
        .into_iter()
        .map(|o| Record {
            offset: o,
            timestamp: 1_700_000_000_000 + o as i64 * 3,
            key: (o % 5 != 0).then(|| Bytes::from(format!("k{}", o % 7))),
            value: (o % 9 != 4).then(|| Bytes::from(format!("value-{o}"))),
            headers: vec![
                Header { key: "h".into(), value: Some(Bytes::from(format!("{o}"))) },
                Header { key: "h".into(), value: None },
            ],
        })
        .collect()
}

/// Source batches of `per` records each, as a Ferry source stores them (each starts at its first record).
fn batches(records: &[Record], per: usize) -> Vec<Batch> {
    records
        .chunks(per)
        .map(|chunk| Batch::parse(encode_records(chunk, 0, Compression::None, ProducerInfo::NONE)).unwrap())
        .collect()
}

/// Batches as the Kafka consumer builds them: each starts at the offset after the previous one (`from` first),
/// so offset gaps sit inside batches.
fn kafka_batches(records: &[Record], from: u64, per: usize) -> Vec<Batch> {
    let mut b = PartitionBatcher::new(from, usize::MAX, Compression::None);
    let mut out = Vec::new();
    for chunk in records.chunks(per) {
        for r in chunk {
            b.push(r.offset, r.timestamp, r.key.as_deref(), r.value.as_deref(), &r.headers);
        }
        out.push(Batch::parse(b.flush().unwrap().0).unwrap());
    }
    out
}

/// Appends `records` starting at source offset `from` in batches of 10.
async fn append(t: &KafkaTarget, topic: &str, p: u32, records: &[Record], from: u64) -> AppendOutcome {
    t.append(&TargetTp::new(topic, p), &format!("uuid-{topic}"), 0, &kafka_batches(records, from, 10)).await.unwrap()
}

/// What a successful append reports.
fn appended(log_end: u64, written: u32, present: u32) -> AppendOutcome {
    AppendOutcome::Appended { log_end, written, present }
}

/// The target partition as confluent-kafka reads it, provenance checked and stripped.
async fn mirrored(k: &Tansu, topic: &str, p: u32) -> Vec<Record> {
    let got = consume(k, topic, p, 0).await;
    for r in &got {
        assert_eq!(header(r, "ferry.source.cluster"), Some("dc-a"));
        assert_eq!(header(r, "ferry.source.topic"), Some(topic));
        assert_eq!(header(r, "ferry.source.partition"), Some(p.to_string().as_str()));
        assert_eq!(header(r, "ferry.source.topic_id"), Some(format!("uuid-{topic}").as_str()));
    }
    got.iter().map(strip_provenance).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_carry_provenance_and_a_restarted_adapter_resumes_without_duplicates() {
    let k = Tansu::start("kafka-b").await;
    let t = target(&k, Rename::Identity);
    let config = pb::TopicConfig { retention_ms: Some(0), ..Default::default() };
    t.create_topic("orders", 2, config.clone(), mirror_source("orders"), "single", false).await.unwrap();
    let again = t.create_topic("orders", 2, config, mirror_source("orders"), "single", false).await.unwrap_err();
    assert!(again.is_already_exists(), "{again:?}");
    let listed = t.list_topics().await.unwrap();
    let orders = listed.iter().find(|t| t.name == "orders").unwrap();
    assert_eq!((orders.partitions, orders.mirror.clone()), (2, Some(mirror_source("orders"))));

    // Source offsets 0..50, then a compaction gap, then 60..110.
    let source: Vec<Record> = source_records((0..50).chain(60..110));
    let p0 = TargetTp::new("orders", 0);
    assert_eq!(t.partition(&p0).await.unwrap().log_end, 0);
    assert_eq!(append(&t, "orders", 0, &source[..50], 0).await, appended(50, 5, 0));
    // 60..110 in batches of 10 from 50: the first batch absorbs the gap.
    assert_eq!(append(&t, "orders", 0, &source[50..], 50).await, appended(110, 5, 0));
    assert_eq!(t.transactions(), TransactionSupport::Supported);
    assert_eq!(mirrored(&k, "orders", 0).await, source);

    // A crash: the adapter is gone. A new one finds the log end in the provenance at the tail.
    drop(t);
    let t = target(&k, Rename::Identity);
    let p = t.partition(&p0).await.unwrap();
    assert_eq!((p.log_start, p.log_end, p.last_epoch), (0, 110, None));
    // The pipeline re-sends from its last acknowledged offset (here, 60..110 again) and then new records.
    let more = source_records(110..140);
    let mut resent = source[50..].to_vec();
    resent.extend(more.iter().cloned());
    assert_eq!(append(&t, "orders", 0, &resent, 50).await, appended(140, 3, 5));
    let mut expected = source.clone();
    expected.extend(more);
    let got = mirrored(&k, "orders", 0).await;
    assert_eq!(got.len(), 130, "zero duplicates");
    assert_eq!(digest(&got), digest(&expected));
    assert_eq!(got, expected);

    // A batch above the log end is a gap only when it starts exactly at the source log start (retention moved the
    // source's start there): not when the source log start is below it (0), nor when it is above the log end but
    // below the batch (145: offsets 145..150 would be skipped unexplained).
    let gap = batches(&source_records(150..155), 10);
    let refused = |start: u64| {
        AppendOutcome::GapRefused(format!(
            "batch at offset 150 is above the Kafka target's log end 140 (source offsets) and does not start at the \
             source log start {start}"
        ))
    };
    assert_eq!(t.append(&p0, "uuid-orders", 0, &gap).await.unwrap(), refused(0));
    assert_eq!(t.append(&p0, "uuid-orders", 145, &gap).await.unwrap(), refused(145));
    assert_eq!(t.partition(&p0).await.unwrap().log_end, 140, "a refused batch writes nothing");
    assert_eq!(t.append(&p0, "uuid-orders", 150, &gap).await.unwrap(), appended(155, 1, 0));

    // An empty partition positioned at a start point (start_position = latest).
    let p1 = TargetTp::new("orders", 1);
    assert_eq!(t.append(&p1, "uuid-orders", 200, &[]).await.unwrap(), appended(200, 0, 0));
    let p = t.partition(&p1).await.unwrap();
    assert_eq!((p.log_start, p.log_end), (200, 200));
    assert_eq!(append(&t, "orders", 1, &source_records(200..203), 200).await, appended(203, 1, 0));
    assert_eq!(mirrored(&k, "orders", 1).await, source_records(200..203));
}

/// A mirror process killed mid-transaction, then restarted: the new writer fences the dead one, no source offset is
/// written twice, and the fenced writer can add nothing.
///
/// **On tansu the dead writer's aborted records count as present.** tansu 0.6 aborts the open transaction when the
/// new writer registers, but still shows its records to read_committed readers (docs/kafka.md, "What was
/// tested"), so the resume finds source offsets 50..70 in their provenance headers and the new writer copies only
/// 70..100: the target then shows the zombie's 20 records (their values, not the source's) at 50..70. On Kafka
/// they are hidden and the mirror writes 50..100 itself; that is not provable against tansu.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_transaction_is_fenced_and_nothing_is_duplicated_and_on_tansu_its_aborted_records_stay() {
    let k = Tansu::start("kafka-b").await;
    let t1 = target(&k, Rename::Identity);
    t1.create_topic("orders", 1, pb::TopicConfig::default(), mirror_source("orders"), "single", false).await.unwrap();
    let source = source_records(0..100);
    assert_eq!(append(&t1, "orders", 0, &source[..50], 0).await, appended(50, 5, 0));

    // A mirror process with the same transactional id wrote 50..70 in a transaction and was killed before commit.
    let provenance = [
        ("ferry.source.cluster", "dc-a"),
        ("ferry.source.topic", "orders"),
        ("ferry.source.partition", "0"),
        ("ferry.source.offset", "{o}"),
        ("ferry.source.topic_id", "uuid-orders"),
    ];
    let zombie = Zombie::start(&k, "orders", 0, "ferry-mirror.m.orders.0", &provenance, 20, 50).await;
    zombie.kill9().await;

    // The restarted mirror re-sends from its last acknowledged offset (50), in batches of 10: the two batches the
    // zombie's visible records cover are present, the three after them are written.
    let t2 = target(&k, Rename::Identity);
    assert_eq!(append(&t2, "orders", 0, &source[50..], 50).await, appended(100, 3, 2));
    let got = consume(&k, "orders", 0, 0).await;
    let offsets: Vec<u64> = got.iter().map(|r| header(r, "ferry.source.offset").unwrap().parse().unwrap()).collect();
    assert_eq!(offsets, (0..100).collect::<Vec<u64>>(), "every source offset exactly once, in order");
    assert_eq!(got.len(), 100, "zero duplicates");
    // 0..50 and 70..100 are the source's records; 50..70 are the zombie's, exactly as it wrote them.
    let ours: Vec<Record> = [&got[..50], &got[70..]].concat().iter().map(strip_provenance).collect();
    assert_eq!(ours, [&source[..50], &source[70..]].concat());
    for (i, r) in got[50..70].iter().enumerate() {
        let o = (50 + i).to_string();
        let headers: Vec<(&str, Option<&[u8]>)> =
            r.headers.iter().map(|h| (h.key.as_str(), h.value.as_deref())).collect();
        let want: Vec<(&str, Option<&[u8]>)> =
            provenance.iter().map(|(k, v)| (*k, Some(if *v == "{o}" { o.as_bytes() } else { v.as_bytes() }))).collect();
        assert_eq!((r.key.as_deref(), r.value.as_deref()), (None, Some(format!("zombie-{i}").as_bytes())));
        assert_eq!(headers, want, "zombie record {i}");
    }

    // The first adapter's producer was fenced by the second: its next write fails with a clear error.
    let err =
        t1.append(&TargetTp::new("orders", 0), "uuid-orders", 0, &batches(&source[50..60], 10)).await.unwrap_err();
    assert!(err.is_failed_precondition() && err.to_string().contains("fenced"), "{err}");
    assert_eq!(consume(&k, "orders", 0, 0).await, got, "the fenced writer added nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_translate_exactly_both_ways() {
    let k = Tansu::start("kafka-b").await;
    let t = target(&k, Rename::Prefix);
    t.create_topic("dc-a.orders", 1, pb::TopicConfig::default(), mirror_source("orders"), "single", false)
        .await
        .unwrap();
    let source = source_records((0..50).chain(60..110));
    let tp = TargetTp::new("dc-a.orders", 0);
    let mut from = 0;
    for chunk in source.chunks(25) {
        // 25 records in batches of 10: three batches, up to one past the chunk's last record.
        let end = chunk.last().unwrap().offset + 1;
        let r = t.append(&tp, "uuid-orders", 0, &kafka_batches(chunk, from, 10)).await.unwrap();
        assert_eq!(r, appended(end, 3, 0));
        from = end;
    }
    let got = consume(&k, "dc-a.orders", 0, 0).await;
    let target_of = |src: u64| -> u64 {
        got.iter().find(|r| header(r, "ferry.source.offset").unwrap().parse::<u64>().unwrap() >= src).unwrap().offset
    };
    let committed = async |group: &str| -> u64 {
        tool(&["committed", &k.bootstrap(), group, "dc-a.orders", "0"]).await.trim().parse().unwrap()
    };
    let commit = |s: u64| {
        vec![pb::CommittedOffset { topic: "dc-a.orders".into(), partition: 0, offset: s, metadata: String::new() }]
    };

    // Within the offset map: 55 falls in the source gap, so consumers start at source offset 60.
    t.commit_group("app", commit(55)).await.unwrap();
    assert_eq!(committed("app").await, target_of(60));
    let state = t.group_state("app").await.unwrap();
    assert_eq!(state.active_members, 0);
    assert_eq!(
        state.offsets.iter().map(|o| (o.topic.as_str(), o.partition, o.offset)).collect::<Vec<_>>(),
        vec![("dc-a.orders", 0, 60)]
    );

    // A restarted adapter has no map: the target itself is searched (provenance headers).
    let t2 = target(&k, Rename::Prefix);
    for s in [0, 20, 49, 60, 99] {
        t2.commit_group("app2", commit(s)).await.unwrap();
        assert_eq!(committed("app2").await, target_of(s), "source offset {s}");
        let back = t2.group_state("app2").await.unwrap();
        assert_eq!(back.offsets[0].offset, s, "source offset {s} back from the target");
    }
    // At the log end: one past the last record on both sides.
    t2.commit_group("app3", commit(110)).await.unwrap();
    assert_eq!(committed("app3").await, got.last().unwrap().offset + 1);
    assert_eq!(t2.group_state("app3").await.unwrap().offsets[0].offset, 110);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_members_split_the_partitions_and_take_over_on_leave() {
    let k = Tansu::start("kafka-b").await;
    let a = target(&k, Rename::Identity);
    let b = target(&k, Rename::Identity);
    a.create_topic("orders", 4, pb::TopicConfig::default(), mirror_source("orders"), "single", false).await.unwrap();
    let group = "ferry-mirror.m";
    let session = Duration::from_secs(6);
    let ma = a.join(group, "", vec!["orders".into()], session).await.unwrap();
    assert_eq!(ma.assignment.len(), 4, "{ma:?}");
    b.join(group, "", vec!["orders".into()], session).await.unwrap();
    let split = ferry_testkit::wait_for("the partitions split between two members", DEADLINE, async || {
        let (Some(x), Some(y)) = (a.heartbeat(group, "", 0).await?, b.heartbeat(group, "", 0).await?) else {
            return Ok::<_, anyhow::Error>(None);
        };
        let mut all: Vec<(String, u32)> = x.assignment.iter().chain(&y.assignment).cloned().collect();
        all.sort();
        let full: Vec<(String, u32)> = (0..4).map(|p| ("orders".to_owned(), p)).collect();
        Ok((!x.assignment.is_empty() && !y.assignment.is_empty() && all == full).then_some((x, y)))
    })
    .await
    .unwrap();
    assert!(split.0.generation > ma.generation);
    b.leave(group, "").await.unwrap();
    ferry_testkit::wait_until("the remaining member takes everything", DEADLINE, async || {
        Ok::<_, anyhow::Error>(a.heartbeat(group, "", 0).await?.is_some_and(|m| m.assignment.len() == 4))
    })
    .await
    .unwrap();
    a.leave(group, "").await.unwrap();
    assert_eq!(a.heartbeat(group, "", 0).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_clear_and_local_topics_are_not_mirror_topics() {
    let k = Tansu::start("kafka-b").await;
    let t = target(&k, Rename::Prefix);
    t.create_topic("dc-a.orders", 2, pb::TopicConfig::default(), mirror_source("orders"), "single", false)
        .await
        .unwrap();

    let err = t.alter_partitions("dc-a.orders", 4).await.unwrap_err();
    assert_eq!(err.code(), Some(ferry_client::Code::Unimplemented), "{err}");
    assert!(err.to_string().contains("KIP-195") && err.to_string().contains("dc-a.orders"), "{err}");
    let err = t.truncate(&TargetTp::new("dc-a.orders", 0), 5).await.unwrap_err();
    assert!(err.is_failed_precondition() && err.to_string().contains("truncation is not possible on a Kafka target"));
    // tansu 0.6 has no AlterConfigs (docs/kafka.md).
    let err = t
        .alter_topic_config("dc-a.orders", pb::TopicConfig { retention_ms: Some(1000), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ferry_client::Code::Unimplemented), "{err}");
    assert!(err.to_string().contains("dc-a.orders") && err.to_string().contains("UnsupportedFeature"), "{err}");
    let err = t.partition(&TargetTp::new("orders", 0)).await.unwrap_err();
    assert!(err.is_invalid_argument() && err.to_string().contains("rename policy"), "{err}");
    let limits = t.limits().await.unwrap();
    assert_eq!(limits.max_batch_bytes, 1 << 20);
    let props = BTreeMap::from([("message.max.bytes".to_owned(), "2000000".to_owned())]);
    let big =
        KafkaTarget::new(KafkaTargetOptions::new(vec![k.bootstrap()], props, "m", "dc-a", Rename::Prefix)).unwrap();
    assert_eq!(big.limits().await.unwrap().max_batch_bytes, 2_000_000);

    // A topic named like a mirror topic but written by someone else is not a mirror topic; an empty one is.
    create_topic(&k, "dc-a.local", 1).await;
    produce(&k, "dc-a.local", 0, 5, 1, &[]).await;
    create_topic(&k, "dc-a.empty", 1).await;
    create_topic(&k, "other", 1).await;
    let topics = t.list_topics().await.unwrap();
    let mark = |name: &str| topics.iter().find(|t| t.name == name).unwrap().mirror.clone();
    assert_eq!(mark("dc-a.orders"), Some(mirror_source("orders")));
    assert_eq!(mark("dc-a.local"), None);
    assert_eq!(mark("other"), None);
    let empty = mark("dc-a.empty").unwrap();
    assert_eq!((empty.source_topic.as_str(), empty.source_cluster.as_str()), ("empty", "dc-a"));
}
