//! Reading for consumers and mirrors: the long-poll `Fetch` over many partitions and the credit-based streaming
//! `Subscribe`.
//!
//! Both wait on the broker-wide arrivals signal (bumped by every append) rather than one signal per partition, so
//! a stream over 1,000 partitions costs one wake-up per append burst, not 1,000 waiters. After a wake-up only the
//! partitions whose log end moved past the reader's position are read.
//!
//! Subscribe's flow control is per partition: the server sends a partition's data only while its credit (bytes
//! granted by the client) is positive, and always sends whole batches, so one batch may overdraw the credit. A
//! mirror that stops granting credit for a slow partition stops that partition alone; HTTP/2 flow control below
//! bounds the rest.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use ferry_proto as pb;
use ferry_storage::StorageError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::core::BrokerCore;
use crate::error::BrokerError;
use crate::partition::Partition;

/// Builds the per-partition error entry of a fetch-style response.
fn error_data(topic: &str, partition: u32, err: &BrokerError, topic_id: String) -> pb::PartitionData {
    let (code, error_offset) = match err {
        BrokerError::UnknownTopic { .. } | BrokerError::UnknownPartition { .. } => {
            (pb::ErrorCode::UnknownTopicOrPartition, None)
        }
        BrokerError::OffsetOutOfRange { .. } => (pb::ErrorCode::OffsetOutOfRange, None),
        BrokerError::Storage { source: StorageError::CorruptSegment { offset, .. }, .. } => {
            (pb::ErrorCode::CorruptBatch, *offset)
        }
        _ => (pb::ErrorCode::StorageError, None),
    };
    let (log_start_offset, log_end_offset) = match err {
        BrokerError::OffsetOutOfRange { log_start, log_end, .. } => (*log_start, *log_end),
        _ => (0, 0),
    };
    pb::PartitionData {
        topic: topic.to_owned(),
        partition,
        error: code as i32,
        message: err.to_string(),
        batches: Bytes::new(),
        log_start_offset,
        log_end_offset,
        epoch: 0,
        topic_id,
        next_offset: 0,
        error_offset,
    }
}

/// Reads one partition for a fetch-style response.
fn read_one(core: &BrokerCore, topic: &str, partition: u32, offset: u64, max_bytes: u64) -> pb::PartitionData {
    let t = match core.topic(topic) {
        Ok(t) => t,
        Err(e) => return error_data(topic, partition, &e, String::new()),
    };
    let topic_id = t.id();
    let p = match t.partition(partition) {
        Ok(p) => p,
        Err(e) => return error_data(topic, partition, &e, topic_id),
    };
    read_partition(&p, offset, max_bytes, topic_id)
}

fn read_partition(p: &Partition, offset: u64, max_bytes: u64, topic_id: String) -> pb::PartitionData {
    match p.read(offset, max_bytes) {
        Ok(r) => pb::PartitionData {
            topic: p.topic().to_owned(),
            partition: p.index(),
            error: pb::ErrorCode::None as i32,
            message: String::new(),
            batches: r.batches,
            log_start_offset: r.log_start_offset,
            log_end_offset: r.log_end_offset,
            epoch: r.epoch,
            topic_id,
            next_offset: r.next_offset,
            error_offset: None,
        },
        Err(e) => {
            let mut d = error_data(p.topic(), p.index(), &e, topic_id);
            if d.log_end_offset == 0 {
                d.log_start_offset = p.log().log_start_offset();
                d.log_end_offset = p.log().log_end_offset();
            }
            d.epoch = p.log().epoch();
            d
        }
    }
}

/// Serves a long-poll fetch: answers at once when any partition has data or an error, else waits up to
/// `max_wait` for data to arrive and reads once more.
pub async fn fetch(
    core: &BrokerCore,
    req: pb::FetchRequest,
    max_wait: Duration,
    shutdown: &CancellationToken,
) -> pb::FetchResponse {
    let mut arrivals = core.arrivals();
    let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_millis(u64::from(req.max_wait_ms)));
    loop {
        // Mark the current arrivals value as seen before reading, so an append between the read and the wait
        // still wakes us.
        arrivals.borrow_and_update();
        let mut budget = if req.max_bytes == 0 { u64::MAX } else { req.max_bytes };
        let mut out = Vec::with_capacity(req.partitions.len());
        let mut any = false;
        for pf in &req.partitions {
            let per = if pf.max_bytes == 0 { budget } else { pf.max_bytes.min(budget) };
            // Once the total budget is spent, later partitions report their position only.
            let data = read_one(core, &pf.topic, pf.partition, pf.offset, if budget == 0 { 1 } else { per });
            let mut data = data;
            if budget == 0 && !data.batches.is_empty() {
                data.batches = Bytes::new();
                data.next_offset = pf.offset;
            }
            budget = budget.saturating_sub(data.batches.len() as u64);
            any |= !data.batches.is_empty() || data.error != pb::ErrorCode::None as i32;
            out.push(data);
        }
        if any || tokio::time::Instant::now() >= deadline {
            return pb::FetchResponse { partitions: out };
        }
        tokio::select! {
            changed = tokio::time::timeout_at(deadline, arrivals.changed()) => {
                if !matches!(changed, Ok(Ok(()))) {
                    // Timed out: answer with positions only (reading again would find nothing new).
                    return pb::FetchResponse { partitions: out };
                }
            }
            _ = shutdown.cancelled() => return pb::FetchResponse { partitions: out },
        }
    }
}

