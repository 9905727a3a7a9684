//! The mirror's monitor as the tests read it: its JSON documents, events and partition rows, and waits on them.

use super::*;

/// GETs `path` from the mirror's monitor and parses the JSON.
pub async fn monitor_get(mirror: &MirrorProcess, path: &str) -> anyhow::Result<serde_json::Value> {
    let url = format!("{}{path}", mirror.monitor_url());
    let response = reqwest::get(&url).await.with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let body = response.text().await?;
    if !status.is_success() {
        bail!("GET {url}: {status}: {body}");
    }
    serde_json::from_str(&body).with_context(|| format!("GET {url}: not JSON: {body}"))
}

/// POSTs to `path` of the mirror's monitor with the bearer `token`; fails on any status but 200.
pub async fn monitor_post(mirror: &MirrorProcess, path: &str, token: &str) -> anyhow::Result<serde_json::Value> {
    let url = format!("{}{path}", mirror.monitor_url());
    let response =
        reqwest::Client::new().post(&url).bearer_auth(token).send().await.with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let body = response.text().await?;
    ensure!(status.is_success(), "POST {url}: {status}: {body}");
    serde_json::from_str(&body).with_context(|| format!("POST {url}: not JSON: {body}"))
}

/// The mirror's recent events (`/api/v1/events`, newest first), optionally only those of `kind`.
pub async fn monitor_events(mirror: &MirrorProcess, kind: Option<&str>) -> anyhow::Result<Vec<serde_json::Value>> {
    let v = monitor_get(mirror, "/api/v1/events?limit=200").await?;
    let all = v.get("events").and_then(|e| e.as_array()).context("no \"events\" array")?;
    Ok(all.iter().filter(|e| kind.is_none_or(|k| e["kind"] == k)).cloned().collect())
}

/// One row of `/api/v1/partitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRow {
    pub topic: String,
    pub partition: u32,
    pub state: String,
    pub last_error: Option<String>,
    pub cache_offset: u64,
    pub target_offset: u64,
    pub lag: u64,
}

/// The partitions the mirror reports, keyed by (source topic, partition).
pub async fn monitor_partitions(mirror: &MirrorProcess) -> anyhow::Result<BTreeMap<(String, u32), PartitionRow>> {
    let v = monitor_get(mirror, "/api/v1/partitions").await?;
    let list = v.get("partitions").and_then(|p| p.as_array()).context("no \"partitions\" array")?;
    let mut out = BTreeMap::new();
    for item in list {
        let row = PartitionRow {
            topic: item["topic"].as_str().context("topic")?.to_owned(),
            partition: item["partition"].as_u64().context("partition")? as u32,
            state: item["state"].as_str().context("state")?.to_owned(),
            last_error: item["last_error"].as_str().map(str::to_owned),
            cache_offset: item["cache_offset"].as_u64().unwrap_or(0),
            target_offset: item["target_offset"].as_u64().unwrap_or(0),
            lag: item["lag"].as_u64().unwrap_or(0),
        };
        out.insert((row.topic.clone(), row.partition), row);
    }
    Ok(out)
}

/// Waits until `accept` holds for the partitions the mirror's monitor lists, and returns them.
pub async fn wait_owned(
    mirror: &MirrorProcess,
    what: &str,
    limit: Duration,
    mut accept: impl FnMut(&BTreeMap<(String, u32), PartitionRow>) -> bool,
) -> anyhow::Result<BTreeMap<(String, u32), PartitionRow>> {
    wait_for(what, limit, async || -> anyhow::Result<Option<_>> {
        let rows = monitor_partitions(mirror).await?;
        Ok(accept(&rows).then_some(rows))
    })
    .await
}

/// The resident set size of a process, in bytes, from `/proc/PID/status`.
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS line")?;
    let kib: u64 = line.split_whitespace().nth(1).context("VmRSS value")?.parse()?;
    Ok(kib * 1024)
}

/// The partitions a mirror's monitor lists as `mirroring`.
pub fn mirroring_partitions(rows: &BTreeMap<(String, u32), PartitionRow>) -> std::collections::BTreeSet<(String, u32)> {
    rows.iter().filter(|(_, r)| r.state == "mirroring").map(|(k, _)| k.clone()).collect()
}

/// Waits until two mirrors of one scale-out group split `all` partitions between them: each mirrors some, none is
/// mirrored by both, and together they mirror all. Returns each one's share.
pub async fn wait_split(
    one: &MirrorProcess,
    two: &MirrorProcess,
    all: &std::collections::BTreeSet<(String, u32)>,
    limit: Duration,
) -> anyhow::Result<(std::collections::BTreeSet<(String, u32)>, std::collections::BTreeSet<(String, u32)>)> {
    wait_for("the two mirrors to split the partitions", limit, async || -> anyhow::Result<Option<_>> {
        let a = mirroring_partitions(&monitor_partitions(one).await?);
        let b = mirroring_partitions(&monitor_partitions(two).await?);
        let union: std::collections::BTreeSet<_> = a.union(&b).cloned().collect();
        Ok((!a.is_empty() && !b.is_empty() && a.is_disjoint(&b) && &union == all).then_some((a, b)))
    })
    .await
}
