//! The fetch session of a Ferry source: one streaming `Subscribe` carrying every partition of its set, with
//! per-partition byte credits taken from each lane's budget.
//!
//! Each partition is started (`PartitionStart`) at its lane's fetch position, tagged with the lane's seat; the
//! broker echoes the seat in every message of that partition, so data fetched before a re-seat is told apart
//! exactly. A re-seat is simply a new start (the broker replaces the partition's subscription); a lane that wants
//! no data is stopped. Credit is granted as the lane's budget frees up, at least a quarter of its window at a
//! time. Batches are parsed once, here, into zero-copy [`Batch`] values.
//!
//! The broker beats on a fixed period, so silence for several beats means a dead link: the session fails, and that
//! counts against the route. The session asks for changes-only beats (`SubscribeStart.changed_beats`): a beat
//! carries the partitions whose position changed, and every tenth beat every partition. A beat's position that
//! repeats, for the same seat, exactly the position the lane was last handed (and nothing but data-free beats came
//! between) is held back, as [`crate::lane::repeats`] says: so an idle partition's lane is not woken by every full
//! beat, and a broker that beats every partition every time (one from before changes-only beats) is followed the
//! same way. A lane that takes a new seat (it starts mirroring, or starts over) gets the next position as news.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_client::batch::{Batch, Batches};
use ferry_client::proto as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{FetchSession, PartitionSet, SessionEnd};
use crate::egress::{ActiveRoute, EgressHandle};
use crate::lane::budget::{Budget, Held};
use crate::lane::core::{SourceFault, SourcePos};
use crate::lane::link::LaneLink;
use crate::lane::repeats::Repeat;
use crate::metrics::Metrics;
use crate::state::Shared;
use crate::tp::SourceTp;

/// Tuning of the Ferry session.
#[derive(Debug, Clone)]
pub struct FerrySessionSettings {
    /// Largest response message.
    pub max_response_bytes: u64,
    /// The broker's position heartbeat period.
    pub heartbeat: Duration,
    /// How often credits are topped up.
    pub credit_tick: Duration,
}

impl Default for FerrySessionSettings {
    fn default() -> Self {
        FerrySessionSettings {
            max_response_bytes: 4 << 20,
            heartbeat: Duration::from_millis(500),
            credit_tick: Duration::from_millis(10),
        }
    }
}

/// The Ferry fetch session.
pub struct FerrySession {
    settings: FerrySessionSettings,
    egress: EgressHandle,
    metrics: Metrics,
    shared: Arc<Shared>,
}

impl FerrySession {
    /// A session with these settings, reporting the route's health to `egress` and counting what it receives.
    pub fn new(
        settings: FerrySessionSettings,
        egress: EgressHandle,
        metrics: Metrics,
        shared: Arc<Shared>,
    ) -> FerrySession {
        FerrySession { settings, egress, metrics, shared }
    }
}

/// One partition of the stream.
struct Sub {
    link: Arc<LaneLink>,
    /// The link's seat version this subscription follows.
    version: u64,
    /// The seat the data must carry; `None`: not subscribed (the lane wants no data now).
    seat: Option<u64>,
    /// Credit granted and not yet used.
    credit: Held,
    /// The position of the last beat handed to the lane under the current seat, while nothing else (data, an
    /// error) was handed on since.
    last_beat: Repeat<SourcePos>,
}

fn start(tp: &SourceTp, offset: u64, credit: u64, seat: u64) -> pb::PartitionStart {
    pb::PartitionStart {
        topic: tp.topic().to_owned(),
        partition: tp.partition,
        offset,
        credit_bytes: credit,
        seat,
        leader_epoch: None,
    }
}

fn stop_msg(tps: Vec<pb::TopicPartition>) -> pb::SubscribeRequest {
    pb::SubscribeRequest { kind: Some(pb::subscribe_request::Kind::Stop(pb::SubscribeStop { partitions: tps })) }
}

/// The source's error code, as the core reads it.
fn fault(code: pb::ErrorCode) -> SourceFault {
    match code {
        pb::ErrorCode::OffsetOutOfRange => SourceFault::OutOfRange,
        pb::ErrorCode::CorruptBatch => SourceFault::Corrupt,
        pb::ErrorCode::UnknownTopicOrPartition => SourceFault::Missing,
        other => SourceFault::Other(other.as_str_name().to_owned()),
    }
}

