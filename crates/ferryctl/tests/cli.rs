//! `ferryctl` as operators and scripts use it: the real binary against the real `ferry-broker` (started by
//! ferry-testkit). Checks exit codes, exact stdout/stderr sentences, the JSON shapes of `topic describe` and
//! `consume --format json`, and exact data through produce and consume.
//!
//! Needs `target/debug/ferry-broker` (`cargo build -p ferry-broker`).

use std::process::Stdio;
use std::time::Duration;

use ferry_testkit::{BrokerProcess, init_tracing};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs ferryctl against `broker` with `stdin`, bounded by a generous timeout so a hang fails the test.
async fn ferryctl(broker: &BrokerProcess, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ferryctl"))
        .args(args)
        .env("FERRY_BROKER", broker.addr().to_string())
        .env_remove("FERRY_TOKEN")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ferryctl");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("ferryctl {args:?} hung"))
        .unwrap();
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"))).collect()
}

#[tokio::test]
async fn topic_commands_answer_with_exact_sentences_and_exit_codes() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    let addr = broker.addr().to_string();

    let out =
        ferryctl(&broker, &["topic", "create", "orders", "--partitions", "2", "--config", "retention_ms=60000"], b"")
            .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("created topic \"orders\" with 2 partitions (id "), "{}", out.stdout);

    let out = ferryctl(&broker, &["topic", "create", "orders", "--partitions", "2"], b"").await;
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (1, format!("error: topic \"orders\" already exists on {addr}\n").as_str())
    );

    let out = ferryctl(&broker, &["topic", "create", "x", "--partitions", "1", "--config", "bogus=1"], b"").await;
    assert_eq!(out.code, 2);
    assert!(out.stderr.starts_with("error: unknown topic config key \"bogus\""), "{}", out.stderr);

    let out = ferryctl(&broker, &["topic", "describe", "nope"], b"").await;
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (1, format!("error: topic \"nope\" does not exist on {addr}\n").as_str())
    );

    let out = ferryctl(&broker, &["topic", "alter", "orders", "--partitions", "1"], b"").await;
    assert_eq!(out.code, 1);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);

    let out = ferryctl(&broker, &["topic", "alter", "orders", "--partitions", "3"], b"").await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "topic \"orders\" has 3 partitions\n"));

    let out = ferryctl(&broker, &["topic", "describe", "orders", "--format", "json"], b"").await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let d: Value = serde_json::from_str(&out.stdout).unwrap();
    let keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
    let mut expected_keys =
        vec!["name", "topic_id", "partitions", "config", "mirror", "replication", "risk_phase", "partition_info"];
    expected_keys.sort();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, expected_keys);
    assert_eq!((d["name"].as_str(), d["partitions"].as_u64()), (Some("orders"), Some(3)));
    assert_eq!(d["config"]["retention_ms"], 60000);
    assert_eq!(d["mirror"], Value::Null);
    assert_eq!((&d["replication"], &d["risk_phase"]), (&Value::from("single"), &Value::from(false)));
    let parts = d["partition_info"].as_array().unwrap();
    assert_eq!(parts.len(), 3);
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p["partition"], i);
        assert_eq!(p["log_end_offset"], 0);
        assert_eq!(p["gaps"], serde_json::json!([]));
        for key in ["log_start_offset", "epoch", "size_bytes", "segments"] {
            assert!(p[key].is_u64(), "{key} in {p}");
        }
    }

    let out = ferryctl(&broker, &["topic", "list", "--format", "json"], b"").await;
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect::<Vec<_>>(), ["orders"]);

    let out = ferryctl(&broker, &["topic", "promote", "orders"], b"").await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "topic \"orders\" was not a mirror topic; nothing changed\n"));
    let out = ferryctl(&broker, &["topic", "delete", "orders"], b"").await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "deleted topic \"orders\"\n"));
    let out = ferryctl(&broker, &["consume"], b"").await;
    assert_eq!(out.code, 2, "clap usage errors exit with 2");
}

