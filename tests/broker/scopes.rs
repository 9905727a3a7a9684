//! Scoped tokens (`[[auth.tokens]]`, docs/broker.md "Tokens and scopes") on a real broker: a produce-only token
//! produces to its topics and is denied everything else, each denial naming the token and the operation; the
//! denials change nothing; listings show only what a token's patterns match; only the mirror scope joins
//! `ferry-mirror.*`; the broker's log names the token and counts its denials, and never holds a secret.

use std::path::Path;

use bytes::Bytes;
use ferry_batch::Header;
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, ClientConfig, ClientError, Code, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, deadline, wait_for};

use crate::common::{IO_BUDGET, Rec, assert_same_records, assert_status, leos, plain_batch, read_topic};

const APP_SECRET: &str = "app-secret-5d0c7a91e2b84f36";
const OPS_SECRET: &str = "ops-secret-c81f4e09a6d2b753";
const MIRROR_SECRET: &str = "mirror-secret-2e6b9d41f07ca835";
const TS0: i64 = 1_700_000_000_000;

fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

fn client(broker: &BrokerProcess, secret: &str) -> anyhow::Result<BrokerClient> {
    Ok(BrokerClient::new(ClientConfig::new([broker.addr().to_string()]).with_token(secret))?)
}

fn record(i: usize) -> ProducerRecord {
    ProducerRecord {
        topic: "orders.eu".into(),
        partition: Some((i % 2) as u32),
        key: Some(Bytes::from(format!("customer-{}", i % 7))),
        value: Some(Bytes::from(format!("order-{i}"))),
        headers: vec![Header { key: "region".into(), value: Some(Bytes::from_static(b"eu")) }],
        timestamp: Some(TS0 + i as i64),
        when: None,
    }
}

