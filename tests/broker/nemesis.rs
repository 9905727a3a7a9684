//! A randomised nemesis against a raft3 cluster under load, seeded and replayable (`FERRY_TEST_SEED`), for
//! `FERRY_NEMESIS_SECS` seconds (60 by default). One fault at a time, on a random member, held past a lease:
//! kill -9, SIGSTOP, cut from etcd, a peer link cut, etcd itself stopped, or a power loss (the unsynced tail is
//! dropped; the topic flushes on every write, so nothing acknowledged may go).
//!
//! The oracle, after healing:
//! - every acknowledged record is in the log exactly once, at the offset its acknowledgement named;
//! - no offset was ever read with two values, and every record read is in the final log at its offset (no read of
//!   a record that was later lost);
//! - each reader's offsets only move forward;
//! - no two members of a group were given the same partition in one generation;
//! - the replicas are byte-identical.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_client::proto as pb;
use ferry_testkit::{ClusterSpec, Signal, deadline, hold_fault};
use rand::Rng;
use std::sync::Mutex as StdMutex;
use tokio_util::sync::CancellationToken;

use crate::common::{IO_BUDGET, Rec, headers, read_partition};
use crate::faults::{client, cluster_with_topic, placement, producer, record, wait_placement};

const TOPIC: &str = "nemesis";

/// A std mutex that never stays poisoned (a panicking task already fails the test).
#[derive(Default)]
struct Mutex<T>(StdMutex<T>);

impl<T> Mutex<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
const PARTITIONS: u32 = 2;

/// How long the soak runs.
fn soak_time() -> Duration {
    let secs = std::env::var("FERRY_NEMESIS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    Duration::from_secs(secs)
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Pause,
    CutEtcd,
    CutPeer,
    EtcdDown,
    PowerLoss,
}

const FAULTS: [Fault; 6] =
    [Fault::Kill, Fault::Pause, Fault::CutEtcd, Fault::CutPeer, Fault::EtcdDown, Fault::PowerLoss];

/// What the readers saw: per partition, offset -> (value), and whether any reader went back.
#[derive(Default)]
struct Seen {
    values: BTreeMap<(u32, u64), Rec>,
    violations: Vec<String>,
}

/// Polls `partition` from offset 0 through every member until `stop`, recording every record read.
async fn reader(
    cluster_client: ferry_client::BrokerClient,
    partition: u32,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) {
    let mut offset = 0u64;
    let mut last: Option<u64> = None;
    // After a refused or failed read, the next waits for this ticker: a member being failed over answers at once.
    let mut backoff = tokio::time::interval(Duration::from_millis(20));
    backoff.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.is_cancelled() {
        let at = cluster_client.for_partition(TOPIC, partition);
        let request = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: TOPIC.into(),
                partition,
                offset,
                max_bytes: 1 << 20,
                leader_epoch: cluster_client.known_leader_epoch(TOPIC, partition),
            }],
            max_wait_ms: 200,
            max_bytes: 1 << 20,
        };
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            a = at.fetch(request) => a,
        };
        let Ok(answer) = answer else {
            backoff.reset();
            backoff.tick().await;
            continue;
        };
        let Some(data) = answer.partitions.into_iter().next() else { continue };
        if data.error != pb::ErrorCode::None as i32 {
            if let Some(hint) = &data.leader {
                cluster_client.take_hint(TOPIC, partition, hint);
            }
            backoff.reset();
            backoff.tick().await;
            continue;
        }
        if data.leader_epoch > 0 {
            cluster_client.learn_leader(TOPIC, partition, data.leader_epoch, &at.address());
        }
        let Ok(batches) = ferry_batch::split_verified(&data.batches) else {
            seen.lock().violations.push(format!("{partition}: a corrupt batch at {offset}"));
            continue;
        };
        let mut s = seen.lock();
        for (_, bytes) in batches {
            let Ok(records) = ferry_batch::decode_records(&bytes) else { continue };
            for r in records.into_iter().filter(|r| r.offset >= offset) {
                if last.is_some_and(|l| r.offset <= l) {
                    s.violations.push(format!("{partition}: a read went back from {last:?} to {}", r.offset));
                }
                last = Some(r.offset);
                let rec = Rec {
                    partition,
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    headers: headers(&r.headers),
                    timestamp: r.timestamp,
                };
                if let Some(before) = s.values.get(&(partition, r.offset))
                    && *before != rec
                {
                    s.violations.push(format!("{partition}: offset {} read with two values", r.offset));
                }
                s.values.insert((partition, r.offset), rec);
            }
        }
        offset = offset.max(data.next_offset);
    }
}

