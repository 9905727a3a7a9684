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
//!
//! Invariant: no response carries more than [`response_limit`] bytes of batches, whatever budgets the client
//! asks for, so a response always fits the gRPC message limit both ends apply
//! (`ferry_proto::max_message_bytes`). A partition whose next batch would cross the limit is answered with its
//! position only and served by the next response.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_proto as pb;
use ferry_storage::{ReadResult, StorageError};
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::cluster::serving::Serving;
use crate::error::BrokerError;
use crate::node::partition::Partition;
use crate::node::registry::BrokerCore;
use crate::rpc::auth::{Grant, Scopes};

mod beat;
use beat::{Beats, Said};

/// The shortest idle heartbeat a subscribe stream may ask for, ms.
const MIN_HEARTBEAT_MS: u64 = 10;

/// Bytes of batches one fetch or subscribe response may carry: twice the largest batch. The gRPC message limit is
/// `2 x max_batch_bytes + ferry_proto::MESSAGE_OVERHEAD_BYTES`, so this leaves the overhead for framing and the
/// other fields.
pub const fn response_limit(max_batch_bytes: u64) -> u64 {
    max_batch_bytes.saturating_mul(2)
}

/// Builds the per-partition error entry of a fetch-style response.
fn error_data(topic: &str, partition: u32, err: &BrokerError, topic_id: String) -> pb::PartitionData {
    let (code, error_offset) = match err {
        BrokerError::UnknownTopic { .. } | BrokerError::UnknownPartition { .. } => {
            (pb::ErrorCode::UnknownTopicOrPartition, None)
        }
        BrokerError::OffsetOutOfRange { .. } => (pb::ErrorCode::OffsetOutOfRange, None),
        BrokerError::NotLeader { .. } | BrokerError::LeaderFenced { .. } => (pb::ErrorCode::NotLeader, None),
        BrokerError::FencedLeaderEpoch { .. } => (pb::ErrorCode::FencedLeaderEpoch, None),
        BrokerError::Storage { source: StorageError::CorruptSegment { offset, .. }, .. } => {
            (pb::ErrorCode::CorruptBatch, *offset)
        }
        _ => (pb::ErrorCode::StorageError, None),
    };
    let (log_start_offset, log_end_offset) = match err {
        BrokerError::OffsetOutOfRange { log_start, log_end, .. } => (*log_start, *log_end),
        _ => (0, 0),
    };
    let leader = match err {
        BrokerError::NotLeader { leader, address, epoch, .. } => {
            Some(pb::LeaderHint { leader_id: *leader, leader_address: address.clone(), leader_epoch: *epoch })
        }
        BrokerError::FencedLeaderEpoch { leader, address, current, .. } => {
            Some(pb::LeaderHint { leader_id: *leader, leader_address: address.clone(), leader_epoch: *current })
        }
        BrokerError::LeaderFenced { .. } => Some(pb::LeaderHint::default()),
        _ => None,
    };
    pb::PartitionData {
        leader,
        topic: topic.to_owned(),
        partition,
        error: code as i32,
        message: err.client_message(),
        batches: Bytes::new(),
        log_start_offset,
        log_end_offset,
        epoch: 0,
        topic_id,
        next_offset: 0,
        error_offset,
        seat: 0,
        leader_epoch: 0,
    }
}

/// The error code, message and leader hint a multi-partition answer gives for `err` on `topic`/`partition` (a
/// partition this member cannot answer for points at the leader the catalog names).
pub(crate) fn classify(
    reads: &Reads,
    topic: &str,
    partition: u32,
    err: &BrokerError,
) -> (pb::ErrorCode, String, Option<pb::LeaderHint>) {
    let d = redirect(&reads.hints, error_data(topic, partition, err, String::new()));
    (pb::ErrorCode::try_from(d.error).unwrap_or(pb::ErrorCode::StorageError), d.message, d.leader)
}

/// Where a cluster member points a client for a partition it cannot answer for: the partition's leader as the
/// catalog names it (see `Replication::leader_hint`). `None` on a single broker.
pub type LeaderHints = Option<Arc<dyn Fn(&str, u32) -> Option<pb::LeaderHint> + Send + Sync>>;

