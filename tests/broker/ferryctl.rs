//! `ferryctl` exit codes against a real broker: 2 for bad usage, 1 for a runtime failure, each with one
//! `error: ...` sentence on stderr.

use std::process::Output;
use std::time::Duration;

use ferry_testkit::{FERRYCTL_BIN, binary_path, deadline};

use crate::common::start_broker;

/// ferryctl's own request timeout in these runs; the wait for the process is derived from it.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

async fn ferryctl(args: &[&str]) -> anyhow::Result<Output> {
    let program = binary_path(FERRYCTL_BIN)?;
    let run = tokio::process::Command::new(program)
        .args(["--timeout", "5s"])
        .args(args)
        .env_remove("FERRY_BROKER")
        .env_remove("FERRY_TOKEN")
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output();
    Ok(tokio::time::timeout(deadline(&[CALL_TIMEOUT]), run).await??)
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_and_runtime_errors_exit_1_with_one_sentence() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let addr = broker.addr().to_string();

    // A command line clap rejects: exit 2, and the first line is the one-sentence error.
    let out = ferryctl(&["--broker", &addr, "topic", "frobnicate"]).await?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let lines = stderr_lines(&out);
    assert!(lines.first().is_some_and(|l| l.starts_with("error: ")), "stderr: {lines:?}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("error")).count(), 1, "stderr: {lines:?}");
    assert!(out.stdout.is_empty());

    // A bad option value found by ferryctl itself: exit 2, exactly one line.
    let out = ferryctl(&["--broker", "not-an-address", "topic", "list"]).await?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "stderr: {lines:?}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("not-an-address"), "stderr: {lines:?}");

    // A runtime failure (the broker says the topic does not exist): exit 1, exactly one line that says so.
    let out = ferryctl(&["--broker", &addr, "topic", "describe", "missing"]).await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "stderr: {lines:?}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("\"missing\" does not exist"), "stderr: {lines:?}");
    assert!(out.stdout.is_empty());

    // And success exits 0.
    let out = ferryctl(&["--broker", &addr, "topic", "create", "made-by-ctl", "--partitions", "2"]).await?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    Ok(())
}
