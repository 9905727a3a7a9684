//! The Alarmer against real channels, driven through the EventBus (no broker): a real SMTP server (aiosmtpd via
//! `tests/support/smtp_sink.py`) and a webhook receiver (axum). Every wait is a poll with a deadline.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ferry_mirror::config::SmtpTls;
use ferry_mirror::events::{Details, DivergedFacts, Event, EventKind, LagFacts, RouteFacts};
use ferry_mirror::state::{PartitionState, PartitionStatus};
use ferry_testkit::wait_until;
use serde_json::json;
use support::alarmer::{Capture, Running, alarms, at_t0, deadline, email, hmac_hex, rules_file, webhook};
use support::{Hook, SmtpSink};

const SMTP_USER: &str = "ferry-alarms";
const SMTP_PASSWORD: &str = "smtp-Pa55word-never-logged";
const WRONG_PASSWORD: &str = "wrong-Pa55word-never-logged";
const HOOK_SECRET: &str = "hook-hmac-key-never-logged";
const URL_TOKEN: &str = "url-token-never-logged";

#[tokio::test]
async fn email_alarm_reaches_a_real_smtp_server_with_the_rendered_templates() {
    let sink = SmtpSink::start(None).await;
    let r = Running::start(alarms(None, vec![], vec![email("oncall", sink.port, None, Duration::from_secs(10))]));
    r.bus.emit(at_t0(
        Event::new(EventKind::PartitionDiverged, "orders/3 diverged at offset 120: the source reused offsets")
            .partition("orders", 3)
            .with(Details::Diverged(DivergedFacts {
                offset: 120,
                cache_offset: 150,
                reason: "the source reused offsets".into(),
                policy: "halt".into(),
            })),
    ));
    r.wait_count("oncall", "sent", 1).await;
    let mails = sink.messages();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let m = &mails[0];
    assert_eq!(m.mail_from, "ferry@example.org");
    assert_eq!(m.rcpt_tos, ["oncall@example.org", "backup@example.org"]);
    assert_eq!(m.auth_login, None);
    assert_eq!(m.from, "Ferry Alarms <ferry@example.org>");
    assert_eq!(m.to, "oncall@example.org, backup@example.org");
    assert_eq!(m.content_type, "text/plain");
    assert_eq!(m.subject, "[ferry critical] ALARM: partition_diverged on dc-a_to_dc-b (orders/3)");
    let body = "ALARM: partition_diverged (critical)

orders/3 diverged at offset 120: the source reused offsets

Mirror:     dc-a_to_dc-b (dc-a -> dc-b)
Topic:      orders
Partition:  3
Route:      -
Time:       2023-11-14T22:13:20.000Z
Cleared:    false

Details:
  cache_offset: 150
  offset: 120
  policy: halt
  reason: the source reused offsets

Runbook: docs/alarms.md, section \"partition_diverged\".
-- 
Sent by ferry-mirror. Alarm key: partition_diverged/orders/3/-
";
    assert_eq!(m.body, body);
    // Info events are logged only under the shipped rules.
    r.bus.emit(Event::new(EventKind::AddTopic, "payments is mirrored").topic("payments"));
    r.bus.emit(at_t0(Event::new(EventKind::SyncError, "target topic orders was promoted").partition("orders", 0)));
    r.wait_count("oncall", "sent", 2).await;
    let subjects: Vec<String> = sink.messages().into_iter().map(|m| m.subject).collect();
    assert_eq!(subjects[1], "[ferry critical] ALARM: sync_error on dc-a_to_dc-b (orders/0)");
    assert_eq!(subjects.len(), 2);
    r.stop().await;
}

#[tokio::test]
async fn email_over_starttls_and_tls_verifies_the_server_against_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("smtp.pem"), dir.path().join("smtp.key"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    for (mode, tls) in [("starttls", SmtpTls::StartTls), ("implicit", SmtpTls::Tls)] {
        let sink = SmtpSink::start_tls(mode, &cert_path, &key_path).await;
        // The same server, trusted through ca_file, and with the built-in roots only (which must refuse it).
        let mut trusted = email("trusted", sink.port, None, Duration::from_secs(10));
        trusted.tls = tls;
        trusted.ca_file = Some(cert_path.clone());
        let mut untrusted = email("untrusted", sink.port, None, Duration::from_secs(10));
        untrusted.tls = tls;
        let r = Running::start(alarms(None, vec![], vec![trusted, untrusted]));
        r.bus.emit(at_t0(
            Event::new(EventKind::PartitionDiverged, "orders/3 diverged at offset 120: the source reused offsets")
                .partition("orders", 3),
        ));
        r.wait_count("trusted", "sent", 1).await;
        r.wait_count("untrusted", "failed", 1).await;
        assert_eq!((r.count("trusted", "failed"), r.count("untrusted", "sent")), (0, 0), "{mode}");
        let mails = sink.messages();
        assert_eq!(mails.len(), 1, "{mode}: {mails:#?}");
        assert_eq!(mails[0].tls_version.as_deref(), Some("TLSv1.3"), "{mode}");
        assert_eq!(mails[0].rcpt_tos, ["oncall@example.org", "backup@example.org"], "{mode}");
        assert_eq!(mails[0].subject, "[ferry critical] ALARM: partition_diverged on dc-a_to_dc-b (orders/3)", "{mode}");
        r.stop().await;
    }
}

