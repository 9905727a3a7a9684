//! Operating transactional messages: `ferryctl txn prepare` (one message per stdin line), `txn list`, `txn commit`
//! and `txn rollback`; resolving by hand as an operator needs the admin scope and is audit-logged; a produce-only
//! token may prepare and resolve transactions of its topics but not list them or resolve as an operator.

use std::process::Stdio;
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Code, Transactions};
use ferry_testkit::{BrokerProcess, FERRYCTL_BIN, binary_path, deadline};
use tokio::io::AsyncWriteExt;

use crate::common::{assert_status, read_topic};

const APP_SECRET: &str = "txn-app-secret-7a1c93e05b2d4f68";
const OPS_SECRET: &str = "txn-ops-secret-3f9e2b71c0d84a56";
const NARROW_SECRET: &str = "txn-narrow-secret-91d0b7e4a2c35f86";
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

async fn ferryctl(addr: &str, token: &str, args: &[&str], stdin: &str) -> anyhow::Result<std::process::Output> {
    let mut child = tokio::process::Command::new(binary_path(FERRYCTL_BIN)?)
        .args(["--timeout", "5s", "--broker", addr, "--token", token])
        .args(args)
        .env_remove("FERRY_BROKER")
        .env_remove("FERRY_TOKEN")
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

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_by_hand_with_ferryctl_needs_admin_to_resolve_as_operator_and_is_audited() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let secrets = tempfile::tempdir()?;
    let mut config = String::from("[transactions]\ntransaction_timeout = \"60s\"\n\n");
    for (name, secret, scopes, topics) in [
        ("app", APP_SECRET, r#"["produce"]"#, ".*"),
        ("ops", OPS_SECRET, r#"["admin", "consume"]"#, ".*"),
        ("narrow", NARROW_SECRET, r#"["produce"]"#, "^other$"),
    ] {
        let file = secrets.path().join(format!("{name}.token"));
        std::fs::write(&file, format!("{secret}\n"))?;
        config.push_str(&format!(
            "[[auth.tokens]]\nname = \"{name}\"\ntoken_file = {:?}\nscopes = {scopes}\ntopics = [\"{topics}\"]\ngroups = \
             [\".*\"]\n\n",
            file.display().to_string()
        ));
    }
    let broker = BrokerProcess::builder().config(config).start().await?;
    let addr = broker.addr().to_string();
    let ops = BrokerClient::new(ClientConfig::new([addr.clone()]).with_token(OPS_SECRET))?;
    let app = BrokerClient::new(ClientConfig::new([addr.clone()]).with_token(APP_SECRET))?;
    Admin::new(ops.clone()).create_topic("drill", 1, TopicConfig::default(), None).await?;

    // Prepare by hand: one message per line, invisible until committed.
    let out =
        ferryctl(&addr, APP_SECRET, &["txn", "prepare", "d1", "drill", "--group", "ops-drill"], "one\ntwo\nthree\n")
            .await?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out), "prepared d1\n");
    let out = ferryctl(&addr, APP_SECRET, &["txn", "prepare", "d2", "drill", "--group", "ops-drill"], "x\n").await?;
    assert!(out.status.success(), "{out:?}");
    assert!(read_topic(&ops, "drill").await.is_empty());

    // Listing needs admin; it shows both, pending.
    let out = ferryctl(&addr, APP_SECRET, &["txn", "list"], "").await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = ferryctl(&addr, OPS_SECRET, &["txn", "list", "--format", "json"], "").await?;
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_str(&text(&out))?;
    let rows: Vec<(String, String, u64)> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|t| {
            (t["txn_id"].as_str().unwrap().into(), t["state"].as_str().unwrap().into(), t["messages"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(rows, vec![("d1".into(), "pending".into(), 3), ("d2".into(), "pending".into(), 1)]);

    // A producer token may resolve only transactions of topics it may produce to.
    let narrow = BrokerClient::new(ClientConfig::new([addr.clone()]).with_token(NARROW_SECRET))?;
    assert_status(
        Transactions::new(narrow, "ops-drill").commit("d1").await,
        Code::PermissionDenied,
        &["TxnResolve", "drill"],
    );

    // An operator's resolution needs admin, and is audit-logged.
    let app_txns = Transactions::new(app.clone(), "ops-drill");
    assert_status(
        app_txns.resolve("d1", ferry_client::TxnOutcome::Commit, true).await,
        Code::PermissionDenied,
        &["TxnResolve by an operator"],
    );
    let out = ferryctl(&addr, OPS_SECRET, &["txn", "commit", "d1", "--group", "ops-drill", "--operator"], "").await?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out), "committed d1 by operator\ndrill/0 0..=2\n");
    assert!(broker.logs().contains("an operator resolved a transaction"), "no audit line");
    let values: Vec<String> = read_topic(&ops, "drill").await.iter().map(|r| r.value_str().to_owned()).collect();
    assert_eq!(values, ["one", "two", "three"]);

    // The producer's own rollback of d2 is allowed with produce scope; a commit after it names the rollback.
    let out = ferryctl(&addr, APP_SECRET, &["txn", "rollback", "d2", "--group", "ops-drill"], "").await?;
    assert_eq!(text(&out), "rolled back d2 by producer\n", "{out:?}");
    let out = ferryctl(&addr, APP_SECRET, &["txn", "commit", "d2", "--group", "ops-drill"], "").await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: ") && err.contains("already rolled back (decided by producer)"), "{err}");
    assert_eq!(read_topic(&ops, "drill").await.len(), 3);
    Ok(())
}
