//! The mirror between clusters under source faults (cases 4 and 15 of the cluster analysis, and the mirror's side
//! of the nemesis): a source cluster whose members' etcd and peer links run through proxies, a target cluster of
//! four members (more than the topic's three replicas), and the real mirror between them.
//!
//! 1. The source leader is cut off from etcd alone: the mirror does not stay on it. The records acknowledged by the
//!    new leader reach the target, and while they wait longer than a check the partition's RPO is above 0.
//! 2. One source leader paused (SIGSTOP, its lease far from expiring): the probe still reads a partition another
//!    member leads, as each leader is asked on its own within the probe's timeout.
//! 3. A seeded random nemesis on the source (kill -9, SIGSTOP, cut from etcd, a peer cut, etcd stopped), one fault
//!    at a time: the target ends identical to the source, with every acknowledged record; at every sample, an
//!    acknowledged record missing from the target for longer than two checks means an RPO above 0, also when its
//!    leader died before the mirror could see it; and no `sync_error` says the target lost records it held (case
//!    15: probes of a member without the partition).
//!
//! The probe's timeout here is one check, so a partition whose leader has not answered for two checks counts its
//! RPO from the last answer (`check_interval + timeout`, see docs/operations.md): that is what bounds a record
//! acknowledged by a leader that died before any sighting of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_client::{Admin, BrokerClient, ClientConfig, OffsetSpec, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{ClusterSpec, FaultyCluster, MirrorProcess, Signal, deadline, hold_fault, wait_for, wait_until};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::watch::*;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 2;

/// The probe: every check, each leader's answer within one check.
const PROBE: &str = "[source.health]\ncheck_interval = \"500ms\"\ntimeout = \"500ms\"\n";

fn all_client(c: &FaultyCluster) -> BrokerClient {
    BrokerClient::new(ClientConfig::new(c.addrs())).expect("loopback")
}

/// A source cluster of three with a raft3 topic, a target cluster of four, and the mirror between them.
async fn setup() -> anyhow::Result<(FaultyCluster, FaultyCluster, MirrorProcess)> {
    setup_with(ClusterSpec::default(), PARTITIONS).await
}

/// [`setup`] with the source cluster of `spec` and a topic of `partitions`.
async fn setup_with(
    spec: ClusterSpec,
    partitions: u32,
) -> anyhow::Result<(FaultyCluster, FaultyCluster, MirrorProcess)> {
    ferry_testkit::init_tracing();
    let source = FaultyCluster::start(spec).await?;
    let target =
        FaultyCluster::start(ClusterSpec { members: 4, cluster_id: "dc-b".into(), ..ClusterSpec::default() }).await?;
    Admin::new(all_client(&source)).create_replicated_topic(TOPIC, partitions, "raft3").await?;
    let conf = MirrorConf {
        include: vec![format!("^{TOPIC}$")],
        exclude: Vec::new(),
        ..MirrorConf::between("dc-a", source.addrs().join("\", \""), "dc-b", target.addrs().join("\", \""))
    };
    let toml = conf.toml().replacen("[target]\n", "[target]\nreplication = \"source\"\n", 1).replacen(
        "[source.health]\ncheck_interval = \"500ms\"\ntimeout = \"1s\"\n",
        PROBE,
        1,
    );
    anyhow::ensure!(toml.contains(PROBE), "the probe's settings are in the config: {toml}");
    let mirror = MirrorProcess::builder(toml).start().await?;
    Ok((source, target, mirror))
}

/// Every record of `topic` on a cluster, per partition, read at each partition's leader.
async fn read_cluster(client: &BrokerClient, partitions: u32) -> anyhow::Result<Vec<PartitionData>> {
    let mut out = Vec::new();
    for p in 0..partitions {
        out.push(read_partition(client, TOPIC, p, None).await?);
    }
    Ok(out)
}

/// Acknowledged records: (partition, offset) -> when acknowledged.
type Acked = Arc<Mutex<BTreeMap<(u32, u64), Instant>>>;

fn record_of(partition: u32, i: u64) -> ProducerRecord {
    record(TOPIC, &format!("p{partition}"), i, 100).with_partition(partition)
}