/// The denial of `op` to the produce-only token: PERMISSION_DENIED naming the token and the operation.
fn denied<T: std::fmt::Debug>(result: Result<T, ClientError>, op: &str, more: &str) {
    let message = assert_status(result, Code::PermissionDenied, &["token \"orders-app\"", &format!("call {op}"), more]);
    assert!(!message.contains(APP_SECRET), "the denial shows the secret: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_only_token_produces_to_its_topics_and_is_denied_everything_else() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let secrets = tempfile::tempdir()?;
    let mut config = String::new();
    for (name, secret, scopes, topics, groups) in [
        ("orders-app", APP_SECRET, r#"["produce"]"#, r#"['^orders\..*$']"#, "[]"),
        ("ops", OPS_SECRET, r#"["admin", "consume"]"#, r#"[".*"]"#, r#"[".*"]"#),
        ("dc-mirror", MIRROR_SECRET, r#"["mirror"]"#, r#"[".*"]"#, r#"['^ferry-mirror\..*$']"#),
    ] {
        let file = secrets.path().join(format!("{name}.token"));
        std::fs::write(&file, format!("{secret}\n"))?;
        config.push_str(&format!(
            "[[auth.tokens]]\nname = \"{name}\"\ntoken_file = {}\nscopes = {scopes}\ntopics = {topics}\ngroups = {groups}\n\n",
            toml_path(&file)
        ));
    }
    let broker = BrokerProcess::builder().config(config).start().await?;
    let (app, ops, mirror) =
        (client(&broker, APP_SECRET)?, client(&broker, OPS_SECRET)?, client(&broker, MIRROR_SECRET)?);
    let (app_admin, ops_admin, mirror_admin) = (Admin::new(app.clone()), Admin::new(ops.clone()), Admin::new(mirror));

    // No token, or one the broker does not know: UNAUTHENTICATED, as before scopes.
    let anonymous = Admin::new(BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?);
    assert_status(anonymous.list_topics().await, Code::Unauthenticated, &["bearer token"]);

    let mark = MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: "5f0e3c1a-7b2d-4e8f-9a6c-1d2b3c4d5e6f".into(),
        source_topic: "orders.eu".into(),
        source_cluster: "dc-a".into(),
    };
    ops_admin.create_topic("orders.eu", 2, TopicConfig::default(), None).await?;
    ops_admin.create_topic("payments", 1, TopicConfig::default(), None).await?;
    ops_admin.create_topic("orders.copy", 1, TopicConfig::default(), Some(mark.clone())).await?;

    // The token produces to its topic: every record lands, exactly.
    let producer = Producer::new(app.clone(), ProducerConfig::default()).await?;
    let mut deliveries = Vec::new();
    for i in 0..40 {
        deliveries.push(producer.send(record(i)).await?);
    }
    let acks = futures::future::try_join_all(deliveries).await?;
    producer.close().await;
    let expected: Vec<Rec> = acks.iter().enumerate().map(|(i, ack)| Rec::acked(ack, record(i))).collect();
    assert_same_records("orders.eu as produced", &expected, &read_topic(&ops, "orders.eu").await);

    // Other topics.
    let produce = |topic: &str| pb::ProduceRequest {
        topic: topic.into(),
        partition: Some(0),
        key: None,
        batches: plain_batch(&["x"], TS0),
    };
    denied(app.produce(produce("payments")).await, "Produce", "topic \"payments\"");
    // Consume.
    let fetch = pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: "orders.eu".into(),
            partition: 0,
            offset: 0,
            max_bytes: 1 << 20,
            leader_epoch: None,
        }],
        max_wait_ms: 0,
        max_bytes: 1 << 20,
    };
    denied(app.fetch(fetch).await, "Fetch", "needs the consume or mirror scope");
    // The admin client asks by topic; the same ask flat is refused alike.
    denied(app_admin.list_offset("orders.eu", 0, ferry_client::OffsetSpec::Latest).await, "ListOffsets", "orders.eu");
    let flat = pb::ListOffsetsRequest {
        partitions: vec![pb::ListOffsetsPartition { topic: "orders.eu".into(), partition: 0, ..Default::default() }],
        columns: None,
    };
    denied(app.list_offsets(flat).await, "ListOffsets", "orders.eu");
    let join = |group: &str| pb::JoinGroupRequest {
        group: group.into(),
        member_id: String::new(),
        topics: vec!["orders.eu".into()],
        session_timeout_ms: 10_000,
        client_id: "scopes-test".into(),
    };
    denied(app.join_group(join("orders-eu")).await, "JoinGroup", "needs the consume scope");
    let commit =
        vec![pb::CommittedOffset { topic: "orders.eu".into(), partition: 0, offset: 1, metadata: String::new() }];
    denied(app_admin.commit_offsets("orders-eu", commit.clone()).await, "CommitOffsets", "orders-eu");
    // Create, delete, truncate, promote.
    denied(app_admin.create_topic("orders.new", 1, TopicConfig::default(), None).await, "CreateTopic", "admin");
    denied(
        app_admin.create_topic("orders.new", 1, TopicConfig::default(), Some(mark)).await,
        "CreateTopic",
        "admin or mirror",
    );
    denied(app_admin.delete_topic("orders.eu").await, "DeleteTopic", "admin");
    denied(app_admin.truncate_partition("orders.eu", 0, 0).await, "TruncatePartition", "admin");
    denied(app_admin.truncate_partition("orders.copy", 0, 0).await, "TruncatePartition", "mirror");
    denied(app_admin.promote("orders.copy").await, "Promote", "admin");
    denied(app_admin.alter_partitions("orders.eu", 4).await, "AlterPartitions", "admin");
    // AppendWithOffsets.
    let batch = plain_batch(&["copied"], TS0);
    denied(
        app_admin.append_with_offsets("orders.copy", 0, &mark_id(), 0, batch.clone()).await,
        "AppendWithOffsets",
        "mirror",
    );
    // Joining the mirror's group: not the produce token, and not even one with consume and admin.
    let mirror_group = "ferry-mirror.dc-a_to_dc-b";
    denied(app.join_group(join(mirror_group)).await, "JoinGroup", "needs the mirror scope");
    let ops_join = ops.join_group(join(mirror_group)).await;
    assert_status(ops_join, Code::PermissionDenied, &["token \"ops\"", "call JoinGroup", "needs the mirror scope"]);
    assert_status(
        ops_admin.commit_offsets(mirror_group, commit.clone()).await,
        Code::PermissionDenied,
        &["token \"ops\"", "call CommitOffsets", "needs the mirror scope"],
    );

    // The denials changed nothing: the same topics, the same data, no group, an empty mirror topic.
    let mut names: Vec<String> = ops_admin.list_topics().await?.into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["orders.copy", "orders.eu", "payments"]);
    assert_same_records("orders.eu after the denials", &expected, &read_topic(&ops, "orders.eu").await);
    assert_eq!(leos(&ops_admin, "payments").await, [0]);
    assert_eq!(leos(&ops_admin, "orders.copy").await, [0]);
    assert_eq!(leos(&ops_admin, "orders.eu").await.iter().sum::<u64>(), 40);
    assert!(ops_admin.list_groups().await?.is_empty());

    // The token sees only its topics.
    let mut seen: Vec<String> = app_admin.list_topics().await?.into_iter().map(|t| t.name).collect();
    seen.sort();
    assert_eq!(seen, ["orders.copy", "orders.eu"]);
    denied(app_admin.describe_topic("payments").await, "DescribeTopic", "none of its topics patterns matches it");

    // The mirror scope may do what the others may not: join its group and append with offsets.
    let joined = mirror_admin.client().join_group(join(mirror_group)).await?;
    assert_eq!(joined.members.len(), 1);
    let appended = mirror_admin.append_with_offsets("orders.copy", 0, &mark_id(), 0, batch).await?;
    assert_eq!((appended.error, appended.log_end_offset), (pb::ErrorCode::None as i32, 1));

    // The log names the token and the operation, counts the denials, and never holds a secret. Lines are at most
    // one a second per token, each counting the denials it left out: keep being denied until a second line shows.
    let until = deadline(&[IO_BUDGET]);
    wait_for("a second logged denial of orders-app", until, async || {
        let _ = app.produce(produce("payments")).await;
        (denial_counts(&broker.logs()).len() >= 2).then_some(())
    })
    .await?;
    let logs = broker.logs();
    let counts = denial_counts(&logs);
    assert_eq!(counts[0], (1, 0), "the first denial is logged at once");
    for pair in counts.windows(2) {
        let ((before, _), (now, left_out)) = (pair[0], pair[1]);
        assert_eq!(now, before + left_out + 1, "each line counts every denial since the last: {counts:?}");
    }
    assert!(logs.contains("token=ops") && logs.contains("operation=\"JoinGroup\""), "the ops denial is logged");
    for secret in [APP_SECRET, OPS_SECRET, MIRROR_SECRET] {
        assert!(!logs.contains(secret), "the broker's log holds a secret");
    }
    Ok(())
}

fn mark_id() -> String {
    "5f0e3c1a-7b2d-4e8f-9a6c-1d2b3c4d5e6f".into()
}

/// `(denials, left_out)` of every logged denial of the orders-app token, in order.
fn denial_counts(logs: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, key: &str| -> Option<u64> {
        let rest = &line[line.find(&format!(" {key}="))? + key.len() + 2..];
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    logs.lines()
        .filter(|l| l.contains("permission denied") && l.contains("token=orders-app"))
        .map(|l| (field(l, "denials").expect("a denials field"), field(l, "left_out").expect("a left_out field")))
        .collect()
}
