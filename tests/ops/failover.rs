//! Issue 5, egress failover: two routes to the same source cluster, "primary" through proxy P1 and "backup"
//! through proxy P2, both to dc-a; alarms to a webhook receiver and a real SMTP server. A load runs throughout.
//!
//! - The primary is cut (connections reset): source_net_not_available arrives by webhook and by email, the mirror
//!   switches to the backup (source_net_be_switched {from, to, reason}), keeps mirroring, and a manual switch back
//!   to the unhealthy primary is refused (409). Restored: source_net_recovered arrives, the mirror stays on the
//!   backup (switch_back = "manual"); a manual switch without or with a wrong token is 401 and changes nothing, to
//!   an unknown route 404, with the token it switches and pins: cut again, the pinned primary is kept past
//!   switch_after, until an unpin lets the failover happen. The target ends identical to the source.
//! - The primary is blackholed (connections hang, nothing is reset): detected and switched the same way.

use ferry_testkit::{MirrorProcess, Proxy, wait_until};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::support::hook::Hook;
use crate::support::smtp::SmtpSink;
use crate::support::*;

const TOPIC: &str = "orders";
const MIRROR: &str = "dc-a_to_dc-b";

/// Two DCs, two proxied routes to dc-a, the alarm endpoints, the mirror, and a load on dc-a.
pub struct Failover {
    pub a: Dc,
    pub b: Dc,
    pub p1: Proxy,
    /// The backup route's proxy, kept up for the test's length.
    _p2: Proxy,
    pub hook: Hook,
    pub conf: OpsConf,
    pub mirror: MirrorProcess,
    stop: CancellationToken,
    load: tokio::task::JoinHandle<anyhow::Result<u64>>,
}

impl Failover {
    /// Starts everything; `email_port` is where the "oncall" email channel sends (a real SMTP server, or a port
    /// with nothing listening). Returns once the mirror copies over the primary and both routes are healthy.
    pub async fn start(email_port: u16) -> anyhow::Result<Failover> {
        let (a, b) = two_dcs().await?;
        a.create_topic(TOPIC, 4).await?;
        let p1 = Proxy::start(a.broker.addr()).await?;
        let p2 = Proxy::start(a.broker.addr()).await?;
        let hook = Hook::start().await?;
        let mut conf = OpsConf::new(&a, &b);
        conf.routes = vec![Route::new("primary", p1.addr()), Route::new("backup", p2.addr())];
        conf.webhooks = vec![("ops".into(), hook.url.clone())];
        conf.emails = vec![("oncall".into(), email_port)];
        let mirror = conf.start().await?;
        let stop = CancellationToken::new();
        let load = background_producer(&a, TOPIC, "failover", stop.clone());
        let f = Failover { a, b, p1, _p2: p2, hook, conf, mirror, stop, load };
        f.wait_target_grows(1_000).await?;
        wait_until(
            "both routes healthy, primary active",
            f.conf.health.reaction(),
            async || -> anyhow::Result<bool> {
                let e = egress(&f.mirror).await?;
                Ok(e["active"] == "primary"
                    && route(&e, "primary")["healthy"] == true
                    && route(&e, "backup")["healthy"] == true)
            },
        )
        .await?;
        Ok(f)
    }

    /// Waits until the target holds `more` records beyond what it holds now: mirroring goes on.
    pub async fn wait_target_grows(&self, more: u64) -> anyhow::Result<()> {
        let base: u64 = self.b.leos(TOPIC).await.map(|l| l.iter().sum()).unwrap_or(0);
        wait_until(&format!("{more} more records on dc-b"), io_deadline(), async || -> anyhow::Result<bool> {
            Ok(self.b.leos(TOPIC).await.map(|l| l.iter().sum::<u64>()).unwrap_or(0) >= base + more)
        })
        .await
    }

