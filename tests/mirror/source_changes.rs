//! Changes on the source side while mirrored (design §4 Discovery, conf/mirror.toml `discovery_interval`):
//!
//! - A source topic deleted: `remove_topic` is raised for it, it leaves the monitor's topics and partitions, its
//!   target topic stays exactly as it was, and the other topic keeps mirroring exactly; the process lives on and
//!   raises nothing else about the deleted topic.
//! - A source topic's config changed (retention, flush): the target topic's config follows within three discovery
//!   intervals.
//! - While nothing changes, discovery rounds after a quiet one are skipped (both lists unchanged by their digests),
//!   and a topic created on the source after such rounds is still read and mirrored exactly.

use ferry_client::admin::TopicConfig;
use ferry_testkit::{MirrorProcess, deadline, wait_until};

use crate::common::*;
use crate::watch::metric;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_source_topic_is_removed_and_the_others_keep_mirroring() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in ["orders", "doomed"] {
        a.create_topic(t, 2).await?;
        produce(&a, t, "before", 400, 64).await?;
    }
    let mut mirror = MirrorConf::new(&a, &b).start().await?;
    let pid = mirror.pid();
    for t in ["orders", "doomed"] {
        wait_caught_up(&a, t, &b, t, io_deadline()).await?;
        assert_identical(&a, t, &b, t).await?;
    }
    let doomed_before = read_topic(&b, "doomed").await?;

    a.admin.delete_topic("doomed").await?;
    let limit = deadline(&[DISCOVERY, IO_BUDGET]);
    wait_until("remove_topic for doomed", limit, async || -> anyhow::Result<bool> {
        Ok(monitor_events(&mirror, Some("remove_topic")).await?.iter().any(|e| e["topic"] == "doomed"))
    })
    .await?;
    let orders = [("orders".to_owned(), 0), ("orders".to_owned(), 1)];
    wait_owned(&mirror, "only orders' partitions listed", limit, |rows| rows.keys().eq(orders.iter())).await?;
    let topics = monitor_get(&mirror, "/api/v1/topics").await?;
    let names: Vec<&str> =
        topics["topics"].as_array().into_iter().flatten().filter_map(|t| t["topic"].as_str()).collect();
    assert_eq!(names, ["orders"], "{topics}");

    produce(&a, "orders", "after", 400, 64).await?;
    wait_caught_up(&a, "orders", &b, "orders", io_deadline()).await?;
    let src = assert_identical(&a, "orders", &b, "orders").await?;
    assert_eq!(src.iter().map(|p| p.records.len()).sum::<usize>(), 800);

    assert!(b.has_topic("doomed").await?, "the target topic is kept");
    let doomed_after = read_topic(&b, "doomed").await?;
    for (p, (x, y)) in doomed_before.iter().zip(&doomed_after).enumerate() {
        assert_same_partition(&format!("dc-b doomed/{p} stays as it was"), x, y);
    }
    // Everything the mirror said about "doomed", oldest first: it was added, then removed.
    let mut about: Vec<String> = monitor_events(&mirror, None)
        .await?
        .iter()
        .filter(|e| e["topic"] == "doomed")
        .filter_map(|e| e["kind"].as_str().map(str::to_owned))
        .collect();
    about.reverse();
    assert_eq!(about, ["add_topic", "remove_topic"]);
    assert!(monitor_events(&mirror, Some("partition_diverged")).await?.is_empty());
    assert!(mirror.is_running() && mirror.pid() == pid, "the mirror lives on");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_topic_config_changes_are_copied_to_the_target() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    let day = 24 * 3600 * 1000;
    let initial = TopicConfig { retention_ms: Some(day), ..TopicConfig::default() };
    a.admin.create_topic("orders", 2, initial, None).await?;
    produce(&a, "orders", "before", 300, 64).await?;
    let _mirror = MirrorConf::new(&a, &b).start().await?;
    wait_caught_up(&a, "orders", &b, "orders", io_deadline()).await?;
    let config_of = async |dc: &Dc| -> anyhow::Result<TopicConfig> {
        Ok(dc.admin.describe_topic("orders").await?.topic.config.unwrap_or_default())
    };
    let source = config_of(&a).await?;
    assert_eq!(source.retention_ms, Some(day));
    assert_eq!(config_of(&b).await?, source, "created with the source's config");

    let change = TopicConfig {
        retention_ms: Some(2 * 3600 * 1000),
        retention_bytes: Some(64 << 20),
        flush: Some("sync".into()),
        ..TopicConfig::default()
    };
    a.admin.alter_topic_config("orders", change).await?;
    let source = config_of(&a).await?;
    assert_eq!(
        (source.retention_ms, source.retention_bytes, source.flush.as_deref()),
        (Some(2 * 3600 * 1000), Some(64 << 20), Some("sync"))
    );
    wait_until("dc-b's orders to take the new config", deadline(&[DISCOVERY]), async || -> anyhow::Result<bool> {
        Ok(config_of(&b).await? == source)
    })
    .await?;

    produce(&a, "orders", "after", 300, 64).await?;
    wait_caught_up(&a, "orders", &b, "orders", io_deadline()).await?;
    assert_identical(&a, "orders", &b, "orders").await?;
    Ok(())
}

/// Discovery rounds of one result (`read` or `unchanged`), as the mirror counts them.
async fn rounds(mirror: &MirrorProcess, result: &str) -> anyhow::Result<u64> {
    let key = format!("ferry_mirror_discovery_rounds_total{{result=\"{result}\"}}");
    Ok(metric(mirror, &key).await?.unwrap_or(0.0) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_discovery_rounds_are_skipped_and_a_topic_created_after_them_is_still_mirrored() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    produce(&a, "orders", "before", 100, 64).await?;
    let mirror = MirrorConf::new(&a, &b).start().await?;
    wait_caught_up(&a, "orders", &b, "orders", io_deadline()).await?;
    // The first round creates the target topic, the second reads that change and is quiet, and from the third on
    // nothing differs: two skipped rounds within four discovery intervals.
    wait_until("two unchanged discovery rounds", deadline(&[DISCOVERY * 4]), async || -> anyhow::Result<bool> {
        Ok(rounds(&mirror, "unchanged").await? >= 2)
    })
    .await?;
    let read = rounds(&mirror, "read").await?;

    a.admin.create_topic("payments", 3, TopicConfig::default(), None).await?;
    produce(&a, "payments", "new", 60, 64).await?;
    wait_caught_up(&a, "payments", &b, "payments", io_deadline()).await?;
    assert_identical(&a, "payments", &b, "payments").await?;
    assert!(rounds(&mirror, "read").await? > read, "the new topic was found by a round that read the lists");
    assert_identical(&a, "orders", &b, "orders").await?;
    Ok(())
}
