//! Case 14 of the cluster analysis: a target that refuses every append with a storage error (its disk is full)
//! raises `sync_error` within a few attempts, not once the stall watchdog fires a minute later; the partition keeps
//! retrying, and once the target takes appends again the condition clears and the target equals the source.

use std::time::Duration;

use ferry_testkit::{BrokerProcess, deadline};

use crate::common::*;
use crate::watch::*;

const TOPIC: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_refuses_every_append_raises_sync_error_within_a_few_attempts_and_clears_it() -> anyhow::Result<()>
{
    let a = Dc::start("dc-a").await?;
    let broker = BrokerProcess::builder().cluster_id("dc-b").config(BROKER_CONFIG).disk_full_switch().start().await?;
    let client = client_for(broker.addr());
    let b = Dc { name: "dc-b".into(), admin: ferry_client::Admin::new(client.clone()), client, broker };
    a.create_topic(TOPIC, 1).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "before", 0, 100, 200).await?;
    let mirror = start_mirror(&MirrorConf::new(&a, &b), "", "").await?;
    let m = &mirror.process;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    // The target's disk fills up: every append of the next records fails with a storage error.
    b.broker.set_disk_full(true)?;
    produce_range(&p, TOPIC, "during", 0, 50, 200).await?;
    // Three attempts at the mirror's retry policy (200 ms doubling): well under 2 s, with the usual margin.
    let raised = wait_event(m, "sync_error", TOPIC, 0, false, deadline(&[Duration::from_secs(2)])).await?;
    let message = raised["message"].as_str().unwrap_or_default();
    assert!(message.contains("the target refuses orders/0") && message.contains("no space left"), "{raised}");
    let doc = partition_doc(m, TOPIC, 0).await?;
    assert_eq!(doc["cache_offset"].as_u64(), Some(100), "{doc}");

    // Room again: the records go through, the condition clears, and the target equals the source.
    b.broker.set_disk_full(false)?;
    produce_range(&p, TOPIC, "after", 0, 10, 200).await?;
    p.close().await;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let cleared = wait_event(m, "sync_error", TOPIC, 0, true, deadline(&[CHECK])).await?;
    assert!(cleared["message"].as_str().unwrap_or_default().contains("takes orders/0 again"), "{cleared}");
    let (source, target) =
        (read_partition(&a.client, TOPIC, 0, None).await?, read_partition(&b.client, TOPIC, 0, None).await?);
    assert_same_partition("the target after the disk had room again", &source, &target);
    assert_eq!(source.records.len(), 160);
    Ok(())
}
