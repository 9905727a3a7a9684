//! Helpers of the tests of what a mirror would lose (issue 18: RPO, the stall watchdog, loss before mirroring,
//! continuous verification): a mirror with its own alarm rules and extra tables, one partition's document from the
//! monitor, pausing and resuming a topic, events and metric values.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ferry_testkit::{MirrorProcess, deadline, wait_for, wait_until};
use serde_json::Value;

use crate::common::*;

/// The monitor token of these tests.
pub const TOKEN: &str = "knowing-what-you-lose-token";

/// `[source.health] check_interval` of [`MirrorConf`]: the independent probe's period.
pub const CHECK: Duration = Duration::from_millis(500);

/// Wall-clock ms since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A started mirror and the directory of its rules file (kept for the mirror's life).
pub struct Mirror {
    pub process: MirrorProcess,
    _rules: tempfile::TempDir,
}

/// Starts the mirror of `conf` with `rules` laid over the shipped alarm rules and `extra` TOML tables after the
/// config's last one; the checks of lag, RPO and stalls run every [`CHECK`], as the probe does.
pub async fn start_mirror(conf: &MirrorConf, rules: &str, extra: &str) -> anyhow::Result<Mirror> {
    let dir = tempfile::tempdir()?;
    let rules_file = dir.path().join("rules.toml");
    std::fs::write(&rules_file, rules)?;
    let mut conf = conf.clone();
    conf.sync_extra.push(format!("stall_check_interval = \"{}\"", dur(CHECK)));
    let text = format!("{}\n[alarms]\nrules = {:?}\n{extra}\n", conf.toml(), rules_file.display().to_string());
    let process = MirrorProcess::builder(text).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    Ok(Mirror { process, _rules: dir })
}

/// `topic`/`partition`'s document in `/api/v1/partitions`.
pub async fn partition_doc(mirror: &MirrorProcess, topic: &str, partition: u32) -> anyhow::Result<Value> {
    let doc = monitor_get(mirror, &format!("/api/v1/partitions?topic={topic}")).await?;
    doc["partitions"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["partition"] == partition).cloned())
        .with_context(|| format!("{topic}/{partition} is not in {doc}"))
}

/// Pauses (`action` = "pause") or resumes a topic and waits until its partition 0 shows `state`.
pub async fn set_topic(mirror: &MirrorProcess, topic: &str, action: &str, state: &str) -> anyhow::Result<()> {
    monitor_post(mirror, &format!("/api/v1/topics/{topic}/{action}"), TOKEN).await?;
    wait_until(&format!("{topic}/0 to be {state}"), deadline(&[IO_BUDGET]), async || -> anyhow::Result<bool> {
        Ok(partition_doc(mirror, topic, 0).await?["state"] == state)
    })
    .await
}

/// Waits for the first event of `kind` on `topic`/`partition` with `cleared` as given, and returns it.
pub async fn wait_event(
    mirror: &MirrorProcess,
    kind: &str,
    topic: &str,
    partition: u32,
    cleared: bool,
    limit: Duration,
) -> anyhow::Result<Value> {
    let what = format!("{kind} (cleared: {cleared}) for {topic}/{partition}");
    wait_for(&what, limit, async || -> anyhow::Result<Option<Value>> {
        let events = monitor_events(mirror, Some(kind)).await?;
        Ok(events.into_iter().find(|e| e["topic"] == topic && e["partition"] == partition && e["cleared"] == cleared))
    })
    .await
}

/// The value of the sample `key` (`name{labels}`, as exposed) on the mirror's `/metrics`.
pub async fn metric(mirror: &MirrorProcess, key: &str) -> anyhow::Result<Option<f64>> {
    let text = reqwest::get(format!("{}/metrics", mirror.monitor_url())).await?.text().await?;
    Ok(text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == key).then(|| v.parse().ok()).flatten()
    }))
}
