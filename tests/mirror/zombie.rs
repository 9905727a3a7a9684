//! A zombie scale-out member: two mirror processes with the same `mirror.name` split the partitions through their
//! group on the target. Under a steady keyed load one of them is frozen with SIGSTOP for longer than the group
//! session timeout (`sync.group_session_timeout`, [`SESSION`]): the group expels it and the survivor takes all
//! partitions over and copies past where the frozen one stood. Then the frozen one is let go (SIGCONT). It wakes
//! up holding stale cache offsets, queued batches and perhaps an append in flight, and runs on from there until
//! its heartbeat tells it that it was expelled, when it joins again and the two split the partitions anew.
//!
//! Nothing it does from its stale position may harm the target: appends with offsets answer batches already there
//! as present. The target ends identical to the source (every partition: offsets, timestamps, keys, values,
//! headers, batch epochs and CRCs), holding exactly the records produced, and neither mirror raised
//! `partition_diverged` or halted a partition.

use std::collections::BTreeSet;

use ferry_testkit::{MIN_DEADLINE, deadline};
use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_member_resumes_from_a_stale_position_without_harm() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, PARTITIONS).await?;
    let all: BTreeSet<(String, u32)> = (0..PARTITIONS).map(|p| (TOPIC.to_owned(), p)).collect();
    let stop = CancellationToken::new();
    let load = background_producer(&a, TOPIC, "zombie", stop.clone());
    let conf = MirrorConf::new(&a, &b);
    let (zombie, survivor) = tokio::join!(conf.start(), conf.start());
    let (mut zombie, survivor) = (zombie?, survivor?);

    // Joining takes a discovery round and a rebalance that each member sees at its next heartbeat.
    let split = deadline(&[DISCOVERY, SESSION, SESSION]);
    let (frozen_share, _) = wait_split(&zombie, &survivor, &all, split).await?;
    tracing::info!(?frozen_share, "the zombie-to-be mirrors these partitions");

    zombie.suspend(MIN_DEADLINE).await?;
    // The group expels the frozen member after the session timeout; the survivor sees the new assignment at its
    // next heartbeat (a fifth of the session) and resumes each partition from the target.
    let takeover = deadline(&[SESSION, SESSION / 5, DISCOVERY]);
    wait_owned(&survivor, "the survivor to mirror every partition", takeover, |rows| mirroring_partitions(rows) == all)
        .await?;
    // Any append the zombie had in flight was answered long ago (the target does not wait for the client): these
    // log ends are past its cache offsets. Once the survivor has copied beyond them, the zombie's positions are
    // stale on every partition it owned.
    let at_takeover = b.leos(TOPIC).await?;
    wait_progress_beyond(&b, TOPIC, &at_takeover, io_deadline()).await?;
    assert!(zombie.process().is_suspended(), "the zombie stayed frozen throughout the takeover");

    zombie.resume()?;
    // It runs from its stale state until its first heartbeat says it was expelled; then it joins again.
    wait_split(&zombie, &survivor, &all, split).await?;
    assert!(
        zombie.logs().contains("was expelled from the scale-out group; joining again"),
        "the zombie learned from the group that it had been expelled"
    );
    // Both copy side by side for a while under the load.
    let rejoined = b.leos(TOPIC).await?;
    wait_progress_beyond(&b, TOPIC, &rejoined, io_deadline()).await?;

    stop.cancel();
    let produced = load.await??;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let src = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), produced, "the source holds the load");
    assert_no_divergence_nor_halt(&zombie, "zombie").await?;
    assert_no_divergence_nor_halt(&survivor, "survivor").await?;
    Ok(())
}