/// Produces to every partition until `stop`, one record awaited at a time per partition.
fn load(
    client: BrokerClient,
    acked: Acked,
    stop: CancellationToken,
) -> Vec<tokio::task::JoinHandle<anyhow::Result<()>>> {
    (0..PARTITIONS)
        .map(|partition| {
            let (client, acked, stop) = (client.clone(), Arc::clone(&acked), stop.clone());
            tokio::spawn(async move {
                let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..Default::default() };
                let p = Producer::new(client, config).await?;
                let mut i = 0;
                // One record per partition every 10 ms at most: a steady load, not a flood.
                let mut pace = tokio::time::interval(Duration::from_millis(10));
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.is_cancelled() {
                    pace.tick().await;
                    let delivered = match p.send(record_of(partition, i)).await {
                        Ok(delivery) => delivery.await.ok(),
                        Err(_) => None,
                    };
                    if let Some(ack) = delivered {
                        acked.lock().unwrap_or_else(|e| e.into_inner()).insert((partition, ack.offset), Instant::now());
                    }
                    i += 1;
                }
                p.close().await;
                Ok(())
            })
        })
        .collect()
}

/// Samples the mirror every [`CHECK`]: an acknowledged record the target lacks (at or past the partition's cache
/// offset) for longer than two checks must come with an RPO above 0. A record's wait is measured to when the
/// sample was asked for (the mirror read its clocks after that). Returns the violations, each with the time since
/// the watch started, and a count of the samples taken so far.
fn rpo_watch(
    mirror_url: String,
    acked: Acked,
    stop: CancellationToken,
) -> (tokio::task::JoinHandle<Vec<String>>, Arc<std::sync::atomic::AtomicUsize>) {
    let samples = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let taken = Arc::clone(&samples);
    let started = Instant::now();
    let watch = tokio::spawn(async move {
        let mut violations = Vec::new();
        let mut sample = tokio::time::interval(CHECK);
        sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        sample.tick().await;
        while !stop.is_cancelled() {
            sample.tick().await;
            let now = Instant::now();
            let Ok(r) = reqwest::get(format!("{mirror_url}/api/v1/partitions?topic={TOPIC}")).await else { continue };
            let Ok(doc) = r.json::<serde_json::Value>().await else { continue };
            taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            for p in doc["partitions"].as_array().into_iter().flatten() {
                let (Some(partition), Some(cache), Some(rpo)) =
                    (p["partition"].as_u64(), p["cache_offset"].as_u64(), p["rpo_seconds"].as_f64())
                else {
                    continue;
                };
                let acked = acked.lock().unwrap_or_else(|e| e.into_inner());
                let oldest =
                    acked.range((partition as u32, cache)..(partition as u32, u64::MAX)).map(|(_, t)| *t).min();
                if let Some(at) = oldest
                    && now.duration_since(at) > 2 * CHECK
                    && rpo == 0.0
                {
                    violations.push(format!(
                        "at {:?}: {TOPIC}/{partition}: a record acknowledged {:?} before is not on the target (cache \
                         {cache}), RPO 0",
                        now.duration_since(started),
                        now.duration_since(at)
                    ));
                }
            }
        }
        violations
    });
    (watch, samples)
}

async fn leader_of(source: &FaultyCluster, partition: u32) -> anyhow::Result<u32> {
    let meta = all_client(source).metadata_for(vec![TOPIC.into()]).await?;
    let p = meta.partitions.iter().find(|p| p.partition == partition).map_or(0, |p| p.leader_id);
    anyhow::ensure!(p != 0, "{TOPIC}/{partition} has no leader");
    Ok(p)
}

/// The end: heal, stop the load, wait until the target holds the source's log ends, and compare.
async fn settle(
    source: &FaultyCluster,
    target: &FaultyCluster,
    mirror: &MirrorProcess,
    acked: &Acked,
) -> anyhow::Result<()> {
    settle_partitions(source, target, mirror, acked, PARTITIONS).await
}

