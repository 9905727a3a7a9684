//! Source batches larger than the target's `max_batch_bytes` are split into batches that fit, keeping every
//! record's offset, timestamp, key, value and headers, and the batch's epoch; a mirror killed in the middle of
//! splitting resumes inside a source batch without a duplicate or a gap. The kill points come from a printed seed;
//! `FERRY_TEST_SEED=N` replays them.

use ferry_client::{Producer, ProducerConfig};
use rand::Rng;

use crate::common::*;

const TOPIC: &str = "large";
const TARGET_MAX_BATCH: u64 = 64 * 1024;
const COUNT: u64 = 6_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_batches_are_split_keeping_every_offset() -> anyhow::Result<()> {
    // The source takes 4 MiB batches, the target 64 KiB ones: one source batch is 64 target batches, and more
    // than the largest message the target accepts (2 x 64 KiB + 1 MiB), so it also takes several requests.
    let source_config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"4MiB\"\n");
    let target_config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"{TARGET_MAX_BATCH}\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &source_config), Dc::start_with("dc-b", &target_config));
    let (a, b) = (a?, b?);
    a.create_topic(TOPIC, 2).await?;
    // Lingering, so that every batch fills up to its 4 MiB (a pipelining producer sends what it has otherwise).
    let config =
        ProducerConfig { batch_bytes: 4 << 20, linger: std::time::Duration::from_secs(1), ..Default::default() };
    let p = Producer::new(a.client.clone(), config).await?;
    produce_range(&p, TOPIC, "big", 0, COUNT, 2_048).await?;
    p.close().await;
    let source = read_topic(&a, TOPIC).await?;
    assert!(source.iter().flat_map(|p| &p.batches).any(|b| b.1 - b.0 > 1_000), "the source holds 4 MiB batches");

    let (seed, mut rng) = ferry_testkit::seeded_rng("kill points while splitting")?;
    let mut mirror = MirrorConf::new(&a, &b).start().await?;
    for kill in 0..3 {
        let target: u64 = b.leos(TOPIC).await.map(|l| l.iter().sum()).unwrap_or(0) + rng.random_range(1..1_500);
        let what = format!("kill {kill} (seed {seed}): {target} records on the target");
        ferry_testkit::wait_until(&what, io_deadline(), async || -> anyhow::Result<bool> {
            Ok(b.leos(TOPIC).await.map(|l| l.iter().sum::<u64>()).unwrap_or(0) >= target.min(COUNT))
        })
        .await
        .map_err(|e| e.context(mirror.logs()))?;
        mirror.kill9().await?;
        mirror.restart().await?;
    }
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    let target = read_topic(&b, TOPIC).await?;
    for (p, (s, t)) in source.iter().zip(&target).enumerate() {
        let what = format!("{TOPIC}/{p} (seed {seed})");
        t.assert_contiguous(&what);
        assert_eq!((t.log_start, t.log_end), (s.log_start, s.log_end), "{what}: log start and end");
        assert_eq!(records_digest(&t.records), records_digest(&s.records), "{what}: every record, as on the source");
        assert!(t.batches.len() > s.batches.len(), "{what}: the large batches were split");
        let epochs: Vec<u32> = s.batches.iter().map(|b| b.2).collect();
        assert!(t.batches.iter().all(|b| epochs.contains(&b.2)), "{what}: the source epochs are kept");
    }
    let sizes = b.admin.describe_topic(TOPIC).await?;
    assert!(sizes.partitions.iter().all(|p| p.size_bytes > 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_target_limit_halts_the_partition() -> anyhow::Result<()> {
    let source_config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"4MiB\"\n");
    let target_config = format!("{BROKER_CONFIG}[broker]\nmax_batch_bytes = \"{TARGET_MAX_BATCH}\"\n");
    let (a, b) = tokio::join!(Dc::start_with("dc-a", &source_config), Dc::start_with("dc-b", &target_config));
    let (a, b) = (a?, b?);
    a.create_topic(TOPIC, 1).await?;
    // Lingering, so that every batch fills up to its 4 MiB (a pipelining producer sends what it has otherwise).
    let config =
        ProducerConfig { batch_bytes: 4 << 20, linger: std::time::Duration::from_secs(1), ..Default::default() };
    let p = Producer::new(a.client.clone(), config).await?;
    // Three batches: small records, one record of 100 KiB alone, small records again.
    produce_range(&p, TOPIC, "small", 0, 10, 100).await?;
    produce_range(&p, TOPIC, "huge", 0, 1, 100 * 1024).await?;
    produce_range(&p, TOPIC, "after", 0, 10, 100).await?;
    p.close().await;

    let mirror = MirrorConf::new(&a, &b).start().await?;
    let rows = wait_owned(&mirror, "the partition to halt on the huge record", io_deadline(), |rows| {
        rows.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == "halted")
    })
    .await?;
    let error = rows[&(TOPIC.to_owned(), 0)].last_error.clone().unwrap_or_default();
    assert!(error.contains("record at offset 10") && error.contains("max_batch_bytes"), "{error}");
    // Everything before the record was copied, nothing after it.
    let source = read_partition(&a.client, TOPIC, 0, Some(10)).await?;
    let target = read_partition(&b.client, TOPIC, 0, None).await?;
    assert_same_partition("the records before the huge one", &source, &target);
    Ok(())
}