impl FerrySession {
    fn start_message(&self, starts: Vec<pb::PartitionStart>) -> pb::SubscribeRequest {
        pb::SubscribeRequest {
            kind: Some(pb::subscribe_request::Kind::Start(pb::SubscribeStart {
                partitions: starts,
                max_response_bytes: self.settings.max_response_bytes,
                idle_heartbeat_ms: u32::try_from(self.settings.heartbeat.as_millis()).unwrap_or(u32::MAX),
                changed_beats: true,
            })),
        }
    }

    /// Brings the subscriptions in line with the set and the lanes' seats: the starts and stops to send.
    fn reconcile(
        subs: &mut BTreeMap<SourceTp, Sub>,
        set: &PartitionSet,
    ) -> (Vec<pb::PartitionStart>, Vec<pb::TopicPartition>) {
        let (_, lanes) = set.snapshot();
        let mut starts = Vec::new();
        let mut stops = Vec::new();
        let wanted: BTreeMap<SourceTp, Arc<LaneLink>> = lanes.into_iter().map(|l| (l.tp.clone(), l)).collect();
        subs.retain(|tp, sub| {
            let keep = wanted.contains_key(tp);
            if !keep && sub.seat.is_some() {
                stops.push(pb::TopicPartition { topic: tp.topic().to_owned(), partition: tp.partition });
            }
            keep
        });
        for (tp, link) in wanted {
            let (version, wish) = link.seat();
            let sub = subs.entry(tp.clone()).or_insert_with(|| Sub {
                link: Arc::clone(&link),
                version: u64::MAX,
                seat: None,
                credit: Held::none(),
                last_beat: Repeat::default(),
            });
            if sub.version == version {
                continue;
            }
            sub.version = version;
            // A new seat starts afresh: credit granted under the old one is void, and its first beat is news.
            sub.credit = Held::none();
            sub.last_beat.forget();
            match wish {
                Some((seat, _)) => {
                    let budget = &link.budget;
                    let credit = budget.free();
                    sub.credit = budget.hold(credit);
                    sub.seat = Some(seat);
                    starts.push(start(&tp, link.fetch_from(), credit, seat));
                }
                None => {
                    if sub.seat.take().is_some() {
                        stops.push(pb::TopicPartition { topic: tp.topic().to_owned(), partition: tp.partition });
                    }
                }
            }
        }
        (starts, stops)
    }

    /// Credit top-ups for partitions whose free budget passed a quarter of their window. Only the partitions in
    /// `wanting` are looked at (those that received data, or started, since their credit was last whole), or every
    /// partition when `all`; a partition leaves `wanting` once everything its budget holds is credit outstanding:
    /// its lane holds none of its bytes, so nothing can free up before more data comes. With thousands of idle
    /// partitions, looking at every one on every tick would cost more than anything else the session does.
    fn credits(
        subs: &mut BTreeMap<SourceTp, Sub>,
        wanting: &mut HashSet<SourceTp>,
        all: bool,
    ) -> Option<pb::SubscribeRequest> {
        let mut partitions = Vec::new();
        let mut top_up = |tp: &SourceTp, sub: &mut Sub| -> bool {
            if sub.seat.is_none() {
                return false;
            }
            let budget = &sub.link.budget;
            let free = budget.free();
            if free > 0 && free >= (budget.window() / 4).max(1) {
                sub.credit.merge(budget.hold(free));
                partitions.push(pb::PartitionCredit {
                    topic: tp.topic().to_owned(),
                    partition: tp.partition,
                    bytes: free,
                });
            }
            // Still wanting while the lane holds bytes of it (they free up as it appends).
            sub.credit.bytes() < budget.held()
        };
        if all {
            wanting.clear();
            for (tp, sub) in subs.iter_mut() {
                if top_up(tp, sub) {
                    wanting.insert(tp.clone());
                }
            }
        } else {
            wanting.retain(|tp| subs.get_mut(tp).is_some_and(|sub| top_up(tp, sub)));
        }
        (!partitions.is_empty()).then_some(pb::SubscribeRequest {
            kind: Some(pb::subscribe_request::Kind::Credit(pb::SubscribeCredit { partitions })),
        })
    }

