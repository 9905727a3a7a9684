//! Compaction of the delay store (docs/messaging.md, "Delay", "Compaction"): once a burst of delayed records has
//! fired, the segments that held them are deleted, so the store's disk use shrinks; the records still pending (due
//! later, stored after the burst) survive it and a kill -9 after it, and arrive once each, intact.

use std::path::Path;
use std::time::Duration;

use ferry_client::{Code, DeliverAt, ProducerRecord};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, assert_status, leos, read_partition, start_broker};
use crate::delay::{TICK, TOPIC, expected, index_of, now_ms, record, topic};

/// Bytes the files under `dir` take on disk (allocated blocks, so preallocated index files count what they use).
fn disk_use(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_frees_fired_segments_and_pending_records_survive_it_and_a_kill_9() -> anyhow::Result<()> {
    const BURST: usize = 12_000;
    const PER_REQUEST: usize = 500;
    const PAD: usize = 1_000;
    let mut broker = start_broker("[delay]\ntick = \"50ms\"\n").await?;
    let (client, delayed) = topic(&broker, 1, None).await?;
    let admin = ferry_client::Admin::new(client.clone());
    // About 12 MiB due in two seconds: three 4 MiB segments of the delay store and more.
    let pad = "p".repeat(PAD);
    let mut burst_ids = Vec::new();
    for start in (0..BURST).step_by(PER_REQUEST) {
        let records: Vec<ProducerRecord> =
            (start..start + PER_REQUEST).map(|i| record(i, 1).with_header("pad", pad.clone())).collect();
        let receipt = delayed.send(&records, DeliverAt::After(Duration::from_secs(2))).await?;
        burst_ids.extend(receipt.ids);
    }
    // Stored after the burst, due well after it: still pending when the burst's segments go.
    let survivors: Vec<ProducerRecord> = (BURST..BURST + 5).map(|i| record(i, 1)).collect();
    let kept = delayed.send(&survivors, DeliverAt::After(Duration::from_secs(7))).await?;
    let store = broker.data_dir().join("__ferry_delay");
    let before = disk_use(&store);

    let burst_due = Duration::from_secs(2) + TICK;
    wait_until("the burst to be moved", deadline(&[burst_due, IO_BUDGET]), async || {
        leos(&admin, TOPIC).await == vec![BURST as u64]
    })
    .await?;
    // The owner looks for segments to free about once a second.
    wait_until("the delay store to shrink", deadline(&[Duration::from_secs(1), TICK, IO_BUDGET]), async || {
        disk_use(&store) < before / 2
    })
    .await?;
    let after = disk_use(&store);
    println!("delay store on disk: {} KiB with the burst pending, {} KiB once it fired", before >> 10, after >> 10);
    let pending = delayed.describe(TOPIC).await?;
    assert_eq!((pending.len(), pending[0].pending), (1, 5), "{pending:?}");
    // A freed id is no longer pending, and says so.
    assert_status(delayed.cancel(TOPIC, &burst_ids[0]).await, Code::FailedPrecondition, &["no longer pending"]);

    // A new process replays the compacted store: the survivors are still pending, and arrive once.
    broker.kill9().await?;
    broker.restart().await?;
    assert_eq!(delayed.describe(TOPIC).await?, pending);
    let wait = Duration::from_millis(u64::try_from(kept.due_ms - now_ms()).unwrap_or(0));
    wait_until("the survivors to arrive", deadline(&[wait, TICK, IO_BUDGET]), async || {
        leos(&admin, TOPIC).await[0] >= (BURST + 5) as u64
    })
    .await?;
    let held = read_partition(&client, TOPIC, 0).await;
    assert_eq!(held.len(), BURST + 5, "every record once");
    let indices: Vec<usize> = held.iter().map(index_of).collect();
    assert_eq!(indices, (0..BURST + 5).collect::<Vec<_>>(), "in produced order, none twice");
    let want: Vec<_> = (0..5).map(|j| expected(BURST + j, 0, (BURST + j) as u64, kept.due_ms, 1)).collect();
    assert_eq!(held[BURST..].to_vec(), want);
    assert!(delayed.describe(TOPIC).await?.is_empty());
    Ok(())
}
