//! Message models on a single broker (docs/messaging.md, "Message models"): queue groups where every record
//! succeeds once across many members, locks that end and members that die, a lifecycle that survives a restart,
//! broadcast to every member, a serial group with one active member, retries with backoff and dead letters with
//! their disposition headers and history.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_client::admin::TopicConfig;
use ferry_client::{
    BrokerClient, Outcome, Producer, ProducerConfig, ProducerRecord, ShareAdmin, ShareConfig, ShareConsumer,
    ShareMessage, ShareMode,
};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, connect, read_topic, start_broker};

/// Produces `n` records `v{i}` keyed `k{i % 8}` (by key over the partitions), with a header `n = i`.
pub async fn produce(client: &BrokerClient, topic: &str, n: usize, tag: &str) -> anyhow::Result<()> {
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut acks = Vec::new();
    for i in 0..n {
        let r = ProducerRecord::new(topic, format!("{tag}{i}"))
            .with_key(format!("k{}", i % 8))
            .with_header("n", i.to_string());
        acks.push(producer.send(r).await?);
    }
    for a in acks {
        a.await?;
    }
    producer.close().await;
    Ok(())
}

pub fn config(group: &str, topic: &str, mode: ShareMode) -> ShareConfig {
    let mut c = ShareConfig::new(group, &[topic], mode);
    c.from_earliest = true;
    c.session_timeout = Duration::from_secs(2);
    c
}

