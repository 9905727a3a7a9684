//! The actions' effects and audit lines; 401, 403 and the CSRF and confirmation refusals.

use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{Consumer, ConsumerConfig, ProducerRecord, Transactions};
use serde_json::json;

use crate::common::{Env, OPS, VIEWER};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_take_effect_and_are_audited_and_refusals_change_nothing() -> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let produce = "/api/v1/clusters/dc1/produce";
    let body = json!({"topic": "orders", "partition": 1, "key": "k1", "value": "hello",
                      "headers": [{"key": "h", "value": "v"}], "confirm": true});

    // No token: 401 on reads and actions. A read-only token: reads yes, actions 403. No CSRF token: 403.
    let (s, e) = env.get("/api/v1/clusters/dc1/topics", None).await?;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")));
    let (s, _) = env.get("/api/v1/clusters/dc1/topics", Some(VIEWER)).await?;
    assert_eq!(s, 200);
    let (s, e) = env.post(produce, None, None, body.clone()).await?;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")));
    let (_, viewer) = env.get("/api/v1/session", Some(VIEWER)).await?;
    let (s, e) = env.post(produce, Some(VIEWER), viewer["csrf"].as_str(), body.clone()).await?;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")));
    let (s, e) = env.post(produce, Some(OPS), None, body.clone()).await?;
    assert_eq!((s, e["code"].as_str()), (403, Some("csrf_required")));
    let (s, e) = env.post(produce, Some(OPS), viewer["csrf"].as_str(), body.clone()).await?;
    assert_eq!((s, e["code"].as_str()), (403, Some("csrf_required")), "another caller's CSRF token is refused");
    let mut unconfirmed = body.clone();
    unconfirmed["confirm"] = json!(false);
    let (s, e) = env.post(produce, Some(OPS), Some(&env.csrf), unconfirmed).await?;
    assert_eq!((s, e["code"].as_str()), (400, Some("confirmation_required")));
    let end = env.admin.list_offset("orders", 1, ferry_client::OffsetSpec::Latest).await?.log_end_offset;
    assert_eq!(end, 0, "no refused call wrote anything");

    // Produce.
    let w = env.act(produce, body).await?;
    assert_eq!(w["written"], json!({"topic": "orders", "partition": 1, "offset": 0}));
    let page = env.read("/api/v1/clusters/dc1/topics/orders/partitions/1/records?offset=0").await?;
    assert_eq!(page["records"].as_array().unwrap().len(), 1);
    let r = &page["records"][0];
    assert_eq!((r["key"].as_str(), r["value"].as_str()), (Some("k1"), Some("hello")));
    assert_eq!(r["headers"], json!([{"key": "h", "value": "v"}]));

    // An offset reset is refused while the group has a member, and done once it left.
    env.admin
        .commit_offsets(
            "reporting",
            vec![pb::CommittedOffset { topic: "orders".into(), partition: 1, offset: 1, metadata: String::new() }],
        )
        .await?;
    let mut consumer = Consumer::new(
        env.client.clone(),
        ConsumerConfig { group: Some("reporting".into()), ..ConsumerConfig::default() },
    )?;
    consumer.subscribe("reporting", vec!["orders".into()]).await?;
    let reset = "/api/v1/clusters/dc1/groups/reporting/offsets";
    let body = json!({"topic": "orders", "partitions": [1], "to": "earliest", "confirm": true});
    let (s, e) = env.post(reset, Some(OPS), Some(&env.csrf), body.clone()).await?;
    assert_eq!((s, e["code"].as_str()), (409, Some("group_active")), "{e}");
    consumer.close().await?;
    let done = env.act(reset, body).await?;
    assert_eq!(done["offsets"], json!([{"topic": "orders", "partition": 1, "offset": 0}]));
    let committed = env.admin.fetch_committed_offsets("reporting", &[("orders".into(), 1)]).await?;
    assert_eq!(committed.iter().map(|o| o.offset).collect::<Vec<_>>(), vec![0]);

    // A stuck transaction, resolved by the operator: its message becomes visible.
    let txn = Transactions::new(env.client.clone(), "shop");
    txn.prepare("t-1", vec![ProducerRecord::new("orders", "in-txn").with_partition(0)]).await?;
    let list = env.read("/api/v1/clusters/dc1/transactions").await?;
    assert_eq!(list["transactions"][0]["txn_id"], "t-1");
    assert_eq!(list["transactions"][0]["state"], "pending");
    let res = env
        .act(
            "/api/v1/clusters/dc1/transactions/resolve",
            json!({"group": "shop", "txn_id": "t-1", "outcome": "commit", "confirm": true}),
        )
        .await?;
    assert_eq!((res["outcome"].as_str(), res["decided_by"].as_str()), (Some("commit"), Some("operator")), "{res}");
    let page = env.read("/api/v1/clusters/dc1/topics/orders/partitions/0/records?offset=0").await?;
    assert_eq!(page["records"][0]["value"], "in-txn");

    // One audit line per action call, refused or not, naming the caller and never a token.
    let audit = env.audit();
    let got: Vec<(&str, &str, &str, u64)> = audit
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap(),
                a["who"].as_str().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("produce", "unknown", "unauthorized", 401),
            ("produce", "viewer", "forbidden", 403),
            ("produce", "ops", "csrf_required", 403),
            ("produce", "ops", "csrf_required", 403),
            ("produce", "ops", "confirmation_required", 400),
            ("produce", "ops", "ok", 200),
            ("offsets.reset", "ops", "group_active", 409),
            ("offsets.reset", "ops", "ok", 200),
            ("txn.resolve", "ops", "ok", 200),
        ]
    );
    assert_eq!(audit[5]["detail"]["written"], "orders/1/0");
    let text = std::fs::read_to_string(env.console.dir().join("audit.jsonl"))?;
    let logs = env.console.logs();
    for secret in [OPS, VIEWER] {
        assert!(!text.contains(secret) && !logs.contains(secret), "a token is never written");
    }
    Ok(())
}
