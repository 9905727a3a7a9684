//! `[limits]`: state that clients control is bounded, and the request that would pass a bound is refused with
//! RESOURCE_EXHAUSTED naming the config key, while everything under it still works.

use ferry_client::Code;
use ferry_client::admin::TopicConfig;
use ferry_client::proto::{self as pb, ErrorCode};
use ferry_testkit::{deadline, wait_for};
use tokio::sync::mpsc;

use crate::common::{IO_BUDGET, assert_status, connect, start_broker};

const LIMITS: &str = "[limits]\nmax_topics = 2\nmax_partitions = 5\nmax_subscribe_partitions = 3\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_and_partitions_stop_at_their_limits() -> anyhow::Result<()> {
    let broker = start_broker(LIMITS).await?;
    let (_, admin) = connect(&broker);
    admin.create_topic("a", 2, TopicConfig::default(), None).await?;
    admin.create_topic("b", 2, TopicConfig::default(), None).await?;
    assert_status(
        admin.create_topic("c", 1, TopicConfig::default(), None).await,
        Code::ResourceExhausted,
        &["creating topic \"c\" would pass the broker's 2 topics", "limits.max_topics"],
    );
    // Growing past the partition total is refused; growing up to it is not.
    assert_status(
        admin.alter_partitions("a", 4).await,
        Code::ResourceExhausted,
        &["2 more partitions for topic \"a\" would pass the broker's 5 partitions (4 exist)", "limits.max_partitions"],
    );
    assert_eq!(admin.alter_partitions("a", 3).await?.partitions, 3);
    // A freed slot can be used again.
    admin.delete_topic("b").await?;
    assert_status(
        admin.create_topic("c", 3, TopicConfig::default(), None).await,
        Code::ResourceExhausted,
        &["3 more partitions for topic \"c\" would pass the broker's 5 partitions (3 exist)"],
    );
    admin.create_topic("c", 2, TopicConfig::default(), None).await?;
    let topics: Vec<(String, u32)> = admin.list_topics().await?.into_iter().map(|t| (t.name, t.partitions)).collect();
    assert_eq!(topics, vec![("a".to_owned(), 3), ("c".to_owned(), 2)]);
    Ok(())
}

fn start(partitions: &[(&str, u32)]) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        kind: Some(pb::subscribe_request::Kind::Start(pb::SubscribeStart {
            partitions: partitions
                .iter()
                .map(|&(topic, partition)| pb::PartitionStart {
                    topic: topic.into(),
                    partition,
                    offset: 0,
                    credit_bytes: 1 << 20,
                    seat: 0,
                    leader_epoch: None,
                })
                .collect(),
            max_response_bytes: 0,
            idle_heartbeat_ms: 100,
            changed_beats: false,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_stream_follows_at_most_its_limit_of_partitions() -> anyhow::Result<()> {
    let broker = start_broker(LIMITS).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("feed", 2, TopicConfig::default(), None).await?;
    let within = deadline(&[IO_BUDGET]);

    // Three partitions, one of a topic that does not exist: followed, the missing one answered with its error.
    let (tx, rx) = mpsc::channel::<pb::SubscribeRequest>(4);
    let requests = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    tx.send(start(&[("feed", 0), ("feed", 1), ("nope", 0)])).await?;
    let mut stream = client.raw().await?.subscribe(requests).await?.into_inner();
    let mut seen = std::collections::BTreeMap::new();
    wait_for("a position of every followed partition", within, async || {
        let msg = stream.message().await?.ok_or_else(|| anyhow::anyhow!("the stream ended"))?;
        for d in msg.partitions {
            seen.insert((d.topic.clone(), d.partition), (d.error, d.log_end_offset));
        }
        anyhow::Ok((seen.len() == 3).then_some(()))
    })
    .await?;
    assert_eq!(seen[&("feed".to_owned(), 0)], (ErrorCode::None as i32, 0));
    assert_eq!(seen[&("feed".to_owned(), 1)], (ErrorCode::None as i32, 0));
    assert_eq!(seen[&("nope".to_owned(), 0)].0, ErrorCode::UnknownTopicOrPartition as i32);

    // Following one more ends the stream with RESOURCE_EXHAUSTED naming the key; re-sending a followed one does not.
    tx.send(start(&[("feed", 0)])).await?;
    tx.send(start(&[("other", 7)])).await?;
    let status = wait_for("the stream to end", within, async || match stream.message().await {
        Ok(Some(_)) => anyhow::Ok(None),
        Ok(None) => anyhow::bail!("the stream ended without a status"),
        Err(status) => Ok(Some(status)),
    })
    .await?;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("follows at most 3 partitions; this one follows 3 and asked for 1 more")
            && status.message().contains("limits.max_subscribe_partitions"),
        "{}",
        status.message()
    );
    // The broker keeps serving.
    assert_eq!(admin.describe_topic("feed").await?.partitions.len(), 2);
    Ok(())
}
