//! Scenario 2: the mirror is killed with SIGKILL at ten random moments while a producer keeps producing, and
//! restarted each time: the target ends identical to the source, with no duplicate and no gap.
//!
//! A "random moment" is a random amount of mirrored progress since the last restart (0 to 3,000 records, so some
//! kills land while the mirror is still resolving where to resume): waiting for a condition, not a timer. The
//! moments come from a printed seed; `FERRY_TEST_SEED=N` replays them.

use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPIC: &str = "orders";
const KILLS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_resumes_without_duplicates_after_kill() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 4).await?;
    let (seed, mut rng) = ferry_testkit::seeded_rng("kill moments")?;

    let stop = CancellationToken::new();
    let load = background_producer(&a, TOPIC, "kill9", stop.clone());
    let mut mirror = MirrorConf::new(&a, &b).start().await?;
    for kill in 0..KILLS {
        let base: u64 = match b.leos(TOPIC).await {
            Ok(leos) => leos.iter().sum(),
            Err(_) => 0,
        };
        let progress: u64 = rng.random_range(0..3_000);
        let what = format!("kill {kill} (seed {seed}): {progress} more records mirrored");
        wait_until_progress(&b, base + progress, &what).await?;
        mirror.kill9().await?;
        mirror.restart().await?;
    }
    stop.cancel();
    let produced = load.await??;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let src = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len() as u64).sum::<u64>(), produced, "seed {seed}");
    Ok(())
}

/// Waits until the target holds at least `records` in all (the sum of its log ends).
async fn wait_until_progress(b: &Dc, records: u64, what: &str) -> anyhow::Result<()> {
    ferry_testkit::wait_until(what, io_deadline(), async || -> anyhow::Result<bool> {
        Ok(b.leos(TOPIC).await.map(|l| l.iter().sum::<u64>()).unwrap_or(0) >= records)
    })
    .await
}
