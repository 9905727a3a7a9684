//! The cluster's fault analysis, case by case, with real etcd, real brokers, and the testkit's proxy in front of
//! every member's etcd link and peer link (docs/cluster.md, "Faults and promises"). Each test is one reproduced
//! case; each failed on the cluster before its decision core.

use bytes::Bytes;
use ferry_client::Admin;
use ferry_client::proto as pb;
use ferry_testkit::{ClusterSpec, deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, plain_batch, read_partition};
use crate::faults::{TS0, client, client_of, cluster_with_topic, placement, produce, producer, wait_placement};

const TOPIC: &str = "orders";

/// Async flush whose interval and size are out of reach: only a clean stop makes the log durable, so a test knows
/// exactly what a power loss drops.
fn async_never_flushed() -> ClusterSpec {
    ClusterSpec {
        storage: "flush = \"async\"\nflush_interval = \"1h\"\nflush_bytes = \"1GiB\"\n".into(),
        sync_journal: true,
        ..ClusterSpec::default()
    }
}

/// Case 1. A follower loses its unsynced tail to a power loss and comes back at once; the leader crashes before it
/// took the follower out of the in-sync set. The follower, first in replica order, took itself out when it came
/// back (an unclean restart), so the controller elects the other follower, which holds every acknowledged record,
/// and nothing acknowledged is truncated away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_back_from_a_power_loss_is_not_elected_and_no_acknowledged_record_is_lost() -> anyhow::Result<()> {
    let mut cluster = cluster_with_topic(async_never_flushed(), TOPIC, 1, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let first = placement(&cluster, 1, TOPIC, 0).await?;
    let leader = first.leader_id;
    let followers: Vec<u32> = first.replicas.iter().copied().filter(|r| *r != leader).collect();
    // F is the first follower in replica order: the one an election by replica order alone would pick.
    let (f, g) = (followers[0], followers[1]);

    let producer = producer(&cluster).await?;
    let mut acked = produce(&producer, TOPIC, 0, 0..50).await?;
    // F stops cleanly (its log is durable up to here) and comes back in sync.
    cluster.broker(f).terminate(crate::common::STOP_GRACE).await?;
    cluster.broker(f).restart().await?;
    wait_placement(&cluster, g, TOPIC, 0, deadline(&[ttl, crate::raft3::REPLICA_LAG, IO_BUDGET]), |p| p.isr.len() == 3)
        .await?;
    acked.extend(produce(&producer, TOPIC, 0, 50..100).await?);

    // F loses its page cache and comes back at once, holding the first 50 records; the leader crashes meanwhile.
    let dropped = cluster.broker(f).power_loss().await?;
    assert!(dropped != Default::default(), "the power loss dropped nothing");
    cluster.broker(leader).kill9().await?;
    cluster.broker(f).restart().await?;

    let next = wait_placement(&cluster, g, TOPIC, 0, deadline(&[ttl, ttl, IO_BUDGET]), |p| {
        p.leader_id != 0 && p.leader_id != leader
    })
    .await?;
    assert_eq!(next.leader_id, g, "the follower back from a power loss was elected: {next:?}");
    let got = read_partition(&client_of(&cluster, g), TOPIC, 0).await;
    assert_same_records("the new leader's log", &acked, &got);
    assert!(cluster.broker(f).logs().contains("event=\"unclean_restart\""), "{}", cluster.broker(f).logs());

    // F catches up from G and re-enters the in-sync set; its copy then equals G's, record for record.
    acked.extend(produce(&producer, TOPIC, 0, 100..120).await?);
    producer.close().await;
    wait_placement(&cluster, g, TOPIC, 0, deadline(&[ttl, crate::raft3::REPLICA_LAG, IO_BUDGET]), |p| {
        p.isr.contains(&f)
    })
    .await?;
    assert_same_records(
        "the leader's log at the end",
        &acked,
        &read_partition(&client_of(&cluster, g), TOPIC, 0).await,
    );
    Ok(())
}

/// A produce request of one record, straight to a member.
fn one(value: &str) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: TOPIC.into(), partition: Some(0), key: None, batches: plain_batch(&[value], TS0) }
}

