//! The read endpoints with exact values, the `{code, reason}` shape of every error, and the OpenAPI document
//! against the routes the server serves.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::harness::{
    API, Monitor, TOKEN, build_handle, call, expected_partitions, get, populate, post, rpo_checked, set_meter_second,
    unused_routes,
};

#[tokio::test]
async fn read_endpoints_report_the_exact_state() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;

    let a = get(&m, "/healthz").await;
    assert_eq!((a.status, a.checked("get", "/healthz")), (200, json!({"status": "ok"})));

    // Partitions: exact offsets, lag = source - cache, sorted by topic and partition.
    let a = get(&m, "/api/v1/partitions").await;
    assert_eq!(a.status, 200);
    assert_eq!(rpo_checked(a.checked("get", "/api/v1/partitions")), json!({"partitions": expected_partitions()}));
    let a = get(&m, "/api/v1/partitions?topic=payments").await;
    assert_eq!(rpo_checked(a.checked("get", "/api/v1/partitions")), json!({"partitions": [expected_partitions()[3]]}));
    let a = get(&m, "/api/v1/partitions?topic=nope").await;
    a.checked("get", "/api/v1/partitions");
    assert!(a.error(404, "unknown_topic")["reason"].as_str().unwrap().contains("\"nope\""));

    // Topics: sums per source topic and the state summary.
    let a = get(&m, "/api/v1/topics").await;
    assert_eq!(a.status, 200);
    let states = |st: u64, mi: u64, sl: u64, pa: u64, ha: u64| json!({"starting": st, "mirroring": mi, "stalled": sl, "paused": pa, "halted": ha});
    assert_eq!(
        rpo_checked(a.checked("get", "/api/v1/topics")),
        json!({"topics": [
            {"topic": "orders", "target_topic": "orders", "partitions": 3, "lag": 600, "rpo_max_seconds": 0.0,
             "source_offset": 3300, "cache_offset": 2700, "commit_offset": 2550, "target_offset": 2700,
             "states": states(0, 2, 0, 1, 0), "paused": false},
            {"topic": "payments", "target_topic": "payments", "partitions": 1, "lag": 30, "rpo_max_seconds": 0.0,
             "source_offset": 50, "cache_offset": 20, "commit_offset": 20, "target_offset": 20,
             "states": states(0, 0, 0, 0, 1), "paused": false},
        ]})
    );

    // Status: identity, route, totals; rates once the second of the additions is complete.
    let a = get(&m, "/api/v1/status").await;
    assert_eq!(a.status, 200);
    let s = rpo_checked(a.checked("get", "/api/v1/status"));
    assert_eq!(
        (&s["mirror"], &s["source_cluster"], &s["target_cluster"], &s["active_route"], &s["pinned"]),
        (&json!("dc-a_to_dc-b"), &json!("dc-a"), &json!("dc-b"), &json!("primary"), &json!(false))
    );
    assert_eq!(s["target_down"], false);
    assert_eq!(
        s["totals"],
        json!({"records_in": 600, "bytes_in": 60000, "records_out": 540, "bytes_out": 54000, "topics": 2,
               "partitions": 4, "partitions_by_state": states(0, 2, 0, 1, 1), "lag": 630, "rpo_max_seconds": 0.0})
    );
    assert_eq!(s["paused_topics"], json!([]));
    // The meters count complete seconds only; the second of the additions is complete (`populate`).
    assert_eq!(
        s["rates"],
        json!({
            "source": {"records_per_sec": {"1s": 600.0, "10s": 60.0, "60s": 10.0},
                       "bytes_per_sec": {"1s": 60000.0, "10s": 6000.0, "60s": 1000.0}},
            "target": {"records_per_sec": {"1s": 540.0, "10s": 54.0, "60s": 9.0},
                       "bytes_per_sec": {"1s": 54000.0, "10s": 5400.0, "60s": 900.0}},
        })
    );
    // A second later the 1 s window is empty and the longer ones still hold the records.
    set_meter_second(&m.handle, 2);
    let s = get(&m, "/api/v1/status").await.checked("get", "/api/v1/status");
    assert_eq!(s["rates"]["source"]["records_per_sec"], json!({"1s": 0.0, "10s": 60.0, "60s": 10.0}));
    assert_eq!(s["rates"]["target"]["bytes_per_sec"], json!({"1s": 0.0, "10s": 5400.0, "60s": 900.0}));

    // Egress: both routes, never probed, the first active.
    let a = get(&m, "/api/v1/egress").await;
    assert_eq!(a.status, 200);
    let e = a.checked("get", "/api/v1/egress");
    assert_eq!(
        (&e["active"], &e["pinned"], &e["expected_cluster_id"]),
        (&json!("primary"), &json!(false), &json!("dc-a"))
    );
    let names: Vec<(&Value, &Value, &Value)> =
        e["routes"].as_array().unwrap().iter().map(|r| (&r["name"], &r["active"], &r["healthy"])).collect();
    assert_eq!(
        names,
        [(&json!("primary"), &json!(true), &json!(false)), (&json!("backup"), &json!(false), &json!(false))]
    );

    // Events: newest first, with the severity of the shipped rules; limit applies.
    let a = get(&m, "/api/v1/events").await;
    assert_eq!(a.status, 200);
    let ev = a.checked("get", "/api/v1/events");
    let kinds: Vec<&Value> = ev["events"].as_array().unwrap().iter().map(|e| &e["kind"]).collect();
    assert_eq!(kinds, [&json!("partition_diverged"), &json!("add_topic")]);
    assert_eq!(ev["events"][0]["severity"], "critical");
    assert_eq!((&ev["events"][0]["topic"], &ev["events"][0]["partition"]), (&json!("payments"), &json!(0)));
    assert_eq!(
        ev["events"][0]["details"],
        json!({"offset": 20, "cache_offset": 25, "reason": "the target holds different data", "policy": "halt"})
    );
    let a = get(&m, "/api/v1/events?limit=1").await;
    assert_eq!(a.checked("get", "/api/v1/events")["events"].as_array().unwrap().len(), 1);
    let a = get(&m, "/api/v1/events?limit=lots").await;
    a.checked("get", "/api/v1/events");
    a.error(400, "bad_request");

    // Readiness: the route was never probed healthy and payments/0 is halted.
    let a = get(&m, "/readyz").await;
    assert_eq!(a.status, 503);
    let r = a.checked("get", "/readyz");
    assert_eq!(r["ready"], false);
    assert_eq!(r["reasons"], json!(["partition_halted", "route_unhealthy"]));
    let halted = r["details"].as_array().unwrap().iter().find(|d| d["reason"] == "partition_halted").unwrap();
    assert_eq!((&halted["topic"], &halted["partition"]), (&json!("payments"), &json!(0)));

    // The dashboard is the compiled-in page with the ids the browser test reads.
    let a = get(&m, "/").await;
    assert_eq!(a.status, 200);
    API.check_media("get", "/", 200, &a.content_type);
    for id in ["source-rate", "target-rate", "total-lag", "active-route", "rate-chart", "partitions", "events"] {
        assert!(a.text.contains(&format!("id=\"{id}\"")), "dashboard lacks id {id}");
    }
}