#[tokio::test]
async fn smtp_auth_uses_the_configured_user_and_a_wrong_password_fails() {
    let sink = SmtpSink::start(Some((SMTP_USER, SMTP_PASSWORD))).await;
    let secs = Duration::from_secs(10);
    let r = Running::start(alarms(
        None,
        vec![],
        vec![
            email("good", sink.port, Some((SMTP_USER, SMTP_PASSWORD)), secs),
            email("bad", sink.port, Some((SMTP_USER, WRONG_PASSWORD)), secs),
        ],
    ));
    r.bus.emit(Event::new(EventKind::SyncError, "authentication to the source failed").route("primary"));
    r.wait_count("good", "sent", 1).await;
    r.wait_count("bad", "failed", 1).await;
    let mails = sink.messages();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    assert_eq!(mails[0].auth_login.as_deref(), Some(SMTP_USER));
    assert_eq!(mails[0].subject, "[ferry critical] ALARM: sync_error on dc-a_to_dc-b (route primary)");
    assert_eq!((r.count("good", "failed"), r.count("bad", "sent")), (0, 0));
    r.stop().await;
}

#[tokio::test]
async fn webhook_posts_signed_json_and_retries_after_server_errors() {
    let hook = Hook::start(2).await;
    let r = Running::start(alarms(None, vec![webhook("ops", &hook.url, Some(HOOK_SECRET), 3)], vec![]));
    r.bus.emit(at_t0(
        Event::new(EventKind::SourceNetNotAvailable, "source route \"primary\" failed 3 times in a row: timeout")
            .route("primary")
            .with(Details::Route(RouteFacts { reason: Some("timeout".into()), ..Default::default() })),
    ));
    r.wait_count("ops", "sent", 1).await;
    // Two 500s, then accepted: three attempts, one delivery, no failure counted.
    assert_eq!((hook.attempts(), r.count("ops", "failed")), (3, 0));
    let got = hook.received();
    assert_eq!(got.len(), 1);
    let req = &got[0];
    assert_eq!(
        req.json(),
        json!({
            "event": "source_net_not_available",
            "severity": "critical",
            "notice": "alarm",
            "mirror": "dc-a_to_dc-b",
            "source_cluster": "dc-a",
            "target_cluster": "dc-b",
            "topic": null,
            "partition": null,
            "route": "primary",
            "message": "source route \"primary\" failed 3 times in a row: timeout",
            "details": {"reason": "timeout"},
            "cleared": false,
            "timestamp": "2023-11-14T22:13:20.000Z",
            "key": "source_net_not_available/-/-/primary"
        })
    );
    assert_eq!(req.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(req.header("x-ferry-event").as_deref(), Some("source_net_not_available"));
    assert_eq!(req.header("x-ferry-signature"), Some(format!("sha256={}", hmac_hex(HOOK_SECRET, &req.body))));

    // The route recovers: a recovery notice for the alarm that was sent.
    r.bus.emit(at_t0(
        Event::new(EventKind::SourceNetRecovered, "source route \"primary\" is healthy again").route("primary"),
    ));
    r.wait_count("ops", "sent", 2).await;
    let rec = &hook.received()[1];
    let body = rec.json();
    assert_eq!(
        (&body["event"], &body["notice"], &body["severity"], &body["cleared"], &body["key"]),
        (
            &json!("source_net_recovered"),
            &json!("recovery"),
            &json!("critical"),
            &json!(true),
            &json!("source_net_not_available/-/-/primary")
        )
    );
    assert_eq!(rec.header("x-ferry-signature"), Some(format!("sha256={}", hmac_hex(HOOK_SECRET, &rec.body))));
    r.stop().await;
}

#[tokio::test]
async fn webhook_gives_up_after_its_retries() {
    let hook = Hook::start(usize::MAX).await;
    let r = Running::start(alarms(None, vec![webhook("ops", &hook.url, None, 1)], vec![]));
    r.bus.emit(Event::new(EventKind::PartitionDiverged, "diverged").partition("orders", 0));
    r.wait_count("ops", "failed", 1).await;
    assert_eq!((hook.attempts(), hook.received().len(), r.count("ops", "sent")), (2, 0, 0));
    r.stop().await;
}

#[tokio::test]
async fn an_alarm_storm_is_throttled_per_key_on_every_channel() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(
        &dir,
        "rules.toml",
        "[events.lag_above_threshold]\nthrottle = { max = 3, window = \"1h\" }\nrepeat = \"0s\"\n",
    );
    let hook = Hook::start(0).await;
    let sink = SmtpSink::start(None).await;
    let r = Running::start(alarms(
        Some(rules),
        vec![webhook("ops", &hook.url, None, 0)],
        vec![email("oncall", sink.port, None, Duration::from_secs(10))],
    ));
    for i in 0..1000 {
        r.bus.emit(
            Event::new(EventKind::LagAboveThreshold, format!("storm {i}"))
                .partition("orders", 0)
                .with(Details::Lag(LagFacts { lag: i, ..Default::default() })),
        );
    }
    // Another key has its own budget.
    r.bus.emit(Event::new(EventKind::LagAboveThreshold, "other partition").partition("orders", 1));
    for channel in ["ops", "oncall"] {
        r.wait_count(channel, "sent", 4).await;
        assert_eq!(r.count(channel, "suppressed"), 1000 - 3, "{channel}");
        assert_eq!((r.count(channel, "failed"), r.count(channel, "dropped")), (0, 0), "{channel}");
    }
    let bodies: Vec<(String, serde_json::Value)> = hook
        .received()
        .iter()
        .map(|q| (q.json()["message"].as_str().unwrap().to_owned(), q.json()["partition"].clone()))
        .collect();
    assert_eq!(
        bodies,
        [
            ("storm 0".to_owned(), json!(0)),
            ("storm 1".to_owned(), json!(0)),
            ("storm 2".to_owned(), json!(0)),
            ("other partition".to_owned(), json!(1))
        ]
    );
    let subjects: Vec<String> = sink.messages().into_iter().map(|m| m.subject).collect();
    assert_eq!(subjects.len(), 4, "{subjects:#?}");
    assert_eq!(subjects[3], "[ferry warning] ALARM: lag_above_threshold on dc-a_to_dc-b (orders/1)");
    r.stop().await;
}

