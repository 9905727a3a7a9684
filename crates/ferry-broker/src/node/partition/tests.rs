//! The partition's produce and offset-append rules against a real log.

use super::*;
use ferry_batch::{Compression, ProducerInfo, Record, encode_records};

fn partition(dir: &std::path::Path) -> Partition {
    let (arrivals, _) = watch::channel(0);
    Partition::open(
        &ferry_storage::fs::os(),
        "m",
        0,
        dir.join("0"),
        LogConfig::default(),
        Default::default(),
        arrivals,
        None,
    )
    .unwrap()
}

fn batch(base: u64, n: u64, epoch: u32) -> Bytes {
    let records: Vec<Record> = (base..base + n)
        .map(|o| Record {
            offset: o,
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(o.to_string())),
            headers: vec![],
        })
        .collect();
    encode_records(&records, epoch, Compression::None, ProducerInfo::NONE)
}

fn kind(r: Result<OffsetAppendOutcome>) -> Option<RefusalKind> {
    match r {
        Err(BrokerError::AppendRefused { kind, .. }) => Some(kind),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The records of `p`, as (offset, value).
fn values(p: &Partition) -> Vec<(u64, String)> {
    let read = p.log().read(0, 1 << 20).unwrap();
    batch::split_verified(&read.batches)
        .unwrap()
        .iter()
        .flat_map(|(_, bytes)| batch::decode_records(bytes).unwrap())
        .map(|r| (r.offset, String::from_utf8(r.value.unwrap().to_vec()).unwrap()))
        .collect()
}

#[tokio::test]
async fn a_produce_of_several_batches_that_fails_part_way_on_a_full_disk_writes_none_of_them() {
    use ferry_storage::fs::{PowerLoss, SimFs};
    let fs = SimFs::new();
    let config = LogConfig { flush: ferry_storage::FlushPolicy::Sync, ..LogConfig::default() };
    let open = |fs: &SimFs| {
        let fs: FsRef = Arc::new(fs.clone());
        Partition::open(
            &fs,
            "t",
            0,
            PathBuf::from("/data/t-0"),
            config.clone(),
            Default::default(),
            watch::channel(0).0,
            None,
        )
        .unwrap()
    };
    let p = open(&fs);
    p.produce(batch(0, 2, 0)).await.unwrap();
    let (one, two, three) = (batch(0, 3, 0), batch(0, 1, 0), batch(0, 2, 0));
    let request = Bytes::from([one.clone(), two.clone(), three.clone()].concat());
    // Room for the first batch of the request and a little more, not for the rest.
    fs.set_space_limit(Some(fs.used_bytes() + one.len() as u64 + 10));
    let err = p.produce(request.clone()).await.unwrap_err();
    assert!(matches!(err, BrokerError::Storage { .. }), "{err:?}");
    assert_eq!((err.code(), err.reason()), (tonic::Code::Internal, "storage_error"));
    assert_eq!(p.log().log_end_offset(), 2, "a refused request left some of its batches in the log");
    assert_eq!(values(&p), vec![(0, "0".into()), (1, "1".into())]);

    // Space is back: the same request is written whole, after what was there.
    fs.set_space_limit(None);
    let produced = p.produce(request).await.unwrap();
    assert_eq!((produced.base_offset, produced.last_offset, produced.log_end_offset), (2, 7, 8));
    let expected: Vec<(u64, String)> = [(0, "0"), (1, "1"), (2, "0"), (3, "1"), (4, "2"), (5, "0"), (6, "0"), (7, "1")]
        .into_iter()
        .map(|(o, v)| (o, v.to_string()))
        .collect();
    assert_eq!(values(&p), expected);
    // Acknowledged under sync flush: a power loss keeps exactly that.
    drop(p);
    let after = fs.power_loss(PowerLoss::DropUnsynced, 1);
    assert_eq!(values(&open(&after)), expected);
}

/// An idempotent batch of producer 7 at `seq`, `n` records valued `v{seq}..`.
fn idempotent(seq: i32, n: u64) -> Bytes {
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            offset: i,
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(format!("v{}", seq as u64 + i))),
            headers: vec![],
        })
        .collect();
    let producer = ProducerInfo { producer_id: 7, producer_epoch: 0, base_sequence: seq };
    encode_records(&records, 0, Compression::None, producer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_overtook_earlier_ones_of_its_producer_waits_for_them_and_is_written_after() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(partition(dir.path()));
    // Sequences 2.. and 0.. of a producer new here arrive in that order (a pipelining producer's requests run
    // as separate tasks), then 4.. and 2...
    for (ahead_at, ahead_n, next_at, next_n) in [(2, 2, 0, 2), (6, 1, 4, 2)] {
        let ahead = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.produce(idempotent(ahead_at, ahead_n)).await }
        });
        wait_for_waiter(&p).await;
        let next = p.produce(idempotent(next_at, next_n)).await.unwrap();
        let ahead = ahead.await.unwrap().unwrap();
        assert_eq!((next.base_offset, next.last_offset), (next_at as u64, (next_at + next_n as i32) as u64 - 1));
        assert_eq!((ahead.base_offset, ahead.last_offset), (ahead_at as u64, ahead_at as u64 + ahead_n - 1));
    }
    let expected: Vec<(u64, String)> = (0..7).map(|o| (o, format!("v{o}"))).collect();
    assert_eq!(values(&p), expected);

    // A batch past a gap that nothing fills is refused once the wait runs out, and writes nothing.
    let started = tokio::time::Instant::now();
    let err = p.produce(idempotent(9, 1)).await.unwrap_err();
    assert!(started.elapsed() >= SEQUENCE_GAP_WAIT, "refused before the wait ran out");
    assert_eq!(err.reason(), "out_of_sequence", "{err}");
    assert_eq!(p.log().log_end_offset(), 7);
    // A resend of a written batch is still a duplicate, answered at once with its offsets.
    let again = p.produce(idempotent(2, 2)).await.unwrap();
    assert_eq!((again.base_offset, again.last_offset), (2, 3));
}

