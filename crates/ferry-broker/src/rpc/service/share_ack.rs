//! Settling records (acks, retries, dead letters) and the owner's housekeeping: ended locks, expired members, and
//! dead letters decided but not known written.

use ferry_batch::{ProducerInfo, Record};
use ferry_proto as pb;
use tonic::Request;

use super::share::{active_of, settled};
use super::share_io::{batch_of, header, now};
use super::{BrokerService, Rpc, ok};
use crate::error::BrokerError;
use crate::rpc::auth::{caller, member_scopes};
use crate::share::core::{self, AfterFailure, Mode};
use crate::share::state::{Change, Event};
use crate::share::{Groups, Tp, dlq_topic, headers, producer_id};
use crate::state::OwnerGuard;

type Result<T> = std::result::Result<T, BrokerError>;

/// Most acks in one call.
const MAX_ACKS: usize = 10_000;
/// Longest error text kept, bytes.
const MAX_ERROR_BYTES: usize = 4_096;

impl BrokerService {
    pub(super) async fn share_ack_rpc(&self, req: Request<pb::ShareAckRequest>) -> Rpc<pb::ShareAckResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("ShareAck", member_scopes(&req.group), &req.group)?;
        if req.acks.len() > MAX_ACKS {
            return Err(
                BrokerError::InvalidArgument(format!("{} acks in one call, above {MAX_ACKS}", req.acks.len())).into()
            );
        }
        if let Some(a) = req.acks.iter().find(|a| a.error.len() > MAX_ERROR_BYTES) {
            return Err(BrokerError::InvalidArgument(format!(
                "the error text of the ack of {}/{}/{} is {} bytes, above {MAX_ERROR_BYTES}",
                a.topic,
                a.partition,
                a.offset,
                a.error.len()
            ))
            .into());
        }
        let mut guard = self.share_lock(&req.group).await?;
        let now = now();
        self.share_housekeep(&mut guard, &req.group, now).await?;
        let Some(g) = guard.state_mut().groups.get_mut(&req.group) else {
            return Err(unknown_member(&req.group, &req.member_id).into());
        };
        let Some(m) = g.rt.members.get_mut(&req.member_id) else {
            return Err(unknown_member(&req.group, &req.member_id).into());
        };
        m.last_seen_ms = now;
        let Some(settings) = g.settings.clone() else { return Err(unknown_member(&req.group, &req.member_id).into()) };
        let mut results = Vec::with_capacity(req.acks.len());
        if settings.mode == Mode::Broadcast {
            let mut changes = Vec::new();
            for a in &req.acks {
                let tp = (a.topic.clone(), a.partition);
                let pos = g.positions.get(&req.member_id).and_then(|ps| ps.get(&tp)).copied().unwrap_or(0);
                if a.offset + 1 > pos {
                    g.positions.entry(req.member_id.clone()).or_default().insert(tp, a.offset + 1);
                    changes
                        .retain(|c| !matches!(c, Change::Position { t, p, .. } if *t == a.topic && *p == a.partition));
                    changes.push(Change::Position {
                        member: req.member_id.clone(),
                        t: a.topic.clone(),
                        p: a.partition,
                        offset: a.offset + 1,
                    });
                }
                results.push(result(a, pb::ErrorCode::None, String::new()));
            }
            self.share_write(&mut guard, &req.group, &changes).await?;
            return ok(pb::ShareAckResponse { results });
        }
        let mut changes = Vec::new();
        let mut dead = Vec::new();
        for a in &req.acks {
            let tp: Tp = (a.topic.clone(), a.partition);
            let held =
                g.parts.get(&tp).and_then(|p| p.locks.get(&a.offset)).filter(|l| l.member == req.member_id).cloned();
            let Some(lock) = held else {
                results.push(result(
                    a,
                    pb::ErrorCode::NotHeld,
                    format!(
                        "{}/{}/{} is not held by member {} (never delivered to it, its lock ended, or already settled)",
                        a.topic, a.partition, a.offset, req.member_id
                    ),
                ));
                continue;
            };
            let deliveries = g.parts.get(&tp).and_then(|p| p.recs.get(&a.offset)).map_or(1, |r| r.deliveries);
            let outcome = pb::AckOutcome::try_from(a.outcome).unwrap_or(pb::AckOutcome::Release);
            match outcome {
                pb::AckOutcome::Ack => {
                    g.rt.counters.settled += 1;
                    changes.push(settled(&a.topic, a.partition, a.offset, Event::Success, &req.member_id, now, "", 0));
                }
                pb::AckOutcome::Release => {
                    if let Some(p) = g.parts.get_mut(&tp) {
                        p.locks.remove(&a.offset);
                    }
                    changes.push(settled(&a.topic, a.partition, a.offset, Event::Released, &req.member_id, now, "", 0));
                }
                pb::AckOutcome::Retry => {
                    match core::after_failure(&settings, deliveries, lock.retries, a.retry_after_ms, now) {
                        AfterFailure::RetryAt(at) => {
                            changes.push(settled(
                                &a.topic,
                                a.partition,
                                a.offset,
                                Event::Retry,
                                &req.member_id,
                                now,
                                &a.error,
                                at,
                            ));
                        }
                        AfterFailure::DeadLetter => dead.push((tp, a.offset, a.error.clone())),
                    }
                }
                pb::AckOutcome::DeadLetter => dead.push((tp, a.offset, a.error.clone())),
            }
            results.push(result(a, pb::ErrorCode::None, String::new()));
        }
        self.share_write(&mut guard, &req.group, &changes).await?;
        for (tp, offset, error) in dead {
            let read = self.read_any(&tp.0, tp.1, offset, 1).await?;
            let Some(record) = read.records.into_iter().find(|r| r.offset == offset) else {
                return Err(BrokerError::Internal(format!(
                    "{}/{}/{offset} is no longer in the log; it cannot be dead-lettered",
                    tp.0, tp.1
                ))
                .into());
            };
            self.share_dead_letter(&mut guard, &req.group, &tp, &record, &req.member_id, &error, now).await?;
        }
        ok(pb::ShareAckResponse { results })
    }

    /// Dead-letters `record` of `tp`: the intent, the idempotent write to `{group}.dlq`, then the result.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn share_dead_letter(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        group: &str,
        tp: &Tp,
        record: &Record,
        member: &str,
        error: &str,
        now: i64,
    ) -> Result<()> {
        let seq = guard.state().groups.get(group).map_or(0, |g| g.dlq_seq);
        let intent = Change::DlqIntent {
            t: tp.0.clone(),
            p: tp.1,
            offset: record.offset,
            seq,
            member: member.to_owned(),
            at: now,
            error: error.to_owned(),
        };
        self.share_write(guard, group, &[intent]).await?;
        self.share_finish_dead_letter(guard, group, tp, record).await
    }

    /// Writes the dead letter an intent recorded (again, after a crash: the write is then a duplicate).
    async fn share_finish_dead_letter(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        group: &str,
        tp: &Tp,
        record: &Record,
    ) -> Result<()> {
        let Some(g) = guard.state().groups.get(group) else { return Ok(()) };
        let Some(intent) = g.intents.get(&(tp.clone(), record.offset)).cloned() else { return Ok(()) };
        let rec = g.parts.get(tp).and_then(|p| p.recs.get(&record.offset)).cloned().unwrap_or_default();
        let mut hs: Vec<_> =
            record.headers.iter().filter(|h| !headers::ALL.contains(&h.key.as_str())).cloned().collect();
        let first = if rec.first_fail_ms == 0 { intent.at } else { rec.first_fail_ms };
        hs.extend([
            header(headers::TOPIC, &tp.0),
            header(headers::PARTITION, tp.1),
            header(headers::OFFSET, record.offset),
            header(headers::GROUP, group),
            header(headers::CONSUMER, &intent.member),
            header(headers::ATTEMPTS, rec.deliveries),
            header(headers::ERROR, if intent.error.is_empty() { &rec.last_error } else { &intent.error }),
            header(headers::FIRST_FAILURE, first),
            header(headers::LAST_FAILURE, intent.at),
        ]);
        let dlq = dlq_topic(group);
        self.ensure_topic(&dlq).await?;
        let producer =
            ProducerInfo { producer_id: producer_id("dlq", group), producer_epoch: 0, base_sequence: intent.seq };
        let batch = batch_of(&[(record.key.clone(), record.value.clone(), hs, record.timestamp)], producer);
        let written = self.append_any(&dlq, 0, batch).await?;
        let done = Change::DeadLettered {
            t: tp.0.clone(),
            p: tp.1,
            offset: record.offset,
            member: intent.member.clone(),
            at: intent.at,
            dlq_offset: written.base_offset,
        };
        self.share_write(guard, group, &[done]).await?;
        if let Some(g) = guard.state_mut().groups.get_mut(group) {
            g.rt.counters.dead_lettered += 1;
        }
        tracing::info!(group, topic = %tp.0, partition = tp.1, offset = record.offset, dlq_offset = written.base_offset, "record dead-lettered");
        Ok(())
    }

    /// Ends what time ended: members whose session passed (their locks back to NEW), locks that ended (NEW again),
    /// and dead letters decided but not known written (written now).
    pub(super) async fn share_housekeep(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        group: &str,
        now: i64,
    ) -> Result<()> {
        let Some(g) = guard.state_mut().groups.get_mut(group) else { return Ok(()) };
        let gone: Vec<String> =
            g.rt.members
                .iter()
                .filter(|(_, m)| now.saturating_sub(m.last_seen_ms) > m.session_ms as i64)
                .map(|(id, _)| id.clone())
                .collect();
        let was_active = active_of(g);
        for id in &gone {
            g.rt.members.remove(id);
            tracing::warn!(group, member = %id, "message-model member's session timed out; its records are released");
        }
        let mut changes = Vec::new();
        for ((t, p), part) in g.parts.iter_mut() {
            for id in &gone {
                for offset in part.release_member(id) {
                    changes.push(settled(t, *p, offset, Event::MemberGone, id, now, "", 0));
                }
            }
            for (offset, member) in part.expire_locks(now) {
                g.rt.counters.lock_expiries += 1;
                changes.push(settled(t, *p, offset, Event::LockExpired, &member, now, "", 0));
            }
        }
        if !gone.is_empty() && g.settings.as_ref().is_some_and(|s| s.mode == Mode::Serial) && active_of(g) != was_active
        {
            tracing::info!(group, active = ?active_of(g), "serial group: another member is active now");
        }
        let intents: Vec<(Tp, u64)> = g.intents.keys().cloned().collect();
        self.share_write(guard, group, &changes).await?;
        for (tp, offset) in intents {
            let read = self.read_any(&tp.0, tp.1, offset, 1).await?;
            match read.records.into_iter().find(|r| r.offset == offset) {
                Some(record) => self.share_finish_dead_letter(guard, group, &tp, &record).await?,
                None => {
                    tracing::warn!(group, topic = %tp.0, partition = tp.1, offset, "a dead letter's record is gone from the log; not written")
                }
            }
        }
        Ok(())
    }
}

fn result(a: &pb::ShareAck, error: pb::ErrorCode, message: String) -> pb::ShareAckResult {
    pb::ShareAckResult {
        topic: a.topic.clone(),
        partition: a.partition,
        offset: a.offset,
        error: error as i32,
        message,
    }
}

fn unknown_member(group: &str, member: &str) -> BrokerError {
    BrokerError::Group {
        group: group.to_owned(),
        kind: crate::error::GroupRefusal::UnknownMember,
        reason: format!("member {member} is not in the group (expired?); join again"),
    }
}
