//! Issue 5: the SMTP server is down (nothing listens on the email channel's port) while the primary route is cut.
//! The webhook alarms still arrive, the failover and mirroring are unaffected (the target ends identical), and
//! `ferry_alarms_total{channel="oncall",outcome="failed"}` rises on /metrics.

use ferry_testkit::wait_until;

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
    // Two critical/warning notices went to the email channel: both fail (one SMTP attempt each).
    wait_until(
        "ferry_alarms_total{channel=\"oncall\",outcome=\"failed\"} >= 2",
        limit,
        async || -> anyhow::Result<bool> {
            let text = metrics_text(&f.mirror).await?;
            Ok(sample(&text, r#"ferry_alarms_total{channel="oncall",outcome="failed"}"#).unwrap_or(0.0) >= 2.0)
        },
    )
    .await?;
    let text = metrics_text(&f.mirror).await?;
    assert_eq!(sample(&text, r#"ferry_alarms_total{channel="oncall",outcome="sent"}"#).unwrap_or(0.0), 0.0, "{text}");
    assert!(sample(&text, r#"ferry_alarms_total{channel="ops",outcome="sent"}"#).unwrap_or(0.0) >= 2.0, "{text}");
    // Mirroring goes on while the email channel keeps failing.
    f.wait_target_grows(2_000).await?;
    f.finish().await
}
