//! A raft3 follower whose sealed segment was corrupted while it was stopped: on restart it CRC-checks what it
//! holds, leaves the in-sync set until it has, truncates the corrupt batch away, fetches it again from the leader
//! and rejoins; afterwards every replica is byte-identical again.

use ferry_client::proto as pb;
use ferry_client::{Admin, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, STOP_GRACE};
use crate::raft3::{Cluster, LEASE_TTL, REPLICA_LAG, TOPIC, TS0, assert_log_is, assert_replicas_identical};

fn record(i: usize) -> ProducerRecord {
    ProducerRecord::new(TOPIC, format!("order-{i:05}-{}", "x".repeat(1000)))
        .with_partition(0)
        .with_timestamp(TS0 + i as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_corrupt_sealed_segment_is_repaired_from_the_leader_outside_the_isr() -> anyhow::Result<()> {
    // Small segments, so that a few hundred records seal some.
    let mut cluster =
        Cluster::start_with("segment_bytes = \"128KiB\"\n\n[broker]\nmax_batch_bytes = \"64KiB\"\n").await?;
    Admin::new(cluster.client_of(1)).create_replicated_topic(TOPIC, 1, "raft3").await?;
    let first = cluster.wait_leader(1, 0, 3, deadline(&[LEASE_TTL])).await?;
    let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..ProducerConfig::default() };
    let producer = Producer::new(cluster.client(), config).await?;
    let mut acked = Vec::new();
    for i in 0..400 {
        let ack = producer.send(record(i)).await?.await?;
        acked.push(Rec::acked(&ack, record(i)));
    }
    producer.close().await;
    let leader = first.leader_id;
    let follower = first.replicas.iter().copied().find(|r| *r != leader).expect("replicas");
    wait_until("the follower holding everything", deadline(&[IO_BUDGET]), async || {
        let status = cluster.client_of(leader).cluster_status(Default::default()).await?;
        let ours = |p: &pb::PartitionStatus| p.placement.as_ref().is_some_and(|pl| pl.topic == TOPIC);
        let p = status.partitions.into_iter().find(ours).expect("the topic's partition");
        anyhow::Ok(p.followers.iter().any(|f| f.broker_id == follower && f.log_end_offset == 400))
    })
    .await?;

    // Stop it cleanly and flip one byte of a record value in its first (sealed) segment: the headers stay whole,
    // the batch's CRC no longer matches.
    assert_eq!(cluster.broker(follower).terminate(STOP_GRACE).await?.code(), Some(0));
    let dir = cluster.broker(follower).data_dir().join(TOPIC).join("0");
    let mut names: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.retain(|n| n.ends_with(".log"));
    names.sort();
    assert!(names.len() >= 3, "expected sealed segments: {names:?}");
    let path = dir.join(&names[0]);
    let mut bytes = std::fs::read(&path)?;
    let needle = b"order-00042-";
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("record 42 in the first segment");
    bytes[at + 9] ^= 0x01;
    std::fs::write(&path, &bytes)?;

    // Back: it checks its log, leaves the ISR meanwhile, repairs the batch from the leader and rejoins.
    cluster.broker(follower).restart().await?;
    wait_until("the repaired follower back in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        let p = cluster.placement(leader).await?;
        // Its own partition's shrink, then its expand: an internal partition's expand at start-up does not count.
        let logs = cluster.brokers[leader as usize - 1].logs();
        let ours = |l: &&str| l.contains(&format!("topic=\"{TOPIC}\""));
        let lines: Vec<&str> = logs.lines().filter(ours).collect();
        let out = lines.iter().position(|l| l.contains("isr_shrink") && l.contains(&format!("removed=[{follower}]")));
        let rejoined = out.is_some_and(|o| {
            lines[o..].iter().any(|l| l.contains("isr_expand") && l.contains(&format!("added=[{follower}]")))
        });
        anyhow::Ok(p.isr.len() == 3 && rejoined)
    })
    .await?;
    let follower_logs = cluster.brokers[follower as usize - 1].logs();
    assert!(follower_logs.contains("replica_repair"), "the follower did not repair: {follower_logs}");
    assert!(follower_logs.contains("replica verified"), "the follower did not finish its check: {follower_logs}");
    let leader_logs = cluster.brokers[leader as usize - 1].logs();
    let shrink = format!("removed=[{follower}]");
    let out = leader_logs.lines().position(|l| l.contains("isr_shrink") && l.contains(&shrink));
    let back = leader_logs
        .lines()
        .collect::<Vec<_>>()
        .iter()
        .rposition(|l| l.contains("isr_expand") && l.contains(&format!("added=[{follower}]")));
    assert!(
        matches!((out, back), (Some(o), Some(b)) if o < b),
        "the leader did not take the unverified follower out of the ISR before it rejoined: {leader_logs}"
    );
    assert_log_is(&cluster, leader, &acked, "the leader's log").await;
    cluster.stop_all().await?;
    assert_replicas_identical(&cluster)?;
    Ok(())
}
