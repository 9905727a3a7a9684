//! `ferryctl produce --delay`, `topic describe` with pending delayed records, and `ferryctl delay cancel` against a
//! real broker: ids on stdout, a cancelled record never appears, cancel after due and bad delays exit 1 with the
//! broker's sentence, a malformed delay exits 2.

use std::process::{Output, Stdio};
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_testkit::{FERRYCTL_BIN, binary_path, deadline, wait_until};
use tokio::io::AsyncWriteExt;

use crate::common::{IO_BUDGET, connect, read_topic, start_broker};
use crate::delay::{TICK, TOPIC, now_ms};

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn ferryctl(addr: &str, args: &[&str], stdin: &str) -> anyhow::Result<Output> {
    let mut child = tokio::process::Command::new(binary_path(FERRYCTL_BIN)?)
        .args(["--timeout", "5s", "--broker", addr])
        .args(args)
        .env_remove("FERRY_BROKER")
        .env_remove("FERRY_TOKEN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin.as_bytes()).await?;
    drop(input);
    Ok(tokio::time::timeout(deadline(&[CALL_TIMEOUT]), child.wait_with_output()).await??)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferryctl_produces_delayed_records_describes_and_cancels_them() -> anyhow::Result<()> {
    let broker = start_broker("[delay]\ntick = \"50ms\"\n").await?;
    let addr = broker.addr().to_string();
    let (client, admin) = connect(&broker);
    admin.create_topic(TOPIC, 1, TopicConfig::default(), None).await?;

    let sent_at = now_ms();
    let out = ferryctl(&addr, &["produce", TOPIC, "--delay", "3s", "--key-sep", ":"], "a:one\nb:two\n").await?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ids: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(ids.len(), 2, "stdout: {}", text(&out.stdout));

    let out = ferryctl(&addr, &["topic", "describe", TOPIC], "").await?;
    let described = text(&out.stdout);
    let row = described.lines().skip_while(|l| !l.starts_with("DELAYED")).nth(1).unwrap_or_default().to_owned();
    assert_eq!(row.split_whitespace().take(2).collect::<Vec<_>>(), vec!["0", "2"], "describe: {described}");

    let out = ferryctl(&addr, &["delay", "cancel", TOPIC, &ids[1]], "").await?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).starts_with(&format!("cancelled {}", ids[1])), "{out:?}");

    let wait = Duration::from_millis(u64::try_from(sent_at + 3_000 - now_ms()).unwrap_or(0));
    wait_until("the record left to be delivered", deadline(&[wait, TICK, IO_BUDGET]), async || {
        !read_topic(&client, TOPIC).await.is_empty()
    })
    .await?;
    let held = read_topic(&client, TOPIC).await;
    assert_eq!(
        held.iter().map(|r| (r.key.clone(), r.value_str().to_owned())).collect::<Vec<_>>(),
        vec![(Some(bytes::Bytes::from_static(b"a")), "one".to_owned())]
    );
    assert!(held[0].timestamp >= sent_at + 3_000, "moved at its due time: {held:?}");

    // After due, and for a delay past the limit: exit 1 with the broker's reason; a malformed delay: exit 2.
    let out = ferryctl(&addr, &["delay", "cancel", TOPIC, &ids[0]], "").await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("no longer pending"), "{out:?}");
    let out = ferryctl(&addr, &["produce", TOPIC, "--delay", "8days"], "x\n").await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("past the maximum delay"), "{out:?}");
    let out = ferryctl(&addr, &["produce", TOPIC, "--delay", "soon"], "x\n").await?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(read_topic(&client, TOPIC).await.len(), 1);
    Ok(())
}