#[tokio::test]
async fn every_error_has_the_code_and_reason_shape() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;

    let a = get(&m, "/api/v2/nothing").await;
    assert!(a.error(404, "not_found")["reason"].as_str().unwrap().contains("/api/v2/nothing"));
    get(&m, "/api/v1/topics/orders").await.error(404, "not_found");
    // Wrong method on a known path, read or write.
    call("DELETE", &format!("{}/healthz", m.base), None, None).await.error(405, "method_not_allowed");
    get(&m, "/api/v1/egress/switch").await.error(405, "method_not_allowed");
    post(&m, "/api/v1/status", Some(TOKEN), None).await.error(405, "method_not_allowed");

    // Oversized body: 413 (after the token check), and nothing switched.
    let big = json!({"route": "x".repeat(20 * 1024), "force": true});
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), Some(big)).await;
    a.checked("post", "/api/v1/egress/switch");
    assert!(a.error(413, "payload_too_large")["reason"].as_str().unwrap().contains("16384"));

    // Malformed bodies: 400.
    for body in ["{\"route\": ", "{\"route\": 5}", "{\"route\": \"backup\", \"forse\": true}", ""] {
        let a = call(
            "POST",
            &format!("{}/api/v1/egress/switch", m.base),
            Some(&format!("Bearer {TOKEN}")),
            Some(body.to_owned()),
        )
        .await;
        a.checked("post", "/api/v1/egress/switch");
        a.error(400, "bad_request");
    }
    let outcomes: Vec<Value> = m.audit().iter().map(|l| l["outcome"].clone()).collect();
    assert_eq!(
        outcomes,
        [
            json!("payload_too_large"),
            json!("bad_request"),
            json!("bad_request"),
            json!("bad_request"),
            json!("bad_request")
        ]
    );
    assert_eq!(m.handle.egress.active().name, "primary");
}

#[tokio::test]
async fn openapi_documents_exactly_the_served_endpoints() {
    let served: BTreeSet<(String, String)> = [
        ("get", "/"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/api/v1/status"),
        ("get", "/api/v1/partitions"),
        ("get", "/api/v1/topics"),
        ("get", "/api/v1/egress"),
        ("get", "/api/v1/events"),
        ("post", "/api/v1/egress/switch"),
        ("post", "/api/v1/egress/unpin"),
        ("post", "/api/v1/topics/{topic}/pause"),
        ("post", "/api/v1/topics/{topic}/resume"),
        ("get", "/api/v1/failover"),
        ("post", "/api/v1/failover"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    let documented: BTreeSet<(String, String)> = API.operations().into_iter().collect();
    assert_eq!(documented, served);

    // Every documented path answers (no 404 not_found), so the list above is the router's.
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;
    for (method, path) in &served {
        let path = path.replace("{topic}", "orders");
        let a = call(&method.to_uppercase(), &format!("{}{path}", m.base), None, None).await;
        assert!(a.status != 404 && a.status != 405, "{method} {path}: {} {}", a.status, a.text);
    }

    // Every error code of the implementation is in the documented enum.
    let codes = [
        "bad_request",
        "unauthorized",
        "not_found",
        "unknown_route",
        "unknown_topic",
        "method_not_allowed",
        "route_unhealthy",
        "payload_too_large",
        "failover_refused",
        "unavailable",
    ];
    for code in codes {
        API.check_component("Error", &json!({"code": code, "reason": "r"}));
    }
}
