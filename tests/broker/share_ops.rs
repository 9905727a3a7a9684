//! Message models, operations: the redrive job (rate-limited, resumed after a kill -9, idempotent, ending when it
//! writes into the dead-letter topic itself), the push listener (order per key, keys in parallel, credit bounds,
//! a handler past its deadline retried), ferryctl's consume --mode/--nack, message show and group describe, and
//! bad input refused with nothing changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{
    BrokerClient, Code, Listener, ListenerConfig, Outcome, Producer, ProducerConfig, ProducerRecord, ShareAdmin,
    ShareConsumer, ShareMode,
};
use ferry_testkit::wait_until;

use crate::common::{IO_BUDGET, assert_status, connect, read_topic, start_broker};
use crate::delay_ctl::ferryctl;
use crate::share::{config, produce, text};

/// Produces `n` records that allow no retry, then fails each once: `n` dead letters in `{group}.dlq`.
async fn dead_letters(client: &BrokerClient, topic: &str, group: &str, n: usize) -> anyhow::Result<()> {
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut acks = Vec::new();
    for i in 0..n {
        let r = ProducerRecord::new(topic, format!("d{i}")).with_key(format!("k{i}")).with_header("ferry-retries", "0");
        acks.push(producer.send(r).await?);
    }
    for a in acks {
        a.await?;
    }
    producer.close().await;
    let m = ShareConsumer::join(client.clone(), config(group, topic, ShareMode::Queue)).await?;
    let mut failed = 0;
    while failed < n {
        let got = m.poll(500, Duration::from_millis(500)).await?;
        let nacks: Vec<_> = got.iter().map(|r| (r, Outcome::retry("always"))).collect();
        m.ack(&nacks).await?;
        failed += got.len();
    }
    m.leave().await?;
    Ok(())
}

/// One running handler: counted down when dropped.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A handled record: key, offset, partition, delivery count.
type Handled = (String, u64, u32, u32);

