//! Issue 18, RPO in seconds: how long the oldest source record that is not yet on the target has been waiting.
//!
//! - **Paused.** With the topic paused, ten records arrive two seconds apart. After each one the partition's
//!   `rpo_seconds` is the age of the *first* of them, within one check interval: never more than the time since it
//!   was sent, never less than the time since it was acknowledged less one check interval. `rpo_above_threshold`
//!   fires once the RPO stayed above its threshold for `for_duration`; after the resume the RPO is 0 again (in the
//!   partition view, the status and the metrics) and the alarm clears. The target then holds exactly the source.
//! - **Target down.** Records wait while the target cannot be reached: the RPO keeps growing with their age, within
//!   the same bounds, at every reading over several seconds; once the target is back it drops to 0 and the target
//!   holds exactly the source.
//! - **Source out of sight.** Records the mirror cannot see wait too: with the link to the source blackholed,
//!   records acknowledged there reach neither the stream nor the probe, and the lag stays 0; once the probe has
//!   not been answered for `check_interval + timeout`, the RPO counts from the cut at the latest, at every reading
//!   over several seconds. After the link is back the records are copied and the RPO is 0.

use std::time::{Duration, Instant};

use ferry_client::{Producer, ProducerRecord};
use ferry_testkit::{Proxy, deadline, wait_for, wait_until};

use crate::common::*;
use crate::watch::*;

const TOPIC: &str = "orders";
/// The rules of the paused test: `rpo_threshold` and `for_duration`.
const RPO_THRESHOLD: Duration = Duration::from_secs(5);
const FOR_DURATION: Duration = Duration::from_secs(1);
/// The records that wait, and their spacing.
const WAITING: u64 = 10;
const SPACING: Duration = Duration::from_secs(2);

/// Record `i` of `tag`, to partition 0, stamped with the wall clock now.
fn now_record(tag: &str, i: u64) -> ProducerRecord {
    let r = record(TOPIC, tag, i, 64).with_partition(0);
    r.with_timestamp(now_ms())
}