/// Case 2. The leader and its one in-sync follower lose etcd but still reach each other and their clients; an
/// operator elects the third replica uncleanly. The old leader fenced itself when its lease could have run out (no
/// failsafe covers it: the third replica reaches etcd), so it acknowledges nothing, and it serves no reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_etcd_with_its_follower_acknowledges_nothing_after_an_unclean_election() -> anyhow::Result<()>
{
    let mut cluster = cluster_with_topic(ClusterSpec::default(), TOPIC, 1, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let first = placement(&cluster, 1, TOPIC, 0).await?;
    let l = first.leader_id;
    let others: Vec<u32> = first.replicas.iter().copied().filter(|r| *r != l).collect();
    let (f, g) = (others[0], others[1]);
    let producer = producer(&cluster).await?;
    let mut acked = produce(&producer, TOPIC, 0, 0..20).await?;

    // G falls out of the in-sync set (cut from L), then L and F lose etcd.
    cluster.cut_between(l, g);
    wait_placement(&cluster, g, TOPIC, 0, deadline(&[crate::raft3::REPLICA_LAG, ttl, IO_BUDGET]), |p| {
        p.isr.len() == 2 && !p.isr.contains(&g)
    })
    .await?;
    acked.extend(produce(&producer, TOPIC, 0, 20..40).await?);
    producer.close().await;
    cluster.cut_from_etcd(l);
    cluster.cut_from_etcd(f);
    let brokers_key = |id: u32| format!("/ferry/brokers/{id}");
    let mut etcd = cluster.etcd.client().await?;
    wait_until("L's and F's leases to run out", deadline(&[ttl, ttl]), async || {
        let l_gone = etcd.get(brokers_key(l), None).await?.kvs().is_empty();
        let f_gone = etcd.get(brokers_key(f), None).await?.kvs().is_empty();
        anyhow::Ok(l_gone && f_gone)
    })
    .await?;

    // The operator elects G uncleanly: what only L and F had (records 20..40) is given up, by that choice.
    let elected = Admin::new(client_of(&cluster, g)).elect_leader(TOPIC, 0, true).await?;
    assert_eq!((elected.leader_id, elected.unclean), (g, true), "{elected:?}");

    // L, which still reaches F and its clients, acknowledges nothing and serves nothing.
    let stale = client_of(&cluster, l);
    for i in 0..3 {
        let err =
            stale.produce(one(&format!("after-the-election-{i}"))).await.expect_err("the old leader acknowledged");
        assert_eq!(err.reason(), Some("not_leader"), "{err}");
    }
    let fetched = stale
        .fetch(pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: TOPIC.into(),
                partition: 0,
                offset: 0,
                max_bytes: 1 << 20,
                leader_epoch: None,
            }],
            max_wait_ms: 0,
            max_bytes: 1 << 20,
        })
        .await?;
    assert_eq!(fetched.partitions[0].error, pb::ErrorCode::NotLeader as i32, "{:?}", fetched.partitions[0]);

    // Heal: L and F truncate to G's history; the log holds what G held and what it acknowledged since.
    let producer = crate::faults::producer(&cluster).await?;
    cluster.heal_all();
    let after = produce(&producer, TOPIC, 0, 100..110).await?;
    producer.close().await;
    wait_placement(&cluster, g, TOPIC, 0, deadline(&[ttl, ttl, crate::raft3::REPLICA_LAG, IO_BUDGET]), |p| {
        p.isr.len() == 3
    })
    .await?;
    let mut expected: Vec<Rec> = acked[..20].to_vec();
    expected.extend(after);
    let got = read_partition(&client(&cluster), TOPIC, 0).await;
    if got != expected {
        // What each member holds and did, for the failure's reader: which member acknowledged what, and when.
        for id in [l, f, g] {
            let held: Vec<(u64, Option<Bytes>)> = read_partition(&client_of(&cluster, id), TOPIC, 0)
                .await
                .into_iter()
                .map(|r| (r.offset, r.value))
                .collect();
            eprintln!("== member {id} (L={l} F={f} G={g}) holds {held:?}\n{}", cluster.broker(id).logs());
        }
    }
    assert_same_records("the log after the heal", &expected, &got);
    crate::faults::stop_and_compare(&mut cluster, TOPIC, 0).await
}

