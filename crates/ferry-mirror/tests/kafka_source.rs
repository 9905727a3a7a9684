//! `KafkaSource` against a real Kafka-API broker (tansu): probes, topics, watermarks, group offsets, and the clear
//! error of a route whose endpoint does not speak Kafka.

#![cfg(feature = "kafka")]

mod kafka_support;

use ferry_mirror::lane::core::EpochAnswer;
use ferry_mirror::tp::SourceTp;
use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::ClientError;
use ferry_client::proto as pb;
use ferry_mirror::cluster::SourceCluster;
use ferry_mirror::kafka::KafkaSource;
use kafka_support::{Tansu, create_topic, produce, tool};
use tokio::io::AsyncWriteExt;

fn source(k: &Tansu) -> KafkaSource {
    KafkaSource::new(vec![k.bootstrap()], BTreeMap::new(), "test").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_source_probes_lists_topics_and_reads_watermarks() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 3).await;
    create_topic(&k, "payments", 1).await;
    let produced = produce(&k, "orders", 1, 20, 1, &[]).await;
    assert_eq!(produced.len(), 20);
    let s = source(&k);

    assert_eq!(s.probe(Duration::from_secs(5)).await.unwrap(), "kafka-a");
    let mut topics = s.list_topics().await.unwrap();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let summary: Vec<(String, String, u32, bool)> =
        topics.iter().map(|t| (t.name.clone(), t.topic_id.clone(), t.partitions, t.mirror.is_some())).collect();
    assert_eq!(
        summary,
        vec![
            ("orders".into(), "kafka:orders".into(), 3, false),
            ("payments".into(), "kafka:payments".into(), 1, false)
        ]
    );
    assert_eq!(s.log_offsets(&SourceTp::new("orders", 1)).await.unwrap(), (0, 20));
    assert_eq!(s.log_offsets(&SourceTp::new("orders", 0)).await.unwrap(), (0, 0));
    assert_eq!(s.epoch_end(&SourceTp::new("orders", 1), 0).await.unwrap(), EpochAnswer::Unknown);

    // After a reconnect the next call dials again.
    s.reconnect();
    assert_eq!(s.probe(Duration::from_secs(5)).await.unwrap(), "kafka-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_source_commits_and_reads_group_offsets() {
    let k = Tansu::start("kafka-a").await;
    create_topic(&k, "orders", 2).await;
    produce(&k, "orders", 0, 10, 1, &[]).await;
    let s = source(&k);
    let group = "ferry-mirror.test";
    s.commit(
        group,
        vec![pb::CommittedOffset { topic: "orders".into(), partition: 0, offset: 7, metadata: "mirror".into() }],
    )
    .await
    .unwrap();
    let got = s.committed(group, &[SourceTp::new("orders", 0), SourceTp::new("orders", 1)]).await.unwrap();
    // tansu 0.6 does not keep commit metadata: only the offset is compared.
    assert_eq!(
        got.iter().map(|c| (c.topic.as_str(), c.partition, c.offset)).collect::<Vec<_>>(),
        vec![("orders", 0, 7)]
    );
    // All partitions when none is named.
    let all = s.committed(group, &[]).await.unwrap();
    assert_eq!(
        all.iter().map(|c| (c.topic.as_str(), c.partition, c.offset)).collect::<Vec<_>>(),
        vec![("orders", 0, 7)]
    );
    // confluent-kafka sees the same commit.
    let seen = tool(&["committed", &k.bootstrap(), group, "orders", "0"]).await;
    assert_eq!(seen.trim(), "7");
    // A group committed by another client is listed.
    tool(&["commit", &k.bootstrap(), "app-group", "orders", "1", "0"]).await;
    let groups = s.list_groups().await.unwrap();
    assert!(groups.iter().any(|g| g == "app-group") && groups.iter().any(|g| g == group), "{groups:?}");
}

/// A listener that answers every connection with an HTTP error and closes it: not Kafka.
async fn not_kafka() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

/// Probes `s` with `timeout`: the probe gives up by itself, so it must return within the deadline derived from it
/// (3x); a hang fails the test.
async fn probe_within(s: &KafkaSource, timeout: Duration) -> Result<String, ClientError> {
    let deadline = ferry_testkit::deadline(&[timeout]);
    tokio::time::timeout(deadline, s.probe(timeout))
        .await
        .unwrap_or_else(|_| panic!("a probe with a {timeout:?} timeout did not return within {deadline:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probing_an_endpoint_that_is_not_kafka_fails_clearly() {
    let addr = not_kafka().await;
    let s = KafkaSource::new(vec![addr.to_string()], BTreeMap::new(), "test").unwrap();
    let timeout = Duration::from_secs(2);
    let err = probe_within(&s, timeout).await.unwrap_err();
    assert_transport_failure(&err, &addr.to_string());

    // Nothing listening at all.
    let closed = ferry_testkit::reserve_port().unwrap();
    let endpoint = format!("127.0.0.1:{closed}");
    let s = KafkaSource::new(vec![endpoint.clone()], BTreeMap::new(), "test").unwrap();
    let err = probe_within(&s, timeout).await.unwrap_err();
    assert_transport_failure(&err, &endpoint);
}

/// The probe's error for an endpoint that closes the connection (or refuses it): librdkafka's transport failure,
/// naming the endpoint, with the hint to check that it is a Kafka endpoint.
fn assert_transport_failure(err: &ClientError, endpoint: &str) {
    let ClientError::Transport { broker, message } = err else { panic!("not a transport error: {err:?}") };
    assert_eq!(broker, endpoint);
    assert_eq!(
        message,
        &format!(
            "Kafka metadata from [{endpoint}]: Meta data fetch error: BrokerTransportFailure (Local: Broker transport \
             failure); is the route's address a reachable Kafka endpoint?"
        )
    );
}

#[test]
fn bad_properties_are_refused_when_the_source_is_built() {
    let props: BTreeMap<String, String> = [("no.such.property".to_owned(), "secret-value".to_owned())].into();
    let err = KafkaSource::new(vec!["127.0.0.1:9092".into()], props, "test").unwrap_err().to_string();
    assert!(err.contains("source.kafka") && err.contains("no.such.property"), "{err}");
    assert!(!err.contains("secret-value"), "{err}");
}
