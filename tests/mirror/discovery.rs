//! Scenario 5: discovery and the resume rule with `start_position = "latest"`.
//!
//! - At the first start, partitions present then start at the source's log end: older records are not copied.
//! - A matching topic created while the mirror runs is mirrored from offset 0; non-matching and excluded topics
//!   never appear on the target.
//! - SIGHUP with a changed include list takes effect without a restart.
//! - Partitions added on the source (4 -> 8) are mirrored from offset 0.

use ferry_testkit::{Signal, wait_until};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_new_topics_rules_and_partitions() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in ["orders.a", "other", "orders.secret"] {
        a.create_topic(t, 4).await?;
        produce(&a, t, "before", 400, 64).await?;
    }
    let start_leos = a.leos("orders.a").await?;

    let mut conf = MirrorConf::new(&a, &b);
    conf.include = vec!["^orders\\.".into()];
    conf.exclude = vec!["secret".into()];
    conf.start_position = "latest".into();
    let mut mirror = conf.start().await?;
    let discovery = ferry_testkit::deadline(&[DISCOVERY, IO_BUDGET]);

    // The initial partitions are positioned at the source's log end: nothing older is copied.
    wait_until("orders.a positioned at the source log ends", discovery, async || -> anyhow::Result<bool> {
        Ok(b.offsets("orders.a").await.is_ok_and(|o| o.iter().map(|(_, e)| *e).collect::<Vec<_>>() == start_leos))
    })
    .await?;
    let positioned = b.offsets("orders.a").await?;
    assert_eq!(positioned, start_leos.iter().map(|e| (*e, *e)).collect::<Vec<_>>(), "no record before the first start");

    // Later records are copied.
    produce_more(&a, "orders.a", "after", 400).await?;
    wait_caught_up(&a, "orders.a", &b, "orders.a", io_deadline()).await?;
    assert_identical_from(&a, &b, "orders.a", &start_leos).await?;

    // A matching topic created now is mirrored from offset 0.
    a.create_topic("orders.b", 4).await?;
    produce(&a, "orders.b", "new-topic", 600, 64).await?;
    wait_caught_up(&a, "orders.b", &b, "orders.b", discovery).await?;
    assert_identical(&a, "orders.b", &b, "orders.b").await?;

    // Non-matching and excluded topics are absent (discovery ran several times since they existed).
    assert!(!b.has_topic("other").await?, "\"other\" does not match the include rules");
    assert!(!b.has_topic("orders.secret").await?, "\"orders.secret\" is excluded");

    // SIGHUP with "other" included: mirrored without a restart (from offset 0: it is new to the mirror).
    let pid = mirror.pid();
    conf.include.push("^other$".into());
    mirror.rewrite_config(&conf.toml())?;
    mirror.send_signal(Signal::HUP)?;
    wait_caught_up(&a, "other", &b, "other", discovery).await?;
    assert_identical(&a, "other", &b, "other").await?;
    assert!(mirror.is_running() && mirror.pid() == pid, "the reload needs no restart");
    assert!(!b.has_topic("orders.secret").await?, "\"orders.secret\" stays excluded");

    // The source grows from 4 to 8 partitions: the new ones are mirrored from offset 0 despite "latest".
    a.admin.alter_partitions("orders.a", 8).await?;
    let p = producer(&a).await?;
    for partition in 4..8 {
        produce_to_partition(&p, "orders.a", partition, "grown", 0, 150).await?;
    }
    p.close().await;
    wait_until("orders.a to have 8 partitions on the target", discovery, async || -> anyhow::Result<bool> {
        Ok(b.leos("orders.a").await?.len() == 8)
    })
    .await?;
    wait_caught_up(&a, "orders.a", &b, "orders.a", io_deadline()).await?;
    let mut from = start_leos.clone();
    from.extend([0; 4]);
    assert_identical_from(&a, &b, "orders.a", &from).await?;
    for p in 4..8u32 {
        let (start, end) = b.offsets("orders.a").await?[p as usize];
        assert_eq!((start, end), (0, 150), "orders.a/{p} is copied from offset 0");
    }
    Ok(())
}

/// Produces records `[0, n)` of `tag` (a tag not used before on `topic`).
async fn produce_more(a: &Dc, topic: &str, tag: &str, n: u64) -> anyhow::Result<()> {
    produce(a, topic, tag, n, 64).await
}

/// Asserts that each partition of the target equals the source from `from[p]` on (log start included), with no gap.
async fn assert_identical_from(a: &Dc, b: &Dc, topic: &str, from: &[u64]) -> anyhow::Result<()> {
    let src = read_topic(a, topic).await?;
    let dst = read_topic(b, topic).await?;
    assert_eq!(src.len(), dst.len(), "{topic}: partition counts");
    for (p, ((s, d), start)) in src.iter().zip(&dst).zip(from).enumerate() {
        let what = format!("{topic}/{p} from offset {start}");
        let s = s.starting_at(*start);
        s.assert_contiguous(&format!("source {what}"));
        d.assert_contiguous(&format!("target {what}"));
        assert_same_partition(&what, &s, d);
    }
    Ok(())
}
