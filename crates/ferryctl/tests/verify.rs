//! `ferryctl mirror verify` and `ferryctl topic promote --all-from` against two real brokers (dc-a, dc-b). The mirror
//! topics on dc-b are built by hand with append-with-offsets copies of dc-a's batches (one topic batch for batch, one
//! with every batch split in two), so these tests do not depend on the mirror.
//!
//! Needs `target/debug/ferry-broker` (`cargo build -p ferry-broker`).

mod common;

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use common::{client, ferryctl, mirror_by_hand, produce};
use ferry_batch::BatchIter;
use ferry_client::Admin;
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_testkit::{BrokerProcess, init_tracing};
use serde_json::Value;

/// dc-a (cluster id "id-dc-a") with "orders" (3 partitions x 5 batches of 20) and "payments" (1 partition x 4 batches of 10); dc-b with
/// their mirrors "orders" (batch for batch) and "dc-a.payments" (every batch split in two).
async fn two_dcs() -> (BrokerProcess, BrokerProcess) {
    init_tracing();
    let a = BrokerProcess::builder().cluster_id("id-dc-a").start().await.unwrap();
    let b = BrokerProcess::builder().cluster_id("id-dc-b").start().await.unwrap();
    let (src, tgt) = (client(a.addr()), client(b.addr()));
    let admin = Admin::new(src.clone());
    admin.create_topic("orders", 3, TopicConfig::default(), None).await.unwrap();
    admin.create_topic("payments", 1, TopicConfig::default(), None).await.unwrap();
    assert_eq!(produce(&src, "orders", 3, 5, 20).await, 100);
    assert_eq!(produce(&src, "payments", 1, 4, 10).await, 40);
    mirror_by_hand(&src, a.cluster_id(), "orders", &tgt, "orders", false).await;
    mirror_by_hand(&src, a.cluster_id(), "payments", &tgt, "dc-a.payments", true).await;
    (a, b)
}

fn segment_file(data_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    let dir = data_dir.join(topic).join(partition.to_string());
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    assert_eq!(logs.len(), 1, "one segment expected in {}", dir.display());
    logs.remove(0)
}

/// Flips one byte inside a record value of the `nth` batch of the segment; returns that batch's base offset.
fn corrupt_value_in_batch(file: &Path, nth: usize) -> u64 {
    let mut bytes = Vec::new();
    std::fs::File::open(file).unwrap().read_to_end(&mut bytes).unwrap();
    let mut position = 0usize;
    let mut chosen = None;
    for (i, item) in BatchIter::new(&bytes).enumerate() {
        let (header, batch) = item.unwrap();
        if i == nth {
            chosen = Some((header.base_offset, position, batch.len()));
            break;
        }
        position += batch.len();
    }
    let (base, start, len) = chosen.expect("the segment has that many batches");
    let marker = format!("-o{}-xxx", base + 3);
    let within = bytes[start..start + len]
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .expect("the record value is stored uncompressed");
    let at = start + within + marker.len() - 1;
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(file).unwrap();
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(&[bytes[at] ^ 0x20]).unwrap();
    f.sync_all().unwrap();
    base
}

#[tokio::test]
async fn verify_finds_copies_identical_then_names_the_corrupted_batch() {
    let (a, b) = two_dcs().await;
    let (src_addr, tgt_addr) = (a.addr().to_string(), b.addr().to_string());
    let args = ["mirror", "verify", "--source", &src_addr, "--target", &tgt_addr];

    let out = ferryctl(&args).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout,
        "dc-a.payments/0 (source payments/0): identical (40 records compared)\n\
         orders/0: identical (100 records compared)\n\
         orders/1: identical (100 records compared)\n\
         orders/2: identical (100 records compared)\n\
         identical: 4 partitions of 2 mirror topics, 340 records compared\n"
    );
    assert_eq!(out.stderr, "", "no progress line when stderr is not a terminal");

    let out = ferryctl(&[&args[..], &["--format", "json", "--topic", "payments"]].concat()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["identical"], true);
    assert_eq!((report["topics"].as_u64(), report["records_compared"].as_u64()), (Some(1), Some(40)));
    let p = &report["partitions"][0];
    assert_eq!((p["topic"].as_str(), p["source_topic"].as_str()), (Some("dc-a.payments"), Some("payments")));
    assert_eq!((p["start_offset"].as_u64(), p["end_offset"].as_u64()), (Some(0), Some(40)));
    assert_eq!((p["difference_offset"].clone(), p["reason"].clone()), (Value::Null, Value::Null));

    // The source moves on: the target is behind, which is lag, not a difference.
    let src = client(a.addr());
    let producer = ferry_client::Producer::new(src.clone(), Default::default()).await.unwrap();
    for i in 0..7 {
        let record = ferry_client::ProducerRecord::new("orders", format!("late-{i}")).with_partition(2);
        producer.send(record).await.unwrap().await.unwrap();
    }
    producer.close().await;
    let out = ferryctl(&[&args[..], &["--topic", "orders"]].concat()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("orders/2: identical (100 records compared); the target is 7 records behind the source\n"),
        "{}",
        out.stdout
    );

    // One byte inside a record value of orders/1's third batch changes on dc-b's disk.
    let file = segment_file(b.data_dir(), "orders", 1);
    let base = corrupt_value_in_batch(&file, 2);
    assert_eq!(base, 40, "five batches of 20 records: the third starts at 40");
    let out = ferryctl(&args).await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", out.stdout);
    assert!(lines[2].starts_with(&format!("orders/1: differs at offset {base}: the target ")), "{}", lines[2]);
    for (i, line) in lines.iter().enumerate().filter(|(i, _)| *i != 2 && *i != 4) {
        assert!(line.contains(": identical ("), "line {i}: {line}");
    }
    assert_eq!(lines[4], "differs: 1 of 4 partitions differ, 280 records compared");
    assert_eq!(out.stderr, "error: the target differs from the source in 1 of 4 partitions\n");

    let out = ferryctl(&[&args[..], &["--topic", "orders", "--format", "json"]].concat()).await;
    assert_eq!(out.code, 1);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["identical"], false);
    assert_eq!(report["partitions_differing"], 1);
    assert_eq!(report["partitions"][1]["difference_offset"], base);
    assert_eq!(report["partitions"][1]["records_compared"], 40, "the two batches before the corrupt one matched");
}

