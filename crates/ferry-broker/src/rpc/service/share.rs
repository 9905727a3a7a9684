//! The message models' calls (see `crate::share`): join, poll, ack and leave. The group's owner (the leader of
//! its `__ferry_queues` partition) answers; the decisions are `share::core`'s.

use std::time::Duration;

use ferry_batch::Record;
use ferry_proto as pb;
use tonic::Request;

use super::share_io::{now, record_retries};
use super::{BrokerService, READ, Rpc, ok};
use crate::error::BrokerError;
use crate::rpc::auth::{caller, member_scopes};
use crate::share::core::{self, Lock, Mode, Settings};
use crate::share::state::{Change, Event, MemberRt, entry};
use crate::share::{Group, Groups, Tp, check_group_name};
use crate::state::OwnerGuard;

type Result<T> = std::result::Result<T, BrokerError>;

/// Session timeouts a member may ask for, ms, and the default.
const SESSION_MS: (u64, u64, u64) = (1_000, 300_000, 10_000);
/// Most records one poll returns, and the default byte budget.
const MAX_POLL_RECORDS: u32 = 10_000;
const DEFAULT_POLL_BYTES: u64 = 1 << 20;
/// How often a long poll looks again.
const POLL_STEP: Duration = Duration::from_millis(10);

pub(super) fn mode_of(m: i32) -> Result<Mode> {
    match pb::ShareMode::try_from(m) {
        Ok(pb::ShareMode::Broadcast) => Ok(Mode::Broadcast),
        Ok(pb::ShareMode::Queue) => Ok(Mode::Queue),
        Ok(pb::ShareMode::Serial) => Ok(Mode::Serial),
        _ => Err(BrokerError::InvalidArgument(format!(
            "unknown group mode {m}: broadcast, queue or serial (partitioned groups join with JoinGroup)"
        ))),
    }
}

pub(super) fn mode_pb(m: Mode) -> pb::ShareMode {
    match m {
        Mode::Broadcast => pb::ShareMode::Broadcast,
        Mode::Queue => pb::ShareMode::Queue,
        Mode::Serial => pb::ShareMode::Serial,
    }
}

/// The member of `g` that is active (serial): the longest-lived.
pub(super) fn active_of(g: &Group) -> Option<String> {
    core::active_member(g.rt.members.iter().map(|(id, m)| (id.as_str(), m.since))).map(str::to_owned)
}

impl BrokerService {
    /// The partitions of `topics`, in order.
    pub(super) fn share_partitions(&self, topics: &[String]) -> Vec<Tp> {
        let mut out = Vec::new();
        for t in topics {
            for p in 0..self.partition_count(t).unwrap_or(0) {
                out.push((t.clone(), p));
            }
        }
        out
    }

