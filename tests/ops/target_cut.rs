//! Issue 5: the link to the target is cut for 20 s (mirror -> proxy T -> dc-b) while a load runs on dc-a.
//! target_net_not_available arrives by webhook, the monitor shows the target down, nothing switches (the target
//! is local), and once the link is back target_net_recovered arrives and the target ends identical: zero loss, zero
//! duplicates.

use std::time::Duration;

use ferry_testkit::{Proxy, wait_until};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::support::hook::Hook;
use crate::support::*;

const TOPIC: &str = "orders";

/// How long the target stays cut: long enough that an append in flight at the cut has timed out (the target
/// client's 10 s request timeout, or its 5 s keepalive timeout on a hanging connection) and the append retries
/// have reached their longest back-off (5 s), so the recovery starts from the worst case: 10 s + 5 s + 5 s.
const OUTAGE: Duration = Duration::from_secs(10 + 5 + 5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_cut_for_20s_alarms_then_recovers_with_an_identical_target() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 4).await?;
    let t = Proxy::start(b.broker.addr()).await?;
    let hook = Hook::start().await?;
    let mut conf = OpsConf::new(&a, &b);
    conf.target_brokers = t.addr().to_string();
    conf.webhooks = vec![("ops".into(), hook.url.clone())];
    let mirror = conf.start().await?;
    let stop = CancellationToken::new();
    let load = background_producer(&a, TOPIC, "target-cut", stop.clone());
    wait_until("the mirror copies to dc-b", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(b.leos(TOPIC).await.map(|l| l.iter().sum::<u64>()).unwrap_or(0) >= 1_000)
    })
    .await?;

    t.cut();
    let cut_at = Instant::now();
    // Three failed appends in a row, each failing at once on a reset connection, then the webhook's delivery.
    let alarm_limit = deadline_for_target();
    let alarm = hook.wait("target_net_not_available", alarm_limit, |_| true).await?;
    assert_eq!(
        (&alarm["severity"], &alarm["notice"], &alarm["cleared"]),
        (&"critical".into(), &"alarm".into(), &false.into()),
        "{alarm}"
    );
    assert_eq!(alarm["key"], "target_net_not_available/-/-/-", "{alarm}");
    let status = get_json(&mirror, "/api/v1/status").await?;
    assert_eq!(status["target_down"], true, "{status}");
    let ready = call(&mirror, reqwest::Method::GET, "/readyz", Auth::None, None).await?;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(ready.body["reasons"].as_array().is_some_and(|r| r.contains(&"target_down".into())), "{}", ready.body);
    // An append whose request reached dc-b before the cut may still be completing there (one per partition at
    // most): the outage's log ends are those once dc-b's log ends stop moving (two reads a poll apart agree).
    // wait_for polls every POLL_INTERVAL: each reading is compared with the one a poll before.
    let mut last = None;
    let leos_during = ferry_testkit::wait_for("dc-b's log ends to settle after the cut", alarm_limit, async || {
        let now = b.leos(TOPIC).await?;
        let settled = (last.as_ref() == Some(&now)).then(|| now.clone());
        last = Some(now);
        anyhow::Ok(settled)
    })
    .await?;

    // The rest of the outage: all along, nothing reaches dc-b, the target stays down and nothing recovers.
    // Each condition names itself when it breaks.
    hold_while(OUTAGE.saturating_sub(cut_at.elapsed()), "the target outage", async || -> anyhow::Result<bool> {
        let leos = b.leos(TOPIC).await?;
        anyhow::ensure!(leos == leos_during, "dc-b's log ends moved during the outage: {leos_during:?} -> {leos:?}");
        let status = get_json(&mirror, "/api/v1/status").await?;
        anyhow::ensure!(status["target_down"] == true, "the target is not down during the outage: {status}");
        let recovered = hook.of("target_net_recovered");
        anyhow::ensure!(recovered.is_empty(), "target_net_recovered during the outage: {recovered:?}");
        Ok(true)
    })
    .await?;
    t.restore();

    let recovered = hook.wait("target_net_recovered", alarm_limit, |_| true).await?;
    assert_eq!((&recovered["notice"], &recovered["cleared"]), (&"recovery".into(), &true.into()), "{recovered}");
    assert_eq!(recovered["key"], "target_net_not_available/-/-/-", "{recovered}");
    wait_until("status target_down = false", alarm_limit, async || -> anyhow::Result<bool> {
        Ok(get_json(&mirror, "/api/v1/status").await?["target_down"] == false)
    })
    .await?;
    assert_eq!(egress(&mirror).await?["active"], "primary", "a target outage never switches source routes");
    assert!(hook.of("source_net_be_switched").is_empty());

    stop.cancel();
    let produced = load.await??;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let src = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), produced, "zero loss");
    Ok(())
}

/// The deadline for the target alarm and its recovery: the target client's keepalive (2 s interval, 5 s timeout),
/// its request timeout (10 s) and a retry backoff (up to 5 s), in case an append was in flight on a connection
/// that hangs rather than resets, plus the webhook's delivery, with the 3x margin.
fn deadline_for_target() -> Duration {
    ferry_testkit::deadline(&[Duration::from_secs(7), Duration::from_secs(5), Duration::from_secs(2)])
}
