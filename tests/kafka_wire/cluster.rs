//! The Kafka listener on a raft3 cluster: every member advertises its own Kafka address, Metadata names each
//! partition's leader, replicas and in-sync set as the catalog has them, and when a leader is killed with SIGKILL a
//! librdkafka producer (acks=all, idempotent) loses no acknowledged record while a consumer group follows the new
//! leaders (and, when it coordinated the group, the new coordinator), and is then deleted through the new
//! coordinator.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use ferry_client::{Admin, BrokerClient, ClientConfig};
use ferry_testkit::{ClusterSpec, FaultyCluster, deadline, wait_for, wait_until};
use serde_json::{Value, json};

use crate::bad_input::{exchange, frame};
use crate::support::{Member, Rec, assert_same, expected, read_all, run_client, step_deadline};

const TOPIC: &str = "orders";
const PARTS: u32 = 2;
/// Records flushed before the kill; the rest are produced while it happens.
const FIRST: u64 = 100;
const ALL: u64 = 300;

fn client(addrs: Vec<String>) -> anyhow::Result<BrokerClient> {
    Ok(BrokerClient::new(ClientConfig::new(addrs))?)
}

/// The placements of TOPIC as member `id` reads them: partition -> (leader, replicas, isr).
async fn placements(cluster: &FaultyCluster, id: u32) -> anyhow::Result<BTreeMap<u32, (u32, Vec<u32>, Vec<u32>)>> {
    let meta = client(vec![cluster.addrs()[id as usize - 1].clone()])?.metadata_for(vec![TOPIC.into()]).await?;
    Ok(meta
        .partitions
        .into_iter()
        .map(|mut p| {
            p.replicas.sort();
            p.isr.sort();
            (p.partition, (p.leader_id, p.replicas, p.isr))
        })
        .collect())
}

/// What confluent-kafka's Metadata through member `id`'s Kafka listener shows.
async fn kafka_metadata(cluster: &FaultyCluster, id: u32) -> anyhow::Result<Value> {
    let bootstrap = cluster.kafka_addr(id).context("a Kafka listener")?;
    let lines = run_client("confluent", bootstrap, &["metadata", TOPIC]).await?;
    Ok(lines.first().context("a metadata line")?["metadata"].clone())
}

