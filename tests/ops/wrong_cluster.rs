//! Issue 5: a backup route that leads into another cluster (dc-x, a third broker holding a topic of the same name
//! with other records) is never used. The source cluster id is not configured: the mirror learns it from the first
//! route it reaches (the backup's proxy is cut until then). When the primary is cut the mirror stays on it, raises
//! source_net_not_available for the primary and for "no healthy route" ("*"), and never reads dc-x: no switch
//! event, no divergence, no group of the mirror on dc-x, dc-x unchanged, and the target identical to dc-a. A forced
//! manual switch into dc-x is refused with 409 `route_wrong_cluster`.

use ferry_testkit::{Proxy, wait_until};

use crate::common::*;
use crate::support::hook::Hook;
use crate::support::*;

const TOPIC: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_route_into_another_cluster_is_never_used() -> anyhow::Result<()> {
    let (ab, x) = tokio::join!(two_dcs(), Dc::start("dc-x"));
    let ((a, b), x) = (ab?, x?);
    a.create_topic(TOPIC, 4).await?;
    x.create_topic(TOPIC, 4).await?;
    produce(&a, TOPIC, "dc-a", 2_000, 64).await?;
    produce(&x, TOPIC, "dc-x", 500, 64).await?;
    let x_before = x.offsets(TOPIC).await?;

    let p1 = Proxy::start(a.broker.addr()).await?;
    let p2 = Proxy::start(x.broker.addr()).await?;
    // dc-x is out of reach until the mirror has learned the source cluster id from the primary.
    p2.cut();
    let hook = Hook::start().await?;
    let mut conf = OpsConf::new(&a, &b);
    conf.routes = vec![Route::new("primary", p1.addr()), Route::new("backup", p2.addr())];
    conf.webhooks = vec![("ops".into(), hook.url.clone())];
    let mirror = conf.start().await?;
    let limit = conf.health.reaction();
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_eq!(egress(&mirror).await?["expected_cluster_id"], "dc-a");

    p2.restore();
    let e =
        ferry_testkit::wait_for("the backup probed: it leads to dc-x", limit, async || -> anyhow::Result<Option<_>> {
            let e = egress(&mirror).await?;
            Ok((route(&e, "backup")["cluster_id"] == "dc-x").then_some(e))
        })
        .await?;
    let backup = route(&e, "backup");
    assert_eq!((&backup["healthy"], &backup["active"]), (&false.into(), &false.into()), "{e}");
    let reason = backup["last_error"].as_str().unwrap_or_default();
    assert!(reason.contains("\"dc-x\"") && reason.contains("\"dc-a\""), "the reason names both cluster ids: {e}");
    // A forced manual switch into the other cluster is refused too: no route into another cluster is ever used.
    let forced = Some(r#"{"route":"backup","force":true}"#);
    let refused = post(&mirror, "/api/v1/egress/switch", Auth::Bearer(TOKEN), forced).await?;
    assert_eq!((refused.status, refused.code()), (409, "route_wrong_cluster"), "{:?}", refused.body);
    let why = refused.body["reason"].as_str().unwrap_or_default();
    assert!(why.contains("\"dc-x\"") && why.contains("\"dc-a\""), "the refusal names both cluster ids: {why}");
    assert_eq!(
        (egress(&mirror).await?["active"].clone(), egress(&mirror).await?["pinned"].clone()),
        ("primary".into(), false.into())
    );

    // The primary is cut while more records arrive on dc-a.
    p1.cut();
    let not_available = hook.wait("source_net_not_available", limit, |v| v["route"] == "primary").await?;
    assert_eq!(not_available["severity"], "critical");
    let no_route = hook.wait("source_net_not_available", limit, |v| v["route"] == "*").await?;
    assert_eq!(no_route["details"]["active"], "primary", "{no_route}");
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "dc-a", 2_000, 3_000, 64).await?;
    p.close().await;
    // The "*" alarm is raised only after the mirror decided there is nowhere to switch to; the backup stays
    // unused through further probe rounds while the primary is down.
    wait_until("the backup probed as foreign again", limit, async || -> anyhow::Result<bool> {
        let e = egress(&mirror).await?;
        Ok(route(&e, "primary")["consecutive_failures"].as_u64().unwrap_or(0)
            >= 2 * u64::from(conf.health.failure_threshold))
    })
    .await?;
    let e = egress(&mirror).await?;
    assert_eq!(e["active"], "primary", "no switch into another cluster: {e}");
    assert!(events(&mirror, "source_net_be_switched").await?.is_empty(), "never switched");
    assert!(hook.of("source_net_be_switched").is_empty());

    p1.restore();
    let recovered = hook.wait("source_net_recovered", limit, |v| v["route"] == "primary").await?;
    assert_eq!(recovered["notice"], "recovery");
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let src = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), 3_000);

    // dc-x was never read by the mirror: nothing of it reached dc-b (above), no partition saw its topic id (a
    // fetch from dc-x would have halted the partition as re-created), its log is as it was, and the mirror's
    // source group was never committed there.
    assert!(events(&mirror, "partition_diverged").await?.is_empty());
    let parts = get_json(&mirror, "/api/v1/partitions").await?;
    for p in parts["partitions"].as_array().into_iter().flatten() {
        assert_eq!(p["state"], "mirroring", "{p}");
    }
    assert_eq!(x.offsets(TOPIC).await?, x_before, "dc-x's partitions are untouched");
    let group = format!("ferry-mirror.{}", conf.name);
    wait_until("the mirror's cache offsets committed on dc-a", io_deadline(), async || -> anyhow::Result<bool> {
        let committed = a.admin.fetch_committed_offsets(&group, &[]).await?;
        Ok(committed.iter().map(|c| c.offset).sum::<u64>() == 3_000)
    })
    .await?;
    let on_x = x.admin.fetch_committed_offsets(&group, &[]).await?;
    assert!(on_x.is_empty(), "the mirror's group has no offsets on dc-x: {on_x:?}");
    let e = egress(&mirror).await?;
    assert_eq!((&e["active"], &route(&e, "backup")["healthy"]), (&"primary".into(), &false.into()), "{e}");
    Ok(())
}