/// Reads the partition's RPO and checks it against the age of the first waiting record, sent at `sent` and
/// acknowledged at `acked`: at most the time since it was sent, at least the time since it was acknowledged less
/// one check interval. Returns the RPO and the document.
async fn rpo_of_first(mirror: &Mirror, sent: Instant, acked: Instant) -> anyhow::Result<(f64, serde_json::Value)> {
    let before = Instant::now();
    let doc = partition_doc(&mirror.process, TOPIC, 0).await?;
    let after = Instant::now();
    let rpo = doc["rpo_seconds"].as_f64().unwrap_or(f64::NAN);
    let most = after.duration_since(sent).as_secs_f64();
    let least = before.duration_since(acked).saturating_sub(CHECK).as_secs_f64();
    assert!((least..=most).contains(&rpo), "rpo_seconds {rpo} outside [{least}, {most}]: {doc}");
    Ok((rpo, doc))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpo_follows_the_oldest_record_not_yet_mirrored_and_alarms_and_recovers() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    let p = producer(&a).await?;
    send_all(&p, [now_record("before", 0)]).await?;
    let rules =
        format!("[thresholds]\nrpo_threshold = \"{}\"\nfor_duration = \"{}\"\n", dur(RPO_THRESHOLD), dur(FOR_DURATION));
    let mirror = start_mirror(&MirrorConf::new(&a, &b), &rules, "").await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    set_topic(&mirror.process, TOPIC, "pause", "paused").await?;
    assert_eq!(partition_doc(&mirror.process, TOPIC, 0).await?["rpo_seconds"], 0.0, "caught up before the pause");

    // Ten records two seconds apart while paused; after each, the RPO is the first one's age.
    let mut every = tokio::time::interval(SPACING);
    let mut first = None;
    for i in 0..WAITING {
        every.tick().await;
        let sent = Instant::now();
        send_all(&p, [now_record("waiting", i)]).await?;
        let (sent, acked) = *first.get_or_insert((sent, Instant::now()));
        let (_, doc) = rpo_of_first(&mirror, sent, acked).await?;
        assert_eq!((doc["state"].as_str(), doc["cache_offset"].as_u64()), (Some("paused"), Some(1)), "{doc}");
    }
    let (sent, acked) = first.expect("records were sent");
    // The status and the metrics say the same (each read after the previous, so each at least as much).
    let (rpo, _) = rpo_of_first(&mirror, sent, acked).await?;
    let status = monitor_get(&mirror.process, "/api/v1/status").await?;
    let status_rpo = status["totals"]["rpo_max_seconds"].as_f64().unwrap_or(f64::NAN);
    let gauge = metric(&mirror.process, "ferry_mirror_rpo_seconds{topic=\"orders\",partition=\"0\"}").await?;
    let max = metric(&mirror.process, "ferry_mirror_rpo_max_seconds").await?;
    let most = acked.elapsed().as_secs_f64() + CHECK.as_secs_f64();
    for (what, v) in [("status", Some(status_rpo)), ("gauge", gauge), ("max gauge", max)] {
        let v = v.unwrap_or(f64::NAN);
        assert!((rpo..=most).contains(&v), "{what} {v}, after the partition view's {rpo}");
    }

    // The RPO stayed above 5 s for 1 s: rpo_above_threshold, once.
    let fired = wait_event(&mirror.process, "rpo_above_threshold", TOPIC, 0, false, io_deadline()).await?;
    let d = &fired["details"];
    assert_eq!((d["rpo_threshold_seconds"].as_f64(), d["for_duration"].as_str()), (Some(5.0), Some("1s")), "{fired}");
    assert_eq!(d["cache_offset"], 1, "{fired}");
    assert!((2..=1 + WAITING).contains(&d["source_offset"].as_u64().unwrap_or(0)), "records wait: {fired}");
    let at_raise = d["rpo_seconds"].as_f64().unwrap_or(f64::NAN);
    assert!(at_raise > (RPO_THRESHOLD + FOR_DURATION).as_secs_f64(), "above 5 s for 1 s: {fired}");
    assert_eq!(fired["severity"], "warning");

    // Resumed: everything is copied, the RPO is 0 everywhere and the alarm clears.
    set_topic(&mirror.process, TOPIC, "resume", "mirroring").await?;
    wait_until("the RPO to be 0 again", io_deadline(), async || -> anyhow::Result<bool> {
        let doc = partition_doc(&mirror.process, TOPIC, 0).await?;
        Ok(doc["rpo_seconds"] == 0.0 && doc["cache_offset"] == 1 + WAITING)
    })
    .await?;
    let status = monitor_get(&mirror.process, "/api/v1/status").await?;
    assert_eq!(status["totals"]["rpo_max_seconds"], 0.0);
    assert_eq!(metric(&mirror.process, "ferry_mirror_rpo_seconds{topic=\"orders\",partition=\"0\"}").await?, Some(0.0));
    assert_eq!(metric(&mirror.process, "ferry_mirror_rpo_max_seconds").await?, Some(0.0));
    let cleared = wait_event(&mirror.process, "rpo_above_threshold", TOPIC, 0, true, deadline(&[CHECK])).await?;
    assert_eq!(cleared["details"]["rpo_seconds"], 0.0, "{cleared}");
    let raised = monitor_events(&mirror.process, Some("rpo_above_threshold")).await?;
    assert_eq!(raised.iter().filter(|e| e["cleared"] == false).count(), 1, "raised once: {raised:?}");
    p.close().await;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    Ok(())
}

