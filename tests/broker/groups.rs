//! Consumer groups: two members split four partitions; when one dies without leaving, the other takes over all
//! four from the committed offsets within a session timeout; committed offsets survive a broker restart.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::{Consumer, ConsumerConfig, OffsetReset, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, STOP_GRACE, assert_same_records, by_partition, connect, read_topic, start_broker};

const PARTITIONS: u32 = 4;
const PER_PARTITION: usize = 300;
const SESSION: Duration = Duration::from_secs(2);
const HEARTBEAT: Duration = Duration::from_millis(300);
const MAX_WAIT: Duration = Duration::from_millis(100);

fn member_config() -> ConsumerConfig {
    ConsumerConfig {
        auto_offset_reset: OffsetReset::Earliest,
        auto_commit: false,
        heartbeat_interval: HEARTBEAT,
        session_timeout: SESSION,
        max_wait: MAX_WAIT,
        // Small fetches (at least one whole batch each), so each member reads its partitions in several steps.
        partition_max_bytes: 2048,
        ..ConsumerConfig::default()
    }
}

/// Polls `consumer` until `done` holds, collecting what it hands out.
async fn poll_until(
    what: &str,
    consumer: &mut Consumer,
    into: &mut Vec<Rec>,
    within: Duration,
    mut done: impl FnMut(&Consumer, &[Rec]) -> bool,
) -> anyhow::Result<()> {
    wait_until(what, within, async || {
        let batch = consumer.poll(MAX_WAIT).await?;
        into.extend(batch.iter().map(Rec::from_consumed));
        anyhow::Ok(done(consumer, into))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_expelled_and_the_survivor_resumes_from_committed_offsets() -> anyhow::Result<()> {
    let mut broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("events", PARTITIONS, TopicConfig::default(), None).await?;
    // Two members: two partitions each (the Zeze rule over sorted members). They settle before any data exists,
    // so neither reads a record from a partition it is about to lose.
    let mut a = Consumer::new(client.clone(), member_config())?;
    let mut b = Consumer::new(client.clone(), member_config())?;
    a.subscribe("workers", vec!["events".into()]).await?;
    b.subscribe("workers", vec!["events".into()]).await?;
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let rebalance = deadline(&[SESSION, HEARTBEAT]);
    poll_until("member a to own two partitions", &mut a, &mut got_a, rebalance, |c, _| c.assignment().len() == 2)
        .await?;
    poll_until("member b to own two partitions", &mut b, &mut got_b, rebalance, |c, _| c.assignment().len() == 2)
        .await?;
    assert!(got_a.is_empty() && got_b.is_empty());

    // Small batches, so that each member's fetches hand its partitions out in several steps.
    let small = ProducerConfig { batch_bytes: 2048, ..ProducerConfig::default() };
    let producer = Producer::new(client.clone(), small).await?;
    let mut deliveries = Vec::new();
    for i in 0..PER_PARTITION * PARTITIONS as usize {
        let r = ProducerRecord::new("events", format!("event-{i:04}-{}", "p".repeat(40)))
            .with_partition(i as u32 % PARTITIONS)
            .with_key(format!("k{i}"))
            .with_header("i", i.to_string())
            .with_timestamp(1_700_000_000_000 + i as i64);
        deliveries.push(producer.send(r).await?);
    }
    futures::future::try_join_all(deliveries).await?;
    producer.close().await;
    let all = read_topic(&client, "events").await;
    assert_eq!(all.len(), PER_PARTITION * PARTITIONS as usize);

    let owned_a: BTreeSet<(String, u32)> = a.assignment().into_iter().collect();
    let owned_b: BTreeSet<(String, u32)> = b.assignment().into_iter().collect();
    assert!(owned_a.is_disjoint(&owned_b), "{owned_a:?} / {owned_b:?}");
    assert_eq!(owned_a.len() + owned_b.len(), PARTITIONS as usize);

    // Member b consumes some records of each of its partitions and commits them, then more without committing,
    // and dies: its heartbeats stop with no LeaveGroup.
    let b_parts: BTreeSet<u32> = owned_b.iter().map(|(_, p)| *p).collect();
    poll_until("member b to consume from both its partitions", &mut b, &mut got_b, deadline(&[IO_BUDGET]), |_, got| {
        b_parts.iter().all(|p| got.iter().filter(|r| r.partition == *p).count() >= 20)
    })
    .await?;
    b.commit().await?;
    let committed_b = got_b.clone();
    let before = got_b.len();
    poll_until("member b to consume past its commit", &mut b, &mut got_b, deadline(&[IO_BUDGET]), |_, got| {
        got.len() > before
    })
    .await?;
    let uncommitted_b: Vec<Rec> = got_b[before..].to_vec();
    drop(b);

    // Within the session timeout plus a rebalance, a owns all four partitions and reads to the end.
    poll_until("member a to own all four partitions", &mut a, &mut got_a, deadline(&[SESSION, HEARTBEAT]), |c, _| {
        c.assignment().len() == PARTITIONS as usize
    })
    .await?;
    poll_until("member a to reach the end of every partition", &mut a, &mut got_a, deadline(&[IO_BUDGET]), |_, got| {
        let mut ends: BTreeMap<u32, u64> = BTreeMap::new();
        for r in got.iter().chain(committed_b.iter()) {
            let e = ends.entry(r.partition).or_default();
            *e = (*e).max(r.offset + 1);
        }
        ends.values().all(|&e| e == PER_PARTITION as u64) && ends.len() == PARTITIONS as usize
    })
    .await?;

    // Nothing skipped: a's records plus b's committed ones are the whole topic, each once.
    let mut union = got_a.clone();
    union.extend(committed_b.iter().cloned());
    assert_same_records("a + b's committed records", &all, &union);
    // Nothing delivered twice beyond what b had not committed: exactly those records reached both.
    let twice: BTreeSet<&Rec> = got_a.iter().filter(|r| got_b.contains(r)).collect();
    let uncommitted: BTreeSet<&Rec> = uncommitted_b.iter().collect();
    assert_eq!(twice, uncommitted, "records delivered to both members");
    // Each partition came to a in offset order.
    for (p, recs) in by_partition(&got_a) {
        let order: Vec<u64> = got_a.iter().filter(|r| r.partition == p).map(|r| r.offset).collect();
        assert_eq!(order, recs.iter().map(|r| r.offset).collect::<Vec<_>>(), "partition {p} out of order");
    }

    // a commits everything; the committed offsets are the log ends and survive a clean broker restart.
    a.commit().await?;
    a.close().await?;
    let ends: Vec<(u32, u64)> = (0..PARTITIONS).map(|p| (p, PER_PARTITION as u64)).collect();
    let committed = |admin: ferry_client::Admin| async move {
        let offsets = admin.fetch_committed_offsets("workers", &[]).await.expect("committed offsets");
        offsets.iter().map(|c| (c.partition, c.offset)).collect::<Vec<_>>()
    };
    assert_eq!(committed(admin.clone()).await, ends);
    assert_eq!(broker.terminate(STOP_GRACE).await?.code(), Some(0));
    broker.restart().await?;
    assert_eq!(committed(admin.clone()).await, ends);
    Ok(())
}