    /// Locks the state of `group`'s partition of `__ferry_queues` (NOT_LEADER naming its owner elsewhere).
    pub(super) async fn share_lock(&self, group: &str) -> Result<OwnerGuard<'_, Groups>> {
        self.shares.lock_key(&self.state, group.as_bytes()).await
    }

    /// Writes `changes` to `group`'s state.
    pub(super) async fn share_write(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        group: &str,
        changes: &[Change],
    ) -> Result<()> {
        let entries: Vec<_> = changes.iter().map(|c| entry(group, c)).collect();
        guard.write(&entries).await
    }

    pub(super) async fn share_join_rpc(&self, req: Request<pb::ShareJoinRequest>) -> Rpc<pb::ShareJoinResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        check_group_name(&req.group).map_err(BrokerError::InvalidArgument)?;
        who.allow_group("ShareJoin", member_scopes(&req.group), &req.group)?;
        let mode = mode_of(req.mode)?;
        if req.topics.is_empty() {
            return Err(BrokerError::InvalidArgument(format!(
                "group \"{}\": a member must subscribe to a topic",
                req.group
            ))
            .into());
        }
        for t in &req.topics {
            who.allow_topic("ShareJoin", READ, t)?;
            if self.partition_count(t).is_none() {
                return Err(BrokerError::UnknownTopic { topic: t.clone() }.into());
            }
        }
        for (what, id) in [("member id", &req.member_id), ("client id", &req.client_id)] {
            if id.len() > 255 {
                return Err(BrokerError::InvalidArgument(format!(
                    "group \"{}\": the {what} is above 255 bytes",
                    req.group
                ))
                .into());
            }
        }
        let retry = req.retry.clone().unwrap_or_default();
        let asked = Settings {
            mode,
            lock_ms: if req.lock_timeout_ms == 0 { core::DEFAULT_LOCK_MS } else { u64::from(req.lock_timeout_ms) },
            window: if req.window == 0 { core::DEFAULT_WINDOW } else { req.window },
            backoff_ms: retry.backoff_ms.clone(),
            retries: retry.retries.unwrap_or(core::DEFAULT_RETRIES),
        };
        core::check_settings(asked.lock_ms, asked.window, &asked.backoff_ms, asked.retries)
            .map_err(|e| BrokerError::InvalidArgument(format!("group \"{}\": {e}", req.group)))?;
        let partitioned = self.groups.describe(&req.group);
        if !partitioned.members.is_empty() || !partitioned.offsets.is_empty() {
            return Err(BrokerError::InvalidArgument(format!(
                "group \"{}\" is a partitioned group (it has members or committed offsets); it cannot be joined as a {} group",
                req.group,
                mode.name()
            ))
            .into());
        }
        let session_ms = if req.session_timeout_ms == 0 {
            SESSION_MS.2
        } else {
            u64::from(req.session_timeout_ms).clamp(SESSION_MS.0, SESSION_MS.1)
        };
        let tps = self.share_partitions(&req.topics);
        let mut guard = self.share_lock(&req.group).await?;
        let g = guard.state().groups.get(&req.group).cloned().unwrap_or_default();
        let mut changes = Vec::new();
        let settings = match &g.settings {
            None => {
                changes.push(Change::Config(asked.clone()));
                asked
            }
            Some(s) if s.mode != mode => {
                return Err(BrokerError::InvalidArgument(format!(
                    "group \"{}\" is a {} group; it cannot be joined as a {} group",
                    req.group,
                    s.mode.name(),
                    mode.name()
                ))
                .into());
            }
            Some(s) => s.clone(),
        };
        let member_id = if req.member_id.is_empty() {
            let prefix =
                if req.client_id.is_empty() { "member" } else { &req.client_id[..req.client_id.len().min(200)] };
            format!("{prefix}-{}", uuid::Uuid::new_v4())
        } else {
            req.member_id.clone()
        };
        let mut cursor = std::collections::HashMap::new();
        for tp in &tps {
            let known = match mode {
                Mode::Broadcast => g.positions.get(&member_id).and_then(|ps| ps.get(tp)).copied(),
                Mode::Queue | Mode::Serial => g.parts.get(tp).map(|p| p.start),
            };
            let at = match known {
                Some(at) => at,
                None => {
                    let read = self.read_any(&tp.0, tp.1, u64::MAX, 1).await?;
                    let at = if req.from_earliest { read.log_start } else { read.end };
                    if mode != Mode::Broadcast {
                        changes.push(Change::Start { t: tp.0.clone(), p: tp.1, offset: at });
                    }
                    at
                }
            };
            cursor.insert(tp.clone(), at);
        }
        self.share_write(&mut guard, &req.group, &changes).await?;
        let now = now();
        let g = guard.state_mut().groups.entry(req.group.clone()).or_default();
        g.rt.joins += 1;
        let since = g.rt.members.get(&member_id).map_or(now as u64 * 1_000 + g.rt.joins % 1_000, |m| m.since);
        let kept = g.rt.members.get(&member_id).map(|m| m.cursor.clone());
        g.rt.members.insert(
            member_id.clone(),
            MemberRt {
                client_id: req.client_id.clone(),
                topics: req.topics.clone(),
                session_ms,
                last_seen_ms: now,
                since,
                cursor: kept.unwrap_or(cursor),
            },
        );
        let active = settings.mode == Mode::Serial && active_of(g).as_deref() == Some(member_id.as_str());
        tracing::info!(group = %req.group, member = %member_id, mode = settings.mode.name(), "message-model member joined");
        ok(pb::ShareJoinResponse {
            member_id,
            mode: mode_pb(settings.mode) as i32,
            active,
            lock_timeout_ms: settings.lock_ms as u32,
        })
    }

    pub(super) async fn share_poll_rpc(&self, req: Request<pb::SharePollRequest>) -> Rpc<pb::SharePollResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("SharePoll", member_scopes(&req.group), &req.group)?;
        if req.max_records > MAX_POLL_RECORDS {
            return Err(BrokerError::InvalidArgument(format!(
                "max_records {} is above {MAX_POLL_RECORDS}",
                req.max_records
            ))
            .into());
        }
        let wait = Duration::from_millis(u64::from(req.max_wait_ms)).min(self.max_fetch_wait);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let answer = self.share_take(&req).await?;
            if !answer.records.is_empty() || !answer.member_known || req.max_records == 0 {
                return ok(answer);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || self.shutdown.is_cancelled() {
                return ok(answer);
            }
            tokio::time::sleep(left.min(POLL_STEP)).await;
        }
    }

    /// One look for records for a member.
    async fn share_take(&self, req: &pb::SharePollRequest) -> Result<pb::SharePollResponse> {
        let mut guard = self.share_lock(&req.group).await?;
        let now = now();
        self.share_housekeep(&mut guard, &req.group, now).await?;
        let Some(g) = guard.state_mut().groups.get_mut(&req.group) else {
            return Ok(pb::SharePollResponse { member_known: false, ..Default::default() });
        };
        let Some(m) = g.rt.members.get_mut(&req.member_id) else {
            return Ok(pb::SharePollResponse { member_known: false, ..Default::default() });
        };
        m.last_seen_ms = now;
        let topics = m.topics.clone();
        let Some(settings) = g.settings.clone() else {
            return Ok(pb::SharePollResponse { member_known: false, ..Default::default() });
        };
        let active = settings.mode == Mode::Serial && active_of(g).as_deref() == Some(req.member_id.as_str());
        let mut out = pb::SharePollResponse { member_known: true, active, records: Vec::new() };
        if req.max_records == 0 || (settings.mode == Mode::Serial && !active) {
            return Ok(out);
        }
        let budget = if req.max_bytes == 0 {
            DEFAULT_POLL_BYTES
        } else {
            req.max_bytes.min(self.max_batch_bytes.max(DEFAULT_POLL_BYTES))
        };
        let mut tps = self.share_partitions(&topics);
        if !tps.is_empty() {
            let turn = (now as usize / 7) % tps.len();
            tps.rotate_left(turn);
        }
        for tp in tps {
            let left = req.max_records as usize - out.records.len();
            if left == 0 {
                break;
            }
            let got = match settings.mode {
                Mode::Broadcast => self.share_broadcast(&mut guard, req, &tp, left, budget).await?,
                Mode::Queue | Mode::Serial => {
                    self.share_acquire(&mut guard, req, &settings, &tp, left, budget, now).await?
                }
            };
            out.records.extend(got);
        }
        Ok(out)
    }

    /// A broadcast member's records of `tp` from its cursor.
    async fn share_broadcast(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        req: &pb::SharePollRequest,
        tp: &Tp,
        max: usize,
        budget: u64,
    ) -> Result<Vec<pb::ShareRecord>> {
        let Some(m) = guard.state().groups.get(&req.group).and_then(|g| g.rt.members.get(&req.member_id)) else {
            return Ok(Vec::new());
        };
        let cursor = match m.cursor.get(tp) {
            Some(c) => *c,
            // A partition added since the member joined: from its start.
            None => 0,
        };
        let read = self.read_any(&tp.0, tp.1, cursor, budget).await?;
        let mut next = cursor.max(read.log_start);
        let mut out = Vec::new();
        for r in read.records.into_iter().take(max) {
            next = r.offset + 1;
            out.push(share_record(tp, r, 1, 0));
        }
        if let Some(m) = guard.state_mut().groups.get_mut(&req.group).and_then(|g| g.rt.members.get_mut(&req.member_id))
        {
            m.cursor.insert(tp.clone(), next);
        }
        Ok(out)
    }

    /// Takes up to `max` records of `tp` for a queue or serial member: locked to it, their counts raised first.
    #[allow(clippy::too_many_arguments)]
    async fn share_acquire(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        req: &pb::SharePollRequest,
        settings: &Settings,
        tp: &Tp,
        max: usize,
        budget: u64,
        now: i64,
    ) -> Result<Vec<pb::ShareRecord>> {
        let group = &req.group;
        let Some(part) = guard.state().groups.get(group).and_then(|g| g.parts.get(tp)).cloned() else {
            // A partition added since the group started: from its beginning.
            let read = self.read_any(&tp.0, tp.1, u64::MAX, 1).await?;
            self.share_write(guard, group, &[Change::Start { t: tp.0.clone(), p: tp.1, offset: read.log_start }])
                .await?;
            return Ok(Vec::new());
        };
        let Some(from) = part.first_available(settings.window, now) else { return Ok(Vec::new()) };
        let read = self.read_any(&tp.0, tp.1, from, budget).await?;
        // Offsets the log no longer holds (retention) or never held (a gap) are skipped.
        let first = read.records.first().map_or(read.log_start.max(from.min(read.end)), |r| r.offset);
        let gap_end =
            if read.records.is_empty() && read.end > from && read.log_start > from { read.log_start } else { first };
        if from == part.start && gap_end > part.start {
            self.share_write(guard, group, &[Change::Start { t: tp.0.clone(), p: tp.1, offset: gap_end }]).await?;
        }
        let serial = settings.mode == Mode::Serial;
        let offsets: Vec<u64> = read.records.iter().map(|r| r.offset).collect();
        let Some(part) = guard.state().groups.get(group).and_then(|g| g.parts.get(tp)) else { return Ok(Vec::new()) };
        let picked = part.pick(&offsets, settings.window, now, max, serial);
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let mut deliver = Vec::new();
        let mut exhausted = Vec::new();
        for r in read.records.into_iter().filter(|r| picked.contains(&r.offset)) {
            let retries = record_retries(&r).unwrap_or(settings.retries);
            let deliveries = part.recs.get(&r.offset).map_or(0, |x| x.deliveries);
            if core::exhausted(deliveries, retries) {
                exhausted.push(r);
            } else {
                deliver.push((r, retries, deliveries + 1));
            }
        }
        for r in exhausted {
            let error = format!("delivery limit reached: {} deliveries without a success", settings.retries + 1);
            self.share_dead_letter(guard, group, tp, &r, "", &error, now).await?;
            if serial {
                return Ok(Vec::new());
            }
        }
        if deliver.is_empty() {
            return Ok(Vec::new());
        }
        let until = now + settings.lock_ms as i64;
        let offsets: Vec<u64> = deliver.iter().map(|(r, ..)| r.offset).collect();
        let change = Change::Delivered {
            t: tp.0.clone(),
            p: tp.1,
            offsets,
            member: req.member_id.clone(),
            at: now,
            lock_until: until,
        };
        self.share_write(guard, group, &[change]).await?;
        let Some(g) = guard.state_mut().groups.get_mut(group) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for (r, retries, count) in deliver {
            if count > 1 {
                g.rt.counters.redeliveries += 1;
            }
            if let Some(p) = g.parts.get_mut(tp) {
                p.locks.insert(r.offset, Lock { member: req.member_id.clone(), until_ms: until, retries });
            }
            out.push(share_record(tp, r, count, until));
        }
        Ok(out)
    }

    pub(super) async fn share_leave_rpc(&self, req: Request<pb::ShareLeaveRequest>) -> Rpc<pb::ShareLeaveResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("ShareLeave", member_scopes(&req.group), &req.group)?;
        let mut guard = self.share_lock(&req.group).await?;
        let gone =
            guard.state_mut().groups.get_mut(&req.group).is_some_and(|g| g.rt.members.remove(&req.member_id).is_some());
        if gone {
            self.share_release(&mut guard, &req.group, &req.member_id, Event::MemberGone, now()).await?;
            tracing::info!(group = %req.group, member = %req.member_id, "message-model member left");
        }
        ok(pb::ShareLeaveResponse {})
    }

    /// Returns every lock `member` holds to NEW, noting `ev` in the history.
    pub(super) async fn share_release(
        &self,
        guard: &mut OwnerGuard<'_, Groups>,
        group: &str,
        member: &str,
        ev: Event,
        now: i64,
    ) -> Result<()> {
        let Some(g) = guard.state_mut().groups.get_mut(group) else { return Ok(()) };
        let mut changes = Vec::new();
        for ((t, p), part) in g.parts.iter_mut() {
            for offset in part.release_member(member) {
                changes.push(settled(t, *p, offset, ev, member, now, "", 0));
            }
        }
        self.share_write(guard, group, &changes).await
    }
}

/// A history-only settlement record (or a success or retry).
#[allow(clippy::too_many_arguments)]
pub(super) fn settled(
    t: &str,
    p: u32,
    offset: u64,
    ev: Event,
    member: &str,
    at: i64,
    error: &str,
    not_before: i64,
) -> Change {
    Change::Settled {
        t: t.to_owned(),
        p,
        offset,
        ev,
        member: member.to_owned(),
        at,
        error: error.to_owned(),
        not_before,
    }
}

fn share_record(tp: &Tp, r: Record, delivery_count: u32, lock_until_ms: i64) -> pb::ShareRecord {
    pb::ShareRecord {
        topic: tp.0.clone(),
        partition: tp.1,
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key,
        value: r.value,
        headers: r.headers.into_iter().map(|h| pb::TxnHeader { key: h.key, value: h.value }).collect(),
        delivery_count,
        lock_until_ms,
    }
}
