//! The server's life: readiness against a real broker, HTTPS with the configured certificate, shutdown and a
//! taken port, and the bootstrap that writes the bound address.

use std::net::SocketAddr;
use std::time::Duration;

use ferry_mirror::config::{MonitorConfig, Secret};
use ferry_mirror::state::PartitionState;
use ferry_mirror::{MirrorConfig, RunOptions, monitor};
use ferry_testkit::{deadline, reserve_ports, wait_until};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::harness::{
    Monitor, PROBE_INTERVAL, TOKEN, add_partition, build_handle, client, get, populate, post, source_config,
    unused_routes,
};

#[tokio::test]
async fn readyz_is_200_on_a_healthy_route_and_503_when_a_partition_halts() {
    // A real broker, so the egress probes (gRPC health + metadata, cluster id check) pass.
    let broker = ferry_testkit::BrokerProcess::builder().cluster_id("dc-a").start().await.unwrap_or_else(|e| {
        panic!("cannot start ferry-broker ({e}); build the binaries first: cargo build --workspace --bins")
    });
    let addr = broker.addr().to_string();
    let source = source_config(&[("primary", addr.clone()), ("backup", addr)], Some("dc-a"));
    let h = build_handle(&source);
    h.shared.topics.lock().insert("orders".into(), "orders".into());
    let p0 = add_partition(&h, "orders", 0, (0, 10), 10, 10, 10, PartitionState::Mirroring);
    add_partition(&h, "orders", 1, (0, 5), 3, 3, 3, PartitionState::Mirroring);
    let stop = CancellationToken::new();
    let probes = tokio::spawn(h.egress.clone().run(h.metrics.clone(), stop.clone()));
    let m = Monitor::start(h.clone(), Some(TOKEN)).await;

    let within = deadline(&[PROBE_INTERVAL, Duration::from_millis(500)]);
    let mut last = None;
    wait_until("both routes to pass their probes", within.max(Duration::from_secs(10)), async || {
        let v = h.egress.view();
        let ok = v.routes.iter().all(|r| r.healthy);
        last = Some(v);
        ok
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {last:?}"));

    let a = get(&m, "/readyz").await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.checked("get", "/readyz"), json!({"ready": true, "reasons": [], "details": []}));

    // A switch to a healthy route needs no force; it pins.
    let a = post(&m, "/api/v1/egress/switch", Some(TOKEN), Some(json!({"route": "backup"}))).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let e = a.checked("post", "/api/v1/egress/switch");
    assert_eq!((&e["active"], &e["pinned"]), (&json!("backup"), &json!(true)));
    assert_eq!(e["routes"][1]["cluster_id"], "dc-a");

    p0.halt("diverged at offset 7");
    let a = get(&m, "/readyz").await;
    assert_eq!(a.status, 503);
    let r = a.checked("get", "/readyz");
    assert_eq!(r["reasons"], json!(["partition_halted"]));
    assert_eq!(r["details"][0]["message"], "partition orders/0 is halted: diverged at offset 7");

    p0.set_state(PartitionState::Mirroring);
    h.target_health.failure(&h.events, "connection refused");
    h.target_health.failure(&h.events, "connection refused");
    h.target_health.failure(&h.events, "connection refused");
    let a = get(&m, "/readyz").await;
    assert_eq!((a.status, &a.checked("get", "/readyz")["reasons"]), (503, &json!(["target_down"])));
    assert_eq!(get(&m, "/api/v1/status").await.checked("get", "/api/v1/status")["target_down"], true);

    stop.cancel();
    probes.await.unwrap();
}

#[tokio::test]
async fn tls_serves_https_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let h = build_handle(&unused_routes());
    populate(&h);
    let config = MonitorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token_file: None,
        token: Some(Secret::new(TOKEN)),
        tls: Some((cert_path.clone(), key_path.clone())),
        audit_log: None,
    };
    let shutdown = CancellationToken::new();
    let (addr, task) = monitor::start(h.clone(), &config, shutdown.clone()).await.unwrap();

    let trusted = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let r = trusted.get(format!("https://{addr}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    let r = trusted.post(format!("https://{addr}/api/v1/topics/orders/pause")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(h.shared.is_paused("orders"));

    // Plain HTTP to the TLS port gets no HTTP answer; an untrusted certificate is refused by the client.
    assert!(client().get(format!("http://{addr}/healthz")).send().await.is_err());
    assert!(client().get(format!("https://{addr}/healthz")).send().await.is_err());

    // Bad files: a clear error naming the file.
    let bad = MonitorConfig { tls: Some((key_path.clone(), key_path.clone())), ..config.clone() };
    let e = monitor::start(h.clone(), &bad, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(e.contains("key.pem") && e.contains("BEGIN CERTIFICATE"), "{e}");
    let missing = MonitorConfig { tls: Some((dir.path().join("none.pem"), key_path)), ..config };
    let e = monitor::start(h, &missing, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(e.contains("none.pem"), "{e}");

    shutdown.cancel();
    tokio::time::timeout(monitor::SHUTDOWN_GRACE * 3, task).await.expect("the server stops on shutdown").unwrap();
}

#[tokio::test]
async fn server_stops_on_shutdown_and_a_taken_port_is_a_clear_error() {
    let h = build_handle(&unused_routes());
    let m = Monitor::start(h.clone(), Some(TOKEN)).await;
    assert_eq!(get(&m, "/healthz").await.status, 200);

    let taken = MonitorConfig { listen: m.addr, token_file: None, token: None, tls: None, audit_log: None };
    let e = monitor::start(h, &taken, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(e.contains(&m.addr.to_string()) && e.contains("monitor.listen"), "{e}");

    m.shutdown.cancel();
    tokio::time::timeout(monitor::SHUTDOWN_GRACE * 3, m.task).await.expect("the server stops on shutdown").unwrap();
    assert!(client().get(format!("{}/healthz", m.base)).send().await.is_err(), "still serving after shutdown");
}

#[tokio::test]
async fn bootstrap_writes_the_bound_monitor_address_and_serves_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let [source, target] = reserve_ports::<2>().unwrap();
    let config = MirrorConfig::from_toml(
        &format!(
            "[source]\ncluster = \"dc-a\"\n[[source.routes]]\nname = \"primary\"\nbrokers = [\"127.0.0.1:{source}\"]\n\
             [target]\ncluster = \"dc-b\"\nbrokers = [\"127.0.0.1:{target}\"]\n[topics]\ninclude = [\"^orders$\"]\n\
             [monitor]\nlisten = \"127.0.0.1:0\"\naudit_log = \"{}\"\n",
            dir.path().join("audit.log").display()
        ),
        false,
    )
    .unwrap();
    let addr_file = dir.path().join("addr");
    let shutdown = CancellationToken::new();
    let options = RunOptions { addr_file: Some(addr_file.clone()), ..Default::default() };
    let run = tokio::spawn(ferry_mirror::run(config, options, shutdown.clone()));

    let mut addr: Option<SocketAddr> = None;
    wait_until("the monitor address file", Duration::from_secs(30), async || {
        addr = std::fs::read_to_string(&addr_file).ok().and_then(|s| s.trim().parse().ok());
        addr.is_some()
    })
    .await
    .unwrap();
    let addr = addr.unwrap();
    assert_ne!(addr.port(), 0, "the bound port, not the configured 0");
    let r = client().get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Neither side is reachable: not ready, because the route is unhealthy.
    let r = client().get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), run).await.expect("run returns after shutdown");
    result.unwrap().unwrap();
    assert!(client().get(format!("http://{addr}/healthz")).send().await.is_err(), "monitor still serving");
}
