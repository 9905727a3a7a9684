//! A target topic promoted while it is mirrored (design §3: `Promote` clears the mirror mark; from then on
//! append-with-offsets is refused and the mirror raises an alarm). `ferryctl topic promote` runs against dc-b while
//! the mirror copies; records produced on dc-a afterwards halt each partition with `sync_error` naming the
//! promotion, and nothing more is appended. A discovery round afterwards (forced by SIGHUP) refuses the topic as a
//! target (`sync_error`) and stops mirroring it (`remove_topic`); still nothing is appended.
//!
//! Discovery runs only at the start and on SIGHUP here (a 10 minute interval), so the partitions meet the promotion
//! on their append path, which is what the first half is about.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use ferry_testkit::{Signal, deadline, wait_until};

use crate::common::*;

const TOPIC: &str = "orders";

/// Runs the real `ferryctl` with `args` and returns its exit code and output.
async fn ferryctl(args: &[&str]) -> anyhow::Result<(i32, String)> {
    let program = ferry_testkit::binary_path(ferry_testkit::FERRYCTL_BIN)?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    for var in ["FERRY_TOKEN", "FERRY_BROKER", "FERRY_MONITOR", "RUST_LOG"] {
        cmd.env_remove(var);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .with_context(|| format!("ferryctl {args:?} did not finish within 120 s"))??;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

/// Asserts that every partition of `TOPIC` on dc-b is exactly as in `snapshot`.
async fn assert_unchanged(b: &Dc, snapshot: &[PartitionData], when: &str) -> anyhow::Result<()> {
    let now = read_topic(b, TOPIC).await?;
    assert_eq!(now.len(), snapshot.len());
    for (p, (then, now)) in snapshot.iter().zip(&now).enumerate() {
        assert_same_partition(&format!("dc-b {TOPIC}/{p} {when}"), then, now);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_target_halts_with_sync_error_and_takes_nothing_more() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "before", 0, 400, 64).await?;
    let conf = MirrorConf::new(&a, &b);
    let one_round = format!("discovery_interval = \"{}\"", dur(DISCOVERY));
    let text = conf.toml();
    assert!(text.contains(&one_round), "the config layout changed:\n{text}");
    let text = text.replace(&one_round, "discovery_interval = \"10m\"");
    let mut mirror = ferry_testkit::MirrorProcess::builder(text).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let snapshot = assert_identical(&a, TOPIC, &b, TOPIC).await?;

    let (code, out) = ferryctl(&["--broker", &b.addr(), "topic", "promote", TOPIC]).await?;
    assert_eq!(code, 0, "ferryctl topic promote: {out}");
    let info = b.admin.describe_topic(TOPIC).await?;
    assert!(info.topic.mirror.is_none(), "dc-b's {TOPIC} is no longer a mirror topic");

    // More records on the source, in both partitions.
    let source_before = a.leos(TOPIC).await?;
    produce_range(&p, TOPIC, "after-promote", 0, 200, 64).await?;
    let source_after = a.leos(TOPIC).await?;
    assert!(source_before.iter().zip(&source_after).all(|(x, y)| y > x), "{source_before:?} -> {source_after:?}");

    let halted = |rows: &std::collections::BTreeMap<(String, u32), PartitionRow>| {
        (0..2).all(|p| {
            rows.get(&(TOPIC.to_owned(), p)).is_some_and(|r| {
                r.state == "halted" && r.last_error.as_deref().is_some_and(|e| e.contains("was promoted"))
            })
        })
    };
    wait_owned(&mirror, "both partitions halted by the promotion", io_deadline(), halted).await?;
    let errors = monitor_events(&mirror, Some("sync_error")).await?;
    for p in 0..2u64 {
        let e = errors
            .iter()
            .find(|e| e["topic"] == TOPIC && e["partition"].as_u64() == Some(p))
            .with_context(|| format!("a sync_error for {TOPIC}/{p}: {errors:?}"))?;
        let reason = e["details"]["reason"].as_str().unwrap_or_default();
        assert_eq!(
            reason,
            format!("target topic {TOPIC} was promoted (it is no longer a mirror topic); mirroring into it stopped"),
            "{e}"
        );
    }
    let rows = monitor_partitions(&mirror).await?;
    for p in 0..2 {
        let r = &rows[&(TOPIC.to_owned(), p)];
        assert_eq!(r.cache_offset, snapshot[p as usize].log_end, "{TOPIC}/{p}: the cache offset stayed: {r:?}");
    }
    assert_unchanged(&b, &snapshot, "after the promotion").await?;

    // A discovery round now refuses the topic as a target and stops mirroring it.
    mirror.send_signal(Signal::HUP)?;
    let limit = deadline(&[DISCOVERY]);
    wait_until(
        "a topic-level sync_error and remove_topic for the promoted topic",
        limit,
        async || -> anyhow::Result<bool> {
            let refused = monitor_events(&mirror, Some("sync_error"))
                .await?
                .iter()
                .any(|e| e["topic"] == TOPIC && e["partition"].is_null() && e["details"]["target_topic"] == TOPIC);
            let removed = monitor_events(&mirror, Some("remove_topic")).await?.iter().any(|e| e["topic"] == TOPIC);
            Ok(refused && removed)
        },
    )
    .await?;
    let refused = monitor_events(&mirror, Some("sync_error")).await?;
    let refused: Vec<_> = refused.iter().filter(|e| e["partition"].is_null()).collect();
    assert_eq!(refused.len(), 1, "one alarm for the refused target: {refused:?}");
    assert!(
        refused[0]["message"].as_str().is_some_and(|m| m.contains("exists and is not a mirror topic")),
        "{}",
        refused[0]
    );
    produce_range(&p, TOPIC, "after-removal", 0, 200, 64).await?;
    p.close().await;
    // A second forced round, which mirrors a new topic, proves the mirror looked again after these records and
    // still left the promoted topic alone, without alarming twice.
    a.create_topic("probe", 1).await?;
    mirror.send_signal(Signal::HUP)?;
    wait_until("probe on dc-b", limit, async || -> anyhow::Result<bool> { b.has_topic("probe").await }).await?;
    assert_unchanged(&b, &snapshot, "after the topic left the mirror").await?;
    let again = monitor_events(&mirror, Some("sync_error")).await?;
    assert_eq!(again.iter().filter(|e| e["partition"].is_null()).count(), 1, "alarmed once: {again:?}");
    assert!(mirror.is_running(), "nothing crashed");
    Ok(())
}