/// Waits until a produce is parked on the sequence gap (it has taken and released the write lock).
async fn wait_for_waiter(p: &Partition) {
    let deadline = tokio::time::Instant::now() + SEQUENCE_GAP_WAIT;
    while p.arrivals.receiver_count() < 1 && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(p.arrivals.receiver_count(), 1, "the overtaking batch never waited");
}

#[tokio::test]
async fn every_offset_append_refusal_of_the_log_is_classified() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.append_with_offsets(batch(0, 5, 1), 0).await.unwrap();
    // Above the log end without a retention gap to explain it.
    assert_eq!(kind(p.append_with_offsets(batch(9, 1, 1), 0).await), Some(RefusalKind::Gap));
    // Straddling the log end.
    assert_eq!(kind(p.append_with_offsets(batch(3, 4, 1), 0).await), Some(RefusalKind::Straddle));
    // An older epoch after a newer one.
    assert_eq!(kind(p.append_with_offsets(batch(5, 1, 0), 0).await), Some(RefusalKind::EpochRegressed));
    // Offered batches out of order are a bad request, not an outcome against the log.
    let unordered = Bytes::from([batch(5, 2, 1), batch(6, 2, 1)].concat());
    let err = p.append_with_offsets(unordered, 0).await.unwrap_err();
    assert!(matches!(err, BrokerError::MalformedBatch { .. }), "{err:?}");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.to_string().contains("offsets must increase"), "{err}");
    assert_eq!(p.log().log_end_offset(), 5);
    // Below the log start (moved by a gap append to a log that had nothing): cannot be checked.
    let dir2 = tempfile::tempdir().unwrap();
    let q = partition(dir2.path());
    q.append_with_offsets(batch(100, 2, 0), 100).await.unwrap();
    assert_eq!(q.log().log_start_offset(), 100);
    assert_eq!(kind(q.append_with_offsets(batch(90, 2, 0), 100).await), Some(RefusalKind::Gap));
}