/// Case 3. A leader cut off from etcd alone stops acting as leader within its lease: it serves no read at its
/// frozen high watermark, does not tell clients in Metadata that it leads, and does not coordinate groups; the
/// others elect a new leader, and a reader given every member's address reads what was written there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_etcd_alone_stops_serving_reads_answering_as_leader_and_coordinating() -> anyhow::Result<()> {
    let cluster = cluster_with_topic(ClusterSpec::default(), TOPIC, 1, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let first = placement(&cluster, 1, TOPIC, 0).await?;
    let l = first.leader_id;
    let other = first.replicas.iter().copied().find(|r| *r != l).expect("three replicas");
    let producer = producer(&cluster).await?;
    let mut acked = produce(&producer, TOPIC, 0, 0..10).await?;

    cluster.cut_from_etcd(l);
    let next = wait_placement(&cluster, other, TOPIC, 0, deadline(&[ttl, ttl, IO_BUDGET]), |p| {
        p.leader_id != 0 && p.leader_id != l
    })
    .await?;
    acked.extend(produce(&producer, TOPIC, 0, 10..30).await?);
    producer.close().await;

    // L, cut off, answers no read: not at its frozen high watermark, not at any epoch.
    let stale = client_of(&cluster, l);
    let fetched = stale
        .fetch(pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: TOPIC.into(),
                partition: 0,
                offset: 0,
                max_bytes: 1 << 20,
                leader_epoch: None,
            }],
            max_wait_ms: 0,
            max_bytes: 1 << 20,
        })
        .await?;
    assert_eq!(fetched.partitions[0].error, pb::ErrorCode::NotLeader as i32, "{:?}", fetched.partitions[0]);
    // Its Metadata does not name it the leader, and ListOffsets does not answer with its stale end.
    let meta = stale.metadata_for(vec![TOPIC.to_owned()]).await?;
    assert_ne!(meta.partitions[0].leader_id, l, "{:?}", meta.partitions[0]);
    let lo = stale
        .list_offsets(pb::ListOffsetsRequest {
            partitions: vec![pb::ListOffsetsPartition {
                topic: TOPIC.into(),
                partition: 0,
                spec: Some(pb::list_offsets_partition::Spec::Latest(true)),
                leader_epoch: None,
            }],
            ..Default::default()
        })
        .await?;
    assert_eq!(lo.partitions[0].error, pb::ErrorCode::NotLeader as i32, "{:?}", lo.partitions[0]);
    // A read naming the new leader epoch at the new leader gets everything; naming the old one, it is fenced.
    let leader = client_of(&cluster, next.leader_id);
    let old_epoch = leader
        .fetch(pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: TOPIC.into(),
                partition: 0,
                offset: 0,
                max_bytes: 1 << 20,
                leader_epoch: Some(first.leader_epoch),
            }],
            max_wait_ms: 0,
            max_bytes: 1 << 20,
        })
        .await?;
    assert_eq!(old_epoch.partitions[0].error, pb::ErrorCode::FencedLeaderEpoch as i32, "{:?}", old_epoch.partitions[0]);
    assert_eq!(old_epoch.partitions[0].leader.as_ref().map(|h| h.leader_epoch), Some(next.leader_epoch));
    assert_same_records("a reader of every member", &acked, &read_partition(&client(&cluster), TOPIC, 0).await);

    // Groups: L coordinates none. A member that knows only L is told so; it is not given partitions.
    for g in 0..16 {
        let group = format!("group-{g}");
        let request = pb::JoinGroupRequest {
            group: group.clone(),
            member_id: String::new(),
            topics: vec![TOPIC.into()],
            session_timeout_ms: 6000,
            client_id: "cut-off".into(),
        };
        // Straight to L, without following a NOT_COORDINATOR hint elsewhere.
        match stale.raw().await?.join_group(request).await.map(|r| r.into_inner()) {
            Ok(j) => panic!(
                "broker {l}, cut off from etcd, coordinated {group}: {j:?}\n{}",
                cluster.brokers[l as usize - 1].logs()
            ),
            Err(status) => {
                let reason = status.metadata().get("ferry-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
                assert_eq!(reason.as_deref(), Some("not_coordinator"), "{status:?}");
            }
        }
    }
    Ok(())
}