#[tokio::test]
async fn a_dead_or_hanging_smtp_server_never_holds_up_webhooks_or_the_bus() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(&dir, "rules.toml", "[events.sync_error]\nthrottle = { max = 5, window = \"1h\" }\n");
    let hook = Hook::start(0).await;
    // Nothing listens on `dead`; `hung` accepts connections and never says a word.
    let dead = ferry_testkit::reserve_port().unwrap();
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_port = hung.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            held.push(socket);
        }
    });
    let r = Running::start(alarms(
        Some(rules),
        vec![webhook("ops", &hook.url, None, 0)],
        vec![
            email("dead", dead, None, Duration::from_secs(10)),
            email("hung", hung_port, None, Duration::from_secs(600)),
        ],
    ));
    // emit() never waits on a channel: all 1000 go out at once.
    for i in 0..1000 {
        r.bus.emit(Event::new(EventKind::SyncError, format!("error {i}")).partition("orders", 7));
    }
    r.wait_count("ops", "sent", 5).await;
    r.wait_count("dead", "failed", 5).await;
    for channel in ["ops", "dead", "hung"] {
        r.wait_count(channel, "suppressed", 995).await;
    }
    let messages: Vec<String> =
        hook.received().iter().map(|q| q.json()["message"].as_str().unwrap().to_owned()).collect();
    assert_eq!(messages, ["error 0", "error 1", "error 2", "error 3", "error 4"]);
    assert_eq!((r.count("hung", "sent"), r.count("hung", "failed")), (0, 0));
    let metrics = r.metrics.clone();
    // At shutdown the hung delivery is abandoned after the grace period; it and the queued ones count as dropped.
    r.stop().await;
    assert_eq!((metrics.alarm_count("hung", "dropped"), metrics.alarm_count("hung", "sent")), (5, 0));
    assert_eq!(metrics.alarm_count("ops", "dropped"), 0);
    holder.abort();
}