    /// Waits for the webhook's source_net_not_available for `route` and checks its fields.
    pub async fn wait_not_available(&self, route_name: &str) -> anyhow::Result<Value> {
        let body = self
            .hook
            .wait("source_net_not_available", self.conf.health.reaction(), |v| v["route"] == route_name)
            .await?;
        assert_eq!(body["severity"], "critical", "{body}");
        assert_eq!(body["notice"], "alarm", "{body}");
        assert_eq!(body["cleared"], false, "{body}");
        assert_eq!(
            (&body["mirror"], &body["source_cluster"], &body["target_cluster"]),
            (&MIRROR.into(), &"dc-a".into(), &"dc-b".into())
        );
        assert_eq!(body["key"], format!("source_net_not_available/-/-/{route_name}"), "{body}");
        assert!(body["details"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "a reason: {body}");
        Ok(body)
    }

    /// Waits until the mirror uses the backup, and checks the webhook's source_net_be_switched.
    pub async fn wait_switched_to_backup(&self) -> anyhow::Result<()> {
        let limit = self.conf.health.reaction();
        wait_until("egress active = backup", limit, async || -> anyhow::Result<bool> {
            Ok(egress(&self.mirror).await?["active"] == "backup")
        })
        .await?;
        let e = egress(&self.mirror).await?;
        assert_eq!(e["pinned"], false, "an automatic switch does not pin: {e}");
        assert_eq!(route(&e, "backup")["active"], true, "{e}");
        assert_eq!(route(&e, "primary")["healthy"], false, "{e}");
        let switched = self.hook.wait("source_net_be_switched", limit, |v| v["details"]["to"] == "backup").await?;
        assert_eq!(switched["severity"], "warning", "{switched}");
        assert_eq!(switched["route"], "backup", "{switched}");
        assert_eq!(switched["details"]["from"], "primary", "{switched}");
        let reason = switched["details"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("\"primary\" unavailable"), "the reason names the failed route: {switched}");
        // The same event on the monitor.
        let ev = events(&self.mirror, "source_net_be_switched").await?;
        assert!(ev.iter().any(|e| e["details"]["from"] == "primary" && e["details"]["to"] == "backup"), "{ev:?}");
        Ok(())
    }

    /// Stops the load, waits until the mirror caught up, and asserts the target identical to the source with
    /// exactly the records produced.
    pub async fn finish(self) -> anyhow::Result<()> {
        self.stop.cancel();
        let produced = self.load.await??;
        wait_caught_up(&self.a, TOPIC, &self.b, TOPIC, io_deadline()).await?;
        let src = assert_identical(&self.a, TOPIC, &self.b, TOPIC).await?;
        assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), produced, "zero loss");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_primary_alarms_by_webhook_and_email_switches_and_a_manual_switch_back_pins() -> anyhow::Result<()> {
    let smtp = SmtpSink::start().await?;
    let f = Failover::start(smtp.port).await?;
    let limit = f.conf.health.reaction();

    f.p1.cut();
    let alarm = f.wait_not_available("primary").await?;
    assert_eq!(alarm["details"]["brokers"], f.p1.addr().to_string(), "{alarm}");
    let mail = smtp
        .wait_subject("[ferry critical] ALARM: source_net_not_available on dc-a_to_dc-b (route primary)", limit)
        .await?;
    let body = mail["body"].as_str().unwrap_or_default();
    assert_eq!(
        (&mail["mail_from"], &mail["to"], &mail["content_type"]),
        (&"ferry@example.org".into(), &"oncall@example.org".into(), &"text/plain".into())
    );
    for line in [
        "ALARM: source_net_not_available (critical)\n",
        alarm["message"].as_str().unwrap_or("<no message>"),
        "Mirror:     dc-a_to_dc-b (dc-a -> dc-b)\n",
        "Route:      primary\n",
        "Cleared:    false\n",
        "Runbook: docs/alarms.md, section \"source_net_not_available\".\n",
    ] {
        assert!(body.contains(line), "the mail body has {line:?}:\n{body}");
    }
    f.wait_switched_to_backup().await?;
    f.wait_target_grows(2_000).await?;

    // Back to the cut primary, without force: refused, nothing moves.
    let refused = post(&f.mirror, "/api/v1/egress/switch", Auth::Bearer(TOKEN), Some(r#"{"route":"primary"}"#)).await?;
    assert_eq!((refused.status, refused.code()), (409, "route_unhealthy"), "{:?}", refused.body);
    let e = egress(&f.mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"backup".into(), &false.into()), "{e}");

    // The primary comes back: its recovery notice arrives; with switch_back = "manual" the mirror stays.
    f.p1.restore();
    let recovered = f.hook.wait("source_net_recovered", limit, |v| v["route"] == "primary").await?;
    assert_eq!(
        (&recovered["notice"], &recovered["cleared"], &recovered["severity"]),
        (&"recovery".into(), &true.into(), &"critical".into()),
        "{recovered}"
    );
    assert_eq!(
        recovered["key"], "source_net_not_available/-/-/primary",
        "the recovery carries the alarm's key: {recovered}"
    );
    smtp.wait_subject("[ferry critical] RESOLVED: source_net_recovered on dc-a_to_dc-b (route primary)", limit).await?;
    let e = egress(&f.mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"backup".into(), &false.into()), "manual switch-back: {e}");
    assert_eq!(route(&e, "primary")["healthy"], true, "{e}");

    // A manual switch without the token, or with a wrong one: 401, and nothing switches.
    let switch_primary = Some(r#"{"route":"primary"}"#);
    for auth in [Auth::None, Auth::Bearer("not-the-token"), Auth::Header(TOKEN)] {
        let a = post(&f.mirror, "/api/v1/egress/switch", auth, switch_primary).await?;
        assert_eq!((a.status, a.code()), (401, "unauthorized"), "{auth:?}: {:?}", a.body);
        assert_eq!(a.www_authenticate.as_deref(), Some("Bearer"), "{auth:?}");
    }
    // An unknown route: 404 naming the configured routes.
    let unknown = post(&f.mirror, "/api/v1/egress/switch", Auth::Bearer(TOKEN), Some(r#"{"route":"nowhere"}"#)).await?;
    assert_eq!((unknown.status, unknown.code()), (404, "unknown_route"), "{:?}", unknown.body);
    assert!(
        unknown.body["reason"].as_str().is_some_and(|r| r.contains("primary") && r.contains("backup")),
        "{:?}",
        unknown.body
    );
    let e = egress(&f.mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"backup".into(), &false.into()), "refused calls change nothing: {e}");

    // With the token: switched and pinned.
    let ok = post(&f.mirror, "/api/v1/egress/switch", Auth::Bearer(TOKEN), switch_primary).await?;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!((&ok.body["active"], &ok.body["pinned"]), (&"primary".into(), &true.into()), "{:?}", ok.body);
    let e = egress(&f.mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"primary".into(), &true.into()), "{e}");
    let back = f.hook.wait("source_net_be_switched", limit, |v| v["details"]["to"] == "primary").await?;
    assert_eq!(
        (&back["details"]["from"], &back["details"]["reason"]),
        (&"backup".into(), &"manual switch by an operator".into()),
        "{back}"
    );
    // ferryctl shows the same.
    let out = ferryctl(&["--monitor", &f.mirror.addr().to_string(), "mirror", "egress", "--format", "json"]).await?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let shown: Value = serde_json::from_str(&out.stdout)?;
    assert_eq!((&shown["active"], &shown["pinned"]), (&"primary".into(), &true.into()), "{shown}");
    f.wait_target_grows(1_000).await?;

    // Every notice the receiver took is counted as sent on its channel.
    wait_until(
        "ferry_alarms_total{channel=\"ops\",outcome=\"sent\"} = webhook bodies",
        limit,
        async || -> anyhow::Result<bool> {
            let text = metrics_text(&f.mirror).await?;
            Ok(sample(&text, r#"ferry_alarms_total{channel="ops",outcome="sent"}"#)
                == Some(f.hook.received().len() as f64))
        },
    )
    .await?;
    let text = metrics_text(&f.mirror).await?;
    assert_eq!(sample(&text, r#"ferry_alarms_total{channel="ops",outcome="failed"}"#).unwrap_or(0.0), 0.0);
    assert_eq!(sample(&text, r#"ferry_mirror_route_active{route="primary"}"#), Some(1.0), "{text}");

    // The pin holds: the primary fails again and stays failed for longer than switch_after (more failed probe
    // rounds than fit in it), yet the mirror stays on it.
    f.p1.cut();
    let h = &f.conf.health;
    let rounds =
        u64::from(h.failure_threshold) + (h.switch_after.as_millis() / h.check_interval.as_millis()) as u64 + 1;
    wait_until("the pinned primary failing for longer than switch_after", limit, async || -> anyhow::Result<bool> {
        Ok(route(&egress(&f.mirror).await?, "primary")["consecutive_failures"].as_u64().unwrap_or(0) >= rounds)
    })
    .await?;
    let e = egress(&f.mirror).await?;
    assert_eq!((&e["active"], &e["pinned"]), (&"primary".into(), &true.into()), "pinned: {e}");
    // Unpinned, automatic failover applies again.
    let unpinned = post(&f.mirror, "/api/v1/egress/unpin", Auth::Bearer(TOKEN), None).await?;
    assert_eq!((unpinned.status, &unpinned.body["pinned"]), (200, &false.into()), "{:?}", unpinned.body);
    wait_until("egress active = backup after the unpin", limit, async || -> anyhow::Result<bool> {
        Ok(egress(&f.mirror).await?["active"] == "backup")
    })
    .await?;
    f.p1.restore();
    f.wait_target_grows(1_000).await?;
    f.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_primary_is_detected_and_switched() -> anyhow::Result<()> {
    let smtp = SmtpSink::start().await?;
    let f = Failover::start(smtp.port).await?;
    let before = f.p1.stats().connections_open;
    assert!(before > 0, "the mirror holds connections through P1");

    // Nothing is reset: the open stream and every new connection hang.
    f.p1.blackhole();
    f.wait_not_available("primary").await?;
    f.wait_switched_to_backup().await?;
    f.wait_target_grows(2_000).await?;
    let readiness = call(&f.mirror, reqwest::Method::GET, "/readyz", Auth::None, None).await?;
    assert_eq!(readiness.status, 200, "mirroring over the backup is ready: {}", readiness.body);
    assert!(f.p1.stats().resets == 0, "a blackhole resets nothing");
    f.finish().await
}
