//! Tests of the fetch paths.
use super::*;
use crate::node::topic::TopicSettings;
use ferry_batch::{BatchBuilder, BatchIter, Compression, ProducerInfo};
use ferry_storage::LogConfig;

const MAX_BATCH: u64 = 64 * 1024;

/// A broker core whose batches are at most 64 KiB, with `topic` of `partitions` partitions, each holding
/// `batches` batches of ~50 KiB.
async fn core_with_backlog(partitions: u32, batches: usize) -> (tempfile::TempDir, Arc<BrokerCore>) {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { max_batch_bytes: MAX_BATCH, ..LogConfig::default() };
    let core = BrokerCore::open(ferry_storage::fs::os(), dir.path(), Some("test"), config, Default::default()).unwrap();
    let topic = core.create_topic("t", partitions, TopicSettings::default(), None).await.unwrap();
    for p in topic.partitions() {
        for _ in 0..batches {
            let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
            for i in 0..50 {
                b.push(i, 1, None, Some(&[7u8; 1000]), &[]);
            }
            p.produce(b.build(0, 0)).await.unwrap();
        }
    }
    (dir, Arc::new(core))
}

fn request(partitions: u32, offsets: &[u64], max_bytes: u64) -> pb::FetchRequest {
    pb::FetchRequest {
        partitions: (0..partitions)
            .map(|p| pb::PartitionFetch {
                topic: "t".into(),
                partition: p,
                offset: offsets[p as usize],
                max_bytes: 1024 * 1024,
                leader_epoch: None,
            })
            .collect(),
        max_wait_ms: 0,
        max_bytes,
    }
}

#[test]
fn large_partition_data_travels_alone_and_the_rest_together() {
    let data = |partition: u32, len: usize| pb::PartitionData {
        topic: "t".into(),
        partition,
        batches: bytes::Bytes::from(vec![partition as u8; len]),
        ..Default::default()
    };
    let round = vec![
        data(0, 10),
        data(1, OWN_RESPONSE_BYTES),
        data(2, 0),
        data(3, OWN_RESPONSE_BYTES - 1),
        data(4, 3 * OWN_RESPONSE_BYTES),
    ];
    let shape: Vec<Vec<(u32, usize)>> = responses(round.clone())
        .iter()
        .map(|r| r.partitions.iter().map(|d| (d.partition, d.batches.len())).collect())
        .collect();
    assert_eq!(
        shape,
        vec![
            vec![(1, OWN_RESPONSE_BYTES)],
            vec![(4, 3 * OWN_RESPONSE_BYTES)],
            vec![(0, 10), (2, 0), (3, OWN_RESPONSE_BYTES - 1)],
        ]
    );
    // Nothing lost or changed: the same partition data, each once.
    let mut back: Vec<pb::PartitionData> = responses(round.clone()).into_iter().flat_map(|r| r.partitions).collect();
    back.sort_by_key(|d| d.partition);
    assert_eq!(back, round);
    assert!(responses(Vec::new()).is_empty());
}

#[tokio::test]
async fn a_fetch_never_carries_more_than_the_response_limit_and_loses_nothing() {
    let (_dir, core) = core_with_backlog(4, 6).await;
    let limit = response_limit(MAX_BATCH);
    let token = CancellationToken::new();
    let mut offsets = vec![0u64; 4];
    let mut records = 0;
    let mut responses = 0;
    while offsets.iter().any(|&o| o < 300) {
        // The client asks for far more than one message may carry (16 MiB total, 1 MiB per partition).
        let r = fetch(
            &Reads::single(Arc::clone(&core)),
            request(4, &offsets, 16 * 1024 * 1024),
            Duration::ZERO,
            limit,
            0,
            &token,
        )
        .await;
        let total: u64 = r.partitions.iter().map(|d| d.batches.len() as u64).sum();
        assert!(total <= limit, "response of {total} bytes, limit {limit}");
        assert!(total > 0, "no progress at {offsets:?}");
        for d in &r.partitions {
            assert_eq!(d.error, pb::ErrorCode::None as i32, "{}", d.message);
            assert_eq!(d.log_end_offset, 300);
            let p = d.partition as usize;
            for item in BatchIter::new(&d.batches) {
                let (header, _) = item.unwrap();
                assert_eq!(header.base_offset, offsets[p], "partition {p} skipped or repeated data");
                records += header.record_count as u64;
                offsets[p] = header.next_offset();
            }
            assert_eq!(d.next_offset, offsets[p]);
        }
        responses += 1;
    }
    assert_eq!(records, 4 * 300);
    assert!(responses >= 4 * 6 * 50 * 1000 / limit as usize, "{responses} responses");
}

