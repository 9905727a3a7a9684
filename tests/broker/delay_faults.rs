//! Delayed delivery on a raft3 cluster (docs/messaging.md, "Delay"): every member asked counts the pending records
//! of every delay-store owner, not only its own; and records falling due while their owner is cut from etcd, or
//! paused (SIGSTOP), are each delivered exactly once, never early, once the fault is over.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::proto as pb;
use ferry_client::{Code, Delayed, DeliverAt};
use ferry_testkit::{ClusterSpec, FaultyCluster, deadline, wait_for, wait_until};
use tokio_util::sync::CancellationToken;

use crate::common::IO_BUDGET;
use crate::delay::{Lcg, Sent, TICK, TOPIC, assert_delivered_once, now_ms, record, send_delayed, watch};
use crate::faults::{client, client_of, cluster_with_topic};

const PARTITIONS: u32 = 4;

/// Pending count per partition of `TOPIC` as member `id` answers, alone (`local`) or for the cluster.
async fn pending_at(cluster: &FaultyCluster, id: u32, local: bool) -> anyhow::Result<BTreeMap<u32, u64>> {
    let request = pb::DescribeDelayedRequest { topic: TOPIC.into(), local };
    let answer = client_of(cluster, id).describe_delayed(request).await?;
    anyhow::ensure!(answer.unanswered_members.is_empty(), "unanswered: {:?}", answer.unanswered_members);
    Ok(answer.partitions.iter().map(|p| (p.partition, p.pending)).collect())
}

/// The member whose own delay-store partitions hold the most pending records of `TOPIC`.
async fn busiest_owner(cluster: &FaultyCluster) -> anyhow::Result<u32> {
    let mut best = (0, 0);
    for id in 1..=cluster.spec().members {
        let own: u64 = pending_at(cluster, id, true).await?.values().sum();
        if own > best.1 {
            best = (id, own);
        }
    }
    anyhow::ensure!(best.0 != 0, "no member owns pending records");
    Ok(best.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_counts_all_pending_and_records_arrive_once_across_an_etcd_cut_and_a_pause() -> anyhow::Result<()>
{
    let spec = ClusterSpec { extra: "[delay]\ntick = \"50ms\"\n".into(), ..ClusterSpec::default() };
    let mut cluster = cluster_with_topic(spec, TOPIC, PARTITIONS, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let client = client(&cluster);
    let delayed = Delayed::new(client.clone());
    // The controller creates the delay store once the cluster is up: until then a delayed produce is refused.
    let probe = [record(20_100, PARTITIONS).with_partition(0)];
    let first = wait_for("the delay store to take writes", deadline(&[ttl, ttl, IO_BUDGET]), async || {
        match delayed.send(&probe, DeliverAt::After(Duration::from_secs(3_600))).await {
            Ok(r) => anyhow::Ok(Some(r)),
            Err(e) if e.code() == Some(Code::Unavailable) => Ok(None),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    let mut sent = Sent::new();

    // Ten records per partition (and the probe on partition 0), due in an hour: each member answers for the whole
    // cluster, though each owns only some of the delay-store partitions.
    let (_, mut far_ids) =
        send_delayed(&delayed, 20_000..20_040, 10, PARTITIONS, &mut Lcg(1), (3_600_000, 3_600_000)).await?;
    far_ids.extend(first.ids);
    let all: BTreeMap<u32, u64> = (0..PARTITIONS).map(|p| (p, 10 + u64::from(p == 0))).collect();
    let mut owners = 0;
    for id in 1..=cluster.spec().members {
        assert_eq!(pending_at(&cluster, id, false).await?, all, "broker {id} counts every owner's records");
        let own = pending_at(&cluster, id, true).await?;
        owners += usize::from(!own.is_empty());
        println!("broker {id} owns the pending records of partitions {:?}", own.keys().collect::<Vec<_>>());
    }
    assert!(owners >= 2, "the topic's records live in delay-store partitions of at least two owners");
    for id in &far_ids {
        delayed.cancel(TOPIC, id).await?;
    }

    let stop = CancellationToken::new();
    let seen = watch(client.clone(), PARTITIONS, stop.clone());
    // Records fall due while the busiest owner is cut from etcd (its lease lapses and another member takes its
    // partitions over), then the cut heals.
    let (wave, _) = send_delayed(&delayed, 0..400, 20, PARTITIONS, &mut Lcg(5), (1_000, 4_000)).await?;
    sent.extend(wave);
    let cut = busiest_owner(&cluster).await?;
    cluster.cut_from_etcd(cut);
    wait_until("records to fall due during the cut", deadline(&[ttl, ttl, IO_BUDGET]), async || {
        now_ms() > sent.values().map(|(_, d)| *d).max().unwrap_or_default()
    })
    .await?;
    cluster.heal_etcd(cut);
    let wait = |sent: &Sent| {
        Duration::from_millis(u64::try_from(sent.values().map(|(_, d)| *d).max().unwrap_or(0) - now_ms()).unwrap_or(0))
    };
    let expect = sent.len();
    wait_until("every record of the cut to arrive", deadline(&[wait(&sent), ttl, ttl, TICK, IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() >= expect
    })
    .await?;

    // Then the same while the busiest owner is paused.
    let (wave, _) = send_delayed(&delayed, 400..800, 20, PARTITIONS, &mut Lcg(9), (1_000, 4_000)).await?;
    sent.extend(wave);
    let paused = busiest_owner(&cluster).await?;
    cluster.broker(paused).suspend(deadline(&[ttl])).await?;
    let latest = sent.values().map(|(_, d)| *d).max().unwrap_or_default();
    wait_until("records to fall due during the pause", deadline(&[ttl, ttl, IO_BUDGET]), async || now_ms() > latest)
        .await?;
    cluster.broker(paused).resume()?;
    let expect = sent.len();
    wait_until(
        "every record of the pause to arrive",
        deadline(&[wait(&sent), ttl, ttl, TICK, IO_BUDGET]),
        async || seen.lock().expect("the watcher's lock").at.len() >= expect,
    )
    .await?;
    stop.cancel();
    let (p50, p99) = assert_delivered_once(&client, &sent, &seen, PARTITIONS).await?;
    println!("cut broker {cut} from etcd, paused broker {paused}; lateness seen: p50 {p50} ms, p99 {p99} ms");
    Ok(())
}