#[tokio::test]
async fn produced_lines_come_back_as_json_with_keys_headers_and_base64() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    assert_eq!(ferryctl(&broker, &["topic", "create", "t", "--partitions", "1"], b"").await.code, 0);
    let mut input = b"k1|hello\nk2|a|b\r\nk3|".to_vec();
    input.extend_from_slice(&[0xff, 0xfe]);
    input.extend_from_slice(b"\n");
    let out =
        ferryctl(&broker, &["produce", "t", "--key-sep", "|", "--header", "src=cli", "--header", "src=again"], &input)
            .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.starts_with("3 records, "), "{}", out.stderr);

    let out = ferryctl(&broker, &["consume", "t", "--from-beginning", "--max", "3", "--format", "json"], b"").await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let records = json_lines(&out.stdout);
    assert_eq!(records.len(), 3);
    let headers = serde_json::json!([{"key": "src", "value": "cli"}, {"key": "src", "value": "again"}]);
    let expect = [("k1", Some("hello"), None, 0), ("k2", Some("a|b"), None, 1), ("k3", None, Some("//4="), 2)];
    for (r, (key, value, value_b64, offset)) in records.iter().zip(expect) {
        assert_eq!(
            (r["topic"].as_str(), r["partition"].as_u64(), r["offset"].as_u64()),
            (Some("t"), Some(0), Some(offset))
        );
        assert_eq!(r["key"], key);
        assert_eq!(r["value"].as_str(), value);
        assert_eq!(r["value_base64"].as_str(), value_b64);
        assert_eq!(r["headers"], headers);
        assert!(r["timestamp"].as_i64().unwrap() > 1_600_000_000_000, "timestamp is in ms");
    }

    let out = ferryctl(&broker, &["consume", "t", "--from-beginning", "--max", "2", "--print-key"], b"").await;
    assert_eq!(out.stdout, "k1\thello\nk2\ta|b\n");

    let out = ferryctl(&broker, &["produce", "t", "--key-sep", ":"], b"a:1\nno separator\n").await;
    assert_eq!(out.code, 1);
    assert!(out.stderr.ends_with("error: line 2 has no key separator \":\"\n"), "{}", out.stderr);
}

#[tokio::test]
async fn synthetic_load_is_consumed_exactly_once_across_group_runs() {
    init_tracing();
    let broker = BrokerProcess::start().await.unwrap();
    assert_eq!(ferryctl(&broker, &["topic", "create", "load", "--partitions", "3"], b"").await.code, 0);
    let out = ferryctl(&broker, &["produce", "load", "--count", "500", "--size", "64"], b"").await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let last = out.stderr.lines().last().unwrap();
    assert!(last.starts_with("500 records, 0.03 MB in "), "{last}");
    assert!(last.contains(" records/s, ") && last.ends_with(" MB/s"), "{last}");

    // First run takes 200, the second the remaining 300: the commit covers exactly what was printed.
    let first = ferryctl(
        &broker,
        &["consume", "load", "--group", "g", "--from-beginning", "--max", "200", "--format", "json"],
        b"",
    )
    .await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let second =
        ferryctl(&broker, &["consume", "load", "--group", "g", "--idle-timeout", "2", "--format", "json"], b"").await;
    assert_eq!(second.code, 0, "{}", second.stderr);
    let mut seen: Vec<(u64, u64, String, usize)> = json_lines(&first.stdout)
        .into_iter()
        .chain(json_lines(&second.stdout))
        .map(|r| {
            (
                r["partition"].as_u64().unwrap(),
                r["offset"].as_u64().unwrap(),
                r["key"].as_str().unwrap().to_owned(),
                r["value"].as_str().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(json_lines(&first.stdout).len(), 200);
    seen.sort();
    let before = seen.len();
    seen.dedup();
    assert_eq!((before, seen.len()), (500, 500), "a record was printed twice or lost");
    let mut keys: Vec<String> = seen.iter().map(|s| s.2.clone()).collect();
    keys.sort();
    let mut expected: Vec<String> = (0..500).map(|i| format!("key-{i}")).collect();
    expected.sort();
    assert_eq!(keys, expected);
    assert!(seen.iter().all(|s| s.3 == 64));
}