/// ListOffsets v1 of TOPIC/0, latest: (error code, offset) as the Kafka listener at `addr` answers.
async fn latest(addr: &str) -> anyhow::Result<(i16, i64)> {
    use bytes::{Buf, BufMut, BytesMut};
    let mut b = BytesMut::new();
    b.put_i32(-1); // replica id
    b.put_i32(1);
    b.put_i16(TOPIC.len() as i16);
    b.put_slice(TOPIC.as_bytes());
    b.put_i32(1);
    b.put_i32(0); // partition
    b.put_i64(-1); // latest
    let answer = exchange(addr, &frame(2, 1, 9, &b)).await?.context("a ListOffsets answer")?;
    let mut r = &answer[..];
    // correlation id, one topic (its name), one partition: index, error, timestamp, offset.
    r.advance(4 + 4 + 2 + TOPIC.len() + 4 + 4);
    let error = r.get_i16();
    r.advance(8);
    Ok((error, r.get_i64()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft3_cluster_loses_no_acknowledged_kafka_record_through_a_leader_kill() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let spec = ClusterSpec { kafka: Some(String::new()), ..ClusterSpec::default() };
    let ttl = spec.lease_ttl;
    let mut cluster = FaultyCluster::start(spec).await?;
    let kafka: Vec<String> = (1..=3).map(|id| cluster.kafka_addr(id).unwrap_or_default().to_owned()).collect();
    let grpc = client(cluster.addrs())?;
    Admin::new(grpc.clone()).create_replicated_topic(TOPIC, PARTS, "raft3").await?;
    // Every member sees both partitions led and fully in sync.
    for id in 1..=3 {
        wait_until("the topic placed, led and in sync", deadline(&[ttl, step_deadline()]), async || {
            let p = placements(&cluster, id).await?;
            Ok::<_, anyhow::Error>(p.len() == PARTS as usize && p.values().all(|(l, _, isr)| *l != 0 && isr.len() == 3))
        })
        .await?;
    }

    // Metadata through any member's Kafka listener: the three members at their own Kafka addresses, and each
    // partition's leader, replicas and in-sync set exactly as the catalog has them.
    let placed = placements(&cluster, 1).await?;
    let want_brokers: Vec<Value> = (1..=3u32).map(|id| json!([id, kafka[id as usize - 1]])).collect();
    let want_parts: Vec<Value> = placed.iter().map(|(p, (l, r, isr))| json!([p, l, r, isr])).collect();
    for id in [1, 3] {
        let md = kafka_metadata(&cluster, id).await?;
        assert_eq!(md, json!({"brokers": want_brokers, "partitions": want_parts}), "Metadata through member {id}");
    }

    // A group member reading from the start, committing each record; then the producer's first records, flushed.
    let bootstrap = kafka.join(",");
    let member =
        Member::spawn("confluent", &bootstrap, &["member", TOPIC, "follows"], &[("COMMIT_FAILURES", "report")])?;
    let producer = Member::spawn(
        "confluent",
        &bootstrap,
        &["stream", TOPIC, "2", "f", &FIRST.to_string(), &ALL.to_string()],
        &[],
    )?;
    wait_until("the first records flushed", step_deadline(), async || {
        Ok::<_, anyhow::Error>(producer.lines().iter().any(|l| l.get("ready").is_some()))
    })
    .await?;

    // Kill -9 the leader of partition 0 while the rest is being produced.
    let victim = placed[&0].0;
    cluster.broker(victim).kill9().await?;
    let lines = producer.finish("acked").await?;
    let errors: Vec<&Value> = lines.iter().filter(|l| l.get("error").is_some()).collect();
    assert!(errors.is_empty(), "the producer reported errors: {errors:?}");
    assert_eq!(lines.last().cloned(), Some(json!({"acked": ALL, "unflushed": 0})));

    // Each acknowledged record is stored once, at the offset its acknowledgement gave, read through gRPC from the
    // new leaders; and nothing else is stored.
    let mut acked: Vec<Rec> = lines
        .iter()
        .filter_map(|l| l.get("ack"))
        .map(|a| {
            let i = a[0].as_u64().unwrap_or(u64::MAX);
            let mut r = expected("f", PARTS, i);
            r.partition = a[1].as_u64().unwrap_or(u64::MAX) as u32;
            r.offset = a[2].as_u64().unwrap_or(u64::MAX);
            r
        })
        .collect();
    acked.sort();
    let live: Vec<String> =
        (1..=3u32).filter(|id| *id != victim).map(|id| cluster.addrs()[id as usize - 1].clone()).collect();
    let survivors = client(live)?;
    let mut stored = Vec::new();
    for p in 0..PARTS {
        stored.extend(read_all(&survivors, TOPIC, p).await?.iter().map(|r| Rec::of_ferry(p, r)));
    }
    stored.sort();
    assert_same("acknowledged through Kafka vs stored after the leader's kill", &stored, &acked);
    // The new leader of partition 0 is another member, and the Kafka Metadata of a survivor names it.
    let after = wait_for("partition 0 led by a survivor", deadline(&[ttl, step_deadline()]), async || {
        let p = placements(&cluster, if victim == 1 { 2 } else { 1 }).await?;
        Ok::<_, anyhow::Error>(p.get(&0).map(|x| x.0).filter(|l| *l != 0 && *l != victim))
    })
    .await?;
    let md = kafka_metadata(&cluster, if victim == 1 { 2 } else { 1 }).await?;
    assert_eq!(md["partitions"][0][1], json!(after), "Kafka Metadata names the new leader");
    // ListOffsets (latest) of partition 0: the new leader answers its end, the other survivor, a follower,
    // NOT_LEADER_OR_FOLLOWER (6).
    let follower = (1..=3u32).find(|id| *id != victim && *id != after).context("a follower")?;
    let end0 = acked.iter().filter(|r| r.partition == 0).count() as i64;
    assert_eq!(latest(&kafka[after as usize - 1]).await?, (0, end0), "ListOffsets at the new leader");
    assert_eq!(latest(&kafka[follower as usize - 1]).await?, (6, -1), "ListOffsets at a follower");

    // The group followed the new leaders: it read every record; a record read again is one whose commit failed
    // while the coordinator moved, and nothing else.
    let read_all_of = |m: &Member| m.records().iter().map(|r| (r.partition, r.offset)).collect::<BTreeSet<_>>().len();
    wait_until("the group to read every record", step_deadline(), async || {
        Ok::<_, anyhow::Error>(read_all_of(&member) >= ALL as usize)
    })
    .await?;
    let failed: BTreeSet<(u32, u64)> = member
        .lines()
        .iter()
        .filter_map(|l| l.get("commit_failed"))
        .map(|f| (f[0].as_u64().unwrap_or(0) as u32, f[1].as_u64().unwrap_or(0)))
        .collect();
    let consumed = member.stop().await?;
    tracing::info!(victim, new_leader = after, consumed = consumed.len(), failed_commits = failed.len(), "raft3 kill");
    let mut seen = BTreeSet::new();
    let mut distinct = Vec::new();
    for r in consumed {
        if seen.insert((r.partition, r.offset)) {
            distinct.push(r);
        } else {
            assert!(failed.contains(&(r.partition, r.offset)), "{r:?} read twice though its commit succeeded");
        }
    }
    distinct.sort();
    assert_same("read by the group across the leader's kill", &distinct, &acked);

    // The group's commits are at each partition's end; DeleteGroups through a survivor's listener (the client
    // finds the coordinator) drops them through the offsets partition.
    let admin = Admin::new(survivors.clone());
    let ends: Vec<(u32, u64)> =
        (0..PARTS).map(|p| (p, acked.iter().filter(|r| r.partition == p).count() as u64)).collect();
    let committed = admin.fetch_committed_offsets("follows", &[]).await?;
    assert_eq!(committed.iter().map(|c| (c.partition, c.offset)).collect::<Vec<_>>(), ends);
    let deleted = run_client("confluent", &kafka[after as usize - 1], &["delete-group", "follows"]).await?;
    assert_eq!(deleted, vec![json!({"delete_group": "ok"})]);
    assert!(admin.fetch_committed_offsets("follows", &[]).await?.is_empty(), "the group's offsets are gone");
    Ok(())
}
