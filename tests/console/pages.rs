//! Every page rendered by a real headless Chromium with live data; a screenshot of each lands in the artifacts
//! directory (`$FERRY_TEST_ARTIFACTS/console`, default `target/test-artifacts/console`).

use std::path::PathBuf;
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{
    Outcome, Producer, ProducerConfig, ProducerRecord, ShareConfig, ShareConsumer, ShareMode, Transactions,
};
use ferry_testkit::{BrokerProcess, wait_for, wait_until};

use crate::common::{IO_BUDGET, start_console};

fn artifacts() -> PathBuf {
    let dir = std::env::var_os("FERRY_TEST_ARTIFACTS")
        .map_or_else(|| ferry_testkit::workspace_root().join("target").join("test-artifacts"), PathBuf::from)
        .join("console");
    std::fs::create_dir_all(&dir).expect("the artifacts directory can be created");
    dir
}

/// Renders `url` in headless Chromium: its DOM after scripts ran, and a screenshot at `shot`.
async fn render(url: &str, shot: &std::path::Path) -> anyhow::Result<String> {
    let _ = std::fs::remove_file(shot);
    let out = tokio::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1000"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--dump-dom")
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(IO_BUDGET, out).await??;
    anyhow::ensure!(out.status.success(), "chromium failed on {url}: {}", String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(std::fs::metadata(shot).map(|m| m.len() > 0).unwrap_or(false), "no screenshot of {url}");
    Ok(String::from_utf8(out.stdout)?)
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
    for (path, name, needles) in pages {
        let dom = render(&format!("{base}{path}"), &dir.join(format!("{name}.png"))).await?;
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
    let browse = render(&format!("{base}/c/dc1/browse/payments/0"), &dir.join("click-1-browse.png")).await?;
    let message = href(&browse, "/c/dc1/message/").expect("a record links to its message page");
    assert_eq!(message, "/c/dc1/message/payments/0/0");
    let trace = render(&format!("{base}{message}"), &dir.join("click-2-message.png")).await?;
    let dead = href(&trace, "/c/dc1/message/billing.dlq/").expect("the trace links to the dead letter");
    let dlq = render(&format!("{base}{dead}"), &dir.join("click-3-dead-letter.png")).await?;
    assert!(dlq.contains("<a href=\"/c/dc1/message/payments/0/0\">payments/0/0</a>"), "{dlq}");
    assert!(dlq.contains("card declined"), "{dlq}");
    member.leave().await?;
    Ok(())
}
