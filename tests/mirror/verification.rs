//! Issue 18, continuous verification: the mirror re-reads what it mirrored on both sides, at `[verify]
//! bytes_per_sec`, and compares batch by batch.
//!
//! A clean copy completes a pass over every partition: each partition's `verify` shows the pass completed up to its
//! cache offset, no mismatch. Then one byte inside a record of a mirrored batch changes in the target's segment file
//! on disk: within one verification cycle (every partition's bytes at the configured rate, plus the verifier's rest
//! between idle rounds) `verify_mismatch` names that batch's base offset and the target side, the partition's
//! `verify.mismatch` says the same, `ferry_mirror_verify_mismatch_total` is 1, and the other partition stays clean.
//!
//! Many small partitions take their steps in groups, one request per side for a group: 256 partitions complete a
//! clean pass within two rounds of groups, where a request per partition would need half a minute per round.

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::Path;
use std::time::Duration;

use ferry_batch::BatchIter;
use ferry_testkit::{deadline, wait_until};

use crate::common::*;
use crate::watch::*;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 2;
/// The partition whose target copy is damaged.
const VICTIM: u32 = 1;
/// Records per partition, produced in rounds (so each partition holds several batches).
const ROUNDS: u64 = 5;
const PER_ROUND: u64 = 40;
/// `[verify] bytes_per_sec` of this test.
const BYTES_PER_SEC: u64 = 1 << 20;
/// How long the verifier rests after a round over the partitions found nothing new to read
/// (`ferry_mirror::verify`'s `IDLE`).
const VERIFIER_REST: Duration = Duration::from_secs(1);

/// Flips one byte inside the value of the second record of the `nth` batch of a segment file; returns that batch's
/// base offset.
fn damage_record_in_batch(file: &Path, nth: usize) -> anyhow::Result<u64> {
    let mut bytes = Vec::new();
    std::fs::File::open(file)?.read_to_end(&mut bytes)?;
    let mut position = 0usize;
    let mut chosen = None;
    for (i, item) in BatchIter::new(&bytes).enumerate() {
        let (header, batch) = item?;
        if i == nth {
            chosen = Some((header.base_offset, header.record_count, position, batch.len()));
            break;
        }
        position += batch.len();
    }
    let (base, count, start, len) = chosen.ok_or_else(|| anyhow::anyhow!("the segment has no batch {nth}"))?;
    anyhow::ensure!(count >= 2, "batch {nth} holds {count} record(s)");
    let marker = format!("v-value-{}-", base + 1);
    let within = bytes[start..start + len]
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .ok_or_else(|| anyhow::anyhow!("the record value is not stored uncompressed"))?;
    let at = start + within + marker.len() - 2;
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(file)?;
    f.seek(SeekFrom::Start(at as u64))?;
    f.write_all(&[bytes[at] ^ 0x20])?;
    f.sync_all()?;
    Ok(base)
}