#[tokio::test]
async fn verify_usage_and_topic_errors() {
    let (a, b) = two_dcs().await;
    let (src_addr, tgt_addr) = (a.addr().to_string(), b.addr().to_string());
    let out = ferryctl(&["mirror", "verify", "--source", &src_addr]).await;
    assert_eq!(out.code, 2, "a missing --target is a usage error");

    let out = ferryctl(&["mirror", "verify", "--source", &src_addr, "--target", &tgt_addr, "--topic", "nope"]).await;
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stderr,
        format!("error: the target {tgt_addr} has no mirror topic named \"nope\" or mirroring \"nope\"\n")
    );

    // dc-a has no mirror topics: verifying it as a target has nothing to compare.
    let out = ferryctl(&["mirror", "verify", "--source", &tgt_addr, "--target", &src_addr]).await;
    assert_eq!((out.code, out.stderr), (1, format!("error: the target {src_addr} has no mirror topics to verify\n")));
}

#[tokio::test]
async fn promote_all_from_promotes_exactly_the_mirror_topics_of_that_cluster() {
    let (a, b) = two_dcs().await;
    let tgt = client(b.addr());
    let mark = MirrorSource {
        source_cluster_id: "cid-x".into(),
        source_topic_id: "00000000-0000-0000-0000-000000000000".into(),
        source_topic: "audit".into(),
        source_cluster: "dc-x".into(),
    };
    Admin::new(tgt.clone()).create_topic("audit", 1, TopicConfig::default(), Some(mark)).await.unwrap();
    let broker = b.addr().to_string();

    let out = ferryctl(&["--broker", &broker, "topic", "promote", "--all-from", "dc-q"]).await;
    assert_eq!(out.code, 1);
    assert_eq!(out.stderr, format!("error: {broker} has no mirror topics from cluster \"dc-q\"; nothing to promote\n"));

    // By the source cluster id, as recorded on the topics.
    let out = ferryctl(&["--broker", &broker, "topic", "promote", "--all-from", a.cluster_id()]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!(
            "promoted topic \"dc-a.payments\" (mirror of dc-a/payments): it is writable and no longer mirrored\n\
             promoted topic \"orders\" (mirror of dc-a/orders): it is writable and no longer mirrored\n\
             promoted 2 topics from cluster \"{}\" on {broker}\n",
            a.cluster_id()
        )
    );
    let out = ferryctl(&["--broker", &broker, "topic", "list", "--format", "json"]).await;
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    let mirrored: Vec<(&str, bool)> =
        list.as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap(), !t["mirror"].is_null())).collect();
    assert_eq!(mirrored, [("audit", true), ("dc-a.payments", false), ("orders", false)]);

    // Nothing from dc-a is left; the single-topic form is idempotent.
    let out = ferryctl(&["--broker", &broker, "topic", "promote", "--all-from", "dc-a"]).await;
    assert_eq!(out.code, 1);
    let out = ferryctl(&["--broker", &broker, "topic", "promote", "orders"]).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "topic \"orders\" was not a mirror topic; nothing changed\n"));
    let out = ferryctl(&["--broker", &broker, "topic", "promote"]).await;
    assert_eq!(out.code, 2, "a topic name or --all-from is required");
}
