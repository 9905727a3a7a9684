//! SourceDcConsumer: one streaming `Subscribe` to the source cluster over the active egress route, carrying every
//! partition this process owns, with per-partition byte credits.
//!
//! Flow control: each partition may have at most `cap` bytes fetched and not yet appended (queued in its channel
//! or its TargetDcProducer, plus the copies of an append in flight) plus credit granted and not yet used; credit is
//! granted up to half the cap (see [`PartitionFlow::window`]). The consumer grants credit as the producer drains; a
//! paused, halted or slow partition simply stops getting credit, and the broker stops sending it, while the others
//! keep flowing. The caps add up to at most `sync.max_memory`.
//!
//! Restarts (a stream error, a route switch): the consumer bumps a generation, asks every partition to drop what
//! it has queued and to report where to fetch from (its cache offset), waits for the answers, and opens a new
//! stream there. Fetch errors and a silent stream (no message, not even the broker's position heartbeat, for
//! several heartbeat periods) count as failures of the active route for the Egress.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ferry_batch::BatchIter;
use ferry_client::proto as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::egress::{ActiveRoute, EgressHandle};
use crate::metrics::Metrics;
use crate::state::Shared;

/// Where the source partition stands, as of a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePos {
    /// Source log start.
    pub log_start: u64,
    /// Source log end.
    pub log_end: u64,
    /// Source partition epoch.
    pub epoch: u32,
    /// Source topic id.
    pub topic_id: String,
}

/// What the consumer hands a partition's TargetDcProducer.
#[derive(Debug)]
pub enum SourceMsg {
    /// Whole batches, and the position they were read at.
    Data {
        /// Batches back to back.
        batches: Bytes,
        /// Records in them.
        records: u64,
        /// Position.
        pos: SourcePos,
    },
    /// A position heartbeat.
    Position(SourcePos),
    /// The source reported an error for the partition.
    Error {
        /// Error code.
        code: pb::ErrorCode,
        /// Message.
        message: String,
        /// Position (log start/end are filled for OFFSET_OUT_OF_RANGE).
        pos: SourcePos,
    },
    /// Drop everything queued and report the fetch position (stream restart).
    Reset {
        /// The restart generation to acknowledge.
        generation: u64,
    },
}

/// Counters shared between the consumer and one partition's producer.
#[derive(Debug, Default)]
pub struct PartitionFlow {
    /// Bytes this partition holds: received from the source and not yet appended or dropped, plus the copies an
    /// append in flight makes of them.
    pub queued: AtomicU64,
    /// Where a (re)started stream fetches this partition from.
    pub fetch_position: AtomicU64,
    /// The last restart generation the producer acknowledged.
    pub reset_ack: AtomicU64,
    /// Per-partition byte cap (queued + outstanding credit).
    pub cap: AtomicU64,
    /// Largest append request of the partition (set with the cap, a fraction of it).
    pub request: AtomicU64,
}

impl PartitionFlow {
    /// Bytes that may be fetched ahead: half the cap. Of the rest, a quarter holds the two copies an append in
    /// flight makes of up to `request` (an eighth of the cap) bytes, the request body and its encoded message, and a
    /// quarter absorbs the whole batch the broker may send past the credit, so all of it stays within the cap.
    pub fn window(&self) -> u64 {
        self.cap.load(Ordering::Relaxed) / 2
    }

    /// Marks `bytes` as consumed (appended or dropped).
    pub fn consumed(&self, bytes: u64) {
        let _ = self.queued.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(q.saturating_sub(bytes)));
    }
}

/// The consumer's end of a partition.
#[derive(Debug, Clone)]
pub struct PartitionSink {
    /// Messages to the producer.
    pub tx: mpsc::UnboundedSender<SourceMsg>,
    /// Shared counters.
    pub flow: Arc<PartitionFlow>,
}

/// The restart protocol, shared by the Ferry and Kafka fetch paths: every sink that still has a producer is told to
/// drop what it queued (generation `generation`) and the call waits until each has acknowledged and published its
/// fetch position. Producers acknowledge between appends, and an append to a slow target may take a while: the wait
/// ends after 60 s or on shutdown regardless. Returns whether each sink's producer is still there.
pub(crate) async fn reset_sinks<'a>(
    sinks: impl IntoIterator<Item = &'a PartitionSink>,
    generation: u64,
    shutdown: &CancellationToken,
) -> Vec<bool> {
    let alive: Vec<(bool, Arc<PartitionFlow>)> =
        sinks.into_iter().map(|s| (s.tx.send(SourceMsg::Reset { generation }).is_ok(), Arc::clone(&s.flow))).collect();
    let all_acked =
        || alive.iter().filter(|(ok, _)| *ok).all(|(_, f)| f.reset_ack.load(Ordering::Acquire) >= generation);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !all_acked() && tokio::time::Instant::now() < deadline && !shutdown.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    alive.into_iter().map(|(ok, _)| ok).collect()
}