/// What a read goes through: the broker's partitions, and on a cluster member its serving side (the leader's rules:
/// the readable end, the leader epoch a client names) and the catalog's leader hints.
#[derive(Clone)]
pub struct Reads {
    core: Arc<BrokerCore>,
    serving: Option<Serving>,
    hints: LeaderHints,
}

impl Reads {
    /// Reads of `core` through `serving` (a cluster member's), pointing at leaders through `hints`.
    pub fn new(core: Arc<BrokerCore>, serving: Option<Serving>, hints: LeaderHints) -> Reads {
        Reads { core, serving, hints }
    }

    /// Reads of a single broker's `core`.
    pub fn single(core: Arc<BrokerCore>) -> Reads {
        Reads { core, serving: None, hints: None }
    }

    fn read(&self, p: &Partition, offset: u64, max_bytes: u64, epoch: Option<u32>) -> Result<ReadResult, BrokerError> {
        match &self.serving {
            Some(s) => s.read(p, offset, max_bytes, epoch),
            None => p.read(offset, max_bytes),
        }
    }

    /// The leader epoch `p` is served under, or why it is not served here.
    pub(crate) fn check(&self, p: &Partition, epoch: Option<u32>) -> Result<u32, BrokerError> {
        match &self.serving {
            Some(s) => s.check_leading(p, epoch),
            None => Ok(0),
        }
    }
}

/// `d`, pointed at the partition's leader when this broker could not answer for it (an unknown partition: it holds
/// no replica; not_leader without a leader: its replica does not know who leads) and the catalog names one.
fn redirect(hints: &LeaderHints, mut d: pb::PartitionData) -> pb::PartitionData {
    let unknown = d.error == pb::ErrorCode::UnknownTopicOrPartition as i32;
    let leaderless = d.error == pb::ErrorCode::NotLeader as i32 && d.leader.as_ref().is_none_or(|l| l.leader_id == 0);
    if !unknown && !leaderless {
        return d;
    }
    let Some(hint) = hints.as_ref().and_then(|h| h(&d.topic, d.partition)) else { return d };
    d.error = pb::ErrorCode::NotLeader as i32;
    d.message = format!(
        "this broker does not lead {}/{}: broker {} at {} does (leader epoch {})",
        d.topic, d.partition, hint.leader_id, hint.leader_address, hint.leader_epoch
    );
    d.leader = Some(hint);
    d
}

fn read_one(
    reads: &Reads,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u64,
    epoch: Option<u32>,
) -> pb::PartitionData {
    let t = match reads.core.topic(topic) {
        Ok(t) => t,
        Err(e) => return error_data(topic, partition, &e, String::new()),
    };
    let topic_id = t.id();
    let p = match t.partition(partition) {
        Ok(p) => p,
        Err(e) => return error_data(topic, partition, &e, topic_id),
    };
    read_partition(reads, &p, offset, max_bytes, topic_id, epoch)
}

fn read_partition(
    reads: &Reads,
    p: &Partition,
    offset: u64,
    max_bytes: u64,
    topic_id: String,
    epoch: Option<u32>,
) -> pb::PartitionData {
    match reads.read(p, offset, max_bytes, epoch) {
        Ok(r) => pb::PartitionData {
            leader_epoch: p.replica().map_or(0, |r| r.leader_epoch()),
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
            seat: 0,
            leader: None,
        },
        Err(e) => {
            let mut d = error_data(p.topic(), p.index(), &e, topic_id);
            if d.log_end_offset == 0 {
                d.log_start_offset = p.log().log_start_offset();
                d.log_end_offset = p.visible_end();
            }
            d.epoch = p.log().epoch();
            d
        }
    }
}

