//! A replicated topic's shape through the cluster's catalog, on three real brokers under a real etcd: a raft3
//! mirror topic with its own config takes the mirror's appends at its leader only once the in-sync set holds them,
//! its truncation starts a new leader epoch that every follower truncates to, and its config, growth, promotion and
//! deletion, each asked of a different member, reach every replica.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use ferry_batch::{Compression, ProducerInfo, Record, encode_records};
use ferry_client::admin::{MirrorSource, TopicConfig};
use ferry_client::proto::{ErrorCode, PartitionPlacement};
use ferry_client::{Admin, Code, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{deadline, wait_until};

use crate::common::{Rec, assert_same_records, assert_status, read_partition};
use crate::raft3::{Cluster, LEASE_TTL, TS0};

const TOPIC: &str = "mirrored";
const SOURCE_TOPIC_ID: &str = "0a8f5d52-6a0e-4e57-b9a4-1c3e7d2f9b60";

fn source() -> MirrorSource {
    MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: SOURCE_TOPIC_ID.into(),
        source_topic: TOPIC.into(),
        source_cluster: "dc-a".into(),
    }
}

/// Source records `base..base+n` with values tagged `tag`, as one batch of partition epoch `epoch`.
fn batch(base: u64, n: u64, epoch: u32, tag: &str) -> (Bytes, Vec<Rec>) {
    let records: Vec<Record> = (base..base + n)
        .map(|o| Record {
            offset: o,
            timestamp: TS0 + o as i64,
            key: Some(Bytes::from(format!("key-{}", o % 3))),
            value: Some(Bytes::from(format!("{tag}-{o}"))),
            headers: vec![],
        })
        .collect();
    let recs = records.iter().map(|r| Rec::from_batch_record(0, r)).collect();
    (encode_records(&records, epoch, Compression::None, ProducerInfo::NONE), recs)
}

/// The `.log` files of partition `p` of [`TOPIC`] in a member's data dir, by name.
fn segments(data_dir: &Path, p: u32) -> BTreeMap<String, Vec<u8>> {
    let dir = data_dir.join(TOPIC).join(p.to_string());
    let Ok(entries) = std::fs::read_dir(&dir) else { return BTreeMap::new() };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log"))
        .map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap_or_default()))
        .collect()
}

/// Waits until every member's segment files of partition `p` are byte-identical and hold data.
async fn wait_replicas_identical(cluster: &Cluster, p: u32) {
    wait_until(
        &format!("every replica's segments of partition {p} to be identical"),
        deadline(&[LEASE_TTL, LEASE_TTL]),
        async || {
            let all: Vec<_> = cluster.brokers.iter().map(|b| segments(b.data_dir(), p)).collect();
            all[0].values().any(|b| !b.is_empty()) && all.iter().all(|s| *s == all[0])
        },
    )
    .await
    .expect("replicas converge");
}

/// Waits until every member describes the topic as `check` wants.
async fn wait_every_member(cluster: &Cluster, what: &str, check: impl Fn(&ferry_client::proto::TopicInfo) -> bool) {
    wait_until(what, deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        for id in 1..=3 {
            let d = Admin::new(cluster.client_of(id)).describe_topic(TOPIC).await?;
            if !check(&d.topic) {
                return anyhow::Ok(false);
            }
        }
        anyhow::Ok(true)
    })
    .await
    .expect("every member follows the catalog");
}

/// Waits until every member describes partition `p` as `check` wants (each its own replica).
async fn wait_every_member_partition(
    cluster: &Cluster,
    p: u32,
    what: &str,
    check: impl Fn(&ferry_client::proto::PartitionInfo) -> bool,
) {
    wait_until(what, deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        for id in 1..=3 {
            let d = Admin::new(cluster.client_of(id)).describe_topic(TOPIC).await?;
            if !d.partitions.iter().any(|x| x.partition == p && check(x)) {
                return anyhow::Ok(false);
            }
        }
        anyhow::Ok(true)
    })
    .await
    .expect("every replica holds the same partition");
}

