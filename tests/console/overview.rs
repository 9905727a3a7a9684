//! The overview's one pane for a DC pair (a mirror monitor's state, lag and worst RPO; an unreachable one said so)
//! and the topics list's pages.

use ferry_client::admin::TopicConfig;
use serde_json::json;

use crate::common::Env;

/// A stand-in mirror monitor answering `GET /api/v1/status` with the monitor's shape.
async fn fake_monitor() -> anyhow::Result<std::net::SocketAddr> {
    let status = json!({"mirror": "dc-a_to_dc-b", "active_route": "primary", "target_down": false,
        "totals": {"lag": 1234, "rpo_max_seconds": 2.5, "partitions_by_state": {"mirroring": 4}}});
    let app =
        axum::Router::new().route("/api/v1/status", axum::routing::get(move || async move { axum::Json(status) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_each_mirror_and_the_topics_list_pages() -> anyhow::Result<()> {
    let monitor = fake_monitor().await?;
    let closed = ferry_testkit::reserve_port()?;
    let extra = format!(
        "[[mirrors]]\nname = \"ab\"\nurl = \"http://{monitor}\"\n[[mirrors]]\nname = \"gone\"\nurl = \"http://127.0.0.1:{closed}\"\n"
    );
    let env = Env::start_with("", &extra).await?;
    for i in 0..105 {
        env.admin.create_topic(&format!("t{i:03}"), 1 + (i % 3), TopicConfig::default(), None).await?;
    }
    let o = env.read("/api/v1/clusters/dc1/overview").await?;
    assert_eq!(o["topics"], 105);
    assert_eq!(o["partitions"], (0..105u32).map(|i| 1 + i % 3).sum::<u32>());
    assert_eq!(o["mirrors"][0]["name"], "ab");
    assert_eq!(o["mirrors"][0]["reachable"], true);
    assert_eq!((o["mirrors"][0]["lag"].as_u64(), o["mirrors"][0]["rpo_max_seconds"].as_f64()), (Some(1234), Some(2.5)));
    assert_eq!(o["mirrors"][0]["partitions_by_state"], json!({"mirroring": 4}));
    assert_eq!((o["mirrors"][1]["name"].as_str(), o["mirrors"][1]["reachable"].as_bool()), (Some("gone"), Some(false)));

    let names = |v: &serde_json::Value| {
        v["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    let first = env.read("/api/v1/clusters/dc1/topics").await?;
    assert_eq!(first["total"], 105);
    assert_eq!(names(&first), (0..100).map(|i| format!("t{i:03}")).collect::<Vec<_>>());
    let second = env.read("/api/v1/clusters/dc1/topics?offset=100").await?;
    assert_eq!(names(&second), (100..105).map(|i| format!("t{i:03}")).collect::<Vec<_>>());
    let some = env.read("/api/v1/clusters/dc1/topics?q=t10").await?;
    assert_eq!(names(&some), (100..105).map(|i| format!("t{i:03}")).collect::<Vec<_>>());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broker_is_a_502_and_the_console_serves_again_once_it_is_back() -> anyhow::Result<()> {
    let mut env = Env::start().await?;
    env.admin.create_topic("orders", 1, TopicConfig::default(), None).await?;
    env.act("/api/v1/clusters/dc1/produce", json!({"topic": "orders", "value": "before", "confirm": true})).await?;
    env.broker.kill9().await?;
    let (status, e) =
        env.get("/api/v1/clusters/dc1/topics/orders/partitions/0/records?offset=0", Some(crate::common::OPS)).await?;
    assert_eq!((status, e["code"].as_str()), (502, Some("broker_unavailable")), "{e}");
    let (status, e) = env
        .post(
            "/api/v1/clusters/dc1/produce",
            Some(crate::common::OPS),
            Some(&env.csrf),
            json!({"topic": "orders", "value": "lost", "confirm": true}),
        )
        .await?;
    assert_eq!((status, e["code"].as_str()), (502, Some("broker_unavailable")), "{e}");
    let health = env.http.get(env.url("/healthz")).send().await?;
    assert_eq!(health.status(), 200, "the console itself stays up");
    env.broker.restart().await?;
    let page = ferry_testkit::wait_for("the console reads again", crate::common::IO_BUDGET, async || {
        let (status, v) = env
            .get("/api/v1/clusters/dc1/topics/orders/partitions/0/records?offset=0", Some(crate::common::OPS))
            .await?;
        anyhow::Ok((status == 200).then_some(v))
    })
    .await?;
    let values: Vec<&str> = page["records"].as_array().unwrap().iter().map(|r| r["value"].as_str().unwrap()).collect();
    assert_eq!(values, ["before"], "the refused produce wrote nothing");
    let outcomes: Vec<String> = env.audit().iter().map(|a| a["outcome"].as_str().unwrap().to_owned()).collect();
    assert_eq!(outcomes, ["ok", "broker_unavailable"]);
    Ok(())
}