    /// Hands a response's partitions to their lanes. A partition this broker does not lead moves to the session of
    /// the leader its answer names (or back to the route's brokers when it names none).
    fn dispatch(
        &self,
        subs: &mut BTreeMap<SourceTp, Sub>,
        wanting: &mut HashSet<SourceTp>,
        set: &PartitionSet,
        resp: pb::SubscribeResponse,
    ) {
        // The batches of a response are slices of one receive buffer, which lives as long as any slice does. When
        // the response carries several partitions' data, each partition gets its own copy, so that a slow
        // partition's few pending bytes never pin the others' (already appended) megabytes: memory then stays what
        // the budgets count.
        let shared_buffer = resp.partitions.iter().filter(|d| !d.batches.is_empty()).count() > 1;
        // A response names a topic's partitions one after another: their name is made once.
        let mut topic: Arc<str> = Arc::from("");
        for d in resp.partitions {
            if *topic != *d.topic {
                topic = Arc::from(d.topic.as_str());
            }
            let tp = SourceTp { topic: Arc::clone(&topic), partition: d.partition };
            let Some(sub) = subs.get_mut(&tp) else { continue };
            let pos = SourcePos {
                log_start: d.log_start_offset,
                log_end: d.log_end_offset,
                epoch: d.epoch,
                topic_id: d.topic_id,
            };
            let code = pb::ErrorCode::try_from(d.error).unwrap_or(pb::ErrorCode::StorageError);
            if code == pb::ErrorCode::NotLeader && sub.seat == Some(d.seat) {
                let leader = d.leader.as_ref().map_or(0, |h| h.leader_id);
                tracing::debug!(partition = %tp, at = set.leader(), leader, "not the leader here; moving the partition's fetch");
                set.relocate(&tp, leader);
                continue;
            }
            if code != pb::ErrorCode::None {
                if sub.seat == Some(d.seat) {
                    sub.last_beat.forget();
                    sub.link.error(fault(code), d.message, pos);
                }
                continue;
            }
            if d.batches.is_empty() && sub.seat == Some(d.seat) {
                if sub.last_beat.news(&pos) {
                    sub.link.position(pos);
                }
                continue;
            }
            if sub.seat != Some(d.seat) {
                // Data of an older seat: its position is a fact all the same.
                sub.link.position(pos);
                continue;
            }
            sub.last_beat.forget();
            let bytes: Bytes = if shared_buffer { Bytes::copy_from_slice(&d.batches) } else { d.batches };
            let n = bytes.len() as u64;
            let batches: Vec<Batch> = match Batches::new(bytes).collect::<Result<Vec<_>, _>>() {
                Ok(b) => b,
                Err(e) => {
                    let message = format!("the source sent a malformed batch: {e}");
                    sub.link.error(SourceFault::Corrupt, message, pos);
                    continue;
                }
            };
            let records: u64 = batches.iter().map(|b| u64::from(b.record_count())).sum();
            self.metrics.received(records, n);
            self.shared.source_rates.add(records, n);
            let held = sub.credit.take(n, &sub.link.budget);
            sub.link.deliver(d.seat, batches, held, pos);
            wanting.insert(tp);
        }
    }
}

