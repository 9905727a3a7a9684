//! Mutating calls: the bearer token they need (and the refusal with a hint when none is configured), and the
//! audit log line each one writes.

use std::net::SocketAddr;

use ferry_mirror::events::EventKind;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{Monitor, TOKEN, build_handle, call, get, populate, post, unused_routes};

#[tokio::test]
async fn mutating_calls_need_the_token_and_are_audited() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h.clone(), Some(TOKEN)).await;
    let switch = |route: &str, force: bool| Some(json!({"route": route, "force": force}));

    // No token, wrong token, wrong scheme: 401, nothing changes.
    let a = post(&m, "/api/v1/egress/switch", None, switch("backup", true)).await;
    a.checked("post", "/api/v1/egress/switch");
    a.error(401, "unauthorized");
    post(&m, "/api/v1/egress/switch", Some("not-the-token"), switch("backup", true)).await.error(401, "unauthorized");
    let basic =
        call("POST", &format!("{}/api/v1/topics/orders/pause", m.base), Some(&format!("Basic {TOKEN}")), None).await;
    basic.error(401, "unauthorized");
    assert_eq!(h.egress.active().name, "primary");
    assert!(!h.shared.is_paused("orders"));

    // Right token: unknown route 404, unhealthy route 409 without force, 200 and pinned with force.
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), switch("nowhere", false)).await;
    a.checked("post", "/api/v1/egress/switch");
    assert!(a.error(404, "unknown_route")["reason"].as_str().unwrap().contains("primary, backup"));
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), switch("backup", false)).await;
    a.checked("post", "/api/v1/egress/switch");
    a.error(409, "route_unhealthy");
    assert_eq!(h.egress.active().name, "primary");
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), switch("backup", true)).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let e = a.checked("post", "/api/v1/egress/switch");
    assert_eq!((&e["active"], &e["pinned"]), (&json!("backup"), &json!(true)));
    assert_eq!(h.egress.active().name, "backup");
    let switched = h.events.recent().last().unwrap().clone();
    assert_eq!(switched.kind, EventKind::SourceNetBeSwitched);
    assert_eq!(switched.details.value("from"), "primary");

    // Unpin: automatic switching applies again (no route is healthy, so it stays where it is).
    let a = post(&m, "/api/v1/egress/unpin", Some(TOKEN), None).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.checked("post", "/api/v1/egress/unpin")["pinned"], false);

    // Pause and resume: unknown topic 404; a mirrored one is paused, shown in the status, then resumed.
    let a = post(&m, "/api/v1/topics/nope/pause", Some(TOKEN), None).await;
    a.checked("post", "/api/v1/topics/{topic}/pause");
    a.error(404, "unknown_topic");
    post(&m, "/api/v1/topics/nope/resume", Some(TOKEN), None).await.error(404, "unknown_topic");
    let a = post(&m, "/api/v1/topics/orders/pause", Some(TOKEN), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.checked("post", "/api/v1/topics/{topic}/pause"), json!({"topic": "orders", "paused": true}));
    let s = get(&m, "/api/v1/status").await.checked("get", "/api/v1/status");
    assert_eq!(s["paused_topics"], json!(["orders"]));
    let t = get(&m, "/api/v1/topics").await.checked("get", "/api/v1/topics");
    assert_eq!(t["topics"][0]["paused"], true);
    let a = post(&m, "/api/v1/topics/orders/resume", Some(TOKEN), None).await;
    assert_eq!(a.checked("post", "/api/v1/topics/{topic}/resume"), json!({"topic": "orders", "paused": false}));
    assert!(!h.shared.is_paused("orders"));

    // One more call over a raw socket, so the audited peer can be compared with a known local address.
    let mut tcp = tokio::net::TcpStream::connect(m.addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let req = format!(
        "POST /api/v1/egress/unpin HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n",
        m.addr
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");

    // The audit log: one JSON line per mutating call, in order, with the outcome; never the token.
    let text = std::fs::read_to_string(m.audit_path()).unwrap();
    assert!(!text.contains(TOKEN), "the audit log must not contain the token");
    let lines = m.audit();
    let got: Vec<(String, String, String, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["action"].as_str().unwrap().to_owned(),
                l["path"].as_str().unwrap().to_owned(),
                l["outcome"].as_str().unwrap().to_owned(),
                l["status"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("egress.switch", "/api/v1/egress/switch", "unauthorized", 401),
        ("egress.switch", "/api/v1/egress/switch", "unauthorized", 401),
        ("topic.pause", "/api/v1/topics/orders/pause", "unauthorized", 401),
        ("egress.switch", "/api/v1/egress/switch", "unknown_route", 404),
        ("egress.switch", "/api/v1/egress/switch", "route_unhealthy", 409),
        ("egress.switch", "/api/v1/egress/switch", "ok", 200),
        ("egress.unpin", "/api/v1/egress/unpin", "ok", 200),
        ("topic.pause", "/api/v1/topics/nope/pause", "unknown_topic", 404),
        ("topic.resume", "/api/v1/topics/nope/resume", "unknown_topic", 404),
        ("topic.pause", "/api/v1/topics/orders/pause", "ok", 200),
        ("topic.resume", "/api/v1/topics/orders/resume", "ok", 200),
        ("egress.unpin", "/api/v1/egress/unpin", "ok", 200),
    ];
    let want: Vec<(String, String, String, u64)> =
        want.iter().map(|(a, p, o, s)| ((*a).into(), (*p).into(), (*o).into(), *s)).collect();
    assert_eq!(got, want);
    for l in &lines {
        assert_eq!(l["method"], "POST");
        let peer: SocketAddr = l["peer"].as_str().unwrap().parse().expect("peer is ip:port");
        assert!(peer.ip().is_loopback(), "{peer}");
        assert!(humantime::parse_rfc3339(l["timestamp"].as_str().unwrap()).is_ok(), "{l}");
    }
    assert_eq!(lines.last().unwrap()["peer"], local.to_string());
    assert_eq!(lines[5]["detail"], json!({"route": "backup", "force": true}));
    assert_eq!(lines[9]["detail"], json!({"topic": "orders"}));
    assert_eq!(lines[0]["detail"], Value::Null);
}

#[tokio::test]
async fn without_a_configured_token_every_mutation_is_refused_with_a_hint() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h.clone(), None).await;
    for (path, body) in [
        ("/api/v1/egress/switch", Some(json!({"route": "backup", "force": true}))),
        ("/api/v1/egress/unpin", None),
        ("/api/v1/topics/orders/pause", None),
        ("/api/v1/topics/orders/resume", None),
    ] {
        // Even a request that carries some bearer token.
        let a = post(&m, path, Some(""), body).await;
        let reason = a.error(401, "unauthorized")["reason"].as_str().unwrap().to_owned();
        assert!(reason.contains("FERRY_MONITOR_TOKEN") && reason.contains("monitor.token_file"), "{reason}");
    }
    assert_eq!(h.egress.active().name, "primary");
    assert!(!h.shared.is_paused("orders"));
    assert_eq!(m.audit().len(), 4);
    // Reads need no token.
    assert_eq!(get(&m, "/api/v1/status").await.status, 200);
}
