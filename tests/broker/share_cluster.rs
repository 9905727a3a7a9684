//! Message models under faults: a queue member killed with kill -9 while it holds locks (its records come back after
//! the lock ends, none succeeds twice), and a queue group on a raft3 cluster whose state owner is killed
//! mid-consumption, first the topic's leader, then the group state's owner (nothing lost, nothing succeeds twice: each record's history holds exactly one SUCCESS).

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_client::admin::{Admin, TopicConfig};
use ferry_client::{Outcome, ShareAdmin, ShareConsumer, ShareMode};
use ferry_testkit::{FERRYCTL_BIN, binary_path, deadline, wait_for, wait_until};

use crate::common::{IO_BUDGET, connect, start_broker};
use crate::raft3::{Cluster, LEASE_TTL};
use crate::share::{config, produce};

/// The transitions of `offset` in `group`, as its owner's history has them.
async fn events(admin: &ShareAdmin, group: &str, topic: &str, offset: u64) -> anyhow::Result<Vec<String>> {
    Ok(admin.status(group, topic, 0, offset).await?.history.into_iter().map(|t| t.event).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_holding_locks_has_its_records_redelivered_and_none_succeeds_twice() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("jobs", 1, TopicConfig::default(), None).await?;
    let lock = Duration::from_secs(2);
    // The victim: ferryctl as a queue member whose stdout nobody reads. It acks what it printed; once the pipe is
    // full it blocks mid-batch, holding that batch's locks, and is killed there.
    let mut victim = tokio::process::Command::new(binary_path(FERRYCTL_BIN)?)
        .args(["--broker", &broker.addr().to_string(), "consume", "jobs", "--group", "g", "--mode", "queue"])
        .args(["--from-beginning", "--ack-timeout", "2s", "--session-timeout", "60s"])
        .env_remove("FERRY_BROKER")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let shares = ShareAdmin::new(client.clone());
    wait_until("the victim joined", IO_BUDGET, async || shares.describe("g").await.map(|d| d.members.len() == 1))
        .await?;
    produce(&client, "jobs", 20, "small").await?;
    wait_until("the victim settled the first records", IO_BUDGET, async || {
        shares.describe("g").await.map(|d| d.partitions[0].start_offset == 20)
    })
    .await?;
    let big = "x".repeat(2_000);
    let producer = ferry_client::Producer::new(client.clone(), ferry_client::ProducerConfig::default()).await?;
    for i in 0..200 {
        producer.send(ferry_client::ProducerRecord::new("jobs", format!("{i}:{big}"))).await?.await?;
    }
    producer.close().await;
    wait_until("the victim holds records it cannot answer for", IO_BUDGET, async || {
        shares.describe("g").await.map(|d| d.partitions[0].in_flight > 0)
    })
    .await?;
    let held = shares.describe("g").await?.partitions[0].in_flight;
    victim.start_kill()?;
    victim.wait().await?;
    // Another member gets everything not settled, after the lock ends.
    let mut c = config("g", "jobs", ShareMode::Queue);
    c.lock_timeout = Some(lock);
    let other = ShareConsumer::join(client.clone(), c).await?;
    let mut got = Vec::new();
    wait_until("the rest is settled by the other member", deadline(&[lock, IO_BUDGET]), async || {
        let batch = other.poll(100, Duration::from_millis(200)).await?;
        let acks: Vec<_> = batch.iter().map(|r| (r, Outcome::Ack)).collect();
        let refused = other.ack(&acks).await?;
        assert!(refused.iter().all(Option::is_none), "{refused:?}");
        got.extend(batch);
        anyhow::Ok(shares.describe("g").await?.partitions[0].start_offset == 220)
    })
    .await?;
    let again: Vec<&ferry_client::ShareMessage> = got.iter().filter(|r| r.delivery_count == 2).collect();
    assert_eq!(again.len() as u64, held, "exactly the records the victim held came back, counted twice");
    let offsets: BTreeSet<u64> = got.iter().map(|r| r.offset).collect();
    assert_eq!(offsets.len(), got.len(), "no record delivered twice to the other member");
    assert!(offsets.iter().all(|o| *o >= 20), "nothing the victim settled came back");
    for r in &again {
        let ev = events(&shares, "g", "jobs", r.offset).await?;
        assert_eq!(ev.iter().filter(|e| *e == "SUCCESS").count(), 1, "offset {}: {ev:?}", r.offset);
        assert_eq!(ev.first().map(String::as_str), Some("DELIVERED"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_group_on_raft3_loses_nothing_and_settles_each_record_once_when_the_leader_and_the_owner_are_killed()
-> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    let client = cluster.client();
    let within = deadline(&[LEASE_TTL, IO_BUDGET]);
    Admin::new(client.clone()).create_replicated_topic("jobs", 1, "raft3").await?;
    wait_until("the internal topics exist", within, async || {
        client
            .metadata_for(vec!["__ferry_queues".to_owned()])
            .await
            .map(|m| m.partitions.iter().all(|p| p.leader_id != 0) && m.partitions.len() == 8)
    })
    .await?;
    produce(&client, "jobs", 400, "v").await?;
    let k = ferry_client::proto::partition_for_key(b"workers", 8);
    let first_owner = wait_for("the group's owner", within, async || {
        let meta = client.metadata_for(vec!["__ferry_queues".to_owned()]).await?;
        anyhow::Ok(meta.partitions.iter().find(|p| p.partition == k).map(|p| p.leader_id).filter(|l| *l != 0))
    })
    .await?;
    let mut members = Vec::new();
    for _ in 0..4 {
        let mut c = config("workers", "jobs", ShareMode::Queue);
        c.lock_timeout = Some(Duration::from_secs(2));
        c.session_timeout = Duration::from_secs(5);
        members.push(Arc::new(ShareConsumer::join(client.clone(), c).await?));
    }
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for m in &members {
        let (m, acked, stop) = (Arc::clone(m), Arc::clone(&acked), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let Ok(got) = m.poll(20, Duration::from_millis(200)).await else { continue };
                let acks: Vec<_> = got.iter().map(|r| (r, Outcome::Ack)).collect();
                if let Ok(refused) = m.ack(&acks).await {
                    let mut a = acked.lock().unwrap();
                    a.extend(got.iter().zip(refused).filter(|(_, e)| e.is_none()).map(|(r, _)| r.offset));
                }
            }
        }));
    }
    let leader_of = async |topic: &str, partition: u32| -> anyhow::Result<u32> {
        let meta = client.metadata_for(vec![topic.to_owned()]).await?;
        Ok(meta.partitions.iter().find(|p| p.partition == partition).map_or(0, |p| p.leader_id))
    };
    // First the topic's leader dies (the owner reads the records from whichever member leads them), then, once it
    // is back, the group's owner.
    wait_until("part of the work is done", within, async || acked.lock().unwrap().len() >= 100).await?;
    let jobs_leader =
        wait_for("the topic's leader", within, async || leader_of("jobs", 0).await.map(|l| (l != 0).then_some(l)))
            .await?;
    cluster.broker(jobs_leader).kill9().await?;
    wait_until("more work is done without the topic's leader", within, async || acked.lock().unwrap().len() >= 200)
        .await?;
    cluster.broker(jobs_leader).restart().await?;
    let owner = wait_for("the group's owner now", within, async || {
        leader_of("__ferry_queues", k)
            .await
            .map(|l| (l != 0 && (l != jobs_leader || first_owner == jobs_leader)).then_some(l))
    })
    .await?;
    wait_until("the restarted member is back in sync", within, async || {
        client.metadata_for(vec!["jobs".to_owned()]).await.map(|m| m.partitions.iter().all(|p| p.isr.len() == 3))
    })
    .await?;
    cluster.broker(owner).kill9().await?;
    let all = ShareAdmin::new(client.clone());
    wait_until(
        "every record settled after the owner moved",
        deadline(&[LEASE_TTL, LEASE_TTL, IO_BUDGET, IO_BUDGET]),
        async || all.describe("workers").await.map(|d| d.partitions.first().is_some_and(|p| p.start_offset == 400)),
    )
    .await?;
    stop.cancel();
    for t in tasks {
        t.await?;
    }
    let acked = acked.lock().unwrap().clone();
    let unique: BTreeSet<u64> = acked.iter().copied().collect();
    assert_eq!(unique.len(), acked.len(), "no record was acknowledged as settled twice");
    for offset in 0..400 {
        let ev = events(&all, "workers", "jobs", offset).await?;
        assert_eq!(ev.iter().filter(|e| *e == "SUCCESS").count(), 1, "offset {offset}: {ev:?}");
    }
    Ok(())
}
