//! Produce and edit-and-resend with an `Idempotency-Key`: a repeat of a request (its answer was lost) gets the first
//! answer and writes nothing; the key bound to another body, or malformed, is refused.

use ferry_client::OffsetSpec;
use ferry_client::admin::TopicConfig;
use serde_json::{Value, json};

use crate::common::{Env, OPS};

async fn post_keyed(env: &Env, path: &str, key: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
    let r = env
        .http
        .post(env.url(path))
        .bearer_auth(OPS)
        .header("x-ferry-csrf", &env.csrf)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await?;
    Ok((r.status().as_u16(), r.json().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_produce_or_resend_with_its_idempotency_key_writes_once() -> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("orders", 1, TopicConfig::default(), None).await?;
    let end = async || anyhow::Ok(env.admin.list_offset("orders", 0, OffsetSpec::Latest).await?.log_end_offset);
    let produce = "/api/v1/clusters/dc1/produce";
    let body = json!({"topic": "orders", "partition": 0, "key": "k", "value": "v1", "confirm": true});
    let first = json!({"written": {"topic": "orders", "partition": 0, "offset": 0}});

    assert_eq!(post_keyed(&env, produce, "key-1", &body).await?, (200, first.clone()));
    assert_eq!(post_keyed(&env, produce, "key-1", &body).await?, (200, first.clone()), "the repeat answers the first");
    assert_eq!(end().await?, 1, "the repeat wrote nothing");
    let mut other = body.clone();
    other["value"] = json!("v2");
    let (s, e) = post_keyed(&env, produce, "key-1", &other).await?;
    assert_eq!((s, e["code"].as_str()), (409, Some("idempotency_key_reused")), "{e}");
    let (s, e) = post_keyed(&env, produce, "a key with spaces", &body).await?;
    assert_eq!((s, e["code"].as_str()), (400, Some("bad_request")), "{e}");
    assert!(e["reason"].as_str().unwrap_or_default().contains("idempotency-key"), "{e}");
    assert_eq!(end().await?, 1);
    let (s, w) = post_keyed(&env, produce, "key-2", &other).await?;
    assert_eq!((s, &w["written"]["offset"]), (200, &json!(1)));

    // Edit and resend, twice with one key: one new record.
    let resend = "/api/v1/clusters/dc1/resend";
    let edit = json!({"topic": "orders", "partition": 0, "offset": 0, "value": "v1-fixed", "confirm": true});
    let (s, w) = post_keyed(&env, resend, "edit-1", &edit).await?;
    assert_eq!((s, &w["written"]), (200, &json!({"topic": "orders", "partition": 0, "offset": 2})), "{w}");
    assert_eq!(post_keyed(&env, resend, "edit-1", &edit).await?, (200, w.clone()));
    assert_eq!(end().await?, 3);
    let page = env.read("/api/v1/clusters/dc1/topics/orders/partitions/0/records?offset=0").await?;
    let values: Vec<&str> = page["records"].as_array().unwrap().iter().map(|r| r["value"].as_str().unwrap()).collect();
    assert_eq!(values, vec!["v1", "v2", "v1-fixed"]);

    // Every request is audited; the repeats say they were replayed.
    let acts: Vec<(String, String, bool)> = env
        .audit()
        .iter()
        .map(|a| {
            let action = a["action"].as_str().unwrap().to_owned();
            (action, a["outcome"].as_str().unwrap().to_owned(), a["detail"]["replayed"] == json!(true))
        })
        .collect();
    let want: Vec<(String, String, bool)> = [
        ("produce", "ok", false),
        ("produce", "ok", true),
        ("produce", "idempotency_key_reused", false),
        ("produce", "bad_request", false),
        ("produce", "ok", false),
        ("resend", "ok", false),
        ("resend", "ok", true),
    ]
    .iter()
    .map(|&(a, o, r)| (a.to_owned(), o.to_owned(), r))
    .collect();
    assert_eq!(acts, want);
    Ok(())
}
