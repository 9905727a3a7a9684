//! The message models' operator calls: describe a group (mode, members, backlog), unpin a serial group's active
//! member, a record's status and history, and the owner's periodic work (snapshots, resumed redrives, expiries).

use std::time::Duration;

use ferry_batch::Record;
use ferry_proto as pb;
use tokio_util::sync::CancellationToken;
use tonic::Request;

use super::share::{active_of, mode_pb};
use super::share_io::now;
use super::{BrokerService, DESCRIBE, READ, Rpc, ok};
use crate::error::BrokerError;
use crate::node::internal::QUEUES;
use crate::rpc::auth::{Scopes, caller};
use crate::share::core::Mode;
use crate::share::gauges::GroupGauges;
use crate::share::state::{Change, Event, change_of};
use crate::state::Replayed;

type Result<T> = std::result::Result<T, BrokerError>;

/// How often the owner looks after its groups.
const TICK: Duration = Duration::from_millis(500);
/// How often each group's whole state is written again.
const SNAPSHOT_EVERY_MS: i64 = 3_600_000;
/// Most transitions a history answer holds.
const MAX_HISTORY: usize = 1_000;

impl BrokerService {
    pub(super) async fn share_describe_rpc(
        &self,
        req: Request<pb::ShareDescribeRequest>,
    ) -> Rpc<pb::ShareDescribeResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("ShareDescribe", DESCRIBE, &req.group)?;
        let mut guard = self.share_lock(&req.group).await?;
        let now = now();
        self.share_housekeep(&mut guard, &req.group, now).await?;
        let Some(g) = guard.state().groups.get(&req.group).cloned() else {
            return Err(BrokerError::Group {
                group: req.group.clone(),
                kind: crate::error::GroupRefusal::UnknownMember,
                reason: "no queue, serial or broadcast group of this name has been joined".into(),
            }
            .into());
        };
        drop(guard);
        let Some(settings) = g.settings.clone() else { return ok(pb::ShareDescribeResponse::default()) };
        let active = active_of(&g);
        let mut members: Vec<pb::ShareMember> = g
            .rt
            .members
            .iter()
            .map(|(id, m)| pb::ShareMember {
                member_id: id.clone(),
                client_id: m.client_id.clone(),
                in_flight: g.parts.values().map(|p| p.locks.values().filter(|l| &l.member == id).count() as u32).sum(),
                active: settings.mode == Mode::Serial && active.as_deref() == Some(id.as_str()),
                joined_ms: (m.since / 1_000) as i64,
            })
            .collect();
        members.sort_by_key(|m| m.joined_ms);
        let mut partitions = Vec::new();
        for (tp, part) in &g.parts {
            let read = self.read_any(&tp.0, tp.1, u64::MAX, 1).await?;
            let (in_flight, failed, dead) = part.counts(now);
            let done_above = part.recs.values().filter(|r| r.done).count() as u64;
            let lag = read.end.saturating_sub(part.start);
            partitions.push(pb::SharePartitionBacklog {
                topic: tp.0.clone(),
                partition: tp.1,
                start_offset: part.start,
                end_offset: read.end,
                waiting: lag.saturating_sub(in_flight + failed + done_above),
                in_flight,
                failed,
                dead_lettered: dead,
                lag,
            });
        }
        if settings.mode == Mode::Broadcast {
            for (member, ps) in &g.positions {
                for (tp, pos) in ps {
                    let read = self.read_any(&tp.0, tp.1, u64::MAX, 1).await?;
                    partitions.push(pb::SharePartitionBacklog {
                        topic: format!("{}@{member}", tp.0),
                        partition: tp.1,
                        start_offset: *pos,
                        end_offset: read.end,
                        waiting: read.end.saturating_sub(*pos),
                        lag: read.end.saturating_sub(*pos),
                        ..Default::default()
                    });
                }
            }
        }
        ok(pb::ShareDescribeResponse {
            group: req.group,
            mode: mode_pb(settings.mode) as i32,
            members,
            partitions,
            lock_timeout_ms: settings.lock_ms as u32,
            window: settings.window,
            retry: Some(pb::RetryPolicy { backoff_ms: settings.backoff_ms.clone(), retries: Some(settings.retries) }),
            redeliveries: g.rt.counters.redeliveries,
            lock_expiries: g.rt.counters.lock_expiries,
            dead_lettered: g.rt.counters.dead_lettered,
            settled: g.rt.counters.settled,
        })
    }

    pub(super) async fn share_list_rpc(&self, req: Request<pb::ShareListRequest>) -> Rpc<pb::ShareListResponse> {
        let who = caller(&req)?;
        who.allow("ShareList", DESCRIBE)?;
        let k = req.into_inner().partition;
        if k >= QUEUES.partitions {
            return Err(BrokerError::InvalidArgument(format!(
                "{} has {} partitions; {k} is not one",
                QUEUES.name, QUEUES.partitions
            ))
            .into());
        }
        let guard = self.shares.lock(&self.state, k).await?;
        let mut groups: Vec<pb::ShareGroupSummary> = guard
            .state()
            .groups
            .iter()
            .filter_map(|(name, g)| {
                Some(pb::ShareGroupSummary {
                    group: name.clone(),
                    mode: mode_pb(g.settings.as_ref()?.mode) as i32,
                    members: g.rt.members.len() as u32,
                })
            })
            .collect();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        ok(pb::ShareListResponse { groups })
    }

    pub(super) async fn share_unpin_rpc(&self, req: Request<pb::ShareUnpinRequest>) -> Rpc<pb::ShareUnpinResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("ShareUnpin", Scopes::ADMIN, &req.group)?;
        let mut guard = self.share_lock(&req.group).await?;
        let now = now();
        let Some(g) = guard.state_mut().groups.get_mut(&req.group) else {
            return Err(
                BrokerError::InvalidArgument(format!("group \"{}\" is not a serial group here", req.group)).into()
            );
        };
        if g.settings.as_ref().map(|s| s.mode) != Some(Mode::Serial) {
            return Err(BrokerError::InvalidArgument(format!(
                "group \"{}\" is not a serial group; only a serial group has an active member",
                req.group
            ))
            .into());
        }
        let Some(old) = active_of(g) else { return ok(pb::ShareUnpinResponse { active: String::new() }) };
        let last = g.rt.members.values().map(|m| m.since).max().unwrap_or(0);
        if let Some(m) = g.rt.members.get_mut(&old) {
            m.since = last + 1;
        }
        self.share_release(&mut guard, &req.group, &old, Event::Released, now).await?;
        let active = guard.state().groups.get(&req.group).and_then(active_of).unwrap_or_default();
        tracing::info!(group = %req.group, from = %old, to = %active, "serial group unpinned");
        ok(pb::ShareUnpinResponse { active })
    }

    pub(super) async fn message_status_rpc(
        &self,
        req: Request<pb::MessageStatusRequest>,
    ) -> Rpc<pb::MessageStatusResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("MessageStatus", READ.or(Scopes::ADMIN), &req.topic)?;
        let guard = self.share_lock(&req.group).await?;
        let tp = (req.topic.clone(), req.partition);
        let Some(g) = guard.state().groups.get(&req.group) else {
            return Err(BrokerError::InvalidArgument(format!(
                "no queue, serial or broadcast group \"{}\" here",
                req.group
            ))
            .into());
        };
        let now = now();
        let (status, count, holder) = match g.parts.get(&tp) {
            Some(part) => (
                part.status(req.offset, now).name().to_owned(),
                part.recs.get(&req.offset).map_or(0, |r| r.deliveries),
                part.locks.get(&req.offset).map(|l| l.member.clone()).unwrap_or_default(),
            ),
            None => ("UNKNOWN".to_owned(), 0, String::new()),
        };
        let owned = guard.owned().clone();
        drop(guard);
        let collect = History { group: req.group.clone(), tp, offset: req.offset, out: Vec::new(), deliveries: 0 };
        let (h, _) = self.state.replay(&owned, collect).await?;
        let count = count.max(h.deliveries);
        // A dead letter below the start is settled as FAIL: its history says so.
        let status = if h.out.last().is_some_and(|t| t.event == "DEAD_LETTERED") { "FAIL".to_owned() } else { status };
        ok(pb::MessageStatusResponse { status, delivery_count: count, history: h.out, member_id: holder })
    }

    /// The owner's periodic work until `stop`: expiries of every loaded group, dead letters to finish, redrives to
    /// resume, and hourly snapshots.
    pub async fn run_share_tasks(self, stop: CancellationToken) {
        let mut timer = tokio::time::interval(TICK);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut snapshots: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = timer.tick() => {}
            }
            self.shares.forget_unowned(&self.state);
            let mut gauges = std::collections::BTreeMap::new();
            // Partition ends read once per tick, however many groups read the partition.
            let mut ends = std::collections::HashMap::new();
            for owned in self.state.owned(&QUEUES) {
                if let Err(e) = self.share_tick(owned.k, &mut snapshots, &mut gauges, &mut ends).await {
                    tracing::debug!(partition = owned.k, error = %e, "message-model housekeeping failed; retried next tick");
                }
            }
            self.share_gauges.set(gauges);
        }
    }

    async fn share_tick(
        &self,
        k: u32,
        snapshots: &mut std::collections::HashMap<String, i64>,
        gauges: &mut std::collections::BTreeMap<String, GroupGauges>,
        ends: &mut std::collections::HashMap<crate::share::Tp, u64>,
    ) -> Result<()> {
        let mut guard = self.shares.lock(&self.state, k).await?;
        let names: Vec<String> = guard.state().groups.keys().cloned().collect();
        let now = now();
        for group in names {
            self.share_housekeep(&mut guard, &group, now).await?;
            let Some(g) = guard.state().groups.get(&group) else { continue };
            if let Some(figures) = self.share_figures(g, now, ends).await {
                gauges.insert(group.clone(), figures);
            }
            if g.redrive.as_ref().is_some_and(|j| j.state == "RUNNING") && self.redrives.lock().insert(group.clone()) {
                let svc = self.clone();
                let name = group.clone();
                tokio::spawn(async move { svc.run_redrive(name).await });
            }
            let last = snapshots.entry(group.clone()).or_insert(now);
            if now - *last >= SNAPSHOT_EVERY_MS {
                let snap = Change::Snapshot(Box::new(g.snapshot()));
                self.share_write(&mut guard, &group, &[snap]).await?;
                snapshots.insert(group, now);
            }
        }
        Ok(())
    }
}

