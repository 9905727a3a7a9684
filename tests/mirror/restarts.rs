//! Broker crashes on either side while a producer keeps producing.
//!
//! - The source broker is killed with SIGKILL and restarted without losing data (what it wrote is in the page
//!   cache): it bumps its partition epochs, as after any unclean start, but the old epochs end exactly where they
//!   did. That is not a divergence: the mirror keeps copying, the new epoch's batches with their epoch.
//! - The target broker is killed and restarted: the mirror raises `target_net_not_available`, waits, resumes from
//!   the target's log end, and raises `target_net_recovered`.
//!
//! Both end with the target identical to the source, with no duplicate and no gap.

use ferry_testkit::deadline;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPIC: &str = "orders";

async fn events_of(mirror: &ferry_testkit::MirrorProcess, kind: &str) -> anyhow::Result<usize> {
    Ok(monitor_events(mirror, Some(kind)).await?.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_broker_crash_without_loss_is_not_a_divergence() -> anyhow::Result<()> {
    let (mut a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    produce(&a, TOPIC, "before", 1_000, 100).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.on_divergence = "truncate".into();
    let mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    let stop = CancellationToken::new();
    let load = background_producer(&a, TOPIC, "across-the-crash", stop.clone());
    let leos: u64 = a.leos(TOPIC).await?.iter().sum();
    ferry_testkit::wait_until("the load to reach the source", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(a.leos(TOPIC).await?.iter().sum::<u64>() > leos)
    })
    .await?;
    a.broker.kill9().await?;
    a.broker.restart().await?;
    assert!(
        a.admin.describe_topic(TOPIC).await?.partitions.iter().all(|p| p.epoch == 1),
        "an unclean start bumps epochs"
    );
    let leos: u64 = a.leos(TOPIC).await?.iter().sum();
    ferry_testkit::wait_until("records of the new epoch", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(a.leos(TOPIC).await?.iter().sum::<u64>() > leos + 1_000)
    })
    .await?;
    stop.cancel();
    load.await??;

    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let source = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert!(source.iter().all(|p| p.batches.iter().any(|b| b.2 == 1)), "the new epoch's batches were copied");
    assert_eq!(events_of(&mirror, "partition_diverged").await?, 0, "no divergence was raised");
    let rows = monitor_partitions(&mirror).await?;
    assert!(rows.values().all(|r| r.state == "mirroring"), "{rows:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_broker_crash_is_survived() -> anyhow::Result<()> {
    let (a, mut b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    let mirror = MirrorConf::new(&a, &b).start().await?;
    let stop = CancellationToken::new();
    let load = background_producer(&a, TOPIC, "steady", stop.clone());
    ferry_testkit::wait_until("the mirror to copy some records", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(b.leos(TOPIC).await.map(|l| l.iter().sum::<u64>()).unwrap_or(0) >= 2_000)
    })
    .await?;
    b.broker.kill9().await?;
    // The target counts as unavailable after a few failed calls.
    ferry_testkit::wait_until("target_net_not_available", deadline(&[IO_BUDGET]), async || -> anyhow::Result<bool> {
        Ok(events_of(&mirror, "target_net_not_available").await? > 0)
    })
    .await?;
    b.broker.restart().await?;
    ferry_testkit::wait_until("target_net_recovered", deadline(&[IO_BUDGET]), async || -> anyhow::Result<bool> {
        Ok(events_of(&mirror, "target_net_recovered").await? > 0)
    })
    .await?;
    stop.cancel();
    load.await??;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    Ok(())
}