#[tokio::test]
async fn successive_fetches_serve_different_partitions_first() {
    let (_dir, core) = core_with_backlog(4, 6).await;
    let limit = response_limit(MAX_BATCH);
    let token = CancellationToken::new();
    for turn in 0..8 {
        let r = fetch(
            &Reads::single(Arc::clone(&core)),
            request(4, &[0; 4], 16 * 1024 * 1024),
            Duration::ZERO,
            limit,
            turn,
            &token,
        )
        .await;
        // The answer keeps the request's order; the partition of this turn was read first and got data.
        let order: Vec<u32> = r.partitions.iter().map(|d| d.partition).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
        assert!(!r.partitions[turn % 4].batches.is_empty(), "turn {turn}");
        let with_data = r.partitions.iter().filter(|d| !d.batches.is_empty()).count();
        assert!(with_data < 4, "the limit should leave some partitions out");
    }
}

#[tokio::test]
async fn partitions_without_room_report_their_position_or_range_error() {
    let (_dir, core) = core_with_backlog(3, 3).await;
    let limit = response_limit(MAX_BATCH);
    let token = CancellationToken::new();
    // The total budget is one byte: partition 0 gets one whole batch, the others no data.
    let r =
        fetch(&Reads::single(Arc::clone(&core)), request(3, &[0, 50, 999], 1), Duration::ZERO, limit, 0, &token).await;
    let d = &r.partitions;
    assert_eq!((d[0].error, d[0].next_offset), (pb::ErrorCode::None as i32, 50));
    assert!(!d[0].batches.is_empty());
    assert_eq!((d[1].error, d[1].next_offset, d[1].log_end_offset), (pb::ErrorCode::None as i32, 50, 150));
    assert!(d[1].batches.is_empty());
    assert_eq!(d[2].error, pb::ErrorCode::OffsetOutOfRange as i32);
    assert!(d[2].message.contains("offset 999 is out of range"), "{}", d[2].message);
    assert_eq!((d[2].log_start_offset, d[2].log_end_offset), (0, 150));
}

#[tokio::test]
async fn a_partition_this_broker_cannot_answer_for_points_at_the_leader_the_catalog_names() {
    let (_dir, core) = core_with_backlog(1, 1).await;
    let limit = response_limit(MAX_BATCH);
    let token = CancellationToken::new();
    let hints: LeaderHints = Some(Arc::new(|topic: &str, partition: u32| {
        (topic == "elsewhere" && partition == 2).then(|| pb::LeaderHint {
            leader_id: 3,
            leader_address: "10.0.0.3:7411".into(),
            leader_epoch: 7,
        })
    }));
    let ask = |topic: &str, partition: u32| pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: topic.into(),
            partition,
            offset: 0,
            max_bytes: 1024,
            leader_epoch: None,
        }],
        max_wait_ms: 0,
        max_bytes: 1024,
    };
    // Held here: read as usual. Unknown here and named by the catalog: not_leader with the leader.
    let reads = Reads::new(Arc::clone(&core), None, hints.clone());
    let here = fetch(&reads, ask("t", 0), Duration::ZERO, limit, 0, &token).await;
    assert_eq!((here.partitions[0].error, here.partitions[0].leader.is_none()), (pb::ErrorCode::None as i32, true));
    let away = fetch(&reads, ask("elsewhere", 2), Duration::ZERO, limit, 0, &token).await;
    let d = &away.partitions[0];
    assert_eq!(d.error, pb::ErrorCode::NotLeader as i32);
    assert_eq!(
        d.leader,
        Some(pb::LeaderHint { leader_id: 3, leader_address: "10.0.0.3:7411".into(), leader_epoch: 7 })
    );
    assert_eq!(d.message, "this broker does not lead elsewhere/2: broker 3 at 10.0.0.3:7411 does (leader epoch 7)");
    // Unknown to the catalog as well (or on a single broker): unknown_topic_or_partition, as before.
    for hints in [&hints, &None] {
        let reads = Reads::new(Arc::clone(&core), None, hints.clone());
        let nowhere = fetch(&reads, ask("nowhere", 0), Duration::ZERO, limit, 0, &token).await;
        assert_eq!(nowhere.partitions[0].error, pb::ErrorCode::UnknownTopicOrPartition as i32);
        assert_eq!(nowhere.partitions[0].leader, None);
    }
}
