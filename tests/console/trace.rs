//! A message's trace: nacked twice, dead-lettered, edited and resent, redriven; every step in order, both ways.

use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{Outcome, Producer, ProducerConfig, ProducerRecord, ShareConfig, ShareConsumer, ShareMode};
use ferry_testkit::{deadline, wait_for, wait_until};
use serde_json::{Value, json};

use crate::common::{Env, IO_BUDGET};

const BACKOFF: Duration = Duration::from_millis(100);

fn events(group: &Value) -> Vec<(String, u64, String)> {
    group["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["event"].as_str().unwrap().to_owned(),
                h["delivery_count"].as_u64().unwrap(),
                h["error"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn steps(list: &Value) -> Vec<(Value, String)> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| (s["kind"].clone(), format!("{}/{}/{}", s["topic"].as_str().unwrap(), s["partition"], s["offset"])))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_of_a_message_nacked_twice_dead_lettered_edited_and_redriven_shows_every_step_in_order()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("payments", 1, TopicConfig::default(), None).await?;
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    let r = ProducerRecord::new("payments", "pay-1")
        .with_key("p1")
        .with_header("ferry-retries", "1")
        .with_header("trace", "x1");
    let ack = producer.send(r).await?.await?;
    producer.close().await;
    assert_eq!((ack.partition, ack.offset), (0, 0));

    // Two deliveries, each failed: the second has no retry left and goes to billing.dlq.
    let mut cfg = ShareConfig::new("billing", &["payments"], ShareMode::Queue);
    cfg.from_earliest = true;
    cfg.session_timeout = Duration::from_secs(2);
    cfg.backoff = vec![BACKOFF];
    let member = ShareConsumer::join(env.client.clone(), cfg).await?;
    for attempt in 1..=2 {
        let got = wait_for("a delivery", deadline(&[BACKOFF, Duration::from_secs(2)]), async || {
            anyhow::Ok(Some(member.poll(1, Duration::from_millis(200)).await?).filter(|g| !g.is_empty()))
        })
        .await?;
        assert_eq!((got[0].offset, got[0].delivery_count), (0, attempt));
        member.ack(&[(&got[0], Outcome::retry(format!("boom-{attempt}")))]).await?;
    }
    wait_until("the dead letter is written", IO_BUDGET, async || {
        anyhow::Ok(env.admin.list_offset("billing.dlq", 0, ferry_client::OffsetSpec::Latest).await?.log_end_offset == 1)
    })
    .await?;
    member.leave().await?;

    // Edit the dead letter and resend it: a new record in the origin topic naming the dead letter.
    let edited = env
        .act(
            "/api/v1/clusters/dc1/resend",
            json!({"topic": "billing.dlq", "partition": 0, "offset": 0, "value": "pay-1-fixed", "confirm": true}),
        )
        .await?;
    assert_eq!(edited["written"], json!({"topic": "payments", "partition": 0, "offset": 1}));
    // Redrive the dead letters and watch the job until it is done.
    let job = env
        .act("/api/v1/clusters/dc1/groups/billing/redrive", json!({"rate": 0, "dry_run": false, "confirm": true}))
        .await?;
    assert_eq!((job["from_offset"].as_u64(), job["end_offset"].as_u64()), (Some(0), Some(1)));
    let done = wait_for("the redrive job ends", IO_BUDGET, async || {
        let j = env.read("/api/v1/clusters/dc1/groups/billing/redrive").await?;
        anyhow::Ok((j["state"] != "RUNNING").then_some(j))
    })
    .await?;
    assert_eq!((done["state"].as_str(), done["copied"].as_u64()), (Some("DONE"), Some(1)), "{done}");

    // The original's trace: its deliveries and failures in order, then dead letter -> edited, redriven.
    let t = env.read("/api/v1/clusters/dc1/topics/payments/partitions/0/records/0?groups=billing").await?;
    assert_eq!(t["record"]["value"], "pay-1");
    assert!(t["origin"].is_null());
    let group =
        t["groups"].as_array().unwrap().iter().find(|g| g["group"] == "billing").expect("billing in the trace").clone();
    assert_eq!(group["status"], "FAIL", "{group}");
    let ev = events(&group);
    let step = |e: &str, n: u64, err: &str| (e.to_owned(), n, err.to_owned());
    assert_eq!(
        ev,
        vec![
            step("DELIVERED", 1, ""),
            step("RETRY", 1, "boom-1"),
            step("DELIVERED", 2, ""),
            step("DEAD_LETTERED", 2, "")
        ]
    );
    assert_eq!(group["history"][3]["detail"], "billing.dlq/0/0");
    let times: Vec<i64> = group["history"].as_array().unwrap().iter().map(|h| h["at_ms"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "history in time order: {times:?}");
    assert_eq!(
        steps(&t["lineage"]["derived"]),
        vec![
            (json!("dead_letter"), "billing.dlq/0/0".to_owned()),
            (json!("edited"), "payments/0/1".to_owned()),
            (json!("redriven"), "payments/0/2".to_owned()),
        ]
    );
    let dl = &t["lineage"]["derived"][0];
    assert_eq!(
        (dl["group"].as_str(), dl["error"].as_str(), dl["attempts"].as_str()),
        (Some("billing"), Some("boom-2"), Some("2")),
        "{dl}"
    );
    assert_eq!(t["lineage"]["derived"][1]["edited_by"], "ops");

    // Back from the redriven copy and from the edit: both lead to the dead letter, then the original.
    for (offset, kind) in [(2, "redriven"), (1, "edited")] {
        let t = env.read(&format!("/api/v1/clusters/dc1/topics/payments/partitions/0/records/{offset}")).await?;
        assert_eq!(t["origin"], json!({"kind": kind, "from": {"topic": "billing.dlq", "partition": 0, "offset": 0}}));
        assert_eq!(
            steps(&t["lineage"]["origins"]),
            vec![(Value::Null, "payments/0/0".to_owned()), (json!("dead_letter"), "billing.dlq/0/0".to_owned())]
        );
        assert_eq!(t["lineage"]["derived"], json!([]));
    }
    let redriven = env.read("/api/v1/clusters/dc1/topics/payments/partitions/0/records?offset=1&limit=2").await?;
    let r = &redriven["records"];
    assert_eq!((r[0]["value"].as_str(), r[1]["value"].as_str()), (Some("pay-1-fixed"), Some("pay-1")));
    let names = |r: &Value| {
        r["headers"].as_array().unwrap().iter().map(|h| h["key"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(&r[0]),
        [
            "ferry-retries",
            "trace",
            "ferry-origin-cluster",
            "ferry-origin-topic",
            "ferry-origin-partition",
            "ferry-origin-offset",
            "ferry-edited-by",
            "ferry-edited-at-ms"
        ]
    );
    assert!(names(&r[1]).contains(&"ferry-redriven-from".to_owned()));
    // The dead letter's own trace links both ways.
    let t = env.read("/api/v1/clusters/dc1/topics/billing.dlq/partitions/0/records/0").await?;
    assert_eq!(steps(&t["lineage"]["origins"]), vec![(Value::Null, "payments/0/0".to_owned())]);
    assert_eq!(
        steps(&t["lineage"]["derived"]),
        vec![(json!("edited"), "payments/0/1".to_owned()), (json!("redriven"), "payments/0/2".to_owned())]
    );

    // Each action left one audit line naming who did it.
    let audit = env.audit();
    let acts: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|a| (a["action"].as_str().unwrap(), a["who"].as_str().unwrap(), a["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(acts, vec![("resend", "ops", "ok"), ("redrive", "ops", "ok")]);
    assert_eq!(audit[0]["detail"]["written"], "payments/0/1");
    assert_eq!(audit[0]["detail"]["from"], "billing.dlq/0/0");
    assert_eq!(audit[1]["detail"]["group"], "billing");
    Ok(())
}
