//! Scenario 8: divergence between source and target.
//!
//! a. The source topic is deleted and re-created under the same name: `partition_diverged` is raised and the
//!    partitions halt, leaving the target unchanged. A re-created topic always halts, even under
//!    `on_divergence = "truncate"`, whether the new topic is already longer than what was mirrored or not.
//! b. A power loss under async flush: the source broker dies without its clean-shutdown marker and its log loses
//!    an acknowledged tail (cut at a batch boundary, index removed); restarted, it bumps the partition epoch and
//!    hands the lost offsets to new records. The mirror detects it: under "halt" the partition halts with the
//!    target unchanged; under "truncate" the target ends identical to the source.

use std::path::{Path, PathBuf};

use ferry_testkit::{deadline, wait_until};

use crate::common::*;

const TOPIC: &str = "orders";

/// Whether `/api/v1/events` holds a `partition_diverged` event for `topic`/`partition`.
async fn diverged_event(mirror: &ferry_testkit::MirrorProcess, partition: u32) -> anyhow::Result<bool> {
    Ok(monitor_events(mirror, Some("partition_diverged"))
        .await?
        .iter()
        .any(|e| e["topic"] == TOPIC && e["partition"].as_u64() == Some(u64::from(partition))))
}

/// Waits until every partition of `TOPIC` is halted with an error containing `needle` and the event is listed.
async fn wait_halted(mirror: &ferry_testkit::MirrorProcess, partitions: u32, needle: &str) -> anyhow::Result<()> {
    let limit = deadline(&[DISCOVERY, IO_BUDGET]);
    wait_until(&format!("{TOPIC} to halt with {needle:?}"), limit, async || -> anyhow::Result<bool> {
        let rows = monitor_partitions(mirror).await?;
        let halted = (0..partitions).all(|p| {
            rows.get(&(TOPIC.to_owned(), p))
                .is_some_and(|r| r.state == "halted" && r.last_error.as_deref().is_some_and(|e| e.contains(needle)))
        });
        if !halted {
            return Ok(false);
        }
        for p in 0..partitions {
            if !diverged_event(mirror, p).await? {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_source_topic_halts_and_keeps_the_target() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    let p = producer(&a).await?;
    for partition in 0..2 {
        produce_to_partition(&p, TOPIC, partition, "first-life", 0, 300).await?;
    }
    let mut conf = MirrorConf::new(&a, &b);
    conf.on_divergence = "truncate".into();
    let mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let before = read_topic(&b, TOPIC).await?;

    let old_id = a.admin.describe_topic(TOPIC).await?.topic.topic_id;
    a.admin.delete_topic(TOPIC).await?;
    a.create_topic(TOPIC, 2).await?;
    let new_id = a.admin.describe_topic(TOPIC).await?.topic.topic_id;
    // Partition 0 of the new topic grows past what was mirrored, partition 1 stays below it.
    produce_to_partition(&p, TOPIC, 0, "second-life", 0, 500).await?;
    produce_to_partition(&p, TOPIC, 1, "second-life", 0, 100).await?;
    p.close().await;

    let reason = format!(
        "the source topic was re-created (id {old_id} became {new_id}); the target holds the old topic's records"
    );
    wait_halted(&mirror, 2, &reason).await?;
    for e in monitor_events(&mirror, Some("partition_diverged")).await? {
        assert_eq!((&e["details"]["reason"], &e["details"]["policy"]), (&reason.clone().into(), &"halt".into()), "{e}");
    }
    let after = read_topic(&b, TOPIC).await?;
    for (p, (x, y)) in before.iter().zip(&after).enumerate() {
        assert_same_partition(&format!("target {TOPIC}/{p} stays as it was"), x, y);
    }
    Ok(())
}

/// The batch boundaries of a segment file: (file position, base offset) of every whole batch.
fn batch_boundaries(path: &Path) -> anyhow::Result<Vec<(u64, u64)>> {
    let bytes = std::fs::read(path)?;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + ferry_batch::LOG_OVERHEAD <= bytes.len() {
        let base = u64::from_be_bytes(bytes[pos..pos + 8].try_into()?);
        let length = u32::from_be_bytes(bytes[pos + 8..pos + 12].try_into()?) as usize;
        let total = ferry_batch::LOG_OVERHEAD + length;
        if pos + total > bytes.len() {
            break;
        }
        out.push((pos as u64, base));
        pos += total;
    }
    Ok(out)
}

/// Simulates a power loss on the source under async flush: SIGKILL (no clean-shutdown marker), then the
/// partition's log loses everything from the first batch at or after `keep` (at a batch boundary), and its index
/// goes; then the broker starts again. Returns the offset the log was cut at.
async fn power_loss(a: &mut Dc, keep: u64) -> anyhow::Result<u64> {
    a.broker.kill9().await?;
    let dir: PathBuf = a.broker.data_dir().join(TOPIC).join("0");
    let log = dir.join(format!("{:020}.log", 0));
    let boundaries = batch_boundaries(&log)?;
    let &(position, cut_at) =
        boundaries.iter().find(|(_, base)| *base >= keep).expect("a batch boundary at or after the cut point");
    std::fs::OpenOptions::new().write(true).open(&log)?.set_len(position)?;
    std::fs::remove_file(dir.join(format!("{:020}.index", 0)))?;
    let marker = dir.join("clean-shutdown");
    assert!(!marker.exists(), "SIGKILL leaves no clean-shutdown marker");
    a.broker.restart().await?;
    Ok(cut_at)
}

/// When the mirror learns of the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// It runs throughout and sees the shortened log before new records arrive.
    ShortLog,
    /// It is down during the loss and comes back when the lost offsets already hold new records of the new epoch.
    NewEpoch,
}

async fn power_loss_scenario(policy: &str, seen: Seen) -> anyhow::Result<()> {
    let (mut a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    // Many small batches, so there are batch boundaries to cut at.
    let p = producer(&a).await?;
    for chunk in 0..20 {
        produce_range(&p, TOPIC, "acked", chunk * 50, (chunk + 1) * 50, 100).await?;
    }
    p.close().await;
    let mut conf = MirrorConf::new(&a, &b);
    conf.on_divergence = policy.into();
    let mut mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let before = read_topic(&b, TOPIC).await?;
    assert_eq!(before[0].log_end, 1_000);

    if seen == Seen::NewEpoch {
        mirror.kill9().await?;
    }
    let cut_at = power_loss(&mut a, 600).await?;
    let d = a.admin.describe_topic(TOPIC).await?;
    assert_eq!(d.partitions[0].log_end_offset, cut_at, "the source lost its tail");
    assert_eq!(d.partitions[0].epoch, 1, "an unclean start bumps the epoch");
    if seen == Seen::ShortLog {
        // The mirror notices the source log end below what it copied before any new record exists.
        let limit = deadline(&[IO_BUDGET]);
        wait_until("the mirror to see the short source log", limit, async || -> anyhow::Result<bool> {
            if policy == "halt" {
                Ok(monitor_partitions(&mirror).await?.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == "halted"))
            } else {
                Ok(b.leos(TOPIC).await?[0] == cut_at)
            }
        })
        .await?;
    }
    // New records take the lost offsets and go past the old end, in small batches as before the loss (so a batch
    // of the new epoch starts exactly where the mirror had stopped).
    let p = producer(&a).await?;
    for chunk in 0..14 {
        produce_range(&p, TOPIC, "after-loss", chunk * 50, (chunk + 1) * 50, 100).await?;
    }
    p.close().await;
    assert!(a.leos(TOPIC).await?[0] > 1_000);
    if seen == Seen::NewEpoch {
        mirror.restart().await?;
    }

    // How the mirror learns of the loss decides the reason: a running mirror sees the source's log end (its
    // subscribe stream reports positions, never an error, for an offset past the end) fall below what it copied;
    // a restarted one sees the new epoch and asks where the old one ended.
    let reason = match seen {
        Seen::ShortLog => format!(
            "the source log end offset {cut_at} is below the cache offset 1000: the source lost records the target holds"
        ),
        Seen::NewEpoch => format!(
            "source epoch 0 ends at offset {cut_at}, below the cache offset 1000: the source lost and reused offsets \
             the target already holds (source epoch now 1)"
        ),
    };
    if policy == "halt" {
        wait_halted(&mirror, 1, &reason).await?;
        let rows = monitor_partitions(&mirror).await?;
        let row = &rows[&(TOPIC.to_owned(), 0)];
        assert_eq!(row.last_error.as_deref(), Some(format!("diverged at offset {cut_at}: {reason}").as_str()));
        assert_eq!((row.cache_offset, row.target_offset), (1_000, 1_000), "{row:?}");
        let after = read_topic(&b, TOPIC).await?;
        assert_same_partition("the halted target stays as it was", &before[0], &after[0]);
    } else {
        wait_caught_up(&a, TOPIC, &b, TOPIC, deadline(&[IO_BUDGET])).await?;
        assert_identical(&a, TOPIC, &b, TOPIC).await?;
        let rows = monitor_partitions(&mirror).await?;
        assert_eq!(rows[&(TOPIC.to_owned(), 0)].state, "mirroring");
        // The new epoch's batches were copied with their epoch.
        let target = read_topic(&b, TOPIC).await?;
        assert!(target[0].batches.iter().any(|b| b.0 >= cut_at && b.2 == 1));
    }
    // Exactly one partition_diverged, with the offset, the reason and the policy applied.
    let events = monitor_events(&mirror, Some("partition_diverged")).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!((&e["topic"], &e["partition"], &e["severity"]), (&TOPIC.into(), &0.into(), &"critical".into()), "{e}");
    assert_eq!(e["message"], format!("{TOPIC}/0 diverged at offset {cut_at}: {reason}"), "{e}");
    assert_eq!(
        e["details"],
        serde_json::json!({"offset": cut_at, "cache_offset": 1_000, "reason": reason, "policy": policy}),
        "{e}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_power_loss_halts_under_halt() -> anyhow::Result<()> {
    power_loss_scenario("halt", Seen::ShortLog).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_power_loss_seen_as_a_new_epoch_halts_under_halt() -> anyhow::Result<()> {
    power_loss_scenario("halt", Seen::NewEpoch).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_power_loss_truncates_the_target_under_truncate() -> anyhow::Result<()> {
    power_loss_scenario("truncate", Seen::ShortLog).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_power_loss_seen_as_a_new_epoch_truncates_under_truncate() -> anyhow::Result<()> {
    power_loss_scenario("truncate", Seen::NewEpoch).await
}