/// Applies a command to a fetch path's partitions while it has no stream open, shared by the Ferry and Kafka paths:
/// additions are built by `make`, removals dropped; a re-seat needs nothing, because the next stream starts from
/// each partition's fetch position.
pub(crate) fn apply_offline<T>(
    parts: &mut BTreeMap<(String, u32), T>,
    cmd: ConsumerCmd,
    make: impl Fn(&(String, u32), PartitionSink) -> T,
) {
    match cmd {
        ConsumerCmd::Add(list) => {
            for (tp, sink) in list {
                let part = make(&tp, sink);
                parts.insert(tp, part);
            }
        }
        ConsumerCmd::Remove(list) => {
            for tp in list {
                parts.remove(&tp);
            }
        }
        ConsumerCmd::Reseat(_) => {}
    }
}

/// Commands from the SyncManager and the producers.
#[derive(Debug)]
pub enum ConsumerCmd {
    /// Start fetching these partitions from their `fetch_position`.
    Add(Vec<((String, u32), PartitionSink)>),
    /// Stop fetching these partitions.
    Remove(Vec<(String, u32)>),
    /// Fetch this partition again from its `fetch_position` (after a truncation or resync).
    Reseat((String, u32)),
}

struct Assigned {
    sink: PartitionSink,
    /// Credit granted and not yet used.
    outstanding: u64,
}

/// Tuning of the consumer.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// Largest response message.
    pub max_response_bytes: u64,
    /// Broker position heartbeat period.
    pub heartbeat: Duration,
    /// How often credits are topped up.
    pub credit_tick: Duration,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        ConsumerSettings {
            max_response_bytes: 4 << 20,
            heartbeat: Duration::from_millis(500),
            credit_tick: Duration::from_millis(10),
        }
    }
}

/// The SourceDcConsumer.
pub struct SourceDcConsumer {
    cmds: mpsc::UnboundedReceiver<ConsumerCmd>,
    egress: EgressHandle,
    settings: ConsumerSettings,
    metrics: Metrics,
    shared: Arc<Shared>,
    parts: BTreeMap<(String, u32), Assigned>,
    generation: u64,
}

enum StreamEnd {
    Shutdown,
    RouteChanged,
    Failed(String),
}