#[async_trait::async_trait]
impl FetchSession for FerrySession {
    async fn run(&mut self, route: Arc<ActiveRoute>, set: &PartitionSet, stop: &CancellationToken) -> SessionEnd {
        let Some(route_client) = &route.client else {
            return SessionEnd::Failed(format!("route {} has no Ferry client", route.name));
        };
        // A leader's session dials it at its address on the route's listener (the route's Metadata names it).
        let client = match set.leader() {
            0 => route_client.clone(),
            id => match route_client.for_broker(id) {
                Some(c) => c,
                None => {
                    if let Err(e) = route_client.metadata().await {
                        return SessionEnd::Failed(format!("cannot learn broker {id}'s address: {e}"));
                    }
                    match route_client.for_broker(id) {
                        Some(c) => c,
                        None => return SessionEnd::Failed(format!("the route's brokers do not name broker {id}")),
                    }
                }
            },
        };
        let mut raw = match client.raw().await {
            Ok(r) => r,
            Err(e) => return SessionEnd::Failed(format!("cannot connect: {e}")),
        };
        let changed = set.changed();
        let mut subs: BTreeMap<SourceTp, Sub> = BTreeMap::new();
        let (req_tx, req_rx) = mpsc::channel::<pb::SubscribeRequest>(256);
        let (starts, _) = Self::reconcile(&mut subs, set);
        // Partitions whose credit may need a top-up; every partition is looked at again after the SyncManager
        // resized budgets (a budget's free bytes grow without data only then).
        let mut wanting: HashSet<SourceTp> = subs.keys().cloned().collect();
        let mut resizes = Budget::resizes();
        if req_tx.send(self.start_message(starts)).await.is_err() {
            return SessionEnd::Failed("request channel closed".into());
        }
        let opened = tokio::select! {
            _ = stop.cancelled() => return SessionEnd::Shutdown,
            r = raw.subscribe(ReceiverStream::new(req_rx)) => r,
        };
        let mut stream = match opened {
            Ok(r) => r.into_inner(),
            Err(status) => return SessionEnd::Failed(format!("subscribe refused: {status}")),
        };
        tracing::info!(route = %route.name, leader = set.leader(), partitions = subs.len(), "source fetch stream open");
        // Credit is looked at every credit tick while some partition may want it; an idle session (no partition
        // wanting) is not woken a hundred times a second for nothing, only once a beat to watch the link and the
        // budgets.
        let mut credit_tick = tokio::time::interval(self.settings.credit_tick);
        credit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut beat_tick = tokio::time::interval(self.settings.heartbeat);
        beat_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The broker sends positions every heartbeat even when idle; silence means a dead link.
        let silence_limit = self.settings.heartbeat * 6 + Duration::from_secs(2);
        let mut last_message = tokio::time::Instant::now();
        let mut delivered = false;
        let closed = || SessionEnd::Failed("request channel closed".into());
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return SessionEnd::Shutdown,
                _ = changed.notified() => {
                    if set.is_empty() {
                        return SessionEnd::Drained;
                    }
                    let (starts, stops) = Self::reconcile(&mut subs, set);
                    wanting.extend(starts.iter().map(|p| SourceTp::new(p.topic.as_str(), p.partition)));
                    if !stops.is_empty() && req_tx.send(stop_msg(stops)).await.is_err() {
                        return closed();
                    }
                    if !starts.is_empty() && req_tx.send(self.start_message(starts)).await.is_err() {
                        return closed();
                    }
                }
                // Credits before data: under a steady flow a message is always ready, and a biased select that
                // looked at messages first would never grant credit, starving the pipeline on a long link.
                _ = credit_tick.tick(), if !wanting.is_empty() => {
                    let all = Budget::resized_since(&mut resizes);
                    if let Some(credit) = Self::credits(&mut subs, &mut wanting, all) && req_tx.send(credit).await.is_err() {
                        return closed();
                    }
                }
                _ = beat_tick.tick() => {
                    if last_message.elapsed() > silence_limit {
                        return SessionEnd::Failed(format!("no data or heartbeat from the source for {:?}", last_message.elapsed()));
                    }
                    if Budget::resized_since(&mut resizes)
                        && let Some(credit) = Self::credits(&mut subs, &mut wanting, true)
                        && req_tx.send(credit).await.is_err()
                    {
                        return closed();
                    }
                }
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        last_message = tokio::time::Instant::now();
                        if !delivered {
                            delivered = true;
                            self.egress.report_success(&route.name);
                        }
                        self.dispatch(&mut subs, &mut wanting, set, resp);
                        if set.is_empty() {
                            return SessionEnd::Drained;
                        }
                    }
                    Ok(None) => return SessionEnd::Failed("the source closed the fetch stream".into()),
                    Err(status) => return SessionEnd::Failed(format!("fetch stream error: {status}")),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