pub fn text(b: &Option<Bytes>) -> String {
    b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_members_settle_every_record_once_and_the_lifecycle_survives_a_restart() -> anyhow::Result<()> {
    let mut broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("jobs", 1, TopicConfig::default(), None).await?;
    produce(&client, "jobs", 3_000, "v").await?;
    // Eight members on one partition: any member takes any record.
    let mut members = Vec::new();
    for _ in 0..8 {
        members.push(Arc::new(ShareConsumer::join(client.clone(), config("workers", "jobs", ShareMode::Queue)).await?));
    }
    let settled: Arc<std::sync::Mutex<Vec<(String, u64, String)>>> = Arc::default();
    let mut tasks = Vec::new();
    for m in &members {
        let (m, settled) = (Arc::clone(m), Arc::clone(&settled));
        tasks.push(tokio::spawn(async move {
            loop {
                let got = m.poll(50, Duration::from_millis(300)).await?;
                if got.is_empty() {
                    return anyhow::Ok(());
                }
                let outcomes: Vec<_> = got.iter().map(|r| (r, Outcome::Ack)).collect();
                let refused = m.ack(&outcomes).await?;
                assert!(refused.iter().all(Option::is_none), "acks refused: {refused:?}");
                settled.lock().unwrap().extend(got.iter().map(|r| (m.member_id(), r.offset, text(&r.value))));
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let settled = settled.lock().unwrap().clone();
    let offsets: BTreeSet<u64> = settled.iter().map(|s| s.1).collect();
    assert_eq!(settled.len(), 3_000, "each record settled once");
    assert_eq!(offsets, (0..3_000).collect(), "every record settled");
    assert!(settled.iter().all(|(_, o, v)| *v == format!("v{o}")), "values match their offsets");
    let who: BTreeSet<&String> = settled.iter().map(|s| &s.0).collect();
    assert!(who.len() > 1, "the records were spread over members ({} took any)", who.len());
    let d = ShareAdmin::new(client.clone()).describe("workers").await?;
    let p = &d.partitions[0];
    assert_eq!((p.start_offset, p.end_offset, p.lag, p.in_flight), (3_000, 3_000, 0, 0));
    assert_eq!(d.settled, 3_000);
    // Hold 10 records, settle 5, and restart: the settled ones stay settled, the held ones are NEW again.
    produce(&client, "jobs", 20, "w").await?;
    let m = &members[0];
    let got = m.poll(10, Duration::from_secs(2)).await?;
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), (3_000..3_010).collect::<Vec<_>>());
    let done: Vec<_> = got[..5].iter().map(|r| (r, Outcome::Ack)).collect();
    m.ack(&done).await?;
    broker.kill9().await?;
    broker.restart().await?;
    let (client, _) = connect(&broker);
    let after = ShareConsumer::join(client.clone(), config("workers", "jobs", ShareMode::Queue)).await?;
    let mut again = Vec::new();
    wait_until("the unsettled records are delivered again", IO_BUDGET, async || {
        again.extend(after.poll(100, Duration::from_millis(200)).await?);
        anyhow::Ok(again.len() >= 15)
    })
    .await?;
    let offsets: Vec<u64> = again.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (3_005..3_020).collect::<Vec<_>>(), "the 5 settled before the restart are not delivered again");
    let counts: Vec<u32> = again.iter().map(|r| r.delivery_count).collect();
    assert_eq!(&counts[..5], &[2; 5], "the records held at the crash count their first delivery");
    assert_eq!(&counts[5..], &[1; 10]);
    // An ack of a record not held changes nothing and says so.
    let stranger = &got[0];
    let refused = after.ack(&[(stranger, Outcome::Ack)]).await?;
    assert!(refused[0].as_deref().is_some_and(|e| e.contains("not held")), "{refused:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_s_locks_and_an_ended_lock_return_records_to_new_with_their_count_raised() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("jobs", 1, TopicConfig::default(), None).await?;
    produce(&client, "jobs", 10, "v").await?;
    let lock = Duration::from_millis(800);
    let mut c = config("q", "jobs", ShareMode::Queue);
    c.lock_timeout = Some(lock);
    c.session_timeout = Duration::from_secs(60);
    let slow = ShareConsumer::join(client.clone(), c.clone()).await?;
    let taken = slow.poll(4, Duration::from_secs(2)).await?;
    assert_eq!(taken.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    // The slow member never answers: after the lock timeout another member gets the same records, counted twice.
    let other = ShareConsumer::join(client.clone(), c).await?;
    let mut got = Vec::new();
    wait_until("the records come back after their locks end", deadline(&[lock]), async || {
        got.extend(other.poll(10, Duration::from_millis(100)).await?);
        anyhow::Ok(got.iter().any(|r| r.offset == 0))
    })
    .await?;
    let again: BTreeMap<u64, u32> = got.iter().map(|r| (r.offset, r.delivery_count)).collect();
    for o in 0..4 {
        assert_eq!(again.get(&o), Some(&2), "offset {o} came back with its count raised: {again:?}");
    }
    // The late answer of the slow member is refused: nothing succeeds twice.
    let late = slow.ack(&[(&taken[0], Outcome::Ack)]).await?;
    assert!(late[0].is_some(), "a lock that ended is not held");
    let s = ShareAdmin::new(client.clone()).status("q", "jobs", 0, 0).await?;
    assert_eq!(s.status, "ING");
    let events: Vec<&str> = s.history.iter().map(|t| t.event.as_str()).collect();
    assert_eq!(events, vec!["DELIVERED", "LOCK_EXPIRED", "DELIVERED"], "{:?}", s.history);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_back_off_then_a_record_that_always_fails_is_dead_lettered_with_its_disposition() -> anyhow::Result<()>
{
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("pay", 1, TopicConfig::default(), None).await?;
    // Record 0 names 2 retries; record 1 the group default (3).
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    producer
        .send(ProducerRecord::new("pay", "p0").with_key("a").with_header("ferry-retries", "2").with_header("h", "x"))
        .await?
        .await?;
    producer.send(ProducerRecord::new("pay", "p1").with_key("b")).await?.await?;
    producer.close().await;
    let backoff = [Duration::from_millis(300), Duration::from_millis(600)];
    let mut c = config("billing", "pay", ShareMode::Queue);
    c.backoff = backoff.to_vec();
    c.retries = Some(3);
    let m = ShareConsumer::join(client.clone(), c).await?;
    // Record 1 fails twice then succeeds; record 0 always fails.
    let mut seen: BTreeMap<u64, Vec<(u32, tokio::time::Instant)>> = BTreeMap::new();
    wait_until("record 1 succeeds and record 0 is dead-lettered", deadline(&[Duration::from_secs(3)]), async || {
        for r in m.poll(10, Duration::from_millis(100)).await? {
            seen.entry(r.offset).or_default().push((r.delivery_count, tokio::time::Instant::now()));
            let outcome = if r.offset == 1 && r.delivery_count == 3 {
                Outcome::Ack
            } else {
                Outcome::retry(format!("boom {}", r.delivery_count))
            };
            m.ack(&[(&r, outcome)]).await?;
        }
        let d = ShareAdmin::new(client.clone()).describe("billing").await?;
        anyhow::Ok(d.partitions[0].start_offset == 2)
    })
    .await?;
    let counts = |o: u64| seen[&o].iter().map(|s| s.0).collect::<Vec<_>>();
    assert_eq!(counts(1), vec![1, 2, 3], "k = 2 failures then a success: 3 deliveries");
    assert_eq!(counts(0), vec![1, 2, 3], "2 retries: 3 deliveries, then the dead letter");
    for o in [0, 1] {
        let s = &seen[&o];
        for (i, w) in s.windows(2).enumerate() {
            assert!(
                w[1].1 - w[0].1 >= backoff[i],
                "offset {o}: attempt {} came {:?} after the last, under {:?}",
                i + 2,
                w[1].1 - w[0].1,
                backoff[i]
            );
        }
    }
    let dlq = read_topic(&client, "billing.dlq").await;
    assert_eq!(dlq.len(), 1, "one dead letter");
    let d = &dlq[0];
    assert_eq!((d.key.as_deref(), d.value.as_deref()), (Some(&b"a"[..]), Some(&b"p0"[..])));
    let h: BTreeMap<&str, String> = d.headers.iter().map(|(k, v)| (k.as_str(), text(v))).collect();
    assert_eq!(h["h"], "x", "the record's own headers are kept");
    assert_eq!(
        (h["ferry-dlq-topic"].as_str(), h["ferry-dlq-partition"].as_str(), h["ferry-dlq-offset"].as_str()),
        ("pay", "0", "0")
    );
    assert_eq!((h["ferry-dlq-group"].as_str(), h["ferry-dlq-consumer"].clone()), ("billing", m.member_id()));
    assert_eq!((h["ferry-dlq-attempts"].as_str(), h["ferry-dlq-error"].as_str()), ("3", "boom 3"));
    let (first, last): (i64, i64) = (h["ferry-dlq-first-failure-ms"].parse()?, h["ferry-dlq-last-failure-ms"].parse()?);
    assert!(first > 0 && last >= first + 900, "first {first}, last {last}: two backoffs apart");
    let s = ShareAdmin::new(client.clone()).status("billing", "pay", 0, 0).await?;
    let events: Vec<(&str, u32)> = s.history.iter().map(|t| (t.event.as_str(), t.delivery_count)).collect();
    assert_eq!(
        events,
        vec![("DELIVERED", 1), ("RETRY", 1), ("DELIVERED", 2), ("RETRY", 2), ("DELIVERED", 3), ("DEAD_LETTERED", 3)]
    );
    assert_eq!(s.status, "FAIL", "dead-lettered");
    let ok = ShareAdmin::new(client.clone()).status("billing", "pay", 0, 1).await?;
    assert_eq!((ok.status.as_str(), ok.delivery_count), ("SUCCESS", 3));
    // The owner's metrics count the same, per group.
    let figures =
        |m: &str, name: &str| crate::delay::metric_sum(m, &format!("{name}{{group=\"billing\",mode=\"queue\"}}"));
    let names = ["dead_lettered", "settled", "redeliveries", "backlog", "in_flight", "members"];
    let mut got = Vec::new();
    let counted = wait_until("the group's metrics", deadline(&[Duration::from_millis(500)]), async || {
        let metrics = crate::raft3::scrape(&broker).await?;
        got = names.iter().map(|n| figures(&metrics, &format!("ferry_broker_group_{n}"))).collect();
        anyhow::Ok(got == vec![1, 1, 4, 0, 0, 1])
    })
    .await;
    assert!(counted.is_ok(), "{names:?}: {got:?}, want [1, 1, 4, 0, 0, 1]");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broadcast_members_each_get_every_record_in_order_and_a_late_member_starts_at_the_end() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("news", 2, TopicConfig::default(), None).await?;
    let mut c = config("fanout", "news", ShareMode::Broadcast);
    c.from_earliest = false;
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(Arc::new(ShareConsumer::join(client.clone(), c.clone()).await?));
    }
    produce(&client, "news", 10_000, "v").await?;
    let expected = read_topic(&client, "news").await;
    assert_eq!(expected.len(), 10_000);
    let mut tasks = Vec::new();
    for m in &members {
        let m = Arc::clone(m);
        tasks.push(tokio::spawn(async move {
            let mut got: Vec<ShareMessage> = Vec::new();
            while got.len() < 10_000 {
                let batch = m.poll(1_000, Duration::from_millis(500)).await?;
                let acks: Vec<_> = batch.iter().map(|r| (r, Outcome::Ack)).collect();
                m.ack(&acks).await?;
                got.extend(batch);
            }
            anyhow::Ok(got)
        }));
    }
    for t in tasks {
        let got = tokio::time::timeout(IO_BUDGET, t).await???;
        assert_eq!(got.len(), 10_000, "exactly once each");
        for p in 0..2u32 {
            let mine: Vec<(u64, String)> =
                got.iter().filter(|r| r.partition == p).map(|r| (r.offset, text(&r.value))).collect();
            let want: Vec<(u64, String)> =
                expected.iter().filter(|r| r.partition == p).map(|r| (r.offset, text(&r.value))).collect();
            assert_eq!(mine, want, "partition {p} in order, each record once");
        }
    }
    let late = ShareConsumer::join(client.clone(), c).await?;
    assert!(late.poll(10, Duration::from_millis(300)).await?.is_empty(), "a late member starts at the latest offset");
    produce(&client, "news", 3, "late").await?;
    let mut fresh = Vec::new();
    wait_until("the late member sees what came after it joined", IO_BUDGET, async || {
        fresh.extend(late.poll(10, Duration::from_millis(200)).await?);
        anyhow::Ok(fresh.len() >= 3)
    })
    .await?;
    let values: BTreeSet<String> = fresh.iter().map(|r| text(&r.value)).collect();
    assert_eq!(values, ["late0", "late1", "late2"].into_iter().map(String::from).collect());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serial_group_runs_one_member_at_a_time_and_the_next_takes_over_in_order() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("steps", 1, TopicConfig::default(), None).await?;
    produce(&client, "steps", 600, "s").await?;
    let session = Duration::from_secs(1);
    let mut c = config("line", "steps", ShareMode::Serial);
    c.session_timeout = session;
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(Arc::new(ShareConsumer::join(client.clone(), c.clone()).await?));
    }
    // Every member runs the same loop; a shared log records each handler's start and end, to find overlaps, and
    // the acked offsets in the order their acks were answered.
    let log: Arc<std::sync::Mutex<Vec<(usize, u64, bool)>>> = Arc::default();
    let acked: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
    let died = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let (m, log, acked, died) = (Arc::clone(m), Arc::clone(&log), Arc::clone(&acked), died.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let got = m.poll(20, Duration::from_millis(100)).await?;
                if got.is_empty() && acked.lock().unwrap().len() >= 600 {
                    return anyhow::Ok(());
                }
                for r in &got {
                    log.lock().unwrap().push((i, r.offset, false));
                    tokio::task::yield_now().await;
                    log.lock().unwrap().push((i, r.offset, true));
                }
                if !got.is_empty() && acked.lock().unwrap().len() >= 200 && !died.is_cancelled() {
                    // The active member dies holding this batch: it never calls again.
                    died.cancel();
                    return Ok(());
                }
                let acks: Vec<_> = got.iter().map(|r| (r, Outcome::Ack)).collect();
                let refused = m.ack(&acks).await?;
                assert!(refused.iter().all(Option::is_none), "a serial member's acks were refused: {refused:?}");
                acked.lock().unwrap().extend(got.iter().map(|r| r.offset));
            }
        }));
    }
    died.cancelled().await;
    let at_death = log.lock().unwrap().len();
    wait_until("another member takes over", deadline(&[session]), async || log.lock().unwrap().len() > at_death)
        .await?;
    for t in tasks {
        tokio::time::timeout(IO_BUDGET, t).await???;
    }
    let log = log.lock().unwrap().clone();
    for w in log.chunks(2) {
        assert!(!w[0].2 && w[1].2 && w[0].0 == w[1].0 && w[0].1 == w[1].1, "overlapping executions: {w:?}");
    }
    assert_eq!(*acked.lock().unwrap(), (0..600).collect::<Vec<u64>>(), "in order, nothing skipped, nothing twice");
    let runners: BTreeSet<usize> = log.iter().map(|e| e.0).collect();
    assert!(runners.len() >= 2, "the role moved: {runners:?}");
    Ok(())
}
