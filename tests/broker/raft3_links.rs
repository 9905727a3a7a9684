//! raft3 with cut links, on the testkit's [`ferry_testkit::FaultyCluster`]: every broker reaches etcd through a
//! proxy of its own, and every other member through one proxy per direction. First the leader's link to etcd is
//! cut: it loses its lease, the others elect a new leader, and the old one acknowledges nothing. Then the new
//! leader's links to its followers are cut: it takes them out of the ISR and refuses writes until they are back.
//! Nothing is acknowledged twice or lost.

use ferry_testkit::{ClusterSpec, deadline};

use crate::common::{IO_BUDGET, assert_same_records, read_partition};
use crate::faults::{client_of, cluster_with_topic, placement, produce, producer, stop_and_compare, wait_placement};

const TOPIC: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_etcd_and_then_one_cut_from_its_followers_lose_and_duplicate_nothing() -> anyhow::Result<()> {
    let mut cluster = cluster_with_topic(ClusterSpec::default(), TOPIC, 1, "raft3").await?;
    let (ttl, lag) = (cluster.spec().lease_ttl, cluster.spec().replica_lag);
    let first = placement(&cluster, 1, TOPIC, 0).await?;
    let producer = producer(&cluster).await?;
    let mut acked = produce(&producer, TOPIC, 0, 0..100).await?;

    // 1. The leader's link to etcd goes: its lease runs out and another member leads. The old leader, which cannot
    //    read etcd, fences itself and acknowledges nothing more.
    let a = first.leader_id;
    let other = first.replicas.iter().copied().find(|r| *r != a).expect("replicas");
    cluster.cut_from_etcd(a);
    let second =
        wait_placement(&cluster, other, TOPIC, 0, deadline(&[ttl, ttl]), |p| p.leader_id != 0 && p.leader_id != a)
            .await?;
    acked.extend(produce(&producer, TOPIC, 0, 100..200).await?);
    cluster.heal_etcd(a);
    wait_placement(&cluster, other, TOPIC, 0, deadline(&[ttl, lag, IO_BUDGET]), |p| p.isr.len() == 3).await?;

    // 2. The new leader's links to its followers go: it takes them out of the ISR and refuses writes meanwhile;
    //    the load waits, and goes on once the links are back.
    let b = second.leader_id;
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce(&producer, TOPIC, 0, 200..300).await })
    };
    let followers: Vec<u32> = second.replicas.iter().copied().filter(|r| *r != b).collect();
    for f in &followers {
        cluster.cut_between(b, *f);
    }
    wait_placement(&cluster, b, TOPIC, 0, deadline(&[lag, ttl]), |p| p.leader_id == b && p.isr == [b]).await?;
    for f in &followers {
        cluster.heal_between(b, *f);
    }
    acked.extend(load.await??);
    producer.close().await;
    wait_placement(&cluster, b, TOPIC, 0, deadline(&[ttl, lag, IO_BUDGET]), |p| p.isr.len() == 3).await?;

    let offsets: Vec<u64> = acked.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..300).collect::<Vec<u64>>(), "one producer's acknowledged offsets");
    let got = read_partition(&client_of(&cluster, b), TOPIC, 0).await;
    assert_same_records("the log after both cuts", &acked, &got);
    stop_and_compare(&mut cluster, TOPIC, 0).await
}
