//! `ferryctl mirror ...` against a real `ferry-mirror` between two real brokers (ferry-testkit): the JSON of status,
//! partitions and egress, the text tables, the sentences and exit codes of refused calls (unknown route, unhealthy
//! route, wrong or missing token, unknown topic), pause and resume as the partitions show them, `--watch`, `mirror
//! verify` of what the mirror copied, and `topic promote --all-from` with the monitor's report.
//!
//! Needs `cargo build -p ferry-broker -p ferry-mirror -p ferryctl --bins`.

mod common;

use std::time::Duration;

use common::{client, ferryctl, produce};
use ferry_client::Admin;
use ferry_client::admin::TopicConfig;
use ferry_testkit::{
    BrokerProcess, ChildProcess, ChildSpec, MirrorProcess, Signal, deadline, init_tracing, reserve_port, wait_until,
};
use serde_json::Value;

const TOKEN: &str = "s3cret-token";

/// The mirror's configured intervals: discovery, route checks and commits every second.
const INTERVAL: Duration = Duration::from_secs(1);

struct Setup {
    source: BrokerProcess,
    target: BrokerProcess,
    mirror: MirrorProcess,
    dead: String,
}

/// dc-a with "orders" (2 partitions x 30 records), dc-b, and the mirror between them with a second route
/// ("backup") to an address where nothing listens; waits until both partitions are copied and their offsets
/// committed (commit_interval 1 s).
async fn setup() -> Setup {
    init_tracing();
    let source = BrokerProcess::builder().cluster_id("dc-a").start().await.unwrap();
    let target = BrokerProcess::builder().cluster_id("dc-b").start().await.unwrap();
    let src = client(source.addr());
    Admin::new(src.clone()).create_topic("orders", 2, TopicConfig::default(), None).await.unwrap();
    assert_eq!(produce(&src, "orders", 2, 3, 10).await, 30);
    let dead = format!("127.0.0.1:{}", reserve_port().unwrap());
    let config = format!(
        "[mirror]\nname = \"a_to_b\"\n\
         [source]\ncluster = \"dc-a\"\n\
         [[source.routes]]\nname = \"primary\"\nbrokers = [\"{}\"]\n\
         [[source.routes]]\nname = \"backup\"\nbrokers = [\"{dead}\"]\n\
         [source.health]\ncheck_interval = \"1s\"\ntimeout = \"1s\"\n\
         [target]\ncluster = \"dc-b\"\nbrokers = [\"{}\"]\n\
         [topics]\ninclude = [\"^orders$\"]\ndiscovery_interval = \"1s\"\n\
         [sync]\ncommit_interval = \"1s\"\n\
         [monitor]\nlisten = \"127.0.0.1:0\"\n",
        source.addr(),
        target.addr()
    );
    let mirror = MirrorProcess::builder(config).env("FERRY_MONITOR_TOKEN", TOKEN).start().await.unwrap();
    let url = format!("{}/api/v1/partitions", mirror.monitor_url());
    wait_until("the mirror to copy and commit both partitions", deadline(&[INTERVAL * 10]), async || {
        let doc: Value = reqwest::get(&url).await?.json().await?;
        let parts = doc["partitions"].as_array().cloned().unwrap_or_default();
        Ok::<bool, reqwest::Error>(
            parts.len() == 2
                && parts.iter().all(|p| p["target_offset"] == 30 && p["lag"] == 0 && p["commit_offset"] == 30),
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", mirror.logs()));
    Setup { source, target, mirror, dead }
}

async fn partition_states(monitor_url: &str) -> Vec<String> {
    let doc: Value = reqwest::get(format!("{monitor_url}/api/v1/partitions")).await.unwrap().json().await.unwrap();
    doc["partitions"].as_array().unwrap().iter().map(|p| p["state"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn mirror_commands_against_a_running_mirror() {
    let s = setup().await;
    let m = s.mirror.addr().to_string();
    let mon = |args: &[&'static str]| [&["--monitor", m.as_str()][..], args].concat();
    let with_token = |args: &[&'static str]| [&["--monitor", m.as_str(), "--token", TOKEN][..], args].concat();

    // status
    let out = ferryctl(&mon(&["mirror", "status", "--format", "json"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let status: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!((status["mirror"].as_str(), status["active_route"].as_str()), (Some("a_to_b"), Some("primary")));
    assert_eq!((status["source_cluster"].as_str(), status["target_cluster"].as_str()), (Some("dc-a"), Some("dc-b")));
    assert_eq!((status["totals"]["partitions"].as_u64(), status["totals"]["lag"].as_u64()), (Some(2), Some(0)));
    // The records this mirror newly wrote to the target: exactly the 60 copied (a retried append would not count
    // again); that they are the source's records is verify's job, below.
    assert_eq!(status["totals"]["records_out"].as_u64(), Some(60), "{status}");
    assert!(status["rates"]["source"]["records_per_sec"]["10s"].is_number(), "{status}");
    let out = ferryctl(&mon(&["mirror", "status"])).await;
    assert!(out.stdout.starts_with(&format!("Mirror:        a_to_b (dc-a -> dc-b) at {m}\n")), "{}", out.stdout);
    assert!(out.stdout.contains("Source route:  primary (automatic)\n"), "{}", out.stdout);
    assert!(out.stdout.contains("Partitions:    2 (2 mirroring)\nLag:           0 records\n"), "{}", out.stdout);
    // Caught up: nothing waits, the RPO is 0.
    assert_eq!(status["totals"]["rpo_max_seconds"], 0.0, "{status}");
    assert!(out.stdout.contains("RPO:           0.0 s (the longest any record not yet on the target has waited)\n"));

    // partitions
    let out = ferryctl(&mon(&["mirror", "partitions", "--format", "json"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    let parts = doc["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2);
    for (i, p) in parts.iter().enumerate() {
        assert_eq!((p["topic"].as_str(), p["partition"].as_u64()), (Some("orders"), Some(i as u64)));
        for key in ["source_offset", "cache_offset", "commit_offset", "target_offset"] {
            assert_eq!(p[key], 30, "{key} of {p}");
        }
        assert_eq!((p["lag"].as_u64(), p["state"].as_str()), (Some(0), Some("mirroring")));
        assert_eq!(p["rpo_seconds"], 0.0, "{p}");
        assert!(p.get("last_error").is_some(), "{p}");
    }
    let out = ferryctl(&mon(&["mirror", "partitions", "--topic", "orders"])).await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "TOPIC   PARTITION  SOURCE  CACHE  COMMIT  TARGET  LAG  RPO_S  STATE      LAST_ERROR");
    assert_eq!(
        lines[1], "orders  0          30      30     30      30      0    0.0    mirroring  -",
        "{}",
        out.stdout
    );
    assert_eq!(
        lines[2], "orders  1          30      30     30      30      0    0.0    mirroring  -",
        "{}",
        out.stdout
    );
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    let out = ferryctl(&mon(&["mirror", "partitions", "--topic", "nope"])).await;
    assert_eq!((out.code, out.stderr), (1, format!("error: topic \"nope\" is not mirrored by the mirror at {m}\n")));

    // egress
    let out = ferryctl(&mon(&["mirror", "egress", "--format", "json"])).await;
    let egress: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!((egress["active"].as_str(), egress["pinned"].as_bool()), (Some("primary"), Some(false)));
    let routes: Vec<&str> = egress["routes"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(routes, ["primary", "backup"]);
    assert_eq!(egress["routes"][0]["healthy"], true);
    assert_eq!(egress["routes"][0]["cluster_id"], "dc-a");
    let out = ferryctl(&mon(&["mirror", "egress"])).await;
    assert!(out.stdout.starts_with("Active route:  primary (not pinned: automatic failover)\n"), "{}", out.stdout);
    assert!(out.stdout.contains("\nNAME     ACTIVE  HEALTHY  FAILURES"), "{}", out.stdout);
    assert!(out.stdout.contains("\nbackup   no      no       "), "{}", out.stdout);
    assert!(out.stdout.contains(&s.dead), "{}", out.stdout);

    // switch: unknown route, unhealthy route, then a healthy one; unpin.
    let out = ferryctl(&with_token(&["mirror", "egress", "switch", "nope"])).await;
    assert_eq!(out.code, 1);
    assert_eq!(out.stderr, "error: no route named \"nope\" (configured routes: primary, backup)\n");
    let out = ferryctl(&with_token(&["mirror", "egress", "switch", "backup"])).await;
    assert_eq!(out.code, 1);
    assert!(out.stderr.starts_with("error: route \"backup\" is unhealthy ("), "{}", out.stderr);
    assert!(out.stderr.ends_with("); pass --force to switch anyway\n"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1);
    let out = ferryctl(&with_token(&["mirror", "egress", "switch", "primary"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("route \"primary\" is active and pinned;"), "{}", out.stdout);
    let out = ferryctl(&with_token(&["mirror", "egress", "--format", "json"])).await;
    assert_eq!(serde_json::from_str::<Value>(&out.stdout).unwrap()["pinned"], true);
    let out = ferryctl(&with_token(&["mirror", "egress", "unpin", "--format", "json"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(serde_json::from_str::<Value>(&out.stdout).unwrap()["pinned"], false);

    // tokens
    let out = ferryctl(&mon(&["--token", "wrong", "mirror", "pause", "orders"])).await;
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stderr,
        format!(
            "error: the mirror monitor at {m} rejected the token: it is wrong (pass the monitor's token with --token \
             or FERRY_TOKEN)\n"
        )
    );
    let out = ferryctl(&mon(&["mirror", "egress", "unpin"])).await;
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("needs a token for this call and none was given"), "{}", out.stderr);
    assert_eq!(partition_states(&s.mirror.monitor_url()).await, ["mirroring", "mirroring"], "nothing was paused");

    // pause, then the partitions show it; resume.
    let out = ferryctl(&with_token(&["mirror", "pause", "orders"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "paused topic \"orders\": its partitions stop appending and keep their positions\n");
    let url = s.mirror.monitor_url();
    wait_until("both partitions to be paused", deadline(&[INTERVAL]), async || {
        partition_states(&url).await == ["paused", "paused"]
    })
    .await
    .unwrap();
    let out = ferryctl(&mon(&["mirror", "partitions", "--format", "json"])).await;
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(doc["partitions"].as_array().unwrap().iter().all(|p| p["state"] == "paused"), "{doc}");
    let out = ferryctl(&mon(&["mirror", "partitions"])).await;
    assert_eq!(out.stdout.lines().filter(|l| l.contains("  paused  ")).count(), 2, "{}", out.stdout);
    let out = ferryctl(&with_token(&["mirror", "status"])).await;
    assert!(out.stdout.contains("paused: orders\n"), "{}", out.stdout);
    let out = ferryctl(&with_token(&["mirror", "resume", "orders"])).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "resumed topic \"orders\"\n"));
    wait_until("both partitions to mirror again", deadline(&[INTERVAL]), async || {
        partition_states(&url).await == ["mirroring", "mirroring"]
    })
    .await
    .unwrap();
    let out = ferryctl(&with_token(&["mirror", "pause", "nope"])).await;
    assert_eq!((out.code, out.stderr), (1, format!("error: topic \"nope\" is not mirrored by the mirror at {m}\n")));

    // What the mirror copied is identical to the source.
    let (src, tgt) = (s.source.addr().to_string(), s.target.addr().to_string());
    let out = ferryctl(&["mirror", "verify", "--source", &src, "--target", &tgt]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout,
        "orders/0: identical (30 records compared)\norders/1: identical (30 records compared)\n\
         identical: 2 partitions of 1 mirror topics, 60 records compared\n"
    );

    // Failover: the monitor's report of what was not mirrored, then the promotion.
    let out = ferryctl(&["--broker", &tgt, "--monitor", &m, "topic", "promote", "--all-from", "dc-a"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!(
            "Source records not yet mirrored, as the mirror at {m} last saw the source:\n\
             TOPIC   PARTITION  SOURCE_TOPIC  SOURCE_OFFSET  MIRRORED_UP_TO  NOT_MIRRORED\n\
             orders  0          orders        30             30              0\n\
             orders  1          orders        30             30              0\n\
             0 source records in 2 partitions are not on the target\n\n\
             promoted topic \"orders\" (mirror of dc-a/orders): it is writable and no longer mirrored\n\
             promoted 1 topics from cluster \"dc-a\" on {tgt}\n"
        )
    );
}

#[tokio::test]
async fn partitions_watch_redraws_until_interrupted() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("watch.log");
    let spec = ChildSpec::new("ferryctl-watch", env!("CARGO_BIN_EXE_ferryctl"), &log).args([
        "--monitor",
        &s.mirror.addr().to_string(),
        "mirror",
        "partitions",
        "--watch",
    ]);
    let mut watch = ChildProcess::spawn(spec).unwrap();
    // One frame a second: three frames within 3x their interval.
    wait_until("three frames", deadline(&[INTERVAL * 3]), async || {
        watch.logs().matches("TOPIC   PARTITION").count() >= 3
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", watch.logs()));
    watch.send_signal(Signal::INT).unwrap();
    let status = watch.wait_exit(deadline(&[INTERVAL])).await.unwrap();
    assert!(status.success(), "{status:?}\n{}", watch.logs());
    let logs = watch.logs();
    assert!(logs.contains("orders  1          30"), "{logs}");
    assert!(!logs.contains("error:"), "{logs}");
}

#[tokio::test]
async fn an_unreachable_monitor_is_named() {
    let dead = format!("127.0.0.1:{}", reserve_port().unwrap());
    for args in [&["mirror", "status"][..], &["mirror", "egress", "switch", "backup"], &["mirror", "pause", "t"]] {
        let out = ferryctl(&[&["--monitor", dead.as_str()][..], args].concat()).await;
        assert_eq!(out.code, 1, "{args:?}");
        assert!(
            out.stderr.starts_with(&format!("error: cannot reach the mirror monitor at {dead}: ")),
            "{}",
            out.stderr
        );
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
    let out = ferryctl(&["--monitor", "ftp://x", "mirror", "status"]).await;
    assert_eq!(out.code, 2, "a malformed --monitor is a usage error: {}", out.stderr);
    let out = ferryctl(&["mirror", "egress", "switch"]).await;
    assert_eq!(out.code, 2, "switch needs a route");
}