#[tokio::test]
async fn lag_and_stall_conditions_from_shared_state_alarm_and_recover_through_the_bus() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(
        &dir,
        "rules.toml",
        "[thresholds]\nlag_threshold = 10\nlatency_threshold = \"0s\"\nfor_duration = \"100ms\"\nstall_after = \"300ms\"\n",
    );
    let hook = Hook::start(0).await;
    let r = Running::start(alarms(Some(rules), vec![webhook("ops", &hook.url, None, 0)], vec![]));
    let status = Arc::new(PartitionStatus::new("orders", "orders", 5));
    status.set_state(PartitionState::Mirroring);
    status.set_source(0, 100);
    status.set_cache(40);
    r.shared.partitions.insert(ferry_mirror::tp::SourceTp::new("orders", 5), Arc::clone(&status));
    r.wait_count("ops", "sent", 2).await;
    assert!(status.stalled());
    let notices = |from: usize| -> Vec<(String, String, bool, serde_json::Value)> {
        let mut v: Vec<_> = hook.received()[from..]
            .iter()
            .map(|q| {
                let b = q.json();
                (
                    b["event"].as_str().unwrap().to_owned(),
                    b["notice"].as_str().unwrap().to_owned(),
                    b["cleared"].as_bool().unwrap(),
                    b["details"]["lag"].clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(
        notices(0),
        [
            ("lag_above_threshold".to_owned(), "alarm".to_owned(), false, json!(60)),
            ("partition_stalled".to_owned(), "alarm".to_owned(), false, json!(60)),
        ]
    );
    // The partition catches up: one recovery notice per condition.
    status.set_cache(100);
    r.wait_count("ops", "sent", 4).await;
    assert!(!status.stalled());
    assert_eq!(
        notices(2),
        [
            ("lag_above_threshold".to_owned(), "recovery".to_owned(), true, json!(0)),
            ("partition_stalled".to_owned(), "recovery".to_owned(), true, json!(0)),
        ]
    );
    // The events went through the bus like every other event.
    let on_bus: Vec<(EventKind, bool)> = r.bus.recent().iter().map(|e| (e.kind, e.cleared)).collect();
    for want in [
        (EventKind::LagAboveThreshold, false),
        (EventKind::PartitionStalled, false),
        (EventKind::LagAboveThreshold, true),
        (EventKind::PartitionStalled, true),
    ] {
        assert_eq!(on_bus.iter().filter(|e| **e == want).count(), 1, "{want:?} in {on_bus:?}");
    }
    r.stop().await;
}

#[tokio::test]
async fn a_reload_switches_rules_and_channels() {
    let dir = tempfile::tempdir().unwrap();
    let to_a = rules_file(&dir, "a.toml", "[events.sync_error]\nchannels = [\"a\"]\n");
    let to_b = rules_file(&dir, "b.toml", "[events.sync_error]\nchannels = [\"b\"]\nseverity = \"warning\"\n");
    let (hook_a, hook_b) = (Hook::start(0).await, Hook::start(0).await);
    let hooks = || vec![webhook("a", &hook_a.url, None, 0), webhook("b", &hook_b.url, None, 0)];
    let r = Running::start(alarms(Some(to_a), hooks(), vec![]));
    r.bus.emit(Event::new(EventKind::SyncError, "first").partition("orders", 0));
    r.wait_count("a", "sent", 1).await;
    r.reload.send(alarms(Some(to_b), hooks(), vec![])).unwrap();
    r.bus.emit(Event::new(EventKind::SyncError, "second").partition("orders", 1));
    wait_until("the second alarm at b", deadline(), async || hook_b.received().len() == 1).await.unwrap();
    let b = hook_b.received()[0].json();
    assert_eq!((&b["message"], &b["severity"]), (&json!("second"), &json!("warning")));
    let a: Vec<serde_json::Value> = hook_a.received().iter().map(|q| q.json()["message"].clone()).collect();
    assert_eq!(a, [json!("first")]);
    r.stop().await;
}

#[tokio::test]
async fn secrets_never_appear_in_the_logs() {
    // Everything this (current-thread) runtime logs, at every level, goes to `capture`.
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let sink = SmtpSink::start(Some((SMTP_USER, SMTP_PASSWORD))).await;
    let hook = Hook::start(1).await;
    let dead = ferry_testkit::reserve_port().unwrap();
    let token_url = format!("http://127.0.0.1:{dead}/services/T0/B0/{URL_TOKEN}");
    let secs = Duration::from_secs(10);
    let r = Running::start(alarms(
        None,
        vec![webhook("ops", &hook.url, Some(HOOK_SECRET), 2), webhook("chat", &token_url, None, 0)],
        vec![
            email("good", sink.port, Some((SMTP_USER, SMTP_PASSWORD)), secs),
            email("bad", sink.port, Some((SMTP_USER, WRONG_PASSWORD)), secs),
        ],
    ));
    r.bus.emit(Event::new(EventKind::SyncError, "source authentication failed").route("primary"));
    r.wait_count("good", "sent", 1).await;
    r.wait_count("bad", "failed", 1).await;
    r.wait_count("ops", "sent", 1).await;
    r.wait_count("chat", "failed", 1).await;
    r.stop().await;

    let logs = String::from_utf8(capture.0.lock().clone()).unwrap();
    // The capture works: deliveries and failures are there.
    for needle in ["alarm sent", "alarm delivery failed", "channel=bad", "channel=chat", "http://127.0.0.1"] {
        assert!(logs.contains(needle), "{needle:?} missing from the logs:\n{logs}");
    }
    let plain_auth = |pw: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("\0{SMTP_USER}\0{pw}"))
    };
    for secret in [
        SMTP_PASSWORD.to_owned(),
        WRONG_PASSWORD.to_owned(),
        HOOK_SECRET.to_owned(),
        URL_TOKEN.to_owned(),
        plain_auth(SMTP_PASSWORD),
        plain_auth(WRONG_PASSWORD),
    ] {
        assert!(!logs.contains(&secret), "{secret:?} leaked into the logs:\n{logs}");
    }
}

#[tokio::test]
async fn a_condition_repeats_through_the_run_loop_until_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(&dir, "rules.toml", "[events.partition_stalled]\nrepeat = \"200ms\"\n");
    let hook = Hook::start(0).await;
    let r = Running::start(alarms(Some(rules), vec![webhook("ops", &hook.url, None, 0)], vec![]));
    r.bus.emit(Event::new(EventKind::PartitionStalled, "orders/9 made no progress").partition("orders", 9));
    r.wait_count("ops", "sent", 3).await;
    r.bus.emit(
        Event::new(EventKind::PartitionStalled, "orders/9 is making progress again").partition("orders", 9).cleared(),
    );
    wait_until("the recovery notice", deadline(), async || {
        hook.received().last().is_some_and(|q| q.json()["notice"] == "recovery")
    })
    .await
    .unwrap();
    let got: Vec<(String, String)> = hook
        .received()
        .iter()
        .map(|q| (q.json()["notice"].as_str().unwrap().to_owned(), q.json()["message"].as_str().unwrap().to_owned()))
        .collect();
    let (last, before) = got.split_last().unwrap();
    assert_eq!(*last, ("recovery".to_owned(), "orders/9 is making progress again".to_owned()));
    assert_eq!(before[0], ("alarm".to_owned(), "orders/9 made no progress".to_owned()));
    assert!(before.len() >= 3, "{got:?}");
    for repeat in &before[1..] {
        assert_eq!(*repeat, ("repeat".to_owned(), "orders/9 made no progress".to_owned()));
    }
    r.stop().await;
}