/// Partition `p`'s placement once it has a leader and three in sync, as broker 1 reads it from etcd.
async fn wait_placement(cluster: &Cluster, p: u32) -> anyhow::Result<PartitionPlacement> {
    let client = cluster.client_of(1);
    let placed = async || -> anyhow::Result<Option<PartitionPlacement>> {
        let parts = client.metadata_for(vec![TOPIC.to_owned()]).await?.partitions;
        Ok(parts.into_iter().find(|x| x.partition == p && x.leader_id != 0 && x.isr.len() == 3))
    };
    wait_until(
        &format!("partition {p} to have a leader and three in sync"),
        deadline(&[LEASE_TTL, LEASE_TTL]),
        async || placed().await.map(|x| x.is_some()),
    )
    .await?;
    placed().await?.ok_or_else(|| anyhow::anyhow!("partition {p} lost its placement"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft3_mirror_topic_changes_shape_through_the_catalog_and_every_replica_follows() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let admin = |id: u32| Admin::new(cluster.client_of(id));
    let config = TopicConfig { retention_ms: Some(86_400_000), segment_bytes: Some(1 << 20), ..Default::default() };
    let created = admin(2).create_topic_kept(TOPIC, 2, Some(config), Some(source()), "raft3", false).await?;
    assert_eq!((created.partitions, created.replication.as_str()), (2, "raft3"));
    assert_eq!(created.mirror.as_ref().map(|m| m.source_topic_id.as_str()), Some(SOURCE_TOPIC_ID));
    let topic_id = created.topic_id.clone();
    wait_every_member(&cluster, "every member to hold the mirror topic with its config", |t| {
        let c = t.config.clone().unwrap_or_default();
        t.topic_id == topic_id
            && t.mirror.as_ref().is_some_and(|m| m.source_topic_id == SOURCE_TOPIC_ID)
            && (c.retention_ms, c.segment_bytes) == (Some(86_400_000), Some(1 << 20))
    })
    .await;
    let first = wait_placement(&cluster, 0).await?;

    // A mirror topic refuses produce on every member, and takes the mirror's appends at its leader, wherever the
    // client starts.
    let client = cluster.client();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let refused = producer.send(ProducerRecord::new(TOPIC, "local").with_partition(0)).await?.await;
    assert_status(refused, Code::FailedPrecondition, &["mirrors dc-a"]);
    let mirror = Admin::new(client.clone());
    let (b0, r0) = batch(0, 5, 0, "old");
    let (b1, r1) = batch(5, 3, 0, "old");
    for b in [b0, b1] {
        let a = mirror.append_with_offsets(TOPIC, 0, SOURCE_TOPIC_ID, 0, b).await?;
        assert_eq!(ErrorCode::try_from(a.error)?, ErrorCode::None, "{}", a.message);
    }
    let answered = mirror.append_with_offsets(TOPIC, 0, SOURCE_TOPIC_ID, 0, Bytes::new()).await?;
    assert_eq!(answered.log_end_offset, 8, "the answer names the end the in-sync set holds");
    let expected: Vec<Rec> = r0.into_iter().chain(r1).collect();
    assert_same_records("mirrored", &expected, &read_partition(&cluster.client_of(first.leader_id), TOPIC, 0).await);
    wait_replicas_identical(&cluster, 0).await;

    // The mirror truncates: a new leader epoch starts at the new end, and every follower truncates to it.
    assert_eq!(mirror.truncate_partition(TOPIC, 0, 5).await?, 5);
    // Members read the new epoch from etcd at their next beat.
    let next = (first.leader_id, first.leader_epoch + 1);
    wait_until("the next leader epoch, same leader", deadline(&[LEASE_TTL]), async || {
        wait_placement(&cluster, 0).await.map(|p| (p.leader_id, p.leader_epoch) == next)
    })
    .await?;
    let (b2, r2) = batch(5, 4, 1, "new");
    let a = mirror.append_with_offsets(TOPIC, 0, SOURCE_TOPIC_ID, 0, b2).await?;
    assert_eq!((ErrorCode::try_from(a.error)?, a.log_end_offset), (ErrorCode::None, 9), "{}", a.message);
    let expected: Vec<Rec> = expected[..5].iter().cloned().chain(r2).collect();
    assert_same_records(
        "after truncation",
        &expected,
        &read_partition(&cluster.client_of(first.leader_id), TOPIC, 0).await,
    );
    wait_replicas_identical(&cluster, 0).await;

    // Source retention left a gap: partition 1 holds 0..3, then the source's log starts at 100. The leader
    // records the gap, and every follower copies the gap record with the data.
    let (b_before, r_before) = batch(0, 3, 0, "before-gap");
    let (b_gap, r_gap) = batch(100, 2, 0, "after-gap");
    for (b, start, leo) in [(b_before, 0, 3), (b_gap, 100, 102)] {
        let a = mirror.append_with_offsets(TOPIC, 1, SOURCE_TOPIC_ID, start, b).await?;
        assert_eq!((ErrorCode::try_from(a.error)?, a.log_end_offset), (ErrorCode::None, leo), "{}", a.message);
    }
    let gap_leader = wait_placement(&cluster, 1).await?.leader_id;
    let got: Vec<Rec> = read_partition(&cluster.client_of(gap_leader), TOPIC, 1).await;
    let want: Vec<Rec> = r_before.into_iter().chain(r_gap).map(|r| Rec { partition: 1, ..r }).collect();
    assert_same_records("around the gap", &want, &got);
    wait_replicas_identical(&cluster, 1).await;
    wait_every_member_partition(&cluster, 1, "every replica to hold the gap between 3 and 100", |p| {
        let gaps: Vec<(u64, u64)> = p.gaps.iter().map(|g| (g.start, g.end)).collect();
        (p.log_start_offset, p.log_end_offset, gaps) == (0, 102, vec![(3, 100)])
    })
    .await;

    // Config through broker 3, growth through broker 1: every member follows.
    let altered =
        admin(3).alter_topic_config(TOPIC, TopicConfig { retention_ms: Some(3_600_000), ..Default::default() }).await?;
    assert_eq!(altered.config.and_then(|c| c.retention_ms), Some(3_600_000));
    let grown = admin(1).alter_partitions(TOPIC, 3).await?;
    assert_eq!(grown.partitions, 3);
    assert_status(admin(2).alter_partitions(TOPIC, 2).await, Code::FailedPrecondition, &["only grow"]);
    wait_every_member(&cluster, "every member to take the new config and partition", |t| {
        t.partitions == 3 && t.config.as_ref().and_then(|c| c.retention_ms) == Some(3_600_000)
    })
    .await;
    wait_placement(&cluster, 2).await?;

    // Promotion through broker 2: one compare-and-swap, and every member stops taking mirrored data.
    let promoted = admin(2).promote(TOPIC).await?;
    assert!(promoted.was_mirror && promoted.topic.mirror.is_none(), "{promoted:?}");
    wait_every_member(&cluster, "every member to see the promotion", |t| t.mirror.is_none()).await;
    let (b3, _) = batch(9, 1, 1, "late");
    let late = mirror.append_with_offsets(TOPIC, 0, SOURCE_TOPIC_ID, 0, b3).await?;
    assert_eq!(ErrorCode::try_from(late.error)?, ErrorCode::NotAMirrorTopic, "{}", late.message);
    let own = producer.send(ProducerRecord::new(TOPIC, "local").with_partition(2)).await?.await?;
    assert_eq!((own.partition, own.offset), (2, 0));
    assert!(!admin(3).promote(TOPIC).await?.was_mirror, "a second promotion finds no mirror mark");
    producer.close().await;

    // Deletion through broker 3: every member removes its replicas; the name can be used again, as a new topic.
    admin(3).delete_topic(TOPIC).await?;
    wait_until("every member to drop the topic and its files", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        for (i, b) in cluster.brokers.iter().enumerate() {
            let gone = admin(i as u32 + 1).describe_topic(TOPIC).await.is_err_and(|e| e.code() == Some(Code::NotFound));
            if !gone || b.data_dir().join(TOPIC).exists() {
                return false;
            }
        }
        true
    })
    .await?;
    let again = admin(1).create_replicated_topic(TOPIC, 1, "raft3").await?;
    assert_ne!(again.topic_id, topic_id, "a re-created topic is a new topic");
    assert!(again.mirror.is_none());
    Ok(())
}
