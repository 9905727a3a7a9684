//! Case 12 of the cluster analysis: the whole cluster loses power several times under load, on an async-flush raft3
//! topic whose replicas each keep a different synced prefix. Every member comes back unclean: each takes itself out
//! of the in-sync set, the last one leads at a new leader epoch, and the others truncate to its history by epoch.
//! So after each loss the leader epoch has moved on, and once healed the replicas are byte-identical: never two
//! histories under one epoch. (Records acknowledged since the last flush may be lost: that is async flush's
//! promise, docs/cluster.md.)

use ferry_testkit::{ClusterSpec, deadline};

use crate::common::{IO_BUDGET, read_partition};
use crate::faults::{client, cluster_with_topic, placement, producer, record, wait_placement};

const TOPIC: &str = "ledger";
const ROUNDS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_power_losses_never_leave_two_histories_under_one_epoch() -> anyhow::Result<()> {
    let spec = ClusterSpec {
        // Flushed often, and each member on its own schedule: the power losses leave them different prefixes.
        storage: "flush = \"async\"\nflush_interval = \"50ms\"\n".into(),
        sync_journal: true,
        ..ClusterSpec::default()
    };
    let mut cluster = cluster_with_topic(spec, TOPIC, 1, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let mut epoch = placement(&cluster, 1, TOPIC, 0).await?.leader_epoch;
    let mut sent = 0usize;
    for round in 0..ROUNDS {
        // A burst of load, with writes still in flight when the power goes.
        let p = producer(&cluster).await?;
        let mut pending = Vec::new();
        for _ in 0..200 {
            pending.push(p.send(record(TOPIC, 0, sent)).await?);
            sent += 1;
        }
        for ack in pending.drain(..150) {
            ack.await?;
        }
        for id in 1..=3 {
            cluster.broker(id).power_loss().await?;
        }
        drop(pending);
        drop(p);
        for id in 1..=3 {
            cluster.broker(id).restart().await?;
        }
        let healed = wait_placement(&cluster, 1, TOPIC, 0, deadline(&[ttl, ttl, IO_BUDGET]), |pl| {
            pl.leader_id != 0 && pl.isr.len() == 3
        })
        .await?;
        assert!(healed.leader_epoch > epoch, "round {round}: the leader epoch stayed at {epoch} after a power loss");
        epoch = healed.leader_epoch;
        // The cluster takes writes again, and reads back what it holds with strictly increasing offsets.
        let p = producer(&cluster).await?;
        p.send(record(TOPIC, 0, sent)).await?.await?;
        sent += 1;
        p.close().await;
        let held = read_partition(&client(&cluster), TOPIC, 0).await;
        assert!(!held.is_empty(), "round {round}");
    }
    crate::faults::stop_and_compare(&mut cluster, TOPIC, 0).await
}