/// One partition of a subscribe stream.
struct Sub {
    offset: u64,
    credit: u64,
    /// Set once an error was reported, so it is not repeated on every loop.
    errored: bool,
}

/// Runs one subscribe stream until the client goes away or the broker shuts down.
pub async fn subscribe(
    core: Arc<BrokerCore>,
    mut requests: tonic::Streaming<pb::SubscribeRequest>,
    tx: mpsc::Sender<Result<pb::SubscribeResponse, Status>>,
    shutdown: CancellationToken,
) {
    let mut subs: BTreeMap<(String, u32), Sub> = BTreeMap::new();
    let mut max_response: u64 = 4 * 1024 * 1024;
    let mut heartbeat = Duration::from_millis(1000);
    let mut arrivals = core.arrivals();
    let mut next_heartbeat = tokio::time::Instant::now() + heartbeat;
    loop {
        arrivals.borrow_and_update();
        // Positions of every partition on a fixed beat, busy or not, so the client always knows each log end.
        if tokio::time::Instant::now() >= next_heartbeat {
            next_heartbeat = tokio::time::Instant::now() + heartbeat;
            let positions: Vec<pb::PartitionData> = subs
                .iter()
                .map(|((topic, partition), sub)| position(&core, topic, *partition, sub.offset))
                .collect();
            if !positions.is_empty() && tx.send(Ok(pb::SubscribeResponse { partitions: positions })).await.is_err() {
                return;
            }
        }
        // Send whatever is ready for partitions with credit.
        let mut batch_out = Vec::new();
        let mut size = 0u64;
        for ((topic, partition), sub) in subs.iter_mut() {
            if sub.credit == 0 || size >= max_response {
                continue;
            }
            let Ok((topic_id, p)) = core.topic(topic).and_then(|t| Ok((t.id(), t.partition(*partition)?))) else {
                if !sub.errored {
                    sub.errored = true;
                    batch_out.push(read_one(&core, topic, *partition, sub.offset, 1));
                }
                continue;
            };
            if p.log().log_end_offset() <= sub.offset && !sub.errored {
                continue;
            }
            let data = read_partition(&p, sub.offset, sub.credit.min(max_response - size), topic_id);
            if data.error != pb::ErrorCode::None as i32 {
                if !sub.errored {
                    sub.errored = true;
                    batch_out.push(data);
                }
                continue;
            }
            sub.errored = false;
            if data.batches.is_empty() {
                continue;
            }
            let n = data.batches.len() as u64;
            size += n;
            sub.credit = sub.credit.saturating_sub(n);
            sub.offset = data.next_offset;
            batch_out.push(data);
        }
        if !batch_out.is_empty() {
            if tx.send(Ok(pb::SubscribeResponse { partitions: batch_out })).await.is_err() {
                return;
            }
            // Take in any credit or stop messages that arrived meanwhile before reading more.
            while let Some(msg) = requests.message().now_or_never() {
                match msg {
                    Ok(Some(req)) => apply(&mut subs, req, &mut max_response, &mut heartbeat),
                    Ok(None) | Err(_) => return,
                }
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                let _ = tx.send(Err(Status::unavailable("broker shutting down"))).await;
                return;
            }
            msg = requests.message() => match msg {
                Ok(Some(req)) => apply(&mut subs, req, &mut max_response, &mut heartbeat),
                Ok(None) => return,
                Err(status) => {
                    tracing::debug!(%status, "subscribe stream closed by client");
                    return;
                }
            },
            changed = arrivals.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(next_heartbeat) => {}
        }
    }
}

/// A data-less entry telling the client where a partition stands.
fn position(core: &BrokerCore, topic: &str, partition: u32, offset: u64) -> pb::PartitionData {
    match core.topic(topic).and_then(|t| Ok((t.id(), t.partition(partition)?))) {
        Ok((topic_id, p)) => {
            let log = p.log();
            pb::PartitionData {
                topic: topic.to_owned(),
                partition,
                error: pb::ErrorCode::None as i32,
                message: String::new(),
                batches: Bytes::new(),
                log_start_offset: log.log_start_offset(),
                log_end_offset: log.log_end_offset(),
                epoch: log.epoch(),
                topic_id,
                next_offset: offset,
                error_offset: None,
            }
        }
        Err(e) => error_data(topic, partition, &e, String::new()),
    }
}

fn apply(subs: &mut BTreeMap<(String, u32), Sub>, req: pb::SubscribeRequest, max_response: &mut u64, heartbeat: &mut Duration) {
    match req.kind {
        Some(pb::subscribe_request::Kind::Start(start)) => {
            if start.max_response_bytes > 0 {
                *max_response = start.max_response_bytes.max(64 * 1024);
            }
            if start.idle_heartbeat_ms > 0 {
                *heartbeat = Duration::from_millis(u64::from(start.idle_heartbeat_ms).max(50));
            }
            for p in start.partitions {
                subs.insert((p.topic, p.partition), Sub { offset: p.offset, credit: p.credit_bytes, errored: false });
            }
        }
        Some(pb::subscribe_request::Kind::Credit(credit)) => {
            for c in credit.partitions {
                if let Some(sub) = subs.get_mut(&(c.topic, c.partition)) {
                    sub.credit = sub.credit.saturating_add(c.bytes);
                }
            }
        }
        Some(pb::subscribe_request::Kind::Stop(stop)) => {
            for tp in stop.partitions {
                subs.remove(&(tp.topic, tp.partition));
            }
        }
        None => {}
    }
}
