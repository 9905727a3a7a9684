//! Every page rendered by a real headless Chromium with live data; a screenshot of each lands in the artifacts
//! directory (`$FERRY_TEST_ARTIFACTS/console`, default `target/test-artifacts/console`); a click-through from browse
//! to a message to its dead letter; and a redrive run from the group page after logging in, driven over the
//! DevTools protocol.

use std::path::PathBuf;
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{
    Outcome, Producer, ProducerConfig, ProducerRecord, ShareConfig, ShareConsumer, ShareMode, Transactions,
};
use ferry_testkit::{BrokerProcess, wait_for, wait_until};

use crate::cdp;
use crate::common::{Env, IO_BUDGET, OPS, start_console};

fn artifacts() -> PathBuf {
    let dir = std::env::var_os("FERRY_TEST_ARTIFACTS")
        .map_or_else(|| ferry_testkit::workspace_root().join("target").join("test-artifacts"), PathBuf::from)
        .join("console");
    std::fs::create_dir_all(&dir).expect("the artifacts directory can be created");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_live_data_in_headless_chromium() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let broker = BrokerProcess::start().await?;
    let console = start_console(&broker, true).await?;
    let client = ferry_client::BrokerClient::new(ferry_client::ClientConfig::new([broker.addr().to_string()]))?;
    let admin = ferry_client::Admin::new(client.clone());
    admin.create_topic("payments", 2, TopicConfig::default(), None).await?;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let r = ProducerRecord::new("payments", "pay-<b>7</b>")
        .with_partition(0)
        .with_key("p7")
        .with_header("ferry-retries", "0");
    producer.send(r).await?.await?;
    producer.close().await;
    let mut cfg = ShareConfig::new("billing", &["payments"], ShareMode::Queue);
    cfg.from_earliest = true;
    cfg.session_timeout = Duration::from_secs(2);
    let member = ShareConsumer::join(client.clone(), cfg).await?;
    let got = wait_for("a delivery", IO_BUDGET, async || {
        anyhow::Ok(Some(member.poll(1, Duration::from_millis(200)).await?).filter(|g| !g.is_empty()))
    })
    .await?;
    member.ack(&[(&got[0], Outcome::retry("card declined"))]).await?;
    wait_until("the dead letter is written", IO_BUDGET, async || {
        anyhow::Ok(admin.list_offset("billing.dlq", 0, ferry_client::OffsetSpec::Latest).await?.log_end_offset == 1)
    })
    .await?;
    Transactions::new(client.clone(), "shop").prepare("t-9", vec![ProducerRecord::new("payments", "held")]).await?;

    let dir = artifacts();
    let base = console.url();
    let leader = broker.addr().to_string();
    // (page, file, what its DOM must show)
    let pages: Vec<(String, &str, Vec<&str>)> = vec![
        ("/c/dc1".into(), "overview", vec!["Overview · dc1", &leader, "billing"]),
        ("/c/dc1/topics".into(), "topics", vec!["payments\">payments</a>", "billing.dlq"]),
        ("/c/dc1/topics/payments".into(), "topic", vec!["Topic payments", &leader, "newest</a>"]),
        (
            "/c/dc1/browse/payments/0".into(),
            "browse",
            vec!["pay-&lt;b&gt;7&lt;/b&gt;", "/c/dc1/message/payments/0/0", "Filter scan"],
        ),
        (
            "/c/dc1/message/payments/0/0".into(),
            "message",
            vec![
                "group billing · FAIL",
                "DELIVERED",
                "DEAD_LETTERED",
                "card declined",
                "billing.dlq/0/0",
                "dead_letter",
            ],
        ),
        ("/c/dc1/groups".into(), "groups", vec!["billing</a>", "queue"]),
        ("/c/dc1/groups/billing".into(), "group", vec!["mode <b>queue</b>", "id=\"redrive\"", "browse billing.dlq"]),
        ("/c/dc1/transactions".into(), "transactions", vec!["t-9", "pending", "roll back</button>"]),
        ("/login".into(), "login", vec!["type=\"password\""]),
    ];
    let mut b = cdp::Browser::open(&format!("{base}/login")).await?;
    for (path, name, needles) in pages {
        let dom = b.visit(&format!("{base}{path}")).await?;
        b.screenshot(&dir.join(format!("{name}.png"))).await?;
        for n in needles {
            assert!(dom.contains(n), "{path}: {n:?} not in the page:\n{dom}");
        }
        assert!(!dom.contains("<b>7</b>"), "{path}: a record's text is escaped");
    }
    // Click through as a reader would: the browse page's first offset link, then the trace's link to the dead
    // letter, whose own trace names the original.
    let href = |dom: &str, prefix: &str| -> Option<String> {
        let start = dom.find(&format!("href=\"{prefix}"))? + "href=\"".len();
        Some(dom[start..start + dom[start..].find('"')?].to_owned())
    };
    let browse = b.visit(&format!("{base}/c/dc1/browse/payments/0")).await?;
    let message = href(&browse, "/c/dc1/message/").expect("a record links to its message page");
    assert_eq!(message, "/c/dc1/message/payments/0/0");
    b.eval(&format!("document.querySelector('a[href=\\'{message}\\']').click(); true")).await?;
    wait_until("the message page", IO_BUDGET, async || {
        anyhow::Ok(b.eval("location.pathname").await? == message.as_str())
    })
    .await?;
    let trace = b.visit(&format!("{base}{message}")).await?;
    b.screenshot(&dir.join("click-2-message.png")).await?;
    let dead = href(&trace, "/c/dc1/message/billing.dlq/").expect("the trace links to the dead letter");
    let dlq = b.visit(&format!("{base}{dead}")).await?;
    b.screenshot(&dir.join("click-3-dead-letter.png")).await?;
    assert!(dlq.contains("<a href=\"/c/dc1/message/payments/0/0\">payments/0/0</a>"), "{dlq}");
    assert!(dlq.contains("card declined"), "{dlq}");
    member.leave().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_runs_from_the_group_page_after_logging_in_with_the_admin_token() -> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("payments", 1, TopicConfig::default(), None).await?;
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    for i in 0..3 {
        producer
            .send(ProducerRecord::new("payments", format!("pay-{i}")).with_header("ferry-retries", "0"))
            .await?
            .await?;
    }
    producer.close().await;
    let mut cfg = ShareConfig::new("billing", &["payments"], ShareMode::Queue);
    cfg.from_earliest = true;
    cfg.session_timeout = Duration::from_secs(2);
    let member = ShareConsumer::join(env.client.clone(), cfg).await?;
    let mut failed = 0;
    while failed < 3 {
        let got = member.poll(3, Duration::from_millis(200)).await?;
        let nacks: Vec<_> = got.iter().map(|r| (r, Outcome::retry("declined"))).collect();
        member.ack(&nacks).await?;
        failed += got.len();
    }
    member.leave().await?;
    wait_until("three dead letters", IO_BUDGET, async || {
        anyhow::Ok(env.admin.list_offset("billing.dlq", 0, ferry_client::OffsetSpec::Latest).await?.log_end_offset == 3)
    })
    .await?;

    let dir = artifacts();
    let mut b = cdp::Browser::open(&env.url("/login")).await?;
    wait_until("the login form", IO_BUDGET, async || {
        anyhow::Ok(b.eval("!!document.querySelector('input[name=token]')").await? == true)
    })
    .await?;
    b.eval(&format!("document.querySelector('input[name=token]').value = {OPS:?}; document.forms[0].submit(); true"))
        .await?;
    wait_until("logged in, on the overview", IO_BUDGET, async || {
        anyhow::Ok(b.eval("location.pathname").await? == "/c/dc1")
    })
    .await?;
    b.call("Page.navigate", serde_json::json!({"url": env.url("/c/dc1/groups/billing")})).await?;
    wait_until("the group page", IO_BUDGET, async || {
        anyhow::Ok(b.eval("document.readyState === 'complete' && !!document.getElementById('redrive')").await? == true)
    })
    .await?;
    b.eval("window.confirm = () => true; document.getElementById('redrive').click(); true").await?;
    let progress = wait_for("the redrive's progress on the page", IO_BUDGET, async || {
        let text = b.eval("document.getElementById('job').textContent").await?;
        anyhow::Ok(text.as_str().filter(|t| t.starts_with("DONE")).map(str::to_owned))
    })
    .await?;
    assert_eq!(progress, "DONE: 3 of 3 copied");
    b.screenshot(&dir.join("redrive-done.png")).await?;

    let page = env.read("/api/v1/clusters/dc1/topics/payments/partitions/0/records?offset=3").await?;
    let copies: Vec<(String, String)> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let from =
                r["headers"].as_array().unwrap().iter().find(|h| h["key"] == "ferry-redriven-from").unwrap()["value"]
                    .clone();
            (r["value"].as_str().unwrap().to_owned(), from.as_str().unwrap().to_owned())
        })
        .collect();
    let want: Vec<(String, String)> = (0..3).map(|i| (format!("pay-{i}"), format!("billing.dlq/0/{i}"))).collect();
    assert_eq!(copies, want);
    let acts: Vec<(String, String, String)> = env
        .audit()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().into(),
                a["who"].as_str().unwrap().into(),
                a["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(acts, vec![("login".into(), "ops".into(), "ok".into()), ("redrive".into(), "ops".into(), "ok".into())]);
    Ok(())
}
