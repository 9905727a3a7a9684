//! The dashboard page in headless Chromium: the live numbers the scripts fill in, and a screenshot.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{Monitor, TOKEN, build_handle, populate, unused_routes};

fn chromium() -> PathBuf {
    let candidates = std::env::var_os("FERRY_CHROMIUM")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/bin/chromium", "/usr/bin/chromium-browser"].map(PathBuf::from));
    for c in candidates {
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "headless Chromium is needed for the dashboard test and was not found at /usr/bin/chromium: install it with \
         `apt-get install -y chromium` (scripts/test.sh does this), or set FERRY_CHROMIUM to its path"
    );
}

async fn run_chromium(args: &[String], profile: &Path) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-proxy-server",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("chromium finishes within 120 s")
        .expect("chromium runs")
}

/// The text of the first element whose opening tag contains `marker`.
fn element_text<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom.find(marker).unwrap_or_else(|| panic!("no element with {marker} in the DOM:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap();
    &rest[start..start + end]
}

#[tokio::test]
async fn dashboard_shows_the_live_numbers_in_headless_chromium() {
    let h = build_handle(&unused_routes());
    populate(&h);
    let m = Monitor::start(h, Some(TOKEN)).await;
    let profile = tempfile::tempdir().unwrap();
    let url = format!("{}/", m.base);

    let out =
        run_chromium(&["--virtual-time-budget=5000".into(), "--dump-dom".into(), url.clone()], profile.path()).await;
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "chromium failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));

    // The numbers come from the API after the scripts ran (the page ships "–" placeholders).
    assert_eq!(element_text(&dom, "id=\"total-lag\""), "630");
    assert_eq!(element_text(&dom, "id=\"active-route\""), "primary");
    assert_eq!(element_text(&dom, "id=\"mirror-name\""), "dc-a_to_dc-b");
    assert_eq!(element_text(&dom, "id=\"partition-count\""), "4");
    assert_eq!(element_text(&dom, "id=\"records-in\""), "600");
    assert_eq!(element_text(&dom, "class=\"num lag\" data-topic=\"orders\""), "600");
    assert_eq!(element_text(&dom, "class=\"num lag\" data-topic=\"payments\""), "30");
    // The RPO runs on the real clock since `populate`: a number of seconds, with one decimal.
    for marker in ["id=\"rpo-max\"", "class=\"num rpo\" data-topic=\"payments\""] {
        let rpo = element_text(&dom, marker);
        assert!(rpo.parse::<f64>().is_ok_and(|s| s >= 0.0) && rpo.contains('.'), "{marker}: {rpo:?}");
    }
    assert!(element_text(&dom, "id=\"ready\"").starts_with("not ready: partition_halted"), "{dom}");
    assert!(dom.contains("data-topic=\"payments\" data-partition=\"0\""), "partition table row");
    assert!(dom.contains("data-kind=\"partition_diverged\""), "recent events");
    assert!(dom.contains("data-route=\"backup\""), "route table");
    // The 1 s rates and 10 s averages of the seeded second (`populate`), with one decimal.
    assert_eq!(element_text(&dom, "id=\"source-rate\""), "600.0");
    assert_eq!(element_text(&dom, "id=\"source-rate-10s\""), "60.0");
    assert_eq!(element_text(&dom, "id=\"target-rate\""), "540.0");
    assert_eq!(element_text(&dom, "id=\"target-rate-10s\""), "54.0");
    assert_eq!(element_text(&dom, "id=\"source-bytes-rate\""), "60000.0");
    assert_eq!(element_text(&dom, "id=\"target-bytes-rate\""), "54000.0");

    let shot = m.dir.path().join("dashboard.png");
    let out = run_chromium(
        &[
            "--virtual-time-budget=5000".into(),
            "--hide-scrollbars".into(),
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,900".into(),
            url,
        ],
        profile.path(),
    )
    .await;
    assert!(out.status.success(), "chromium screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "a real PNG, {} bytes", png.len());
    if let Some(copy) = std::env::var_os("FERRY_DASHBOARD_SCREENSHOT") {
        std::fs::copy(&shot, copy).unwrap();
    }
}