fn redrive(group: &str, to: &str, rate: u32, status_only: bool) -> pb::RedriveRequest {
    pb::RedriveRequest { group: group.into(), to: to.into(), rate, dry_run: false, status_only }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_resumes_after_a_kill_adds_no_duplicates_and_ends_when_it_writes_into_its_own_dlq()
-> anyhow::Result<()> {
    let mut broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    admin.create_topic("orders-again", 1, TopicConfig::default(), None).await?;
    dead_letters(&client, "orders", "billing", 1_000).await?;
    assert_eq!(read_topic(&client, "billing.dlq").await.len(), 1_000);
    // A dry run counts and writes nothing.
    let dry = ShareAdmin::new(client.clone());
    let mut req = redrive("billing", "orders-again", 0, false);
    req.dry_run = true;
    dry.redrive(req).await?;
    wait_until("the dry run ends", IO_BUDGET, async || {
        anyhow::Ok(dry.redrive(redrive("billing", "", 0, true)).await?.state == "DONE")
    })
    .await?;
    assert_eq!(dry.redrive(redrive("billing", "", 0, true)).await?.copied, 1_000);
    assert!(read_topic(&client, "orders-again").await.is_empty(), "a dry run writes nothing");
    // The real one, at 1,000 records/s, killed part-way.
    let started = dry.redrive(redrive("billing", "orders-again", 1_000, false)).await?;
    assert_eq!((started.from_offset, started.end_offset), (0, 1_000));
    wait_until("the redrive is part-way", IO_BUDGET, async || {
        let j = dry.redrive(redrive("billing", "", 0, true)).await?;
        anyhow::Ok(j.copied >= 200)
    })
    .await?;
    broker.kill9().await?;
    broker.restart().await?;
    let (client, _) = connect(&broker);
    let admin = ShareAdmin::new(client.clone());
    let job = ferry_testkit::wait_for("the resumed redrive ends", IO_BUDGET, async || {
        let j = admin.redrive(redrive("billing", "", 0, true)).await?;
        anyhow::Ok((j.state == "DONE").then_some(j))
    })
    .await?;
    assert!(job.copied >= 1_000, "the job counts what it copied ({} with a redone step)", job.copied);
    let target = read_topic(&client, "orders-again").await;
    let from: BTreeMap<String, String> = target
        .iter()
        .map(|r| {
            let h =
                r.headers.iter().find(|(k, _)| k == "ferry-redriven-from").map(|(_, v)| text(v)).unwrap_or_default();
            (h, text(&r.value))
        })
        .collect();
    assert_eq!(target.len(), 1_000, "each dead letter reached the target once");
    assert_eq!(from.len(), 1_000, "one record per dead letter");
    let dlq = read_topic(&client, "billing.dlq").await;
    for d in &dlq {
        assert_eq!(from.get(&format!("billing.dlq/0/{}", d.offset)), Some(&text(&d.value)), "dead letter {}", d.offset);
    }
    assert!(target.iter().all(|r| r.headers.iter().all(|(k, _)| !k.starts_with("ferry-dlq-"))), "dispositions dropped");
    // Running it again adds nothing: those dead letters were redriven.
    admin.redrive(redrive("billing", "orders-again", 0, false)).await?;
    wait_until("the second redrive ends", IO_BUDGET, async || {
        anyhow::Ok(admin.redrive(redrive("billing", "", 0, true)).await?.state == "DONE")
    })
    .await?;
    assert_eq!(admin.redrive(redrive("billing", "", 0, true)).await?.copied, 0);
    assert_eq!(read_topic(&client, "orders-again").await.len(), 1_000);
    // Into the dead-letter topic itself: it copies what was there when it started, and ends.
    ferry_client::Admin::new(client.clone()).create_topic("orders-loop", 1, TopicConfig::default(), None).await?;
    dead_letters(&client, "orders-loop", "loop", 10).await?;
    admin.redrive(redrive("loop", "loop.dlq", 0, false)).await?;
    let job = ferry_testkit::wait_for("the self-redrive ends", IO_BUDGET, async || {
        let j = admin.redrive(redrive("loop", "", 0, true)).await?;
        anyhow::Ok((j.state == "DONE").then_some(j))
    })
    .await?;
    assert_eq!((job.from_offset, job.end_offset, job.copied), (0, 10, 10));
    assert_eq!(read_topic(&client, "loop.dlq").await.len(), 20);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listener_keeps_key_order_runs_keys_in_parallel_and_never_holds_more_than_its_credit() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("events", 4, TopicConfig::default(), None).await?;
    produce(&client, "events", 400, "e").await?;
    let consumer = Arc::new(ShareConsumer::join(client.clone(), config("push", "events", ShareMode::Queue)).await?);
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Handled>>> = Arc::default();
    let cfg = ListenerConfig {
        max_in_flight: 6,
        max_per_partition: 2,
        max_rate: None,
        handler_timeout: Duration::from_millis(300),
        poll_wait: Duration::from_millis(100),
    };
    let (r, p, s) = (Arc::clone(&running), Arc::clone(&peak), Arc::clone(&seen));
    let listener = Listener::start(Arc::clone(&consumer), cfg, move |m| {
        let (running, peak, seen) = (Arc::clone(&r), Arc::clone(&p), Arc::clone(&s));
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            // Counted down when the handler ends or is dropped (past its deadline).
            let _running = Running(Arc::clone(&running));
            seen.lock().unwrap().push((text(&m.key), m.offset, m.partition, m.delivery_count));
            // One record stalls past the handler's deadline on its first delivery: it counts as a retry.
            let stall = m.offset == 5 && m.partition == 0 && m.delivery_count == 1;
            if stall {
                // Never answers: dropped at the handler's deadline.
                std::future::pending::<()>().await;
            }
            // Some work off the async threads, so that handlers overlap.
            let spin =
                tokio::task::spawn_blocking(|| (0..200_000u64).fold(0u64, |h, i| h.wrapping_mul(31).wrapping_add(i)));
            std::hint::black_box(spin.await.unwrap_or_default());
            Outcome::Ack
        }
    });
    let handled = wait_until("every record is handled", IO_BUDGET, async || {
        let s = seen.lock().unwrap();
        s.iter().filter(|s| s.3 == 1).count() >= 400 && s.len() >= 401
    })
    .await;
    if let Err(e) = handled {
        let s = seen.lock().unwrap();
        panic!(
            "{e}: {} handled, {} first deliveries, last {:?}",
            s.len(),
            s.iter().filter(|s| s.3 == 1).count(),
            s.last()
        );
    }
    listener.stop().await?;
    let seen = seen.lock().unwrap().clone();
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 6, "at most the credit in flight: {peak}");
    assert!(peak >= 2, "keys ran in parallel: peak {peak}");
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (k, o, _, count) in &seen {
        if *count == 1 {
            per_key.entry(k.clone()).or_default().push(*o);
        }
    }
    assert_eq!(per_key.len(), 8);
    for (k, offsets) in &per_key {
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        assert_eq!(offsets, &sorted, "key {k} in offset order");
        assert_eq!(offsets.len(), 50);
    }
    let retried: Vec<_> = seen.iter().filter(|s| s.3 == 2).collect();
    assert_eq!(retried.len(), 1, "the stalled record was delivered again: {retried:?}");
    assert_eq!((retried[0].1, retried[0].2), (5, 0));
    let d = ShareAdmin::new(client).describe("push").await?;
    let settled: u64 = d.partitions.iter().map(|p| p.start_offset).sum();
    assert_eq!(settled, 400, "everything settled");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferryctl_drives_the_lifecycle_and_bad_input_changes_nothing() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("t", 1, TopicConfig::default(), None).await?;
    let addr = broker.addr().to_string();
    let out = ferryctl(&addr, &["produce", "t", "--retries", "1", "--key", "K"], "hello\n").await?;
    assert!(out.status.success(), "{}", text(&Some(out.stderr.into())));
    let args = [
        "consume",
        "t",
        "--group",
        "g",
        "--mode",
        "queue",
        "--nack",
        "--from-beginning",
        "--retry-backoff",
        "100ms",
        "--idle-timeout",
        "2s",
    ];
    let out = ferryctl(&addr, &args, "").await?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let counts: Vec<u64> = lines.iter().map(|l| l["delivery_count"].as_u64().unwrap_or(0)).collect();
    assert_eq!(counts, vec![1, 2], "one retry, then the dead letter");
    assert_eq!(lines[0]["value"], "hello");
    let dlq = read_topic(&client, "g.dlq").await;
    assert_eq!(dlq.len(), 1);
    let show = ferryctl(&addr, &["message", "show", "t", "0", "0", "--group", "g"], "").await?;
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout)?;
    assert_eq!(shown["status"], "FAIL");
    assert_eq!(shown["record"]["value"], "hello");
    let events: Vec<&str> =
        shown["history"].as_array().map(|a| a.iter().filter_map(|t| t["event"].as_str()).collect()).unwrap_or_default();
    assert_eq!(events, vec!["DELIVERED", "RETRY", "DELIVERED", "DEAD_LETTERED"]);
    let describe = ferryctl(&addr, &["group", "describe", "g"], "").await?;
    let d: serde_json::Value = serde_json::from_slice(&describe.stdout)?;
    assert_eq!((d["mode"].as_str(), d["partitions"][0]["start_offset"].as_u64()), (Some("queue"), Some(1)));
    let list = ferryctl(&addr, &["group", "list"], "").await?;
    assert_eq!(String::from_utf8_lossy(&list.stdout), "g\tqueue\tmembers=0\n");
    // Bad input: each refused with the field named, and the group unchanged.
    let raw = || async { client.for_partition("t", 0).raw().await };
    let join = |mode: pb::ShareMode, group: &str, lock: u32| pb::ShareJoinRequest {
        group: group.into(),
        topics: vec!["t".into()],
        mode: mode as i32,
        lock_timeout_ms: lock,
        ..Default::default()
    };
    let mut c = raw().await?;
    let e = c
        .share_join(join(pb::ShareMode::Broadcast, "g", 0))
        .await
        .map_err(|s| ferry_client::ClientError::from_status(&s, &addr));
    assert_status(e, Code::InvalidArgument, &["is a queue group", "broadcast"]);
    let e = c
        .share_join(join(pb::ShareMode::Unspecified, "g", 0))
        .await
        .map_err(|s| ferry_client::ClientError::from_status(&s, &addr));
    assert_status(e, Code::InvalidArgument, &["unknown group mode"]);
    let e = c
        .share_join(join(pb::ShareMode::Queue, "h", 5))
        .await
        .map_err(|s| ferry_client::ClientError::from_status(&s, &addr));
    assert_status(e, Code::InvalidArgument, &["lock_timeout_ms 5"]);
    let mut bad_window = join(pb::ShareMode::Queue, "h", 0);
    bad_window.window = 1_000_000;
    let e = c.share_join(bad_window).await.map_err(|s| ferry_client::ClientError::from_status(&s, &addr));
    assert_status(e, Code::InvalidArgument, &["window 1000000"]);
    let e = c
        .share_join(join(pb::ShareMode::Queue, "a/b", 0))
        .await
        .map_err(|s| ferry_client::ClientError::from_status(&s, &addr));
    assert_status(e, Code::InvalidArgument, &["group name", ".dlq"]);
    let after = ShareAdmin::new(client.clone()).describe("g").await?;
    assert_eq!((after.mode, after.partitions[0].start_offset), (pb::ShareMode::Queue as i32, 1));
    let names: BTreeSet<String> = admin.list_topics().await?.into_iter().map(|t| t.name).collect();
    assert!(!names.contains("h.dlq") && !names.contains("a/b.dlq"));
    Ok(())
}