#[tokio::test]
async fn validate_lists_rules_file_problems_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(
        &dir,
        "rules.toml",
        "[thresholds]\nstall_after = \"soon\"\n[events.lag_above_threshold]\nchannels = [\"ops\", \"pager\"]\n[events.link_down]\nseverity = \"critical\"\n",
    );
    let config = dir.path().join("mirror.toml");
    let text = format!(
        "[source]\ncluster = \"dc-a\"\n[[source.routes]]\nname = \"primary\"\nbrokers = [\"127.0.0.1:7411\"]\n\
         [target]\ncluster = \"dc-b\"\nbrokers = [\"127.0.0.1:7412\"]\n[topics]\ninclude = [\"^orders$\"]\n\
         [alarms]\nrules = {:?}\n[[alarms.webhook]]\nname = \"ops\"\nurl = \"http://127.0.0.1:9/hook\"\n",
        rules.display().to_string()
    );
    std::fs::write(&config, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry-mirror"))
        .arg("validate")
        .arg("--config")
        .arg(&config)
        .env_remove("FERRY_SMTP_PASSWORD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let prefix = format!("alarms.rules: {}: ", rules.display());
    for problem in [
        "thresholds.stall_after: \"soon\" is not a duration",
        "events.lag_above_threshold.channels[1]: unknown channel \"pager\" (the channels are the names of [[alarms.webhook]] and [[alarms.email]]: \"ops\")",
        "events.link_down: unknown event",
    ] {
        assert!(stderr.contains(&format!("{prefix}{problem}")), "{problem:?} missing from:\n{stderr}");
    }
    assert!(stderr.contains("3 config problem(s)"), "{stderr}");
    // The shipped rules with the same channels are valid.
    std::fs::write(&rules, "").unwrap();
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_ferry-mirror"))
        .args(["validate", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
}
