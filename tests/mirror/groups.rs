//! Scenario 7: consumer-group offset sync for failover. A group on the source consumes part of a topic and
//! commits; with `[groups] include` matching it, the mirror copies `min(committed, target log end)` to the target,
//! and a consumer started on the target with that group reads exactly the records it had not read yet.
//!
//! A second matching group committed past the source's log end gets the target's log end (the `min`), and a
//! group the rules do not match is never copied.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::admin::CommittedOffset;
use ferry_client::{Consumer, ConsumerConfig, OffsetReset, StartAt};
use ferry_testkit::{deadline, wait_until};

use crate::common::*;

const TOPIC: &str = "orders";

fn consumer_config(group: &str) -> ConsumerConfig {
    ConsumerConfig {
        group: Some(group.to_owned()),
        auto_offset_reset: OffsetReset::Earliest,
        auto_commit: false,
        heartbeat_interval: Duration::from_millis(500),
        session_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

/// Polls `consumer` until its consumed position reached `until[p]` on every partition; returns what it read.
async fn consume_until(consumer: &mut Consumer, until: &[u64], what: &str) -> anyhow::Result<Vec<Vec<Rec>>> {
    let mut read: Vec<Vec<Rec>> = vec![Vec::new(); until.len()];
    wait_until(what, io_deadline(), async || -> anyhow::Result<bool> {
        for r in consumer.poll(Duration::from_millis(200)).await? {
            read[r.partition as usize].push(Rec {
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                value: r.value,
                headers: r.headers.iter().map(|h| (h.key.clone(), h.value.clone())).collect(),
            });
        }
        Ok(until
            .iter()
            .enumerate()
            .all(|(p, end)| consumer.position(TOPIC, p as u32).unwrap_or(0) >= *end || *end == 0))
    })
    .await?;
    Ok(read)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_follow_to_the_target() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    produce(&a, TOPIC, "read-on-dc-a", 1_000, 64).await?;

    // "app" consumes everything there is now on the source, and commits.
    let first_leos = a.leos(TOPIC).await?;
    let mut source_consumer = Consumer::new(a.client.clone(), consumer_config("app"))?;
    source_consumer.assign((0..2).map(|p| (TOPIC.to_owned(), p, StartAt::Earliest)).collect())?;
    consume_until(&mut source_consumer, &first_leos, "app to consume on dc-a").await?;
    source_consumer.commit().await?;
    source_consumer.close().await?;
    let committed: BTreeMap<u32, u64> =
        a.admin.fetch_committed_offsets("app", &[]).await?.into_iter().map(|c| (c.partition, c.offset)).collect();
    assert_eq!(committed.values().copied().collect::<Vec<_>>(), first_leos);
    // "app-ahead" claims offsets past the source's end; "zzz" is not matched by the rules.
    let ahead = |extra: u64| -> Vec<CommittedOffset> {
        first_leos
            .iter()
            .enumerate()
            .map(|(p, leo)| CommittedOffset {
                topic: TOPIC.into(),
                partition: p as u32,
                offset: leo + extra,
                metadata: String::new(),
            })
            .collect()
    };
    a.admin.commit_offsets("app-ahead", ahead(5_000)).await?;
    a.admin.commit_offsets("zzz", ahead(0)).await?;

    produce(&a, TOPIC, "unread", 1_000, 64).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.groups_include = vec!["^app".into()];
    let _mirror = conf.start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let target_leos = b.leos(TOPIC).await?;

    let sync = deadline(&[conf.group_sync_interval, IO_BUDGET]);
    let offsets_of = async |group: &str| -> anyhow::Result<Vec<u64>> {
        let d = b.admin.describe_group(group).await?;
        let mut o: Vec<(u32, u64)> =
            d.offsets.iter().filter(|o| o.topic == TOPIC).map(|o| (o.partition, o.offset)).collect();
        o.sort();
        Ok(o.into_iter().map(|(_, offset)| offset).collect())
    };
    wait_until("app's offsets on dc-b", sync, async || -> anyhow::Result<bool> {
        Ok(offsets_of("app").await? == first_leos && offsets_of("app-ahead").await? == target_leos)
    })
    .await?;
    assert!(offsets_of("zzz").await?.is_empty(), "a group the rules do not match is not copied");

    // A consumer of "app" on dc-b reads exactly what it had not read on dc-a.
    let source = read_topic(&a, TOPIC).await?;
    let mut target_consumer = Consumer::new(b.client.clone(), consumer_config("app"))?;
    target_consumer.subscribe("app", vec![TOPIC.into()]).await?;
    let read = consume_until(&mut target_consumer, &target_leos, "app to consume on dc-b").await?;
    target_consumer.close().await?;
    for (p, (got, src)) in read.iter().zip(&source).enumerate() {
        let unread = src.starting_at(first_leos[p]);
        assert!(!unread.records.is_empty());
        assert_eq!(got.len(), unread.records.len(), "{TOPIC}/{p}: count of records read on dc-b");
        assert_eq!(records_digest(got), records_digest(&unread.records), "{TOPIC}/{p}: exactly the unread records");
    }
    Ok(())
}
