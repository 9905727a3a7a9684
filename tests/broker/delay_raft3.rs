//! Delayed delivery on a raft3 cluster: the delay store is a replicated internal topic, so when the leader of the
//! target partition (and of the delay-store partitions it owned) is killed, the new leaders rebuild their timers from
//! the replicated log and every record is still delivered exactly once, never early.

use std::time::Duration;

use ferry_client::{Code, Delayed, DeliverAt};
use ferry_testkit::{ClusterSpec, deadline, wait_for, wait_until};
use tokio_util::sync::CancellationToken;

use crate::common::IO_BUDGET;
use crate::delay::{Lcg, TICK, TOPIC, assert_delivered_once, now_ms, record, send_delayed, watch};
use crate::faults::{client, cluster_with_topic, placement};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_records_survive_killing_the_leader_on_raft3_exactly_once() -> anyhow::Result<()> {
    const TOTAL: usize = 2_000;
    const PARTITIONS: u32 = 2;
    let spec = ClusterSpec { extra: "[delay]\ntick = \"50ms\"\n".into(), ..ClusterSpec::default() };
    let mut cluster = cluster_with_topic(spec, TOPIC, PARTITIONS, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let client = client(&cluster);
    let delayed = Delayed::new(client.clone());
    // The controller creates the delay store once the cluster is up: until then a delayed produce is refused.
    let probe = [record(TOTAL, PARTITIONS).with_partition(0)];
    let first = wait_for("the delay store to take writes", deadline(&[ttl, ttl, IO_BUDGET]), async || {
        match delayed.send(&probe, DeliverAt::After(Duration::from_secs(1))).await {
            Ok(r) => anyhow::Ok(Some(r)),
            Err(e) if e.code() == Some(Code::Unavailable) => Ok(None),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    let stop = CancellationToken::new();
    let seen = watch(client.clone(), PARTITIONS, stop.clone());
    let (mut sent, _) = send_delayed(&delayed, 0..TOTAL, 20, PARTITIONS, &mut Lcg(3), (2_000, 8_000)).await?;
    sent.insert(TOTAL, (first.partition, first.due_ms));
    let latest = sent.values().map(|(_, d)| *d).max().unwrap_or_default();

    wait_until("a third of the records to fall due", deadline(&[Duration::from_secs(8), IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() >= TOTAL / 3
    })
    .await?;
    let leader = placement(&cluster, 1, TOPIC, 0).await?.leader_id;
    cluster.broker(leader).kill9().await?;
    let wait = Duration::from_millis(u64::try_from(latest - now_ms()).unwrap_or(0));
    wait_until("every record to be delivered", deadline(&[wait, ttl, ttl, TICK, IO_BUDGET]), async || {
        seen.lock().expect("the watcher's lock").at.len() > TOTAL
    })
    .await?;
    stop.cancel();
    let (p50, p99) = assert_delivered_once(&client, &sent, &seen, PARTITIONS).await?;
    println!("killed broker {leader}; lateness seen across the failover: p50 {p50} ms, p99 {p99} ms");
    Ok(())
}