/// Serves a long-poll fetch: answers at once when any partition has data or an error, else waits up to
/// `max_wait` for data to arrive and reads once more. The response carries at most `limit` bytes of batches
/// (see [`response_limit`]), however large the request's budgets are.
///
/// Partitions are read starting at index `turn % count` of the request and wrapping around (the answer keeps the
/// request's order), so that when the budget does not cover every partition with data, successive fetches
/// (the service passes a counter) serve different ones first instead of always the first few.
pub async fn fetch(
    reads: &Reads,
    req: pb::FetchRequest,
    max_wait: Duration,
    limit: u64,
    turn: usize,
    shutdown: &CancellationToken,
) -> pb::FetchResponse {
    let mut arrivals = reads.core.arrivals();
    let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_millis(u64::from(req.max_wait_ms)));
    loop {
        // Mark the current arrivals value as seen before reading, so an append between the read and the wait
        // still wakes us.
        arrivals.borrow_and_update();
        let mut budget = if req.max_bytes == 0 { limit } else { req.max_bytes.min(limit) };
        let mut total = 0u64;
        let count = req.partitions.len();
        let mut out: Vec<Option<pb::PartitionData>> = vec![None; count];
        let mut any = false;
        for i in (0..count).map(|k| (turn + k) % count) {
            let pf = &req.partitions[i];
            // Once the total budget is spent, later partitions report their position only.
            let mut data = if budget == 0 {
                unread(reads, &pf.topic, pf.partition, pf.offset, pf.leader_epoch)
            } else {
                let per = if pf.max_bytes == 0 { budget } else { pf.max_bytes.min(budget) };
                read_one(reads, &pf.topic, pf.partition, pf.offset, per, pf.leader_epoch)
            };
            let n = data.batches.len() as u64;
            // A read returns at least one whole batch, which may be more than the budget left: never let it take
            // the response past the limit (the first data of a response always fits: a batch is at most half).
            if total > 0 && total + n > limit {
                data.batches = Bytes::new();
                data.next_offset = pf.offset;
                budget = 0;
            } else {
                total += n;
                budget = budget.saturating_sub(n);
            }
            any |= !data.batches.is_empty() || data.error != pb::ErrorCode::None as i32;
            out[i] = Some(redirect(&reads.hints, data));
        }
        let out: Vec<pb::PartitionData> = out.into_iter().flatten().collect();
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

/// A subscribe stream's settings, as its client's starts set them.
struct Pace {
    /// Bytes of batches one response may carry.
    max_response: u64,
    /// The position beat's period.
    heartbeat: Duration,
    beats: Beats,
}

/// One partition of a subscribe stream.
struct Sub {
    offset: u64,
    credit: u64,
    /// The client's tag of this start, echoed in every message for the partition.
    seat: u64,
    /// Set once an error was reported, so it is not repeated on every loop.
    errored: bool,
    /// The leader epoch the client named for it.
    epoch: Option<u32>,
    /// What the last beat said of it.
    said: Said,
}

/// Runs one subscribe stream until the client goes away or the broker shuts down. No response carries more than
/// `limit` bytes of batches (see [`response_limit`]); a client's `max_response_bytes` is capped at it.
/// Each partition a Start adds must be one `who` may read (PERMISSION_DENIED ends the stream).
pub async fn subscribe(
    reads: Reads,
    who: Arc<Grant>,
    mut requests: tonic::Streaming<pb::SubscribeRequest>,
    tx: mpsc::Sender<Result<pb::SubscribeResponse, Status>>,
    limit: u64,
    shutdown: CancellationToken,
) {
    let core = Arc::clone(&reads.core);
    let hints = reads.hints.clone();
    let mut subs: BTreeMap<(String, u32), Sub> = BTreeMap::new();
    let max_subs = core.limits().max_subscribe_partitions as usize;
    let mut pace =
        Pace { max_response: limit.min(4 * 1024 * 1024), heartbeat: Duration::from_secs(1), beats: Beats::default() };
    let mut arrivals = core.arrivals();
    let mut next_heartbeat = tokio::time::Instant::now() + pace.heartbeat;
    // Where the next response starts: the first partition the last one had no room for. Without it, partitions
    // early in key order would take every response while they have backlog and credit, and starve the rest.
    let mut cursor: Option<(String, u32)> = None;
    loop {
        arrivals.borrow_and_update();
        // Positions on a fixed beat, busy or not, so the client always knows each log end (`beat` says which).
        if tokio::time::Instant::now() >= next_heartbeat {
            next_heartbeat = tokio::time::Instant::now() + pace.heartbeat;
            let positions = subs.iter_mut().map(|((topic, partition), sub)| {
                let d = redirect(&hints, position(&reads, topic, *partition, sub.offset, sub.epoch));
                (pb::PartitionData { seat: sub.seat, ..d }, &mut sub.said)
            });
            if let Some(beat) = pace.beats.next(positions) {
                if tx.send(Ok(beat)).await.is_err() {
                    return;
                }
                core.note_beat();
            }
        }
        // Send whatever is ready for partitions with credit.
        let mut batch_out = Vec::new();
        let mut size = 0u64;
        let order: Vec<(String, u32)> = match cursor.take() {
            Some(c) => subs.range(c.clone()..).chain(subs.range(..c)).map(|(k, _)| k.clone()).collect(),
            None => subs.keys().cloned().collect(),
        };
        for key in order {
            let Some(sub) = subs.get_mut(&key) else { continue };
            let (topic, partition) = (&key.0, &key.1);
            if sub.credit == 0 {
                continue;
            }
            if size >= pace.max_response {
                cursor = Some(key);
                break;
            }
            let Ok((topic_id, p)) = core.topic(topic).and_then(|t| Ok((t.id(), t.partition(*partition)?))) else {
                if !sub.errored {
                    sub.errored = true;
                    batch_out.push(pb::PartitionData {
                        seat: sub.seat,
                        ..redirect(&hints, read_one(&reads, topic, *partition, sub.offset, 1, sub.epoch))
                    });
                }
                continue;
            };
            if p.visible_end() <= sub.offset && !sub.errored && reads.check(&p, sub.epoch).is_ok() {
                continue;
            }
            let budget = sub.credit.min(pace.max_response - size);
            let data = pb::PartitionData {
                seat: sub.seat,
                ..redirect(&hints, read_partition(&reads, &p, sub.offset, budget, topic_id, sub.epoch))
            };
            if data.error != pb::ErrorCode::None as i32 {
                if !sub.errored {
                    sub.errored = true;
                    batch_out.push(data);
                }
                continue;
            }
            sub.errored = false;
            let n = data.batches.len() as u64;
            if n == 0 {
                continue;
            }
            // The first batch of a read may overdraw what is left of the response: leave it for the next one.
            if size > 0 && size + n > pace.max_response {
                cursor = Some(key);
                break;
            }
            size += n;
            sub.credit = sub.credit.saturating_sub(n);
            sub.offset = data.next_offset;
            batch_out.push(data);
        }
        if !batch_out.is_empty() {
            for response in responses(batch_out) {
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
            // Take in any credit or stop messages that arrived meanwhile before reading more.
            while let Some(msg) = requests.message().now_or_never() {
                match msg {
                    Ok(Some(req)) => {
                        if let Err(status) = apply(&who, &mut subs, req, limit, &mut pace, max_subs) {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                    }
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
                Ok(Some(req)) => {
                    if let Err(status) = apply(&who, &mut subs, req, limit, &mut pace, max_subs) {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
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

/// A partition's data of at least this many bytes travels in a Subscribe response of its own. A client keeps
/// received batches as slices of the buffer they arrived in, which lives as long as any slice does: alone in its
/// message, large data needs no copy to be freed independently of the other partitions' (the mirror copies
/// data that shares its message, so that memory stays what its budgets count).
const OWN_RESPONSE_BYTES: usize = 64 * 1024;

/// One round's partition data as Subscribe responses: each partition's large data alone, the rest together. Every
/// response is a subset of the round, so each stays within the round's size limit.
fn responses(round: Vec<pb::PartitionData>) -> Vec<pb::SubscribeResponse> {
    let (large, small): (Vec<_>, Vec<_>) = round.into_iter().partition(|d| d.batches.len() >= OWN_RESPONSE_BYTES);
    let mut out: Vec<pb::SubscribeResponse> =
        large.into_iter().map(|d| pb::SubscribeResponse { partitions: vec![d], beat: 0 }).collect();
    if !small.is_empty() {
        out.push(pb::SubscribeResponse { partitions: small, beat: 0 });
    }
    out
}

/// A fetch entry for a partition the response has no room left for: its position, or why it cannot be read at
/// `offset` (the same error a read would give), without reading any batch.
fn unread(reads: &Reads, topic: &str, partition: u32, offset: u64, epoch: Option<u32>) -> pb::PartitionData {
    let mut data = position(reads, topic, partition, offset, epoch);
    let (log_start, log_end) = (data.log_start_offset, data.log_end_offset);
    if data.error == pb::ErrorCode::None as i32 && (offset < log_start || offset > log_end) {
        let err = BrokerError::OffsetOutOfRange { topic: topic.to_owned(), partition, offset, log_start, log_end };
        let (topic_id, epoch) = (std::mem::take(&mut data.topic_id), data.epoch);
        data = error_data(topic, partition, &err, topic_id);
        data.epoch = epoch;
    }
    data
}

/// A data-less entry telling the client where a partition stands; a replicated partition's only at its leader
/// (elsewhere: not_leader with the hint), since only the leader knows the high watermark clients may read to.
fn position(reads: &Reads, topic: &str, partition: u32, offset: u64, epoch: Option<u32>) -> pb::PartitionData {
    match reads.core.topic(topic).and_then(|t| Ok((t.id(), t.partition(partition)?))) {
        Ok((topic_id, p)) => {
            let leader_epoch = match reads.check(&p, epoch) {
                Ok(e) => e,
                Err(e) => return error_data(topic, partition, &e, topic_id),
            };
            let log = p.log();
            pb::PartitionData {
                topic: topic.to_owned(),
                partition,
                error: pb::ErrorCode::None as i32,
                message: String::new(),
                batches: Bytes::new(),
                log_start_offset: log.log_start_offset(),
                log_end_offset: p.visible_end(),
                epoch: log.epoch(),
                topic_id,
                next_offset: offset,
                error_offset: None,
                seat: 0,
                leader: None,
                leader_epoch,
            }
        }
        Err(e) => error_data(topic, partition, &e, String::new()),
    }
}

/// Takes in one client message. A start that would make the stream follow more than `max_subs` partitions ends it
/// with RESOURCE_EXHAUSTED (partitions of topics that do not exist count too: each is answered with its error).
fn apply(
    who: &Grant,
    subs: &mut BTreeMap<(String, u32), Sub>,
    req: pb::SubscribeRequest,
    limit: u64,
    pace: &mut Pace,
    max_subs: usize,
) -> Result<(), Status> {
    match req.kind {
        Some(pb::subscribe_request::Kind::Start(start)) => {
            for p in &start.partitions {
                who.allow_topic("Subscribe", Scopes::READ, &p.topic)?;
            }
            if start.max_response_bytes > 0 {
                pace.max_response = start.max_response_bytes.max(64 * 1024).min(limit);
            }
            if start.idle_heartbeat_ms > 0 {
                // The floor is the mirror's lowest `sync.position_heartbeat` (10 ms): a client asking for a beat
                // that short gets it, rather than a silently slower one.
                pace.heartbeat = Duration::from_millis(u64::from(start.idle_heartbeat_ms).max(MIN_HEARTBEAT_MS));
            }
            pace.beats.changed_only |= start.changed_beats;
            let added = start.partitions.iter().filter(|p| !subs.contains_key(&(p.topic.clone(), p.partition))).count();
            if subs.len() + added > max_subs {
                return Err(BrokerError::LimitReached {
                    what: format!(
                        "a subscribe stream follows at most {max_subs} partitions; this one follows {} and asked for \
                         {added} more",
                        subs.len()
                    ),
                    key: "limits.max_subscribe_partitions",
                }
                .into());
            }
            for p in start.partitions {
                subs.insert(
                    (p.topic, p.partition),
                    Sub {
                        offset: p.offset,
                        credit: p.credit_bytes,
                        seat: p.seat,
                        errored: false,
                        epoch: p.leader_epoch,
                        said: Said::default(),
                    },
                );
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
    Ok(())
}

#[cfg(test)]
mod tests;
