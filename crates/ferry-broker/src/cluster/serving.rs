//! The serving side of a replicated partition: the driver that applies `cluster::core`'s rules to the node's
//! replica state on every client call and every follower fetch.
//!
//! - writes go through a gate that asks [`hw::may_write`] under the partition's write lock, with the leader's
//!   [`Authority`]; after each write, and after each follower fetch, the high watermark is recomputed
//!   ([`hw::high_watermark`] over the maximal ISR);
//! - acknowledgements wait for [`hw::ack`];
//! - client reads end where [`hw::readable_end`] says, and a read or position naming a leader epoch is answered
//!   only by the leader of that epoch (Kafka's KIP-320);
//! - followers' fetches are accepted only from a replica of the partition, and recorded by [`isr::on_fetch`];
//! - a failsafe confirmation is answered by [`fencing::answer`], and a promise given is recorded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto as pb;
use ferry_storage::{OffsetAppendOutcome, ReadResult};

use super::core::fencing::{self, Answer, Ask, Authority, Knows};
use super::core::{hw, isr};
use super::lease::LeaseClock;
use crate::error::{BrokerError, Result};
use crate::node::partition::{Partition, Produced};
use crate::node::replica::{Leading, NotLeading, Replica};

/// The serving side's shared state: this member's id, its lease clock and when it last read etcd.
#[derive(Debug, Clone)]
pub struct Serving {
    me: u32,
    address: String,
    lease: Arc<LeaseClock>,
    base: Instant,
    /// Nanoseconds after `base` of the last successful read of etcd, plus one; 0 when none.
    etcd_contact: Arc<AtomicU64>,
    /// How recent that read must be for this member to count as reaching etcd.
    fresh_within: Duration,
    /// Benchmarks only (`FERRY_BENCH_NO_FENCING`): every leader acts as one, lease or not, so that a benchmark can
    /// measure what self-fencing costs beside a run without it. Never in production.
    unfenced: bool,
}

/// The environment variable that turns self-fencing off, for a benchmark's side-by-side run only.
pub const NO_FENCING_VAR: &str = "FERRY_BENCH_NO_FENCING";

impl Serving {
    /// The serving side of member `me` (advertised at `address`), whose lease `lease` tracks; it counts as reaching
    /// etcd while its last successful read of it is at most `fresh_within` old.
    pub fn new(me: u32, address: String, lease: Arc<LeaseClock>, fresh_within: Duration) -> Serving {
        Serving {
            me,
            address,
            lease,
            base: Instant::now(),
            etcd_contact: Arc::new(AtomicU64::new(0)),
            fresh_within,
            unfenced: std::env::var_os(NO_FENCING_VAR).is_some_and(|v| v == "1"),
        }
    }

    /// This member's id.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// The lease clock.
    pub fn lease(&self) -> &Arc<LeaseClock> {
        &self.lease
    }

    /// Notes a successful read of etcd at `at`.
    pub fn etcd_answered(&self, at: Instant) {
        let n = u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        self.etcd_contact.fetch_max(n, Ordering::AcqRel);
    }

    /// Whether this member read etcd recently enough at `now` to count as reaching it.
    pub fn etcd_fresh(&self, now: Instant) -> bool {
        match self.etcd_contact.load(Ordering::Acquire) {
            0 => false,
            n => now.saturating_duration_since(self.base + Duration::from_nanos(n - 1)) <= self.fresh_within,
        }
    }

    /// The leader's authority at `now`.
    pub fn authority(&self, l: &Leading, now: Instant) -> Authority {
        if self.unfenced {
            return Authority::Lease;
        }
        fencing::authority(now, self.lease.until(), l.failsafe_until)
    }

    fn fenced(p: &Partition, why: String) -> BrokerError {
        BrokerError::LeaderFenced { topic: p.topic().to_owned(), partition: p.index(), why }
    }

    /// `Ok(epoch)` when this broker may act as `p`'s leader now (and, when `asked` names an epoch, leads that one).
    pub fn check_leading(&self, p: &Partition, asked: Option<u32>) -> Result<u32> {
        let Some(r) = p.replica() else { return Ok(0) };
        let now = Instant::now();
        let (epoch, authority) =
            r.with_leading(|l| (l.epoch, self.authority(l, now))).map_err(|n| p.not_leader_error(n))?;
        if let Authority::Fenced(why) = authority {
            return Err(Self::fenced(p, why));
        }
        self.check_epoch(p, asked, epoch)?;
        Ok(epoch)
    }

