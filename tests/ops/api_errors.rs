//! Issue 6: every monitor endpoint's auth and error cases against the real process. Every POST answers 401
//! (`unauthorized`, `WWW-Authenticate: Bearer`) without the token, with a wrong one, or with another scheme, and
//! changes nothing; unknown routes, topics and paths are 404 with their stable codes; a switch to an unhealthy
//! route is 409 without force and done with it; malformed bodies are 400; every mutating call leaves one audit
//! record, and the token appears in no log. ferryctl reports the same refusals.

use ferry_testkit::{Proxy, wait_until};
use reqwest::Method;
use serde_json::Value;

use crate::common::*;
use crate::support::*;

const TOPIC: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refuses_bad_auth_and_answers_stable_error_codes() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    produce(&a, TOPIC, "api", 500, 64).await?;
    // The backup route leads nowhere: its proxy resets every connection.
    let dead = Proxy::start(a.broker.addr()).await?;
    dead.cut();
    let mut conf = OpsConf::new(&a, &b);
    conf.routes.push(Route::new("backup", dead.addr()));
    conf.audit_log = Some("audit.log".into());
    let mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let limit = conf.health.reaction();
    wait_until("the backup probed unhealthy", limit, async || -> anyhow::Result<bool> {
        let e = egress(&mirror).await?;
        Ok(route(&e, "backup")["last_error"].is_string() && route(&e, "primary")["healthy"] == true)
    })
    .await?;

    // Every mutating endpoint: no token, a wrong token, the right token under another scheme.
    let posts: [(&str, Option<&str>); 5] = [
        ("/api/v1/egress/switch", Some(r#"{"route":"primary"}"#)),
        ("/api/v1/egress/unpin", None),
        ("/api/v1/topics/orders/pause", None),
        ("/api/v1/topics/orders/resume", None),
        ("/api/v1/topics/nope/pause", None),
    ];
    let basic = format!("Basic {TOKEN}");
    let mut refused = 0;
    for (path, body) in posts {
        for auth in [Auth::None, Auth::Bearer("wrong-token"), Auth::Bearer(""), Auth::Header(&basic)] {
            let a = post(&mirror, path, auth, body).await?;
            assert_eq!((a.status, a.code()), (401, "unauthorized"), "POST {path} {auth:?}: {:?}", a.body);
            assert_eq!(a.www_authenticate.as_deref(), Some("Bearer"), "POST {path} {auth:?}");
            assert!(!a.body.to_string().contains(TOKEN), "no token in answers");
            refused += 1;
        }
    }
    // Nothing changed.
    let e = egress(&mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"primary".into(), &false.into()), "{e}");
    let status = get_json(&mirror, "/api/v1/status").await?;
    assert_eq!(status["paused_topics"], serde_json::json!([]), "{status}");

    // Reads need no token; unknown things are 404 with their codes; a wrong method is 405.
    for path in [
        "/healthz",
        "/readyz",
        "/api/v1/status",
        "/api/v1/partitions",
        "/api/v1/topics",
        "/api/v1/egress",
        "/api/v1/events",
    ] {
        let a = call(&mirror, Method::GET, path, Auth::None, None).await?;
        assert_eq!(a.status, 200, "GET {path}: {:?}", a.body);
    }
    let cases: [(Method, &str, u16, &str); 5] = [
        (Method::GET, "/api/v1/partitions?topic=nope", 404, "unknown_topic"),
        (Method::GET, "/api/v1/nope", 404, "not_found"),
        (Method::GET, "/nope", 404, "not_found"),
        (Method::GET, "/api/v1/egress/switch", 405, "method_not_allowed"),
        (Method::GET, "/api/v1/events?limit=lots", 400, "bad_request"),
    ];
    for (method, path, status, code) in cases {
        let a = call(&mirror, method.clone(), path, Auth::None, None).await?;
        assert_eq!((a.status, a.code()), (status, code), "{method} {path}: {:?}", a.body);
        assert!(a.body["reason"].as_str().is_some_and(|r| !r.is_empty()), "{:?}", a.body);
    }
    let token = Auth::Bearer(TOKEN);
    let with_token: [(&str, Option<&str>, u16, &str); 7] = [
        ("/api/v1/egress/switch", Some(r#"{"route":"nowhere"}"#), 404, "unknown_route"),
        ("/api/v1/egress/switch", Some(r#"{"route":"backup"}"#), 409, "route_unhealthy"),
        ("/api/v1/egress/switch", Some(r#"{"route":"backup","force":false}"#), 409, "route_unhealthy"),
        ("/api/v1/egress/switch", Some(r#"{"route":"primary","hurry":true}"#), 400, "bad_request"),
        ("/api/v1/egress/switch", Some("{not json"), 400, "bad_request"),
        ("/api/v1/topics/nope/pause", None, 404, "unknown_topic"),
        ("/api/v1/topics/nope/resume", None, 404, "unknown_topic"),
    ];
    for (path, body, status, code) in with_token {
        let a = post(&mirror, path, token, body).await?;
        assert_eq!((a.status, a.code()), (status, code), "POST {path} {body:?}: {:?}", a.body);
    }
    let unhealthy = post(&mirror, "/api/v1/egress/switch", token, Some(r#"{"route":"backup"}"#)).await?;
    assert!(
        unhealthy.body["reason"].as_str().is_some_and(|r| r.contains("backup") && r.contains("force")),
        "{:?}",
        unhealthy.body
    );
    let e = egress(&mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"primary".into(), &false.into()), "refusals change nothing: {e}");

    // ferryctl: the same refusals, as exit code 1 and one sentence.
    let monitor = mirror.addr().to_string();
    let out = ferryctl(&["--monitor", &monitor, "mirror", "egress", "switch", "primary"]).await?;
    assert_eq!(out.code, 1, "no token: {}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("needs a token"), "{}", out.stderr);
    let out =
        ferryctl(&["--monitor", &monitor, "--token", "wrong-token", "mirror", "egress", "switch", "primary"]).await?;
    assert_eq!(out.code, 1, "wrong token: {}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("rejected the token"), "{}", out.stderr);
    let out = ferryctl(&["--monitor", &monitor, "--token", TOKEN, "mirror", "egress", "switch", "backup"]).await?;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("route_unhealthy") || out.stderr.contains("unhealthy"), "{}", out.stderr);
    let out = ferryctl(&["--monitor", &monitor, "--token", TOKEN, "mirror", "pause", "nope"]).await?;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);

    // Forced, the unhealthy route is taken and pinned; then back to the primary, and unpinned.
    let forced = post(&mirror, "/api/v1/egress/switch", token, Some(r#"{"route":"backup","force":true}"#)).await?;
    assert_eq!(forced.status, 200, "{:?}", forced.body);
    assert_eq!((&forced.body["active"], &forced.body["pinned"]), (&"backup".into(), &true.into()));
    let back = post(&mirror, "/api/v1/egress/switch", token, Some(r#"{"route":"primary"}"#)).await?;
    assert_eq!((&back.body["active"], &back.body["pinned"]), (&"primary".into(), &true.into()), "{:?}", back.body);
    let unpinned = post(&mirror, "/api/v1/egress/unpin", token, None).await?;
    assert_eq!((unpinned.status, &unpinned.body["pinned"]), (200, &false.into()), "{:?}", unpinned.body);
    let paused = post(&mirror, "/api/v1/topics/orders/pause", token, None).await?;
    assert_eq!((paused.status, &paused.body), (200, &serde_json::json!({"topic": "orders", "paused": true})));
    let resumed = post(&mirror, "/api/v1/topics/orders/resume", token, None).await?;
    assert_eq!((resumed.status, &resumed.body), (200, &serde_json::json!({"topic": "orders", "paused": false})));

    // The mirror still works after all that.
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "api", 500, 700, 64).await?;
    p.close().await;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;

    // One audit record per mutating call, refused or not; the token in none of them, nor in the mirror's log.
    let audit = std::fs::read_to_string(audit_path(&mirror, "audit.log"))?;
    let records: Vec<Value> = audit.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let outcomes = |o: &str| records.iter().filter(|r| r["outcome"] == o).count();
    // ferryctl's two calls without and with a wrong token are two more refusals; its switch to the backup one
    // more 409.
    assert_eq!(outcomes("unauthorized"), refused + 2, "{audit}");
    assert_eq!(outcomes("unknown_route"), 1, "{audit}");
    assert_eq!(outcomes("route_unhealthy"), 4, "{audit}");
    assert_eq!(outcomes("bad_request"), 2, "{audit}");
    assert_eq!(outcomes("unknown_topic"), 3, "{audit}");
    assert_eq!(outcomes("ok"), 5, "{audit}");
    let forced_record = records.iter().find(|r| r["detail"]["force"] == true).expect("the forced switch is audited");
    assert_eq!((&forced_record["action"], &forced_record["status"]), (&"egress.switch".into(), &200.into()));
    assert!(!audit.contains(TOKEN), "the token is never audited");
    assert!(!mirror.logs().contains(TOKEN), "the token is never logged");
    Ok(())
}