/// Case 5 (and the broker's side of case 15). With more members than a topic's replicas, a member that holds no
/// replica of a partition points every call about it at the partition's leader: a producer, an admin and a
/// reader that know only that member produce, list offsets, describe and read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_without_a_replica_point_every_call_at_the_leader() -> anyhow::Result<()> {
    let spec = ClusterSpec { members: 4, ..ClusterSpec::default() };
    let cluster = cluster_with_topic(spec, TOPIC, 4, "raft3").await?;
    for p in 0..4u32 {
        let pl = placement(&cluster, 1, TOPIC, p).await?;
        let outsider = (1..=4u32).find(|id| !pl.replicas.contains(id)).expect("a member without a replica");
        let via = client_of(&cluster, outsider);
        let config = ferry_client::ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..Default::default() };
        let producer = ferry_client::Producer::new(via.clone(), config).await?;
        let acked = produce(&producer, TOPIC, p, 0..5).await?;
        producer.close().await;
        let admin = Admin::new(via.clone());
        let offsets = admin.list_offset(TOPIC, p, ferry_client::OffsetSpec::Latest).await?;
        assert_eq!(offsets.log_end_offset, 5, "list offsets via broker {outsider}");
        let described = admin.describe_topic(TOPIC).await?;
        let info = &described.partitions[p as usize];
        assert_eq!((info.error, info.log_end_offset), (pb::ErrorCode::None as i32, 5), "{info:?}");
        assert_same_records("read via a member without a replica", &acked, &read_partition(&via, TOPIC, p).await);
        // Its own answer, without following, names the leader.
        let own = via
            .describe_topic(pb::DescribeTopicRequest { name: TOPIC.into(), leader_epochs: Default::default() })
            .await?;
        let entry = &own.partitions[p as usize];
        assert_eq!(entry.error, pb::ErrorCode::NotLeader as i32, "{entry:?}");
        assert_eq!(entry.leader.as_ref().map(|h| h.leader_id), Some(pl.leader_id));
    }
    Ok(())
}

/// Case 16. The broker that coordinates a group is killed, and a member starts at once with every member's
/// address: it waits for the new coordinator (about one lease TTL) instead of giving up on the dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_started_while_its_coordinator_is_dead_waits_for_the_next_one() -> anyhow::Result<()> {
    let mut cluster = cluster_with_topic(ClusterSpec::default(), TOPIC, 1, "raft3").await?;
    let producer = producer(&cluster).await?;
    let acked = produce(&producer, TOPIC, 0, 0..25).await?;
    producer.close().await;
    let group = "orders-app";
    // The coordinator: the leader of the offsets partition the group's name hashes to.
    let meta = client_of(&cluster, 1).metadata_for(vec!["__ferry_cluster_offsets".into()]).await?;
    let k = ferry_client::proto::partition_for_key(group.as_bytes(), meta.partitions.len() as u32);
    let coordinator =
        meta.partitions.iter().find(|p| p.partition == k).expect("the group's offsets partition").leader_id;
    cluster.broker(coordinator).kill9().await?;
    let program = ferry_testkit::binary_path(ferry_testkit::FERRYCTL_BIN)?;
    let out = tokio::time::timeout(
        deadline(&[cluster.spec().lease_ttl, IO_BUDGET]),
        tokio::process::Command::new(program)
            .args(["--broker", &cluster.addrs().join(","), "consume", TOPIC, "--group", group, "--from-beginning"])
            .args(["--max", "25", "--format", "json"])
            .output(),
    )
    .await??;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let values: Vec<String> = lines.iter().map(|l| l["value"].as_str().unwrap_or_default().to_owned()).collect();
    let expected: Vec<String> =
        acked.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()).collect();
    assert_eq!(values, expected);
    Ok(())
}