/// [`settle`] over a topic of `partitions`.
async fn settle_partitions(
    source: &FaultyCluster,
    target: &FaultyCluster,
    mirror: &MirrorProcess,
    acked: &Acked,
    partitions: u32,
) -> anyhow::Result<()> {
    let (s, t) = (all_client(source), all_client(target));
    wait_until("the target to equal the source", io_deadline(), async || -> anyhow::Result<bool> {
        let (a, b) = (read_cluster(&s, partitions).await?, read_cluster(&t, partitions).await?);
        Ok(a.iter().zip(&b).all(|(x, y)| x.log_end == y.log_end))
    })
    .await?;
    let (a, b) = (read_cluster(&s, partitions).await?, read_cluster(&t, partitions).await?);
    for (p, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_same_partition(&format!("{TOPIC}/{p}"), x, y);
        for (partition, offset) in acked.lock().unwrap_or_else(|e| e.into_inner()).keys() {
            if *partition == p as u32 {
                assert!(
                    x.records.iter().any(|r| r.offset == *offset),
                    "acknowledged {p}/{offset} is not in the source"
                );
            }
        }
    }
    let lost = monitor_events(mirror, Some("sync_error")).await?;
    let lost: Vec<_> = lost.iter().filter(|e| e["message"].as_str().is_some_and(|m| m.contains("lost"))).collect();
    assert!(lost.is_empty(), "the mirror said the target lost records it held: {lost:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_4_a_source_leader_cut_from_etcd_does_not_keep_the_mirror_and_the_rpo_counts_the_wait()
-> anyhow::Result<()> {
    let (source, target, mirror) = setup().await?;
    let acked: Acked = Arc::default();
    let stop = CancellationToken::new();
    let (watch, samples) = rpo_watch(mirror.monitor_url(), Arc::clone(&acked), stop.clone());
    let loads = load(all_client(&source), Arc::clone(&acked), stop.clone());
    wait_until("the load acknowledged on every partition", deadline(&[IO_BUDGET]), async || {
        let a = acked.lock().unwrap_or_else(|e| e.into_inner());
        (0..PARTITIONS).all(|p| a.keys().filter(|(q, _)| *q == p).count() >= 10)
    })
    .await?;
    let leader = leader_of(&source, 0).await?;
    source.cut_from_etcd(leader);
    // The new leader takes the load; the mirror follows it, not the cut-off member.
    wait_until("a new source leader of partition 0", deadline(&[source.spec().lease_ttl, IO_BUDGET]), async || {
        anyhow::Ok(leader_of(&source, 0).await.is_ok_and(|l| l != leader))
    })
    .await?;
    // The watch samples four times more while the load goes on at the new leader.
    let before = samples.load(std::sync::atomic::Ordering::SeqCst);
    wait_until("four more samples of the mirror", deadline(&[4 * CHECK, IO_BUDGET]), async || {
        samples.load(std::sync::atomic::Ordering::SeqCst) >= before + 4
    })
    .await?;
    stop.cancel();
    for l in loads {
        l.await??;
    }
    source.heal_all();
    settle(&source, &target, &mirror, &acked).await?;
    let violations = watch.await?;
    assert!(violations.is_empty(), "{violations:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_source_leader_does_not_blind_the_probe_to_the_partitions_the_others_lead() -> anyhow::Result<()> {
    // A lease far longer than the test: the paused member stays partition 0's leader throughout. Six partitions
    // over three members: placement spreads their leaders (it balances leaderships, the internal topics' too).
    const SPREAD: u32 = 6;
    let spec = ClusterSpec { lease_ttl: Duration::from_secs(60), ..ClusterSpec::default() };
    let (mut source, target, mirror) = setup_with(spec, SPREAD).await?;
    // Every partition led, and the topic known at each leader (creation answers before every member applied it).
    let admin = Admin::new(all_client(&source));
    let leaders = wait_for("every partition led and known at its leader", io_deadline(), async || {
        let mut leaders = Vec::new();
        for partition in 0..SPREAD {
            let Ok(leader) = leader_of(&source, partition).await else { return None };
            admin.list_offset(TOPIC, partition, OffsetSpec::Latest).await.ok()?;
            leaders.push(leader);
        }
        Some(leaders)
    })
    .await?;
    let paused = leaders[0];
    let other = (1..SPREAD)
        .find(|&p| leaders[p as usize] != paused)
        .ok_or_else(|| anyhow::anyhow!("all {SPREAD} partitions are led by member {paused}"))?;
    let p = Producer::new(all_client(&source), ProducerConfig::default()).await?;
    for partition in [0, other] {
        send_all(&p, (0..3).map(|i| record_of(partition, i))).await?;
    }
    let probed = async |partition: u32| -> anyhow::Result<u64> {
        partition_doc(&mirror, TOPIC, partition).await?["probed_source_offset"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no probed_source_offset"))
    };
    wait_until("the probe to read both partitions", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(probed(0).await? == 3 && probed(other).await? == 3)
    })
    .await?;
    // Partition 0's leader freezes, holding its connections: its ask never answers.
    source.broker(paused).suspend(deadline(&[IO_BUDGET])).await?;
    send_all(&p, (3..8).map(|i| record_of(other, i))).await?;
    // The others' answers are kept: the other partition's new end is read within a round and a timeout, from a
    // probe whose every round also asks the frozen leader.
    let round = CHECK + CHECK;
    let read = wait_until("the probe to read the other partition's new end", deadline(&[round]), async || {
        anyhow::Ok(probed(other).await? == 8)
    })
    .await;
    let frozen = probed(0).await;
    source.broker(paused).resume()?;
    read?;
    assert_eq!(frozen?, 3, "the frozen leader's partition kept its last answer");
    p.close().await;
    let acked: Acked = Arc::default();
    settle_partitions(&source, &target, &mirror, &acked, SPREAD).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_between_clusters_under_a_source_nemesis_copies_exactly_and_counts_every_wait() -> anyhow::Result<()> {
    let (seed, mut rng) = ferry_testkit::seeded_rng("mirror nemesis")?;
    let (mut source, target, mirror) = setup().await?;
    let ttl = source.spec().lease_ttl;
    let acked: Acked = Arc::default();
    let stop = CancellationToken::new();
    let (watch, _) = rpo_watch(mirror.monitor_url(), Arc::clone(&acked), stop.clone());
    let watched = Instant::now();
    let loads = load(all_client(&source), Arc::clone(&acked), stop.clone());
    let secs = std::env::var("FERRY_NEMESIS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let started = Instant::now();
    let mut faults = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        let victim = rng.random_range(1..=3u32);
        let hold = ttl + Duration::from_millis(rng.random_range(0..ttl.as_millis() as u64));
        let kind = rng.random_range(0..5);
        faults.push(format!("at {:?}: {kind} on {victim} for {hold:?}", watched.elapsed()));
        match kind {
            0 => {
                source.broker(victim).kill9().await?;
                hold_fault(hold).await;
                source.broker(victim).restart().await?;
            }
            1 => {
                source.broker(victim).suspend(deadline(&[ttl])).await?;
                hold_fault(hold).await;
                source.broker(victim).resume()?;
            }
            2 => {
                source.cut_from_etcd(victim);
                hold_fault(hold).await;
                source.heal_etcd(victim);
            }
            3 => {
                let other = victim % 3 + 1;
                source.cut_between(victim, other);
                hold_fault(hold).await;
                source.heal_between(victim, other);
            }
            _ => {
                source.etcd.send_signal(Signal::STOP)?;
                hold_fault(hold).await;
                source.etcd.send_signal(Signal::CONT)?;
            }
        }
        hold_fault(Duration::from_millis(rng.random_range(300..1500))).await;
    }
    source.heal_all();
    stop.cancel();
    for l in loads {
        l.await??;
    }
    settle(&source, &target, &mirror, &acked)
        .await
        .map_err(|e| anyhow::anyhow!("seed {seed}, faults {faults:?}: {e}"))?;
    let violations = watch.await?;
    assert!(violations.is_empty(), "seed {seed}, faults {faults:?}: {violations:?}");
    Ok(())
}