impl SourceDcConsumer {
    /// A consumer fed by `cmds`, fetching over the Egress's active route.
    pub fn new(
        cmds: mpsc::UnboundedReceiver<ConsumerCmd>,
        egress: EgressHandle,
        settings: ConsumerSettings,
        metrics: Metrics,
        shared: Arc<Shared>,
    ) -> SourceDcConsumer {
        SourceDcConsumer { cmds, egress, settings, metrics, shared, parts: BTreeMap::new(), generation: 0 }
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut routes = self.egress.subscribe();
        let mut backoff = Duration::from_millis(100);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            // Without partitions there is nothing to stream: wait for work.
            if self.parts.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    cmd = self.cmds.recv() => match cmd {
                        Some(cmd) => { apply_offline(&mut self.parts, cmd, |_, sink| Assigned { sink, outstanding: 0 }); continue; }
                        None => return,
                    },
                }
            }
            let route = routes.borrow_and_update().clone();
            self.reset_partitions(&shutdown).await;
            let end = self.stream(&route, &mut routes, &shutdown).await;
            match end {
                StreamEnd::Shutdown => return,
                StreamEnd::RouteChanged => {
                    backoff = Duration::from_millis(100);
                }
                StreamEnd::Failed(reason) => {
                    tracing::warn!(route = %route.name, %reason, "source fetch stream failed");
                    self.egress.report_failure(&route.name, &reason);
                    route.cluster.reconnect();
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                        _ = routes.changed() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// The restart protocol: every partition drops what it queued and reports its fetch position.
    async fn reset_partitions(&mut self, shutdown: &CancellationToken) {
        self.generation += 1;
        let generation = self.generation;
        let alive = reset_sinks(self.parts.values().map(|a| &a.sink), generation, shutdown).await;
        // `retain` visits the map in key order, as `values` did.
        let mut alive = alive.into_iter();
        self.parts.retain(|_, _| alive.next().unwrap_or(false));
        for a in self.parts.values_mut() {
            a.outstanding = 0;
        }
    }

    fn start_message(&mut self, tps: &[(String, u32)]) -> pb::SubscribeRequest {
        let mut partitions = Vec::new();
        for tp in tps {
            if let Some(a) = self.parts.get_mut(tp) {
                let flow = &a.sink.flow;
                let credit = flow.window().saturating_sub(flow.queued.load(Ordering::Relaxed));
                a.outstanding = credit;
                partitions.push(pb::PartitionStart {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    offset: flow.fetch_position.load(Ordering::Acquire),
                    credit_bytes: credit,
                });
            }
        }
        pb::SubscribeRequest {
            kind: Some(pb::subscribe_request::Kind::Start(pb::SubscribeStart {
                partitions,
                max_response_bytes: self.settings.max_response_bytes,
                idle_heartbeat_ms: self.settings.heartbeat.as_millis() as u32,
            })),
        }
    }

    /// Runs one stream until it fails, the route changes or shutdown.
    async fn stream(
        &mut self,
        route: &Arc<ActiveRoute>,
        routes: &mut watch::Receiver<Arc<ActiveRoute>>,
        shutdown: &CancellationToken,
    ) -> StreamEnd {
        let Some(client) = &route.client else {
            return StreamEnd::Failed(format!("route {} has no Ferry client", route.name));
        };
        let mut raw = match client.raw().await {
            Ok(r) => r,
            Err(e) => return StreamEnd::Failed(format!("cannot connect: {e}")),
        };
        let (req_tx, req_rx) = mpsc::channel::<pb::SubscribeRequest>(256);
        let all: Vec<(String, u32)> = self.parts.keys().cloned().collect();
        let start = self.start_message(&all);
        if req_tx.send(start).await.is_err() {
            return StreamEnd::Failed("request channel closed".into());
        }
        let opened = tokio::select! {
            _ = shutdown.cancelled() => return StreamEnd::Shutdown,
            r = raw.subscribe(ReceiverStream::new(req_rx)) => r,
        };
        let mut stream = match opened {
            Ok(r) => r.into_inner(),
            Err(status) => return StreamEnd::Failed(format!("subscribe refused: {status}")),
        };
        tracing::info!(route = %route.name, partitions = all.len(), "source fetch stream open");
        let mut credit_tick = tokio::time::interval(self.settings.credit_tick);
        credit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The broker sends positions every heartbeat even when idle; silence means a dead link.
        let silence_limit = self.settings.heartbeat * 6 + Duration::from_secs(2);
        let mut last_message = tokio::time::Instant::now();
        let mut delivered = false;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return StreamEnd::Shutdown,
                changed = routes.changed() => {
                    if changed.is_err() { return StreamEnd::Shutdown; }
                    if routes.borrow().name != route.name || routes.borrow().generation != route.generation {
                        tracing::info!(from = %route.name, to = %routes.borrow().name, "route changed; restarting the fetch stream");
                        return StreamEnd::RouteChanged;
                    }
                }
                // Credits before data: under a steady flow a message is always ready, and a biased select that
                // looked at messages first would never grant credit, starving the pipeline on a long link.
                _ = credit_tick.tick() => {
                    if last_message.elapsed() > silence_limit {
                        return StreamEnd::Failed(format!("no data or heartbeat from the source for {:?}", last_message.elapsed()));
                    }
                    if let Some(credit) = self.credits() && req_tx.send(credit).await.is_err() {
                        return StreamEnd::Failed("request channel closed".into());
                    }
                }
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        last_message = tokio::time::Instant::now();
                        if !delivered {
                            delivered = true;
                            self.egress.report_success(&route.name);
                        }
                        let closed = self.dispatch(resp);
                        if !closed.is_empty() {
                            let stop = pb::SubscribeRequest { kind: Some(pb::subscribe_request::Kind::Stop(pb::SubscribeStop {
                                partitions: closed.into_iter().map(|(topic, partition)| pb::TopicPartition { topic, partition }).collect(),
                            })) };
                            if req_tx.send(stop).await.is_err() { return StreamEnd::Failed("request channel closed".into()); }
                        }
                    }
                    Ok(None) => return StreamEnd::Failed("the source closed the fetch stream".into()),
                    Err(status) => return StreamEnd::Failed(format!("fetch stream error: {status}")),
                },
                cmd = self.cmds.recv() => match cmd {
                    None => return StreamEnd::Shutdown,
                    Some(ConsumerCmd::Add(list)) => {
                        let tps: Vec<_> = list.iter().map(|(tp, _)| tp.clone()).collect();
                        for (tp, sink) in list {
                            self.parts.insert(tp, Assigned { sink, outstanding: 0 });
                        }
                        let start = self.start_message(&tps);
                        if req_tx.send(start).await.is_err() { return StreamEnd::Failed("request channel closed".into()); }
                    }
                    Some(ConsumerCmd::Remove(list)) => {
                        for tp in &list { self.parts.remove(tp); }
                        let stop = pb::SubscribeRequest { kind: Some(pb::subscribe_request::Kind::Stop(pb::SubscribeStop {
                            partitions: list.into_iter().map(|(topic, partition)| pb::TopicPartition { topic, partition }).collect(),
                        })) };
                        if req_tx.send(stop).await.is_err() { return StreamEnd::Failed("request channel closed".into()); }
                    }
                    Some(ConsumerCmd::Reseat(tp)) => {
                        if self.parts.contains_key(&tp) {
                            let stop = pb::SubscribeRequest { kind: Some(pb::subscribe_request::Kind::Stop(pb::SubscribeStop {
                                partitions: vec![pb::TopicPartition { topic: tp.0.clone(), partition: tp.1 }],
                            })) };
                            let start = self.start_message(std::slice::from_ref(&tp));
                            if req_tx.send(stop).await.is_err() || req_tx.send(start).await.is_err() {
                                return StreamEnd::Failed("request channel closed".into());
                            }
                        }
                    }
                },
            }
        }
    }

    /// Credit top-ups for partitions whose free space passed a quarter of their window.
    fn credits(&mut self) -> Option<pb::SubscribeRequest> {
        let mut partitions = Vec::new();
        for ((topic, partition), a) in self.parts.iter_mut() {
            let flow = &a.sink.flow;
            let window = flow.window();
            let used = flow.queued.load(Ordering::Relaxed).saturating_add(a.outstanding);
            let free = window.saturating_sub(used);
            if free > 0 && free >= (window / 4).max(1) {
                a.outstanding += free;
                partitions.push(pb::PartitionCredit { topic: topic.clone(), partition: *partition, bytes: free });
            }
        }
        if partitions.is_empty() {
            return None;
        }
        Some(pb::SubscribeRequest {
            kind: Some(pb::subscribe_request::Kind::Credit(pb::SubscribeCredit { partitions })),
        })
    }

    fn dispatch(&mut self, resp: pb::SubscribeResponse) -> Vec<(String, u32)> {
        let mut closed = Vec::new();
        // The batches of a response are slices of one receive buffer, which lives as long as any slice does. When
        // the response carries several partitions' data, each partition gets its own copy, so that a slow
        // partition's few pending bytes never pin the others' (already appended) megabytes: memory then stays
        // what the per-partition caps count.
        let shared_buffer = resp.partitions.iter().filter(|d| !d.batches.is_empty()).count() > 1;
        for d in resp.partitions {
            let Some(a) = self.parts.get_mut(&(d.topic.clone(), d.partition)) else { continue };
            let pos = SourcePos {
                log_start: d.log_start_offset,
                log_end: d.log_end_offset,
                epoch: d.epoch,
                topic_id: d.topic_id.clone(),
            };
            let code = pb::ErrorCode::try_from(d.error).unwrap_or(pb::ErrorCode::StorageError);
            let msg = if code != pb::ErrorCode::None {
                SourceMsg::Error { code, message: d.message, pos }
            } else if d.batches.is_empty() {
                SourceMsg::Position(pos)
            } else {
                let bytes = d.batches.len() as u64;
                let records: u64 = BatchIter::new(&d.batches).flatten().map(|(h, _)| u64::from(h.record_count)).sum();
                a.outstanding = a.outstanding.saturating_sub(bytes);
                a.sink.flow.queued.fetch_add(bytes, Ordering::Relaxed);
                self.metrics.received(records, bytes);
                self.shared.source_rates.add(records, bytes);
                let batches = if shared_buffer { Bytes::copy_from_slice(&d.batches) } else { d.batches };
                SourceMsg::Data { batches, records, pos }
            };
            // A closed channel means the producer stopped: stop fetching the partition.
            if a.sink.tx.send(msg).is_err() {
                closed.push((d.topic, d.partition));
            }
        }
        for tp in &closed {
            self.parts.remove(tp);
        }
        closed
    }
}
