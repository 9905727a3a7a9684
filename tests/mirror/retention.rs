//! Scenario 4: source retention deleted the oldest segments before the mirror first ran. The target partition
//! starts where the source now starts (its log start equals the source's) and holds exactly the records from there.

use ferry_client::admin::TopicConfig;

use crate::common::*;

const TOPIC: &str = "orders";
const SEGMENT: u64 = 64 * 1024;
const RETENTION: u64 = 128 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_starts_at_the_source_log_start_after_retention() -> anyhow::Result<()> {
    // The source takes batches of at most one segment, so its 64 KiB segments are effective (a segment is never
    // smaller than the broker's largest batch). The target keeps its 1 MiB limit, so it adjusts the segment size it
    // is given, and the mirror must not copy the config again on every discovery round.
    let config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"64KiB\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &config), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    let config = TopicConfig { segment_bytes: Some(SEGMENT), retention_bytes: Some(RETENTION), ..Default::default() };
    a.admin.create_topic(TOPIC, 2, config, None).await?;
    // Small flushes make small batches, so the segments roll often and retention has whole segments to delete.
    let p = producer(&a).await?;
    for chunk in 0..40u64 {
        produce_range(&p, TOPIC, "old", chunk * 50, (chunk + 1) * 50, 300).await?;
    }
    p.close().await;
    // Wait until retention deleted the old segments and is done (the rest fits the limit).
    let retention_check = std::time::Duration::from_millis(200);
    ferry_testkit::wait_until(
        "source retention to delete old segments and settle",
        ferry_testkit::deadline(&[retention_check, IO_BUDGET]),
        async || -> anyhow::Result<bool> {
            let d = a.admin.describe_topic(TOPIC).await?;
            Ok(d.partitions.iter().all(|p| p.log_start_offset > 0 && (p.size_bytes <= RETENTION || p.segments == 1)))
        },
    )
    .await?;
    let source_starts: Vec<u64> = a.offsets(TOPIC).await?.iter().map(|(start, _)| *start).collect();

    let mirror = MirrorConf::new(&a, &b).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let target = b.offsets(TOPIC).await?;
    for (p, ((start, _), source_start)) in target.iter().zip(&source_starts).enumerate() {
        assert_eq!(start, source_start, "{TOPIC}/{p}: the target's log start is the source's");
    }
    // Retention did not move since: the comparison below covers exactly [log start, log end).
    assert_eq!(a.offsets(TOPIC).await?.iter().map(|(s, _)| *s).collect::<Vec<_>>(), source_starts);
    assert_identical(&a, TOPIC, &b, TOPIC).await?;

    // Two more discovery rounds: the target's adjusted segment size is not "copied" again and again.
    let round = ferry_testkit::deadline(&[DISCOVERY, DISCOVERY]);
    discovery_round(&a, &b, "marker-1", "marker-1", round).await?;
    discovery_round(&a, &b, "marker-2", "marker-2", round).await?;
    let copies = mirror.logs().matches("copied the source topic's config change").count();
    assert_eq!(copies, 0, "the config given at creation is not copied again:\n{}", mirror.logs());
    Ok(())
}
