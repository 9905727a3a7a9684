//! Ferry's own mirror with its Kafka (librdkafka) source pointed at a broker's Kafka listener copies a topic
//! exactly into another broker: the Kafka path, cross-checked against the native one. And a mirror topic refuses
//! Kafka producers until it is promoted.

use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig};
use ferry_testkit::{BrokerProcess, MirrorProcess};

use crate::support::{
    Rec, Wire, assert_same, expected_range, ferry_record, run_client, run_client_lines, step_deadline,
};

fn mirror_toml(kafka: &str, target: &str) -> String {
    format!(
        r#"[mirror]
name = "listener_to_dc-b"

[source]
cluster = "dc-a"
kind = "kafka"

[[source.routes]]
name = "primary"
brokers = ["{kafka}"]

[target]
cluster = "dc-b"
kind = "ferry"
brokers = ["{target}"]

[topics]
include = ["^orders$"]
exclude = ["^__"]
discovery_interval = "1s"
start_position = "earliest"

[sync]
commit_interval = "1s"
shutdown_timeout = "10s"

[monitor]
listen = "127.0.0.1:0"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferry_mirror_copies_a_topic_from_the_kafka_listener_exactly() -> anyhow::Result<()> {
    let src = Wire::start().await?;
    let dst = BrokerProcess::builder().cluster_id("dc-b").start().await?;
    let dst_admin = Admin::new(BrokerClient::new(ClientConfig::new([dst.addr().to_string()]))?);
    src.admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let producer = Producer::new(src.client.clone(), ProducerConfig::default()).await?;
    let mut acks = Vec::new();
    for i in 0..300 {
        acks.push(producer.send(ferry_record("orders", "m", 2, i)).await?);
    }
    producer.flush().await;
    for a in acks {
        a.await?;
    }
    producer.close().await;

    let mut mirror = MirrorProcess::builder(mirror_toml(&src.kafka, &dst.addr().to_string())).start().await?;
    ferry_testkit::wait_until("the mirror to copy both partitions", step_deadline(), async || {
        let Ok(d) = dst_admin.describe_topic("orders").await else { return Ok::<_, anyhow::Error>(false) };
        Ok(d.partitions.iter().map(|p| p.log_end_offset).collect::<Vec<_>>() == vec![150, 150])
    })
    .await?;
    let dst_client = BrokerClient::new(ClientConfig::new([dst.addr().to_string()]))?;
    for p in 0..2 {
        let native = src.read_grpc("orders", p).await?;
        let copied = crate::support::read_all(&dst_client, "orders", p).await?;
        assert_eq!(copied.len(), 150, "partition {p}");
        assert_eq!(copied, native, "partition {p}: the copy through the Kafka listener is the native log");
    }
    mirror.terminate(Duration::from_secs(20)).await?;
    Ok(())
}

#[tokio::test]
async fn a_mirror_topic_refuses_kafka_writes_until_promoted() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    let source = ferry_client::proto::MirrorSource {
        source_cluster_id: "dc-x-id".into(),
        source_topic_id: "00000000-0000-4000-8000-000000000001".into(),
        source_topic: "mirrored".into(),
        source_cluster: "dc-x".into(),
    };
    w.admin.create_topic("mirrored", 1, TopicConfig::default(), Some(source)).await?;
    let refused = run_client_lines("confluent", &w.kafka, &["produce", "mirrored", "1", "r", "0", "5"]).await?;
    let errors: Vec<&str> = refused.iter().filter_map(|l| l["error"].as_str()).collect();
    assert_eq!(errors.len(), 5, "every record refused: {refused:?}");
    assert!(errors.iter().all(|e| e.contains("INVALID_REQUEST")), "Kafka's INVALID_REQUEST: {errors:?}");
    assert_eq!(w.admin.describe_topic("mirrored").await?.partitions[0].log_end_offset, 0, "nothing written");

    w.admin.promote("mirrored").await?;
    let acked = run_client("confluent", &w.kafka, &["produce", "mirrored", "1", "r", "0", "5"]).await?;
    assert_eq!(acked.last().unwrap()["acked"], serde_json::json!(5));
    let stored: Vec<Rec> = w.read_grpc("mirrored", 0).await?.iter().map(|r| Rec::of_ferry(0, r)).collect();
    assert_same("written after the promotion", &stored, &expected_range("r", 1, 0, 5));
    Ok(())
}

/// `ferry-mirror` from the source broker's gRPC API, copying "orders" and the committed offsets of group "app".
fn group_sync_toml(source: &str, target: &str) -> String {
    format!(
        r#"[mirror]
name = "groups_to_dc-b"

[source]
cluster = "dc-a"

[[source.routes]]
name = "primary"
brokers = ["{source}"]

[target]
cluster = "dc-b"
brokers = ["{target}"]

[topics]
include = ["^orders$"]
discovery_interval = "1s"
start_position = "earliest"

[groups]
include = ["^app$"]
group_sync_interval = "500ms"

[sync]
commit_interval = "1s"
shutdown_timeout = "10s"

[monitor]
listen = "127.0.0.1:0"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_syncs_offsets_a_kafka_group_committed() -> anyhow::Result<()> {
    let src = Wire::start().await?;
    let dst = BrokerProcess::builder().cluster_id("dc-b").start().await?;
    let dst_admin = Admin::new(BrokerClient::new(ClientConfig::new([dst.addr().to_string()]))?);
    src.admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    run_client("kafkapython", &src.kafka, &["produce", "orders", "2", "k", "0", "60"]).await?;
    // A kafka-python group reads 25 of the 60 records, committing each through the Kafka listener.
    let read = run_client("kafkapython", &src.kafka, &["consume", "orders", "app", "25"]).await?;
    let read: Vec<Rec> = read.iter().filter_map(|l| l.get("rec")).map(Rec::of).collect();
    assert_eq!(read.len(), 25);
    let mut want: Vec<(u32, u64)> = (0..2u32)
        .filter_map(|p| read.iter().filter(|r| r.partition == p).map(|r| r.offset + 1).max().map(|o| (p, o)))
        .collect();
    want.sort();
    let on_source: Vec<(u32, u64)> =
        src.admin.fetch_committed_offsets("app", &[]).await?.iter().map(|c| (c.partition, c.offset)).collect();
    assert_eq!(on_source, want, "the Kafka commits as the source's gRPC API reads them");

    // The mirror copies the topic and the group's offsets: the target's are the Kafka group's, exactly.
    let mut mirror = MirrorProcess::builder(group_sync_toml(&src.broker.addr().to_string(), &dst.addr().to_string()))
        .start()
        .await?;
    ferry_testkit::wait_until("the group's offsets on the target", step_deadline(), async || {
        let Ok(got) = dst_admin.fetch_committed_offsets("app", &[]).await else { return Ok::<_, anyhow::Error>(false) };
        Ok(got.iter().map(|c| (c.partition, c.offset)).collect::<Vec<_>>() == want)
    })
    .await?;
    let copied: Vec<u64> =
        dst_admin.describe_topic("orders").await?.partitions.iter().map(|p| p.log_end_offset).collect();
    assert_eq!(copied, vec![30, 30], "the topic copied whole");
    mirror.terminate(Duration::from_secs(20)).await?;
    Ok(())
}
