//! confluent-kafka, kafka-python and kafkajs, each through the whole scenario: admin, idempotent produce read back through
//! gRPC, a group of two that rebalances when one leaves, commit-restart-resume, and offsets and records crossing
//! between the Kafka listener and the gRPC API both ways.

use ferry_client::admin::TopicConfig;
use ferry_client::proto::CommittedOffset;
use ferry_client::{Producer, ProducerConfig};
use serde_json::json;

use crate::support::{Member, Rec, Wire, assert_same, expected_range, ferry_record, run_client, step_deadline};

const PARTS: u32 = 4;

async fn scenario(lib: &str) -> anyhow::Result<()> {
    let w = Wire::start().await?;
    let b = w.kafka.clone();

    // Admin: create, create again (refused per topic), grow, describe, delete; gone through gRPC too.
    let admin = run_client(lib, &b, &["admin", "adm"]).await?;
    assert_eq!(
        admin[0]["admin"],
        json!({"created": "adm", "again": "TOPIC_ALREADY_EXISTS", "grown": "adm", "partitions": 5})
    );
    assert_eq!(admin[1], json!({"deleted": "adm"}));
    assert!(w.admin.list_topics().await?.iter().all(|t| t.name != "adm"), "deleted through Kafka, listed by gRPC");

    // Idempotent produce with keys, headers and timestamps; read back exactly through gRPC.
    w.admin.create_topic("orders", PARTS, TopicConfig::default(), None).await?;
    let acked = run_client(lib, &b, &["produce", "orders", "4", "a", "0", "200"]).await?;
    assert_eq!(acked.last().unwrap()["acked"], json!(200));
    let mut grpc = Vec::new();
    for p in 0..PARTS {
        grpc.extend(w.read_grpc("orders", p).await?.iter().map(|r| Rec::of_ferry(p, r)));
    }
    grpc.sort();
    assert_same("Kafka-produced records read through gRPC", &grpc, &expected_range("a", PARTS, 0, 200));

    // Commit, restart, resume: two consumers of one group one after the other read everything exactly once.
    let first = run_client(lib, &b, &["consume", "orders", "resume", "70"]).await?;
    let second = run_client(lib, &b, &["consume", "orders", "resume", "130"]).await?;
    let mut both: Vec<Rec> = first.iter().chain(&second).filter_map(|l| l.get("rec")).map(Rec::of).collect();
    both.sort();
    assert_same("consumed before and after a restart", &both, &expected_range("a", PARTS, 0, 200));
    // The commits (with their metadata) are the Ferry group's, read through gRPC.
    let mut committed = w.admin.fetch_committed_offsets("resume", &[]).await?;
    committed.sort_by_key(|c| c.partition);
    // confluent-kafka hands librdkafka the metadata string with its terminating NUL, which is what it commits;
    // kafkajs commits no metadata.
    let metadata = match lib {
        "confluent" => "m49\0",
        "kafkajs" => "",
        _ => "m49",
    };
    let want: Vec<CommittedOffset> = (0..PARTS)
        .map(|p| CommittedOffset { topic: "orders".into(), partition: p, offset: 50, metadata: metadata.into() })
        .collect();
    assert_eq!(committed, want);

    // Groups listed and described, topic settings described (and with confluent-kafka altered incrementally).
    let inspected = run_client(lib, &b, &["inspect", "orders", "resume"]).await?;
    let mut want = json!({"listed": true, "state": "empty", "before": "-1"});
    if lib == "confluent" {
        want["after"] = json!("3600000");
    }
    assert_eq!(inspected[0]["inspect"], want);
    let retention = w.admin.describe_topic("orders").await?.topic.config.and_then(|c| c.retention_ms);
    assert_eq!(retention, Some(if lib == "confluent" { 3_600_000 } else { 0 }), "the setting as gRPC reads it");

    // A group of two: both get partitions; when one leaves the other takes them all, resuming at the commits.
    w.admin.create_topic("grp", PARTS, TopicConfig::default(), None).await?;
    let m1 = Member::start(lib, &b, "grp", "pair")?;
    ferry_testkit::wait_until("the first member to get every partition", step_deadline(), async || {
        Ok::<_, anyhow::Error>(m1.assigned() == Some(vec![0, 1, 2, 3]))
    })
    .await?;
    let m2 = Member::start(lib, &b, "grp", "pair")?;
    ferry_testkit::wait_until("the group of two to split the partitions", step_deadline(), async || {
        let (Some(a), Some(c)) = (m1.assigned(), m2.assigned()) else { return Ok::<_, anyhow::Error>(false) };
        let mut all: Vec<u32> = a.iter().chain(&c).copied().collect();
        all.sort();
        Ok(!a.is_empty() && !c.is_empty() && all == vec![0, 1, 2, 3])
    })
    .await?;
    let (p1, p2) = (m1.assigned().unwrap(), m2.assigned().unwrap());
    run_client(lib, &b, &["produce", "grp", "4", "b", "0", "100"]).await?;
    ferry_testkit::wait_until("the two members to consume 100 records", step_deadline(), async || {
        Ok::<_, anyhow::Error>(m1.records().len() + m2.records().len() >= 100)
    })
    .await?;
    assert!(m1.records().iter().all(|r| p1.contains(&r.partition)), "member 1 read only its partitions");
    assert!(m2.records().iter().all(|r| p2.contains(&r.partition)), "member 2 read only its partitions");
    let left = m2.stop().await?;
    ferry_testkit::wait_until("the remaining member to take every partition", step_deadline(), async || {
        Ok::<_, anyhow::Error>(m1.assigned() == Some(vec![0, 1, 2, 3]))
    })
    .await?;
    run_client(lib, &b, &["produce", "grp", "4", "b", "100", "160"]).await?;
    ferry_testkit::wait_until("the remaining member to consume the rest", step_deadline(), async || {
        Ok::<_, anyhow::Error>(m1.records().len() + left.len() >= 160)
    })
    .await?;
    let stayed = m1.stop().await?;
    let mut group: Vec<Rec> = stayed.into_iter().chain(left).collect();
    group.sort();
    assert_same("consumed by the group across the rebalance", &group, &expected_range("b", PARTS, 0, 160));

    // Records produced through gRPC, consumed through Kafka; offsets committed through gRPC resume a Kafka group.
    w.admin.create_topic("native", PARTS, TopicConfig::default(), None).await?;
    let producer = Producer::new(w.client.clone(), ProducerConfig::default()).await?;
    let mut acks = Vec::new();
    for i in 0..80 {
        acks.push(producer.send(ferry_record("native", "c", PARTS, i)).await?);
    }
    producer.flush().await;
    for a in acks {
        a.await?;
    }
    producer.close().await;
    let read = run_client(lib, &b, &["consume", "native", "x", "80"]).await?;
    let mut read: Vec<Rec> = read.iter().filter_map(|l| l.get("rec")).map(Rec::of).collect();
    read.sort();
    assert_same("gRPC-produced records consumed through Kafka", &read, &expected_range("c", PARTS, 0, 80));
    let at_ten: Vec<CommittedOffset> = (0..PARTS)
        .map(|p| CommittedOffset { topic: "native".into(), partition: p, offset: 10, metadata: "grpc".into() })
        .collect();
    w.admin.commit_offsets("y", at_ten).await?;
    let rest = run_client(lib, &b, &["consume", "native", "y", "40"]).await?;
    let mut rest: Vec<Rec> = rest.iter().filter_map(|l| l.get("rec")).map(Rec::of).collect();
    rest.sort();
    let want: Vec<Rec> = expected_range("c", PARTS, 0, 80).into_iter().filter(|r| r.offset >= 10).collect();
    assert_same("a Kafka group resuming at offsets committed through gRPC", &rest, &want);
    Ok(())
}

#[tokio::test]
async fn confluent_kafka_produces_consumes_in_a_group_and_administers() -> anyhow::Result<()> {
    scenario("confluent").await
}

#[tokio::test]
async fn kafka_python_produces_consumes_in_a_group_and_administers() -> anyhow::Result<()> {
    scenario("kafkapython").await
}

#[tokio::test]
async fn kafkajs_produces_consumes_in_a_group_and_administers() -> anyhow::Result<()> {
    scenario("kafkajs").await
}
