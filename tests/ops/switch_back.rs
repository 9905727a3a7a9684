//! Egress failover with `switch_back = "auto"` and with a non-zero `min_switch_interval` (conf/mirror.toml
//! `[source.health]`): two routes to dc-a, "primary" through proxy P1 and "backup" through P2, a load throughout.
//!
//! - auto: the primary is cut, the mirror switches to the backup; healed, the primary recovers and the mirror
//!   returns to it by itself (`source_net_be_switched` backup -> primary, reason "switch_back = auto").
//! - min_switch_interval: the same, but the return is held: with the primary healthy again the mirror stays on the
//!   backup (observed), and the second switch comes no sooner than `min_switch_interval` after the first.
//!
//! Both check the exact order of the egress events and end with the target identical to the source.

use std::time::Duration;

use ferry_testkit::{MirrorProcess, Proxy, deadline, wait_until};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::support::*;

const TOPIC: &str = "orders";

struct Setup {
    a: Dc,
    b: Dc,
    p1: Proxy,
    _p2: Proxy,
    health: Health,
    mirror: MirrorProcess,
    stop: CancellationToken,
    load: tokio::task::JoinHandle<anyhow::Result<u64>>,
}

impl Setup {
    async fn start(min_switch_interval: Duration) -> anyhow::Result<Setup> {
        let (a, b) = two_dcs().await?;
        a.create_topic(TOPIC, 4).await?;
        let (p1, p2) = (Proxy::start(a.broker.addr()).await?, Proxy::start(a.broker.addr()).await?);
        let mut conf = OpsConf::new(&a, &b);
        conf.routes = vec![Route::new("primary", p1.addr()), Route::new("backup", p2.addr())];
        conf.health.min_switch_interval = min_switch_interval;
        let text = conf.toml();
        assert!(text.contains("switch_back = \"manual\"\n"), "the config layout changed:\n{text}");
        let text = text.replace("switch_back = \"manual\"\n", "switch_back = \"auto\"\n");
        let mirror = MirrorProcess::builder(text).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
        let stop = CancellationToken::new();
        let load = background_producer(&a, TOPIC, "switch-back", stop.clone());
        let s = Setup { a, b, p1, _p2: p2, health: conf.health.clone(), mirror, stop, load };
        s.wait_target_grows(1_000).await?;
        wait_until("both routes healthy, primary active", s.health.reaction(), async || -> anyhow::Result<bool> {
            let e = egress(&s.mirror).await?;
            Ok(e["active"] == "primary"
                && route(&e, "primary")["healthy"] == true
                && route(&e, "backup")["healthy"] == true)
        })
        .await?;
        Ok(s)
    }

    async fn wait_target_grows(&self, more: u64) -> anyhow::Result<()> {
        let base: u64 = self.b.leos(TOPIC).await.map(|l| l.iter().sum()).unwrap_or(0);
        wait_until(&format!("{more} more records on dc-b"), io_deadline(), async || -> anyhow::Result<bool> {
            Ok(self.b.leos(TOPIC).await.map(|l| l.iter().sum::<u64>()).unwrap_or(0) >= base + more)
        })
        .await
    }

    async fn wait_active(&self, name: &str, limit: Duration) -> anyhow::Result<()> {
        wait_until(&format!("egress active = {name}"), limit, async || -> anyhow::Result<bool> {
            Ok(egress(&self.mirror).await?["active"] == name)
        })
        .await
    }

    /// The egress events (`source_net_*`), oldest first.
    async fn egress_events(&self) -> anyhow::Result<Vec<Value>> {
        let v = get_json(&self.mirror, "/api/v1/events?limit=200").await?;
        let mut list: Vec<Value> = v["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("source_net_")))
            .cloned()
            .collect();
        list.reverse();
        Ok(list)
    }

    /// Asserts the egress events were exactly: the primary unavailable, the switch to the backup, the primary
    /// recovered, the automatic switch back. Returns the two switches.
    async fn assert_cut_and_return(&self) -> anyhow::Result<(Value, Value)> {
        let list = self.egress_events().await?;
        let summary: Vec<(String, String)> = list
            .iter()
            .map(|e| (e["kind"].as_str().unwrap_or("").to_owned(), e["route"].as_str().unwrap_or("").to_owned()))
            .collect();
        let expected = [
            ("source_net_not_available", "primary"),
            ("source_net_be_switched", "backup"),
            ("source_net_recovered", "primary"),
            ("source_net_be_switched", "primary"),
        ]
        .map(|(k, r)| (k.to_owned(), r.to_owned()));
        assert_eq!(summary, expected, "{list:#?}");
        let (away, back) = (list[1].clone(), list[3].clone());
        assert_eq!((&away["details"]["from"], &away["details"]["to"]), (&"primary".into(), &"backup".into()), "{away}");
        assert_eq!((&back["details"]["from"], &back["details"]["to"]), (&"backup".into(), &"primary".into()), "{back}");
        assert_eq!(back["details"]["reason"], "the primary route recovered (switch_back = auto)", "{back}");
        let e = egress(&self.mirror).await?;
        assert_eq!(e["pinned"], false, "an automatic switch does not pin: {e}");
        Ok((away, back))
    }

    /// Stops the load, waits until the mirror caught up, and asserts the target identical with zero loss.
    async fn finish(self) -> anyhow::Result<()> {
        self.stop.cancel();
        let produced = self.load.await??;
        wait_caught_up(&self.a, TOPIC, &self.b, TOPIC, io_deadline()).await?;
        let src = assert_identical(&self.a, TOPIC, &self.b, TOPIC).await?;
        assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), produced, "zero loss");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_back_auto_returns_to_the_recovered_primary() -> anyhow::Result<()> {
    let s = Setup::start(Duration::ZERO).await?;
    let limit = s.health.reaction();
    s.p1.cut();
    s.wait_active("backup", limit).await?;
    s.wait_target_grows(1_000).await?;
    s.p1.restore();
    s.wait_active("primary", limit).await?;
    s.assert_cut_and_return().await?;
    s.wait_target_grows(1_000).await?;
    s.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_switch_interval_holds_the_switch_back() -> anyhow::Result<()> {
    let interval = Duration::from_secs(6);
    let s = Setup::start(interval).await?;
    let limit = s.health.reaction();
    s.p1.cut();
    s.wait_active("backup", limit).await?;
    s.p1.restore();
    // The primary is healthy again, and the mirror stays on the backup: the interval holds the return. The primary
    // passes its probes a round or two after the restore (200 ms each), well inside the 6 s interval that this state
    // lasts for; the interval is long so that a slow machine still sees it.
    wait_until(
        "primary healthy while the backup stays active",
        deadline(&[interval]),
        async || -> anyhow::Result<bool> {
            let e = egress(&s.mirror).await?;
            Ok(e["active"] == "backup"
                && route(&e, "primary")["healthy"] == true
                && route(&e, "primary")["available"] == true)
        },
    )
    .await?;
    s.wait_target_grows(500).await?;
    s.wait_active("primary", deadline(&[interval, limit])).await?;
    let (away, back) = s.assert_cut_and_return().await?;
    let ms = |e: &Value| e["timestamp_ms"].as_i64().unwrap_or_default();
    // Timestamps are whole milliseconds: allow the one the truncation may take off.
    let spacing = ms(&back) - ms(&away);
    assert!(
        spacing >= interval.as_millis() as i64 - 1,
        "switched back {spacing} ms after switching away: {away} {back}"
    );
    let recovered = s.egress_events().await?[2].clone();
    assert!(ms(&recovered) <= ms(&back), "{recovered} {back}");
    s.finish().await
}