impl BrokerService {
    /// A group's figures for the metrics (its partitions' ends read now).
    async fn share_figures(
        &self,
        g: &crate::share::Group,
        now: i64,
        ends: &mut std::collections::HashMap<crate::share::Tp, u64>,
    ) -> Option<GroupGauges> {
        let settings = g.settings.as_ref()?;
        let mut f = GroupGauges {
            mode: settings.mode.name(),
            redeliveries: g.rt.counters.redeliveries,
            lock_expiries: g.rt.counters.lock_expiries,
            dead_lettered: g.rt.counters.dead_lettered,
            settled: g.rt.counters.settled,
            members: g.rt.members.len() as u64,
            ..GroupGauges::default()
        };
        for tp in g.parts.keys().chain(g.positions.values().flat_map(|ps| ps.keys())) {
            if !ends.contains_key(tp) {
                let end = self.read_any(&tp.0, tp.1, u64::MAX, 1).await.map_or(0, |r| r.end);
                ends.insert(tp.clone(), end);
            }
        }
        for (tp, part) in &g.parts {
            let (in_flight, retry_wait, _) = part.counts(now);
            f.backlog += ends[tp].saturating_sub(part.start);
            f.in_flight += in_flight;
            f.retry_wait += retry_wait;
        }
        for ps in g.positions.values() {
            let lag: u64 = ps.iter().map(|(tp, pos)| ends[tp].saturating_sub(*pos)).sum();
            f.backlog = f.backlog.max(lag);
        }
        Some(f)
    }
}