/// Generation -> (member, its assignment), as each member was told.
type Generations = Arc<Mutex<BTreeMap<u64, Vec<(&'static str, Vec<u32>)>>>>;

/// A group member through raw calls, recording (generation -> its assignment) as the coordinator gives it.
async fn member(
    cluster_client: ferry_client::BrokerClient,
    name: &'static str,
    seen: Generations,
    stop: CancellationToken,
) {
    let group = "nemesis-group";
    let mut member_id = String::new();
    let mut generation = 0u64;
    let note = |generation: u64, assignment: &[pb::TopicPartition]| {
        let parts: Vec<u32> = assignment.iter().map(|tp| tp.partition).collect();
        let mut s = seen.lock();
        let entry = s.entry(generation).or_default();
        entry.retain(|(n, _)| *n != name);
        entry.push((name, parts));
    };
    // A member's beat: join or heartbeat every 500 ms (the session is 6 s).
    let mut beat = tokio::time::interval(Duration::from_millis(500));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.is_cancelled() {
        let at = cluster_client.for_group(group);
        if member_id.is_empty() {
            let request = pb::JoinGroupRequest {
                group: group.into(),
                member_id: String::new(),
                topics: vec![TOPIC.into()],
                session_timeout_ms: 6000,
                client_id: name.into(),
            };
            if let Ok(j) = at.join_group(request).await {
                member_id = j.member_id;
                generation = j.generation;
                note(generation, &j.assignment);
            }
        } else {
            let request = pb::HeartbeatRequest { group: group.into(), member_id: member_id.clone(), generation };
            match at.heartbeat(request).await {
                Ok(hb) if !hb.member_known => member_id.clear(),
                Ok(hb) if hb.generation != generation => {
                    generation = hb.generation;
                    note(generation, &hb.assignment);
                }
                _ => {}
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = beat.tick() => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_under_a_random_nemesis_loses_nothing_acknowledged_and_never_reads_two_histories()
-> anyhow::Result<()> {
    let (seed, mut rng) = ferry_testkit::seeded_rng("nemesis")?;
    let spec = ClusterSpec { sync_journal: true, ..ClusterSpec::default() };
    let mut cluster = cluster_with_topic(spec, TOPIC, PARTITIONS, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let stop = CancellationToken::new();

    // Load: one producer per partition, each record awaited, acknowledgements recorded.
    let acked: Arc<Mutex<Vec<Rec>>> = Arc::default();
    let mut tasks = Vec::new();
    for partition in 0..PARTITIONS {
        let (p, acked, stop) = (producer(&cluster).await?, Arc::clone(&acked), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.is_cancelled() {
                let r = record(TOPIC, partition, i);
                if let Ok(ack) = async { p.send(r.clone()).await?.await }.await {
                    acked.lock().push(Rec::acked(&ack, r));
                }
                i += 1;
            }
            p.close().await;
        }));
    }
    let seen: Arc<Mutex<Seen>> = Arc::default();
    for partition in 0..PARTITIONS {
        tasks.push(tokio::spawn(reader(client(&cluster), partition, Arc::clone(&seen), stop.clone())));
    }
    let generations: Generations = Arc::default();
    for name in ["member-a", "member-b"] {
        tasks.push(tokio::spawn(member(client(&cluster), name, Arc::clone(&generations), stop.clone())));
    }

    // The nemesis.
    let started = Instant::now();
    let mut log = Vec::new();
    while started.elapsed() < soak_time() {
        let fault = FAULTS[rng.random_range(0..FAULTS.len())];
        let victim = rng.random_range(1..=3u32);
        let other = (victim % 3) + 1;
        let hold = ttl + Duration::from_millis(rng.random_range(0..2 * ttl.as_millis() as u64));
        log.push(format!("{:?} on {victim} for {hold:?}", fault));
        tracing::warn!(?fault, victim, ?hold, seed, "nemesis");
        match fault {
            Fault::Kill => {
                cluster.broker(victim).kill9().await?;
                hold_fault(hold).await;
                cluster.broker(victim).restart().await?;
            }
            Fault::Pause => {
                cluster.broker(victim).suspend(deadline(&[ttl])).await?;
                hold_fault(hold).await;
                cluster.broker(victim).resume()?;
            }
            Fault::CutEtcd => {
                cluster.cut_from_etcd(victim);
                hold_fault(hold).await;
                cluster.heal_etcd(victim);
            }
            Fault::CutPeer => {
                cluster.cut_between(victim, other);
                hold_fault(hold).await;
                cluster.heal_between(victim, other);
            }
            Fault::EtcdDown => {
                cluster.etcd.send_signal(Signal::STOP)?;
                hold_fault(hold).await;
                cluster.etcd.send_signal(Signal::CONT)?;
            }
            Fault::PowerLoss => {
                cluster.broker(victim).power_loss().await?;
                hold_fault(hold).await;
                cluster.broker(victim).restart().await?;
            }
        }
        // A beat of calm between faults.
        hold_fault(Duration::from_millis(rng.random_range(200..1500))).await;
    }

    // Heal, let every partition get all three replicas in sync, then stop the load and check.
    cluster.heal_all();
    for partition in 0..PARTITIONS {
        let healed = wait_placement(&cluster, 1, TOPIC, partition, deadline(&[ttl, ttl, IO_BUDGET, IO_BUDGET]), |p| {
            p.leader_id != 0 && p.isr.len() == 3
        })
        .await;
        if let Err(e) = healed {
            let now = placement(&cluster, 1, TOPIC, partition).await;
            for (i, b) in cluster.brokers.iter().enumerate() {
                let logs = b.logs();
                let tail: Vec<&str> = logs.lines().rev().take(150).collect();
                eprintln!("==== broker {} (last lines, newest first)\n{}", i + 1, tail.join("\n"));
            }
            let mut etcd = cluster.etcd.client().await?;
            let keys = etcd.get("/ferry/", Some(ferry_testkit::etcd_client::GetOptions::new().with_prefix())).await?;
            for kv in keys.kvs() {
                eprintln!(
                    "etcd {} = {} (lease {})",
                    String::from_utf8_lossy(kv.key()),
                    String::from_utf8_lossy(kv.value()),
                    kv.lease()
                );
            }
            panic!("seed {seed}, faults {log:?}: {e}; the placement now: {now:?}");
        }
    }
    stop.cancel();
    for t in tasks {
        t.await?;
    }
    let context = format!("seed {seed}, faults: {log:?}");
    let acked = acked.lock().clone();
    let seen = std::mem::take(&mut *seen.lock());
    assert!(seen.violations.is_empty(), "{context}: {:?}", seen.violations);
    let mut finals: BTreeMap<(u32, u64), Rec> = BTreeMap::new();
    for partition in 0..PARTITIONS {
        let log = read_partition(&client(&cluster), TOPIC, partition).await;
        let mine: Vec<Rec> = acked.iter().filter(|r| r.partition == partition).cloned().collect();
        // Acknowledged records appear once each, at their offsets; the log may hold more (writes whose
        // acknowledgement was lost to a fault), never fewer.
        let at: BTreeMap<u64, &Rec> = log.iter().map(|r| (r.offset, r)).collect();
        for a in &mine {
            assert_eq!(
                at.get(&a.offset),
                Some(&a),
                "{context}: acknowledged record {a:?} is not in the log at its offset"
            );
        }
        let values: BTreeSet<&Option<bytes::Bytes>> = log.iter().map(|r| &r.value).collect();
        assert_eq!(values.len(), log.len(), "{context}: a record appears twice in {TOPIC}/{partition}");
        finals.extend(log.into_iter().map(|r| ((partition, r.offset), r)));
        assert!(!mine.is_empty(), "{context}: nothing was acknowledged on {partition}");
    }
    for (key, read) in &seen.values {
        assert_eq!(finals.get(key), Some(read), "{context}: read {key:?} is not what the final log holds there");
    }
    for (generation, members) in generations.lock().iter() {
        let mut owned = BTreeSet::new();
        for (_, parts) in members {
            for p in parts {
                assert!(owned.insert(*p), "{context}: generation {generation} gave partition {p} twice: {members:?}");
            }
        }
    }
    tracing::info!(seed, faults = log.len(), acked = acked.len(), read = seen.values.len(), "nemesis done");
    crate::faults::stop_and_compare_all(&mut cluster, TOPIC, PARTITIONS).await
}
