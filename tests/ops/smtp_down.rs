//! Issue 5: the SMTP server is down (nothing listens on the email channel's port) while the primary route is cut.
//! The webhook alarms still arrive, the failover and mirroring are unaffected (the target ends identical), and
//! `ferry_alarms_total{channel="oncall",outcome="failed"}` counts exactly the notices the webhook took.

use ferry_testkit::wait_for;

use crate::failover::Failover;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_down_keeps_webhooks_and_mirroring_and_counts_failed_mail() -> anyhow::Result<()> {
    // A port nothing listens on: every SMTP connection is refused.
    let dead_port = ferry_testkit::reserve_port()?;
    let f = Failover::start(dead_port).await?;
    let limit = f.conf.health.reaction();

    f.p1.cut();
    f.wait_not_available("primary").await?;
    f.wait_switched_to_backup().await?;
    // The shipped rules send every warning and critical notice to both channels: each one the webhook took was
    // attempted by email too, and failed (one SMTP attempt each). At least the two of the cut and the switch.
    let (text, received) = wait_for(
        "ferry_alarms_total{channel=\"oncall\",outcome=\"failed\"} = {channel=\"ops\",outcome=\"sent\"} = webhook bodies",
        limit,
        async || -> anyhow::Result<Option<(String, Vec<serde_json::Value>)>> {
            let received = f.hook.received();
            let text = metrics_text(&f.mirror).await?;
            let n = Some(received.len() as f64);
            let agree = sample(&text, r#"ferry_alarms_total{channel="oncall",outcome="failed"}"#) == n
                && sample(&text, r#"ferry_alarms_total{channel="ops",outcome="sent"}"#) == n
                && f.hook.received().len() == received.len();
            Ok((agree && received.len() >= 2).then_some((text, received)))
        },
    )
    .await?;
    let events: Vec<&str> = received.iter().map(|b| b["event"].as_str().unwrap_or("?")).collect();
    assert_eq!(&events[..2], ["source_net_not_available", "source_net_be_switched"], "{received:?}");
    for (series, value) in [
        (r#"ferry_alarms_total{channel="oncall",outcome="sent"}"#, 0.0),
        (r#"ferry_alarms_total{channel="oncall",outcome="dropped"}"#, 0.0),
        (r#"ferry_alarms_total{channel="ops",outcome="failed"}"#, 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    // Mirroring goes on while the email channel keeps failing.
    f.wait_target_grows(2_000).await?;
    f.finish().await
}
