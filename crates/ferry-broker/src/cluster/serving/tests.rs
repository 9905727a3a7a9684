//! A leader's answer to its followers' fetches: when a fetch waits, and what it carries.

use super::*;
use crate::node::replica::PartitionState;
use ferry_batch::{Compression, ProducerInfo, Record, encode_records};
use ferry_storage::LogConfig;
use tokio::sync::watch;

/// A partition led by broker 1, replicas 1 and 2 both in sync, holding `batches` one-record batches.
fn led(dir: &std::path::Path, batches: u64) -> Partition {
    let fs = ferry_storage::fs::os();
    let p = Partition::open(
        &fs,
        "t",
        0,
        dir.join("0"),
        LogConfig::default(),
        Default::default(),
        watch::channel(0).0,
        Some((1, 2)),
    )
    .unwrap();
    for o in 0..batches {
        p.log().append(&batch(o)).unwrap();
    }
    let state = PartitionState {
        replicas: vec![1, 2],
        leader: 1,
        leader_epoch: 3,
        isr: vec![1, 2],
        target: None,
        unclean_epoch: None,
    };
    p.replica().unwrap().become_leader(&*fs, &state, 1, batches).unwrap();
    p
}

fn batch(offset: u64) -> Bytes {
    let record =
        Record { offset, timestamp: 1, key: None, value: Some(Bytes::from(offset.to_string())), headers: vec![] };
    encode_records(&[record], 3, Compression::None, ProducerInfo::NONE)
}

fn serving() -> Serving {
    Serving::new(1, "h:1".into(), Arc::new(LeaseClock::new(Duration::from_secs(2))), Duration::from_secs(6))
}

/// Follower 2's fetch at `offset`, waiting up to 500 ms.
fn fetch(offset: u64) -> pb::ReplicaFetchRequest {
    pb::ReplicaFetchRequest {
        topic: "t".into(),
        partition: 0,
        offset,
        leader_epoch: 3,
        replica_id: 2,
        max_bytes: 1 << 20,
        max_wait_ms: 500,
        topic_id: String::new(),
        verified: true,
    }
}

/// Follower 2's fetch at `offset` against `p`, with the leader's longest wait `max_wait`: the answer, and how long
/// it took on the paused clock.
async fn timed(s: &Serving, p: &Partition, offset: u64, max_wait: u64) -> (pb::ReplicaFetchResponse, Duration) {
    let start = tokio::time::Instant::now();
    let answer = s.replica_fetch(p, fetch(offset), Duration::from_millis(max_wait)).await;
    (answer, start.elapsed())
}

/// The base offsets of the batches a fetch answer carries.
fn bases(answer: &pb::ReplicaFetchResponse) -> Vec<u64> {
    ferry_batch::split_verified(&answer.batches).unwrap().iter().map(|(h, _)| h.base_offset).collect()
}

#[tokio::test(start_paused = true)]
async fn a_fetch_that_moves_the_hw_is_answered_at_once_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = led(dir.path(), 2);
    let s = serving();
    // The follower holds both batches: its fetch at 2 moves the HW from 0 to 2, which it learns at once.
    let (answer, took) = timed(&s, &p, 2, 500).await;
    assert_eq!(answer.error, pb::ErrorCode::None as i32, "{}", answer.message);
    assert_eq!((answer.high_watermark, bases(&answer), answer.log_end_offset), (2, vec![], 2));
    assert_eq!(took, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_fetch_at_the_end_waits_for_the_next_batch_or_the_whole_wait() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(led(dir.path(), 2));
    let s = serving();
    s.replica_fetch(&p, fetch(2), Duration::from_millis(500)).await;
    // The HW known and nothing new: the fetch waits the whole wait, and no longer than the leader allows.
    let (answer, took) = timed(&s, &p, 2, 300).await;
    assert_eq!((answer.high_watermark, bases(&answer)), (2, vec![]));
    assert_eq!(took, Duration::from_millis(300));
    // A batch 2 ms into the wait ends it, and the answer carries it.
    let writer = {
        let p = Arc::clone(&p);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            p.log().append(&batch(2)).unwrap();
            p.replica().unwrap().nudge();
        })
    };
    let (answer, took) = timed(&s, &p, 2, 500).await;
    writer.await.unwrap();
    assert_eq!((answer.high_watermark, bases(&answer), answer.log_end_offset), (2, vec![2], 3));
    assert_eq!(took, Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_lagging_follower_is_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = led(dir.path(), 2);
    let s = serving();
    let (answer, took) = timed(&s, &p, 1, 500).await;
    assert_eq!((answer.high_watermark, bases(&answer)), (1, vec![1]));
    assert_eq!(took, Duration::ZERO);
}