/// Restores `link`, then waits until the target holds the source, the partition's cache offset is `cache` and its
/// RPO 0, and checks the target equals the source.
async fn restored(a: &Dc, b: &Dc, mirror: &Mirror, link: Proxy, p: Producer, cache: u64) -> anyhow::Result<()> {
    link.restore();
    wait_caught_up(a, TOPIC, b, TOPIC, io_deadline()).await?;
    wait_until("the RPO to be 0 again", io_deadline(), async || -> anyhow::Result<bool> {
        let doc = partition_doc(&mirror.process, TOPIC, 0).await?;
        Ok(doc["rpo_seconds"] == 0.0 && doc["cache_offset"] == cache)
    })
    .await?;
    p.close().await;
    assert_identical(a, TOPIC, b, TOPIC).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpo_keeps_growing_while_the_target_is_down() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    let link = Proxy::start(b.broker.addr()).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.target_brokers = link.addr().to_string();
    let mirror = start_mirror(&conf, "", "").await?;
    let p = producer(&a).await?;
    send_all(&p, [now_record("before", 0)]).await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    // The target holding the record is not enough: its answer must have reached the mirror too, or the cut below
    // can drop it in flight and the record would rightly count as waiting.
    wait_until("the mirror to hear the first append's answer", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(partition_doc(&mirror.process, TOPIC, 0).await?["cache_offset"] == 1)
    })
    .await?;

    // The target goes away; the mirror says so (three failed probes, as [target.health] defaults to the source's).
    link.cut();
    let down_limit = deadline(&[CHECK, CHECK, CHECK, Duration::from_secs(1)]);
    wait_until("target_net_not_available", down_limit, async || -> anyhow::Result<bool> {
        Ok(!monitor_events(&mirror.process, Some("target_net_not_available")).await?.is_empty())
    })
    .await?;
    let sent = Instant::now();
    send_all(&p, (0..3).map(|i| now_record("waiting", i))).await?;
    let acked = Instant::now();

    // Every reading over three seconds has the first waiting record's age; the RPO only grows.
    let mut last = 0.0f64;
    let readings = wait_for("three seconds of readings", deadline(&[Duration::from_secs(3)]), async || {
        let (rpo, doc) = rpo_of_first(&mirror, sent, acked).await?;
        assert!(rpo >= last, "the RPO went down from {last} to {rpo}");
        last = rpo;
        assert_eq!(doc["cache_offset"], 1, "nothing reached the target: {doc}");
        anyhow::Ok((acked.elapsed() >= Duration::from_secs(3)).then_some(rpo))
    })
    .await?;
    assert!(readings >= 3.0 - CHECK.as_secs_f64(), "the RPO grew with the records' age: {readings}");

    // The target is back: the records are copied and the RPO is 0.
    restored(&a, &b, &mirror, link, p, 4).await
}

/// `[source.health] timeout` of [`MirrorConf`]: with [`CHECK`], how long the probe may go unanswered before the RPO
/// counts what the mirror cannot see.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpo_counts_records_the_mirror_cannot_see_while_the_source_is_out_of_sight() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    let link = Proxy::start(a.broker.addr()).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.source_brokers = link.addr().to_string();
    assert!(conf.toml().contains("[source.health]\ncheck_interval = \"500ms\"\ntimeout = \"1s\"\n"), "the probe's");
    let mirror = start_mirror(&conf, "", "").await?;
    let p = producer(&a).await?;
    send_all(&p, [now_record("before", 0)]).await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    wait_until("the probe to read the record", io_deadline(), async || -> anyhow::Result<bool> {
        let doc = partition_doc(&mirror.process, TOPIC, 0).await?;
        Ok(doc["probed_source_offset"] == 1 && doc["cache_offset"] == 1 && doc["rpo_seconds"] == 0.0)
    })
    .await?;
    // The last reading of RPO 0 before the cut: the probe had answered within its grace of then.
    let grace = CHECK + PROBE_TIMEOUT;
    let zero_at = Instant::now();
    assert_eq!(partition_doc(&mirror.process, TOPIC, 0).await?["rpo_seconds"], 0.0);
    link.blackhole();
    let cut_at = Instant::now();
    send_all(&p, (0..3).map(|i| now_record("unseen", i))).await?;

    // Past the grace every reading counts at least from the cut and at most from a grace before the last RPO of
    // 0; the RPO only grows; and nothing of the records reached the mirror.
    let mut last = 0.0f64;
    let readings = wait_for("three seconds past the grace", deadline(&[grace, Duration::from_secs(3)]), async || {
        let before = Instant::now();
        let doc = partition_doc(&mirror.process, TOPIC, 0).await?;
        let after = Instant::now();
        let rpo = doc["rpo_seconds"].as_f64().unwrap_or(f64::NAN);
        assert_eq!((doc["cache_offset"].as_u64(), doc["lag"].as_u64()), (Some(1), Some(0)), "unseen: {doc}");
        assert_eq!(doc["probed_source_offset"], 1, "the probe never read them: {doc}");
        assert!(rpo >= last, "the RPO went down from {last} to {rpo}: {doc}");
        last = rpo;
        if before.duration_since(cut_at) > grace {
            let least = before.duration_since(cut_at).as_secs_f64();
            let most = (after.duration_since(zero_at) + grace).as_secs_f64();
            assert!((least..=most).contains(&rpo), "rpo_seconds {rpo} outside [{least}, {most}]: {doc}");
        }
        anyhow::Ok((cut_at.elapsed() >= grace + Duration::from_secs(3)).then_some(rpo))
    })
    .await?;
    assert!(readings >= (grace + Duration::from_secs(3)).as_secs_f64(), "the RPO grew with the cut: {readings}");

    // The link is back: the records are copied and the RPO is 0.
    restored(&a, &b, &mirror, link, p, 4).await
}
