//! Issue 6: the lag the monitor reports is the real one. While a topic is paused (`ferryctl mirror pause`) and
//! more records arrive on the source, and again after it is resumed (REST), every partition's `lag` in
//! /api/v1/partitions equals source LEO - target LEO as read independently from the brokers with
//! `ferryctl --broker ADDR topic describe T --format json`; `/metrics` and `/api/v1/topics` agree with it.

use std::collections::BTreeMap;

use anyhow::Context;
use ferry_testkit::{MirrorProcess, wait_for, wait_until};
use serde_json::Value;

use crate::common::*;
use crate::support::*;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 3;

/// The monitor's partitions of TOPIC, by partition.
async fn api_partitions(mirror: &MirrorProcess) -> anyhow::Result<BTreeMap<u32, Value>> {
    let v = get_json(mirror, &format!("/api/v1/partitions?topic={TOPIC}")).await?;
    let list = v["partitions"].as_array().context("no partitions array")?;
    Ok(list.iter().map(|p| (p["partition"].as_u64().unwrap_or(u64::MAX) as u32, p.clone())).collect())
}

fn field(p: &Value, name: &str) -> u64 {
    p[name].as_u64().unwrap_or_else(|| panic!("{name} in {p}"))
}

/// Checks, per partition, the monitor's lag against the brokers' log ends read with ferryctl, and `/metrics` and
/// `/api/v1/topics` against the monitor. The target log end is read before and after the monitor, and must not
/// move in between (the caller holds the mirror at rest: paused, or caught up). Returns the lags.
async fn check_lag(mirror: &MirrorProcess, a: &Dc, b: &Dc) -> anyhow::Result<Vec<u64>> {
    let source = describe_offsets(&a.addr(), TOPIC).await?;
    let target = describe_offsets(&b.addr(), TOPIC).await?;
    let api = api_partitions(mirror).await?;
    let metrics = metrics_text(mirror).await?;
    let topics = get_json(mirror, "/api/v1/topics").await?;
    assert_eq!(describe_offsets(&b.addr(), TOPIC).await?, target, "the target moved during the check");
    assert_eq!(source.len(), PARTITIONS as usize);
    assert_eq!(api.len(), PARTITIONS as usize, "{api:?}");
    let mut lags = Vec::new();
    for (p, ((_, src_leo), (_, tgt_leo))) in source.iter().zip(&target).enumerate() {
        let row = &api[&(p as u32)];
        let lag = field(row, "lag");
        assert_eq!(lag, src_leo - tgt_leo, "partition {p}: lag = source LEO {src_leo} - target LEO {tgt_leo}: {row}");
        assert_eq!(field(row, "source_offset"), *src_leo, "{row}");
        assert_eq!(field(row, "target_offset"), *tgt_leo, "{row}");
        assert_eq!(field(row, "cache_offset"), *tgt_leo, "at rest the cache offset is the target LEO: {row}");
        let series = format!("ferry_mirror_partition_lag_records{{topic=\"{TOPIC}\",partition=\"{p}\"}}");
        assert_eq!(sample(&metrics, &series), Some(lag as f64), "{series}");
        for (kind, name) in [("source", "source_offset"), ("cache", "cache_offset"), ("target", "target_offset")] {
            let series =
                format!("ferry_mirror_partition_offset{{topic=\"{TOPIC}\",partition=\"{p}\",kind=\"{kind}\"}}");
            assert_eq!(sample(&metrics, &series), Some(field(row, name) as f64), "{series}");
        }
        lags.push(lag);
    }
    let t = topics["topics"].as_array().and_then(|ts| ts.iter().find(|t| t["topic"] == TOPIC)).context("topic")?;
    assert_eq!(field(t, "lag"), lags.iter().sum::<u64>(), "{t}");
    Ok(lags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_equals_source_minus_target_leo_while_paused_and_after_resume() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, PARTITIONS).await?;
    produce(&a, TOPIC, "before", 3_000, 100).await?;
    let conf = OpsConf::new(&a, &b);
    let mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let monitor = mirror.addr().to_string();

    // Pause with ferryctl: every partition shows paused.
    let out = ferryctl(&["--monitor", &monitor, "--token", TOKEN, "mirror", "pause", TOPIC]).await?;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let limit = ferry_testkit::deadline(&[conf.health.check_interval, DISCOVERY]);
    wait_until("every partition paused", limit, async || -> anyhow::Result<bool> {
        Ok(api_partitions(&mirror).await?.values().all(|p| p["state"] == "paused"))
    })
    .await?;
    let status = get_json(&mirror, "/api/v1/status").await?;
    assert_eq!(status["paused_topics"], serde_json::json!([TOPIC]), "{status}");

    // More records arrive while paused; wait until the monitor's source offsets show them.
    produce(&a, TOPIC, "paused", 1_500, 100).await?;
    let source_leos: Vec<u64> = describe_offsets(&a.addr(), TOPIC).await?.into_iter().map(|(_, e)| e).collect();
    wait_for(
        "the monitor's source offsets reach the source LEOs",
        io_deadline(),
        async || -> anyhow::Result<Option<()>> {
            let api = api_partitions(&mirror).await?;
            Ok(api.values().map(|p| field(p, "source_offset")).eq(source_leos.iter().copied()).then_some(()))
        },
    )
    .await?;
    let lags = check_lag(&mirror, &a, &b).await?;
    assert_eq!(lags.iter().sum::<u64>(), 1_500, "the paused records are the lag: {lags:?}");
    assert!(lags.iter().all(|l| *l > 0), "the keyed load reaches every partition: {lags:?}");
    let status = get_json(&mirror, "/api/v1/status").await?;
    assert_eq!(status["totals"]["lag"], 1_500, "{status}");

    // Resume through the REST API: the lag drains to 0 at rest.
    let resumed = post(&mirror, &format!("/api/v1/topics/{TOPIC}/resume"), Auth::Bearer(TOKEN), None).await?;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    assert_eq!(resumed.body, serde_json::json!({"topic": TOPIC, "paused": false}));
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    wait_until("every partition mirroring with lag 0", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(api_partitions(&mirror).await?.values().all(|p| p["state"] == "mirroring" && p["lag"] == 0))
    })
    .await?;
    assert_eq!(check_lag(&mirror, &a, &b).await?, vec![0; PARTITIONS as usize]);
    let src = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), 4_500);
    Ok(())
}