/// A mirror of `TOPIC` from `a` to `b` verifying at `bytes_per_sec`, once the target holds an identical copy.
async fn mirror_caught_up(a: &Dc, b: &Dc, bytes_per_sec: u64) -> anyhow::Result<Mirror> {
    let extra = format!("[verify]\nbytes_per_sec = \"{bytes_per_sec}\"\n");
    let mirror = start_mirror(&MirrorConf::new(a, b), "", &extra).await?;
    wait_caught_up(a, TOPIC, b, TOPIC, io_deadline()).await?;
    assert_identical(a, TOPIC, b, TOPIC).await?;
    Ok(mirror)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_changed_on_the_target_disk_is_named_by_offset_and_side_within_one_cycle() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, PARTITIONS).await?;
    let p = producer(&a).await?;
    for round in 0..ROUNDS {
        let (from, to) = (round * PER_ROUND, (round + 1) * PER_ROUND);
        send_all(
            &p,
            (0..PARTITIONS).flat_map(|q| (from..to).map(move |i| record(TOPIC, "v", i, 64).with_partition(q))),
        )
        .await?;
    }
    p.close().await;
    let mirror = mirror_caught_up(&a, &b, BYTES_PER_SEC).await?;
    let m = &mirror.process;

    // One cycle: every partition's bytes at the configured rate, and the rest between idle rounds.
    let bytes: u64 = b.admin.describe_topic(TOPIC).await?.partitions.iter().map(|p| p.size_bytes).sum();
    let cycle = Duration::from_secs_f64(bytes as f64 / BYTES_PER_SEC as f64) + VERIFIER_REST;
    let end = ROUNDS * PER_ROUND;
    wait_until("a clean pass over every partition", deadline(&[cycle, CHECK]), async || -> anyhow::Result<bool> {
        let mut clean = true;
        for q in 0..PARTITIONS {
            let v = partition_doc(m, TOPIC, q).await?["verify"].clone();
            clean &= v["enabled"] == true
                && v["passes_completed"].as_u64() >= Some(1)
                && v["pass_end_offset"] == end
                && v["mismatch"].is_null();
        }
        Ok(clean)
    })
    .await?;
    assert!(metric(m, "ferry_mirror_verified_bytes_total").await?.unwrap_or(0.0) > 0.0);
    assert_eq!(metric(m, "ferry_mirror_verify_mismatch_total").await?, Some(0.0));

    // One byte of a record value in the victim's third batch changes on the target's disk.
    let file = segment_file(&b, TOPIC, VICTIM, 0);
    let base = damage_record_in_batch(&file, 2)?;
    assert!(base > 0 && base < end, "a batch in the middle: {base}");
    let found = wait_event(m, "verify_mismatch", TOPIC, VICTIM, false, deadline(&[cycle, CHECK])).await?;
    let d = &found["details"];
    assert_eq!(
        (d["offset"].as_u64(), d["side"].as_str(), d["target_topic"].as_str()),
        (Some(base), Some("target"), Some(TOPIC)),
        "{found}"
    );
    assert!(d["reason"].as_str().is_some_and(|r| r.starts_with("the target ")), "{found}");
    assert_eq!(found["severity"], "critical");
    let v = partition_doc(m, TOPIC, VICTIM).await?["verify"].clone();
    assert_eq!((v["mismatch"]["offset"].as_u64(), v["mismatch"]["side"].as_str()), (Some(base), Some("target")), "{v}");
    assert_eq!(metric(m, "ferry_mirror_verify_mismatch_total").await?, Some(1.0));
    let other = partition_doc(m, TOPIC, 1 - VICTIM).await?["verify"].clone();
    assert!(other["mismatch"].is_null(), "the other partition is clean: {other}");
    let events = monitor_events(m, Some("verify_mismatch")).await?;
    assert_eq!(events.len(), 1, "one mismatch, one event: {events:?}");
    Ok(())
}

/// What the verifier counts a request against its rate at least, and each partition it reads or looks up
/// (`ferry_mirror::verify`'s `READ_COST_BYTES` and `PARTITION_COST_BYTES`).
const READ_COST: u64 = 64 << 10;
const PARTITION_COST: u64 = 4 << 10;
/// Partitions that take a step together (`ferry_mirror::verify`'s `GROUP`).
const GROUP: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_partitions_are_verified_in_groups_within_two_rounds() -> anyhow::Result<()> {
    const MANY: u32 = 256;
    const SLOW_RATE: u64 = 1 << 20;
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, MANY).await?;
    let p = producer(&a).await?;
    // Two batches per partition.
    for round in 0..2u64 {
        send_all(&p, (0..MANY).map(|q| record(TOPIC, "m", u64::from(q) * 2 + round, 32).with_partition(q))).await?;
    }
    p.close().await;
    let mirror = mirror_caught_up(&a, &b, SLOW_RATE).await?;
    let m = &mirror.process;

    // A round: per group, one lookup and one read on each side, each paid as a request for GROUP partitions. The
    // round going on when every partition was caught up, a whole round, and the rest. (Were each partition read on
    // its own, a round would cost 2 * MANY * READ_COST: 32 s at this rate, above the deadline.)
    let groups = u64::from(MANY).div_ceil(GROUP);
    let request = READ_COST.max(GROUP * PARTITION_COST);
    let round = Duration::from_secs_f64((groups * 2 * request) as f64 / SLOW_RATE as f64);
    let cycle = 2 * round + VERIFIER_REST;
    wait_until("a clean pass over all 256 partitions", deadline(&[cycle, CHECK]), async || -> anyhow::Result<bool> {
        let doc = monitor_get(m, &format!("/api/v1/partitions?topic={TOPIC}")).await?;
        let parts = doc["partitions"].as_array().cloned().unwrap_or_default();
        let clean = parts
            .iter()
            .filter(|p| {
                let v = &p["verify"];
                v["enabled"] == true
                    && v["passes_completed"].as_u64() >= Some(1)
                    && v["pass_end_offset"] == 2
                    && v["mismatch"].is_null()
            })
            .count();
        Ok(parts.len() == MANY as usize && clean == MANY as usize)
    })
    .await?;
    assert_eq!(metric(m, "ferry_mirror_verify_mismatch_total").await?, Some(0.0));
    assert!(monitor_events(m, Some("verify_mismatch")).await?.is_empty());
    Ok(())
}
