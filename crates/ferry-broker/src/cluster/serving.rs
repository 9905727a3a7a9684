//! The leader's side of replication: answering a follower's fetch and its leader-epoch question, and waiting for a
//! write's acknowledgement by the in-sync set.

use std::time::Duration;

use ferry_proto as pb;

use crate::error::{BrokerError, Result};
use crate::node::partition::{Partition, Produced};
use crate::node::replica::{AckState, NotLeading};

fn refusal(code: pb::ErrorCode, message: String, epoch: u32) -> pb::ReplicaFetchResponse {
    pb::ReplicaFetchResponse { error: code as i32, message, leader_epoch: epoch, ..Default::default() }
}

fn not_leading(p: &Partition, n: &NotLeading, asked: u32) -> (pb::ErrorCode, String) {
    if n.leader == p.replica().map_or(0, |r| r.broker_id()) {
        let msg =
            format!("{}/{}: the leader is at epoch {}, the follower asked at {asked}", p.topic(), p.index(), n.epoch);
        (pb::ErrorCode::FencedLeaderEpoch, msg)
    } else {
        let msg = format!("{}/{}: this broker does not lead the partition (leader {})", p.topic(), p.index(), n.leader);
        (pb::ErrorCode::NotLeader, msg)
    }
}

/// Answers follower `req.replica_id`'s fetch: its offset is what it holds (the HW moves with it), then, when it
/// has everything, waits up to `req.max_wait_ms` (at most `max_wait`) for data or a HW change.
pub async fn replica_fetch(
    p: &Partition,
    req: pb::ReplicaFetchRequest,
    max_wait: Duration,
) -> pb::ReplicaFetchResponse {
    let Some(replica) = p.replica() else {
        let msg = format!("{}/{} is not a replicated partition", p.topic(), p.index());
        return refusal(pb::ErrorCode::NotLeader, msg, 0);
    };
    let mut changes = replica.changes();
    changes.borrow_and_update();
    let leo = p.log().log_end_offset();
    if req.offset > leo {
        // The follower holds more than the leader: it must truncate first (it asks LeaderEpochEnd).
        let msg = format!("{}/{}: offset {} is past the leader's log end {leo}", p.topic(), p.index(), req.offset);
        return refusal(pb::ErrorCode::OffsetOutOfRange, msg, replica.leader_epoch());
    }
    let hw_before = replica.hw();
    if let Err(n) = replica.follower_fetched(req.replica_id, req.leader_epoch, req.offset, leo, req.verified) {
        let (code, msg) = not_leading(p, &n, req.leader_epoch);
        return refusal(code, msg, n.epoch);
    }
    // Nothing new for the follower (no data, and this fetch did not move the HW it will learn): wait.
    if req.offset >= leo && replica.hw() == hw_before && req.max_wait_ms > 0 {
        let wait = Duration::from_millis(u64::from(req.max_wait_ms)).min(max_wait);
        // Data or a HW change ends the wait; either is a change signal.
        let _ = tokio::time::timeout(wait, changes.changed()).await;
    }
    let log_start = p.log().log_start_offset();
    let from = req.offset.max(log_start);
    let read = match p.read_log(from, req.max_bytes.max(1)) {
        Ok(r) => r,
        Err(e) => return refusal(pb::ErrorCode::StorageError, e.client_message(), replica.leader_epoch()),
    };
    let epochs = replica
        .epochs_in_range(req.offset, read.next_offset)
        .into_iter()
        .map(|e| pb::EpochStart { leader_epoch: e.epoch, start_offset: e.start })
        .collect();
    pb::ReplicaFetchResponse {
        error: pb::ErrorCode::None as i32,
        message: String::new(),
        batches: read.batches,
        high_watermark: replica.hw(),
        log_start_offset: read.log_start_offset,
        log_end_offset: read.log_end_offset,
        leader_epoch: replica.leader_epoch(),
        epochs,
    }
}

/// Answers a follower's `LeaderEpochEnd`: the end of the largest epoch at or below the asked one.
pub fn leader_epoch_end(p: &Partition, req: &pb::LeaderEpochEndRequest) -> pb::LeaderEpochEndResponse {
    let refuse = |code: pb::ErrorCode, message: String| pb::LeaderEpochEndResponse {
        error: code as i32,
        message,
        ..Default::default()
    };
    let Some(replica) = p.replica() else {
        return refuse(pb::ErrorCode::NotLeader, format!("{}/{} is not replicated", p.topic(), p.index()));
    };
    match replica.leading() {
        Ok(l) if l.epoch == req.current_leader_epoch => {}
        Ok(l) => {
            let n = NotLeading { leader: replica.broker_id(), epoch: l.epoch, address: String::new() };
            let (code, msg) = not_leading(p, &n, req.current_leader_epoch);
            return refuse(code, msg);
        }
        Err(n) => {
            let (code, msg) = not_leading(p, &n, req.current_leader_epoch);
            return refuse(code, msg);
        }
    }
    let leo = p.log().log_end_offset();
    let (leader_epoch, end_offset) =
        replica.epoch_end(req.leader_epoch, leo).unwrap_or((req.leader_epoch, p.log().log_start_offset()));
    pb::LeaderEpochEndResponse { error: pb::ErrorCode::None as i32, message: String::new(), leader_epoch, end_offset }
}

/// Waits until the in-sync set holds `produced` (the HW passed its last offset), for at most `timeout`. A write
/// whose leader epoch moved on, or whose ISR shrank below two, is not acknowledged.
pub async fn await_ack(p: &Partition, produced: &Produced, timeout: Duration) -> Result<()> {
    let Some(replica) = p.replica() else { return Ok(()) };
    let mut changes = replica.changes();
    let deadline = tokio::time::Instant::now() + timeout;
    let refused = |why: String| BrokerError::NotAcknowledged {
        topic: p.topic().to_owned(),
        partition: p.index(),
        base: produced.base_offset,
        last: produced.last_offset,
        why,
    };
    loop {
        changes.borrow_and_update();
        match replica.ack_state(produced.leader_epoch, produced.last_offset) {
            AckState::Acked => return Ok(()),
            AckState::Refused(why) => return Err(refused(why)),
            AckState::Waiting => {}
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
            return Err(refused(format!("the in-sync replicas did not confirm it within {timeout:?}")));
        }
    }
}