    fn check_epoch(&self, p: &Partition, asked: Option<u32>, current: u32) -> Result<()> {
        match asked {
            Some(asked) if asked != 0 && asked != current => Err(BrokerError::FencedLeaderEpoch {
                topic: p.topic().to_owned(),
                partition: p.index(),
                asked,
                current,
                leader: self.me,
                address: self.address.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The gate of a write to `p`: its leader epoch, or why this broker may not take it.
    fn gate<'a>(&'a self, p: &'a Partition) -> impl Fn(&Replica) -> Result<u32> + Send + Sync + 'a {
        move |r: &Replica| {
            let now = Instant::now();
            let (epoch, isr, authority) = r
                .with_leading(|l| (l.epoch, l.isr.clone(), self.authority(l, now)))
                .map_err(|n| p.not_leader_error(n))?;
            match hw::may_write(&isr, r.min_insync(), &authority) {
                Ok(()) => Ok(epoch),
                Err(why) if !authority.holds() => Err(Self::fenced(p, why)),
                Err(_) => Err(BrokerError::NotEnoughReplicas {
                    topic: p.topic().to_owned(),
                    partition: p.index(),
                    in_sync: isr.len(),
                    isr,
                    needed: r.min_insync(),
                }),
            }
        }
    }

    /// A client's produce to `p`.
    pub async fn produce(&self, p: &Partition, batches: Bytes) -> Result<Produced> {
        if p.replica().is_none() {
            return p.produce(batches).await;
        }
        let gate = self.gate(p);
        let produced = p.produce_gated(batches, Some(&gate)).await?;
        advance(p);
        Ok(produced)
    }

    /// The mirror's append with offsets to `p`.
    pub async fn append_mirrored(
        &self,
        p: &Partition,
        batches: Bytes,
        source_log_start: u64,
    ) -> Result<(OffsetAppendOutcome, u32)> {
        if p.replica().is_none() {
            return p.append_mirrored(batches, source_log_start, None).await;
        }
        let gate = self.gate(p);
        let out = p.append_mirrored(batches, source_log_start, Some(&gate)).await?;
        advance(p);
        Ok(out)
    }

    /// A client's read of `p` from `offset` (naming leader epoch `asked`, when it knows one).
    pub fn read(&self, p: &Partition, offset: u64, max_bytes: u64, asked: Option<u32>) -> Result<ReadResult> {
        let Some(r) = p.replica() else { return p.read(offset, max_bytes) };
        let now = Instant::now();
        let leo = p.log().log_end_offset();
        let decided = r
            .with_leading(|l| (l.epoch, hw::readable_end(r.hw(), leo, l.epoch_start, &self.authority(l, now))))
            .map_err(|n| p.not_leader_error(n))
            .and_then(|(epoch, end)| {
                self.check_epoch(p, asked, epoch)?;
                match end {
                    hw::ReadEnd::Serve(end) => Ok(Some(end)),
                    hw::ReadEnd::Behind(_) => Ok(None),
                    hw::ReadEnd::Fenced(why) => Err(Self::fenced(p, why)),
                }
            });
        p.read_within(offset, max_bytes, decided)
    }

    /// Waits until the in-sync set holds `produced` (the HW passed its last offset), for at most `timeout`. A write
    /// whose leader epoch moved on, whose ISR shrank below its minimum, or whose leader fenced itself, is not
    /// acknowledged.
    pub async fn await_ack(&self, p: &Partition, produced: &Produced, timeout: Duration) -> Result<()> {
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
        // A lapsing lease is noticed within a beat even while nothing changes.
        let recheck = (self.lease.ttl() / 10).max(Duration::from_millis(50));
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            let view = replica.with_leading(|l| (l.epoch, l.isr.clone(), self.authority(l, now)));
            let state = match &view {
                Ok((epoch, isr, authority)) => hw::ack(&hw::AckInput {
                    write_epoch: produced.leader_epoch,
                    last: produced.last_offset,
                    leading: Some(*epoch),
                    committed_isr: isr,
                    min_insync: replica.min_insync(),
                    hw: replica.hw(),
                    authority,
                }),
                Err(_) => hw::ack(&hw::AckInput {
                    write_epoch: produced.leader_epoch,
                    last: produced.last_offset,
                    leading: None,
                    committed_isr: &[],
                    min_insync: replica.min_insync(),
                    hw: 0,
                    authority: &Authority::Lease,
                }),
            };
            match state {
                hw::Ack::Acked => return Ok(()),
                hw::Ack::Refused(why) => return Err(refused(why)),
                hw::Ack::Waiting => {}
            }
            let wake = tokio::time::Instant::now() + recheck;
            if tokio::time::Instant::now() >= deadline {
                return Err(refused(format!("the in-sync replicas did not confirm it within {timeout:?}")));
            }
            let _ = tokio::time::timeout_at(wake.min(deadline), changes.changed()).await;
        }
    }

    /// Answers follower `req.replica_id`'s fetch (`caller` is the member the link authenticated): its offset is what
    /// it holds (the HW moves with it), then, when it has everything, waits up to `req.max_wait_ms` (at most
    /// `max_wait`) for data or a HW change.
    pub async fn replica_fetch(
        &self,
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
        let now = Instant::now();
        let recorded = replica.with_leading(|l| {
            if l.epoch != req.leader_epoch {
                return Err(NotLeading { leader: self.me, epoch: l.epoch, address: String::new() });
            }
            if !l.replicas.contains(&req.replica_id) || req.replica_id == self.me {
                return Ok(false);
            }
            let prev = l.followers.get(&req.replica_id).copied();
            l.followers.insert(req.replica_id, isr::on_fetch(prev, req.offset, leo, req.verified, now));
            Ok(true)
        });
        match recorded {
            Err(n) | Ok(Err(n)) => {
                let (code, msg) = not_leading(p, &n, req.leader_epoch);
                return refusal(code, msg, n.epoch);
            }
            Ok(Ok(false)) => {
                let msg = format!(
                    "{}/{}: broker {} holds no replica of the partition; its fetch is refused",
                    p.topic(),
                    p.index(),
                    req.replica_id
                );
                return refusal(pb::ErrorCode::NotLeader, msg, replica.leader_epoch());
            }
            Ok(Ok(true)) => {}
        }
        advance(p);
        // Nothing new for the follower (no data, and this fetch did not move the HW it will learn): wait.
        if req.offset >= leo && replica.hw() == hw_before && req.max_wait_ms > 0 {
            let wait = Duration::from_millis(u64::from(req.max_wait_ms)).min(max_wait);
            // Data or a HW change ends the wait; either is a change signal.
            let _ = tokio::time::timeout(wait, changes.changed()).await;
        }
        let log_start = p.log().log_start_offset();
        let from = req.offset.max(log_start);
        let read = match p.read_log_shared(from, req.max_bytes.max(1)) {
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

    /// A replica's answer to a leader's failsafe question about `p`; a confirmation is recorded as a promise.
    pub fn confirm(&self, p: &Partition, ask: Ask) -> Answer {
        let Some(r) = p.replica() else { return Answer::Refuse("not a replicated partition".into()) };
        let now = Instant::now();
        let known = r.known();
        let knows = Knows {
            epoch: known.epoch,
            leader: known.leader,
            etcd_fresh: self.etcd_fresh(now),
            frozen: known.frozen_until.is_some_and(|t| now < t),
        };
        let answer = fencing::answer(ask, knows);
        if answer == Answer::Confirm {
            r.learn_leader(ask.epoch, ask.leader);
            r.promise(ask.leader, now + fencing::grant_length(self.lease.ttl()));
        }
        answer
    }

    /// Whether this replica may start leading `epoch` now: no failsafe promise to a leader of an older epoch runs.
    pub fn may_begin(&self, r: &Replica, epoch: u32) -> bool {
        let known = r.known();
        let promised = known.promise.filter(|(leader, _)| *leader != self.me || known.epoch < epoch).map(|(_, t)| t);
        fencing::may_begin(Instant::now(), promised)
    }
}

/// Recomputes `p`'s high watermark on its leader: the rule of [`hw::high_watermark`] over the maximal ISR.
pub fn advance(p: &Partition) {
    let Some(r) = p.replica() else { return };
    let leo = p.log().log_end_offset();
    let target = r.with_leading(|l| {
        let counted = isr::counted(&l.isr, &l.proposed);
        let ends = l.follower_ends();
        hw::high_watermark(&hw::HwInput {
            me: r.broker_id(),
            leo,
            isr: &counted,
            followers: &ends,
            min_insync: r.min_insync(),
        })
    });
    if let Ok(target) = target {
        r.raise_hw(target);
    }
}

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

#[cfg(test)]
mod tests;
