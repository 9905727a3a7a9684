//! A group's backlog over time, sampled by the console: the chart's samples and the page's chart.

use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{Outcome, Producer, ProducerConfig, ProducerRecord, ShareConfig, ShareConsumer, ShareMode};
use ferry_testkit::{deadline, wait_for, wait_until};

use crate::common::{Env, IO_BUDGET, OPS};

const SAMPLE: Duration = Duration::from_millis(200);

fn backlogs(g: &serde_json::Value) -> Vec<(i64, u64)> {
    g["message_group"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["at_ms"].as_i64().unwrap(), s["backlog"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_backlog_is_sampled_over_time_and_charted() -> anyhow::Result<()> {
    let env = Env::start_with("lag_sample_interval = \"200ms\"", "").await?;
    env.admin.create_topic("jobs", 1, TopicConfig::default(), None).await?;
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    for i in 0..5 {
        producer.send(ProducerRecord::new("jobs", format!("job-{i}"))).await?.await?;
    }
    producer.close().await;
    let mut cfg = ShareConfig::new("workers", &["jobs"], ShareMode::Queue);
    cfg.from_earliest = true;
    cfg.session_timeout = Duration::from_secs(2);
    let member = ShareConsumer::join(env.client.clone(), cfg).await?;
    // The first visit makes the console follow the group; its sampler adds a sample every 200 ms.
    let path = "/api/v1/clusters/dc1/groups/workers";
    assert_eq!(env.read(path).await?["message_group"]["backlog"], 5);
    wait_until("three samples of the full backlog", deadline(&[SAMPLE * 3]), async || {
        anyhow::Ok(backlogs(&env.read(path).await?).len() >= 3)
    })
    .await?;
    let got = wait_for("all five delivered", IO_BUDGET, async || {
        anyhow::Ok(Some(member.poll(5, Duration::from_millis(200)).await?).filter(|g| g.len() == 5))
    })
    .await?;
    member.ack(&got.iter().map(|r| (r, Outcome::Ack)).collect::<Vec<_>>()).await?;
    let series = wait_for("a sample of the empty backlog", deadline(&[SAMPLE * 3]), async || {
        let s = backlogs(&env.read(path).await?);
        anyhow::Ok((s.last().map(|x| x.1) == Some(0)).then_some(s))
    })
    .await?;
    assert!(series.windows(2).all(|w| w[0].0 <= w[1].0), "in time order: {series:?}");
    let values: Vec<u64> = series.iter().map(|s| s.1).collect();
    let full = values.iter().take_while(|v| **v == 5).count();
    assert!(full >= 3 && values[full..].iter().all(|v| *v == 0), "5s then 0s: {values:?}");
    member.leave().await?;
    let page = env.http.get(env.url("/c/dc1/groups/workers")).bearer_auth(OPS).send().await?.text().await?;
    assert!(page.contains("<polyline") && page.contains("latest 0"), "{page}");
    Ok(())
}
