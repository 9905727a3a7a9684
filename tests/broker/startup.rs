//! `ferry-broker` start-up failures: a bad config (unknown key, unreadable token or TLS file) exits 2, a data dir
//! of another cluster exits 1, each with one `error: ...` sentence naming what to fix.

use std::process::Output;
use std::time::Duration;

use ferry_testkit::{BrokerProcess, deadline};

use crate::common::{STOP_GRACE, error_lines, run_to_exit};

/// How long a broker that cannot start may take to say so.
const START_FAILURE: Duration = Duration::from_secs(5);

async fn broker_with(config: &str, data_dir: &std::path::Path, cluster_id: &str) -> anyhow::Result<Output> {
    run_to_exit(config, data_dir, cluster_id, deadline(&[START_FAILURE])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configs_exit_2_and_a_foreign_data_dir_exits_1() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    for (config, says) in [
        ("[storage]\nflushh = \"sync\"\n", "flushh"),
        ("[broker]\nmax_batch_bytes = \"1KiB\"\n[storage]\nsegment_bytes = \"512B\"\n", "storage.segment_bytes"),
        (
            "[broker]\ntoken_file = \"/nonexistent/broker.token\"\n",
            "cannot read broker.token_file /nonexistent/broker.token",
        ),
        (
            "[broker.tls]\ncert_file = \"/nonexistent/broker.crt\"\nkey_file = \"/nonexistent/broker.key\"\n",
            "cannot read /nonexistent/broker.crt",
        ),
    ] {
        let out = broker_with(config, data.path(), "dc-a").await?;
        assert_eq!(out.status.code(), Some(2), "{config}: {out:?}");
        let lines = error_lines(&out);
        assert_eq!(lines.len(), 1, "{config}: {lines:?}");
        assert!(lines[0].contains(says), "{config}: {lines:?}");
    }

    // A data dir that belongs to cluster dc-a refuses to serve as dc-b.
    let mut owner = BrokerProcess::builder().cluster_id("dc-a").data_dir(data.path()).start().await?;
    assert_eq!(owner.terminate(STOP_GRACE).await?.code(), Some(0));
    let out = broker_with("", data.path(), "dc-b").await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("belongs to cluster \"dc-a\"") && lines[0].contains("dc-b"), "{lines:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_in_use_is_refused_and_freed_when_its_broker_dies() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let mut owner = BrokerProcess::builder().cluster_id("dc-a").data_dir(data.path()).start().await?;
    // A second broker on the same directory exits 1 naming the directory and the holder, and changes nothing.
    let before = std::fs::read(data.path().join("__ferry_meta/cluster_id"))?;
    let out = broker_with("", data.path(), "dc-a").await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let expected =
        format!("data directory {} is in use by another ferry-broker (pid {})", data.path().display(), owner.pid());
    assert!(lines[0].contains(&expected), "{lines:?} lacks {expected:?}");
    assert_eq!(std::fs::read(data.path().join("__ferry_meta/cluster_id"))?, before);
    assert!(owner.is_running(), "the owner keeps serving");
    // kill -9 releases the lock with the process: the directory is usable again at once.
    owner.kill9().await?;
    let mut next = BrokerProcess::builder().cluster_id("dc-a").data_dir(data.path()).start().await?;
    assert_eq!(next.terminate(STOP_GRACE).await?.code(), Some(0));
    Ok(())
}