/// Collects one record's transitions from a replay of its group's partition.
struct History {
    group: String,
    tp: (String, u32),
    offset: u64,
    out: Vec<pb::MessageTransition>,
    deliveries: u32,
}

impl Replayed for History {
    fn apply(&mut self, _offset: u64, record: &Record) {
        let Some(c) = change_of(&self.group, record) else { return };
        let same = |t: &str, p: u32| t == self.tp.0 && p == self.tp.1;
        let tr = match c {
            Change::Delivered { t, p, offsets, member, at, lock_until }
                if same(&t, p) && offsets.contains(&self.offset) =>
            {
                self.deliveries += 1;
                pb::MessageTransition {
                    at_ms: at,
                    member_id: member,
                    event: "DELIVERED".into(),
                    delivery_count: self.deliveries,
                    error: String::new(),
                    detail: format!("locked until {lock_until}"),
                }
            }
            Change::Settled { t, p, offset, ev, member, at, error, not_before }
                if same(&t, p) && offset == self.offset =>
            {
                pb::MessageTransition {
                    at_ms: at,
                    member_id: member,
                    event: ev.name().into(),
                    delivery_count: self.deliveries,
                    error,
                    detail: if ev == Event::Retry { format!("retry at {not_before}") } else { String::new() },
                }
            }
            Change::DeadLettered { t, p, offset, member, at, dlq_offset } if same(&t, p) && offset == self.offset => {
                pb::MessageTransition {
                    at_ms: at,
                    member_id: member,
                    event: "DEAD_LETTERED".into(),
                    delivery_count: self.deliveries,
                    error: String::new(),
                    detail: format!("{}/0/{dlq_offset}", crate::share::dlq_topic(&self.group)),
                }
            }
            _ => return,
        };
        if self.out.len() < MAX_HISTORY {
            self.out.push(tr);
        }
    }
}
