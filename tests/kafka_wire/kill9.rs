//! A broker killed with SIGKILL under Kafka clients: every acknowledged record and every committed offset is there
//! after the restart, and a group resumes exactly where it committed. A group member killed with SIGKILL: its
//! session expires and the other member takes its partitions at its commits.

use ferry_client::admin::TopicConfig;
use serde_json::json;

use crate::support::{Member, Rec, Wire, assert_same, expected_range, run_client, step_deadline};

#[tokio::test]
async fn a_killed_broker_keeps_acknowledged_records_and_kafka_commits() -> anyhow::Result<()> {
    let mut w = Wire::start().await?;
    let b = w.kafka.clone();
    w.admin.create_topic("durable", 2, TopicConfig::default(), None).await?;
    let acked = run_client("confluent", &b, &["produce", "durable", "2", "d", "0", "100"]).await?;
    assert_eq!(acked.last().unwrap()["acked"], json!(100));
    let before = run_client("confluent", &b, &["consume", "durable", "k", "40"]).await?;

    w.broker.kill9().await?;
    w.broker.restart().await?;
    ferry_testkit::wait_until("the Kafka listener to accept again", step_deadline(), async || {
        Ok::<_, anyhow::Error>(tokio::net::TcpStream::connect(&b).await.is_ok())
    })
    .await?;

    let acked = run_client("confluent", &b, &["produce", "durable", "2", "d", "100", "150"]).await?;
    assert_eq!(acked.last().unwrap()["acked"], json!(50));
    let after = run_client("confluent", &b, &["consume", "durable", "k", "110"]).await?;
    let mut all: Vec<Rec> = before.iter().chain(&after).filter_map(|l| l.get("rec")).map(Rec::of).collect();
    all.sort();
    assert_same("consumed across the kill", &all, &expected_range("d", 2, 0, 150));
    let mut stored = Vec::new();
    for p in 0..2 {
        stored.extend(w.read_grpc("durable", p).await?.iter().map(|r| Rec::of_ferry(p, r)));
    }
    stored.sort();
    assert_same("stored across the kill", &stored, &expected_range("d", 2, 0, 150));
    Ok(())
}

#[tokio::test]
async fn a_killed_member_is_expired_and_its_partitions_move() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    let b = w.kafka.clone();
    w.admin.create_topic("members", 4, TopicConfig::default(), None).await?;
    let stays = Member::start("confluent", &b, "members", "pair")?;
    ferry_testkit::wait_until("the first member to get every partition", step_deadline(), async || {
        Ok::<_, anyhow::Error>(stays.assigned() == Some(vec![0, 1, 2, 3]))
    })
    .await?;
    let dies = Member::start("confluent", &b, "members", "pair")?;
    ferry_testkit::wait_until("the pair to split the partitions", step_deadline(), async || {
        let (Some(a), Some(c)) = (stays.assigned(), dies.assigned()) else { return Ok::<_, anyhow::Error>(false) };
        Ok(a.len() == 2 && c.len() == 2)
    })
    .await?;
    run_client("confluent", &b, &["produce", "members", "4", "e", "0", "80"]).await?;
    ferry_testkit::wait_until("the pair to consume 80 records", step_deadline(), async || {
        Ok::<_, anyhow::Error>(stays.records().len() + dies.records().len() >= 80)
    })
    .await?;
    // Killed while idle: everything it printed it had committed, and it had nothing else.
    let died = dies.kill().await?;
    // The session (6 s in client.py) expires; the survivor rejoins and gets every partition.
    ferry_testkit::wait_until("the survivor to take every partition", step_deadline(), async || {
        Ok::<_, anyhow::Error>(stays.assigned() == Some(vec![0, 1, 2, 3]))
    })
    .await?;
    run_client("confluent", &b, &["produce", "members", "4", "e", "80", "120"]).await?;
    ferry_testkit::wait_until("the survivor to consume the rest", step_deadline(), async || {
        Ok::<_, anyhow::Error>(stays.records().len() + died.len() >= 120)
    })
    .await?;
    let mut all: Vec<Rec> = stays.stop().await?.into_iter().chain(died).collect();
    all.sort();
    assert_same("consumed across a member's death", &all, &expected_range("e", 4, 0, 120));
    Ok(())
}
