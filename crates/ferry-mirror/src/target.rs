//! TargetDcProducer: one task per partition. It takes the batches the SourceDcConsumer fetched, appends them to
//! the target with their source offsets and epochs (append-with-offsets), and moves the cache offset only after the
//! target acknowledged (ack before commit). It also guards the partition's history: epochs, topic ids, the source
//! log end, and the target's own answers, and acts on divergence by the configured policy.
//!
//! Where the partition resumes is decided by [`crate::topics::resume_position`] (the target is the truth).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use ferry_batch::{BatchHeader, BatchIter};
use ferry_client::ClientError;
use ferry_client::proto as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cluster::TargetCluster;
use crate::config::OnDivergence;
use crate::egress::EgressHandle;
use crate::events::{Event, EventBus, EventKind};
use crate::metrics::Metrics;
use crate::ratelimit::RateLimits;
use crate::reshape;
use crate::source::{ConsumerCmd, PartitionFlow, PartitionSink, SourceMsg, SourcePos};
use crate::state::{PartitionState, PartitionStatus, Shared};
use crate::topics::{ResumeInput, resume_position};

/// Everything the partition tasks share.
#[derive(Clone)]
pub struct PipelineCtx {
    /// Target admin client.
    pub target: Arc<dyn TargetCluster>,
    /// The source routes.
    pub egress: EgressHandle,
    /// Commands to the consumer (reseat).
    pub consumer: mpsc::UnboundedSender<ConsumerCmd>,
    /// Divergence policy.
    pub on_divergence: OnDivergence,
    /// Largest append request.
    pub max_request_bytes: u64,
    /// The target's `max_batch_bytes`.
    pub target_max_batch: u64,
    /// Rate limits.
    pub limits: Arc<RateLimits>,
    /// Events.
    pub events: EventBus,
    /// Metrics.
    pub metrics: Metrics,
    /// Shared state.
    pub shared: Arc<Shared>,
    /// Target health tracking.
    pub target_health: Arc<TargetHealth>,
    /// The source group the mirror commits to.
    pub source_group: String,
}

/// Tracks consecutive target failures across partitions for `target_net_not_available` / `_recovered`.
#[derive(Debug, Default)]
pub struct TargetHealth {
    failures: parking_lot::Mutex<(u32, bool)>,
}

/// Consecutive failed target calls before the target counts as unavailable.
pub const TARGET_FAILURE_THRESHOLD: u32 = 3;

impl TargetHealth {
    /// A target call failed at the transport level.
    pub fn failure(&self, events: &EventBus, reason: &str) {
        let mut f = self.failures.lock();
        f.0 += 1;
        if f.0 >= TARGET_FAILURE_THRESHOLD && !f.1 {
            f.1 = true;
            events.emit(
                Event::new(EventKind::TargetNetNotAvailable, format!("the target cluster cannot be reached: {reason}"))
                    .detail("reason", reason),
            );
        }
    }

    /// A target call succeeded.
    pub fn success(&self, events: &EventBus) {
        let mut f = self.failures.lock();
        f.0 = 0;
        if std::mem::replace(&mut f.1, false) {
            events.emit(Event::new(EventKind::TargetNetRecovered, "the target cluster is reachable again"));
        }
    }

    /// Whether the target is currently considered down.
    pub fn is_down(&self) -> bool {
        self.failures.lock().1
    }
}

/// Commands to one partition task.
#[derive(Debug)]
pub enum PartitionCtl {
    /// Stop appending (keep the state visible).
    Pause,
    /// Continue; a halted partition re-checks where it stands.
    Resume,
}

/// Static identity of the partition.
#[derive(Debug, Clone)]
pub struct PartitionSpec {
    /// Source topic.
    pub topic: String,
    /// Source topic id (as recorded on the target mirror topic).
    pub topic_id: String,
    /// Target topic.
    pub target_topic: String,
    /// Partition.
    pub partition: u32,
    /// Whether `start_position` applies (the mirror's very first run).
    pub first_run_latest: bool,
}

struct Pending {
    header: BatchHeader,
    bytes: Bytes,
}

/// Bytes held in memory beyond the pending batches while an append is in flight (the request body and its encoded
/// message), added to the partition's `queued` count for as long as it lives.
struct InFlight {
    flow: Arc<PartitionFlow>,
    bytes: u64,
}

impl InFlight {
    fn new(flow: Arc<PartitionFlow>, bytes: u64) -> InFlight {
        flow.queued.fetch_add(bytes, Ordering::Relaxed);
        InFlight { flow, bytes }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.flow.consumed(self.bytes);
    }
}

/// The producer task of one partition.
pub struct TargetDcProducer {
    spec: PartitionSpec,
    ctx: PipelineCtx,
    status: Arc<PartitionStatus>,
    flow: Arc<PartitionFlow>,
    /// Handed to the consumer once the resume position is known.
    sink: Option<PartitionSink>,
    rx: mpsc::UnboundedReceiver<SourceMsg>,
    ctl: mpsc::UnboundedReceiver<PartitionCtl>,
    pending: VecDeque<Pending>,
    pending_bytes: u64,
    /// Offset the next pending batch must start at.
    expected: u64,
    /// Next offset to copy (target acknowledged everything below).
    cache: u64,
    /// Epoch of the last batch on the target.
    copied_epoch: Option<u32>,
    /// Highest source epoch already checked against `copied_epoch`.
    checked_epoch: u32,
    source: SourcePos,
    paused: bool,
    halted: bool,
    /// Set when the source's log start passed `expected`: jump there once the pending batches are appended.
    jump_to: Option<u64>,
    reported_error: Option<pb::ErrorCode>,
}

enum Step {
    Continue,
    Stop,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl TargetDcProducer {
    /// A producer for `spec`.
    pub fn new(
        spec: PartitionSpec,
        ctx: PipelineCtx,
        status: Arc<PartitionStatus>,
        sink: PartitionSink,
        rx: mpsc::UnboundedReceiver<SourceMsg>,
        ctl: mpsc::UnboundedReceiver<PartitionCtl>,
    ) -> TargetDcProducer {
        TargetDcProducer {
            spec,
            ctx,
            status,
            flow: Arc::clone(&sink.flow),
            sink: Some(sink),
            rx,
            ctl,
            pending: VecDeque::new(),
            pending_bytes: 0,
            expected: 0,
            cache: 0,
            copied_epoch: None,
            checked_epoch: 0,
            source: SourcePos::default(),
            paused: false,
            halted: false,
            jump_to: None,
            reported_error: None,
        }
    }

    fn tp(&self) -> (String, u32) {
        (self.spec.topic.clone(), self.spec.partition)
    }

    /// Resolves the resume position, then copies until `stop` (graceful: pending batches are appended first, within
    /// `drain` time) or `kill` (immediate).
    pub async fn run(mut self, stop: CancellationToken, kill: CancellationToken, drain: Duration) {
        self.paused = self.ctx.shared.is_paused(&self.spec.topic);
        if !self.resume(&kill).await || stop.is_cancelled() {
            return;
        }
        if let Some(sink) = self.sink.take() {
            let _ = self.ctx.consumer.send(ConsumerCmd::Add(vec![(self.tp(), sink)]));
        }
        loop {
            let step = tokio::select! {
                biased;
                _ = kill.cancelled() => Step::Stop,
                _ = stop.cancelled() => {
                    self.drain(&kill, drain).await;
                    Step::Stop
                }
                ctl = self.ctl.recv() => match ctl {
                    Some(c) => self.control(c, &kill).await,
                    None => Step::Stop,
                },
                msg = self.rx.recv() => match msg {
                    Some(m) => self.on_message(m, &kill).await,
                    None => Step::Stop,
                },
                _ = std::future::ready(()), if self.can_append() => {
                    self.append_some(&kill).await;
                    Step::Continue
                }
            };
            if matches!(step, Step::Stop) {
                break;
            }
        }
        self.flow.consumed(self.pending_bytes);
        self.ctx.metrics.remove_partition(&self.spec.topic, self.spec.partition);
    }

    fn can_append(&self) -> bool {
        !self.paused && !self.halted && (!self.pending.is_empty() || self.jump_to.is_some())
    }

    async fn drain(&mut self, kill: &CancellationToken, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.can_append() && tokio::time::Instant::now() < deadline && !kill.is_cancelled() {
            if tokio::time::timeout_at(deadline, self.append_some(kill)).await.is_err() {
                break;
            }
        }
    }

    /// Finds where to resume (the target is the truth) and checks the source history. Returns false on kill.
    async fn resume(&mut self, kill: &CancellationToken) -> bool {
        self.status.set_state(PartitionState::Starting);
        let mut backoff = Duration::from_millis(200);
        loop {
            let input = ResumeInput {
                target: self.ctx.target.as_ref(),
                source: Arc::clone(&self.ctx.egress.active().cluster),
                source_group: &self.ctx.source_group,
                topic: &self.spec.topic,
                target_topic: &self.spec.target_topic,
                partition: self.spec.partition,
                first_run_latest: self.spec.first_run_latest,
            };
            let result = tokio::select! {
                _ = kill.cancelled() => return false,
                r = resume_position(input) => r,
            };
            match result {
                Ok(r) => {
                    if let Some(warning) = r.sync_error {
                        self.ctx.events.emit(
                            Event::new(EventKind::SyncError, warning.clone())
                                .partition(&self.spec.topic, self.spec.partition),
                        );
                    }
                    if let Some(jump) = r.jump_to {
                        // Position an empty target at the start point (latest, or the source's log start).
                        match self.append_raw(Bytes::new(), jump).await {
                            Ok(resp) if resp.error == pb::ErrorCode::None as i32 => {}
                            Ok(resp) => {
                                self.halt_with(format!(
                                    "cannot position the target at offset {jump}: {}",
                                    resp.message
                                ));
                                return true;
                            }
                            Err(e) => {
                                self.status.set_error(format!("target: {e}"));
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(5));
                                continue;
                            }
                        }
                    }
                    self.cache = r.cache_offset;
                    self.expected = r.cache_offset;
                    self.copied_epoch = r.copied_epoch;
                    self.checked_epoch = r.copied_epoch.unwrap_or(0);
                    self.status.set_cache(self.cache);
                    self.status.set_target(r.target_leo.max(self.cache));
                    self.status.set_commit(r.committed.unwrap_or(0));
                    self.flow.fetch_position.store(self.cache, Ordering::Release);
                    self.status.clear_error();
                    self.status.set_state(if self.paused { PartitionState::Paused } else { PartitionState::Mirroring });
                    tracing::info!(topic = %self.spec.topic, partition = self.spec.partition, cache = self.cache, "partition resumes");
                    return true;
                }
                Err(e) => {
                    self.status.set_error(e.to_string());
                    tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, error = %e, "resume failed; retrying");
                    tokio::select! {
                        _ = kill.cancelled() => return false,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn control(&mut self, ctl: PartitionCtl, kill: &CancellationToken) -> Step {
        match ctl {
            PartitionCtl::Pause => {
                self.paused = true;
                if !self.halted {
                    self.status.set_state(PartitionState::Paused);
                }
            }
            PartitionCtl::Resume => {
                self.paused = false;
                if self.halted {
                    // Re-check from scratch: if the divergence is still there it halts again.
                    self.halted = false;
                    self.clear_pending();
                    if !self.resume(kill).await {
                        return Step::Stop;
                    }
                    let _ = self.ctx.consumer.send(ConsumerCmd::Reseat(self.tp()));
                } else {
                    self.status.set_state(PartitionState::Mirroring);
                }
            }
        }
        Step::Continue
    }

    /// Puts re-encoded batches back at the front of the pending queue, in order; their bytes count as received.
    fn requeue_front(&mut self, batches: Vec<Pending>) {
        for b in batches.into_iter().rev() {
            let n = b.bytes.len() as u64;
            self.pending_bytes += n;
            self.flow.queued.fetch_add(n, Ordering::Relaxed);
            self.pending.push_front(b);
        }
    }

    fn clear_pending(&mut self) {
        self.flow.consumed(self.pending_bytes);
        self.pending.clear();
        self.pending_bytes = 0;
        self.expected = self.cache;
        self.flow.fetch_position.store(self.cache, Ordering::Release);
    }

    async fn on_message(&mut self, msg: SourceMsg, kill: &CancellationToken) -> Step {
        match msg {
            SourceMsg::Reset { generation } => {
                self.clear_pending();
                self.flow.reset_ack.store(generation, Ordering::Release);
            }
            SourceMsg::Position(pos) => {
                self.on_position(pos, kill).await;
            }
            SourceMsg::Data { batches, pos, .. } => {
                self.on_position(pos, kill).await;
                self.accept(batches);
            }
            SourceMsg::Error { code, message, pos } => self.on_error(code, message, pos, kill).await,
        }
        Step::Continue
    }

    /// Queues fetched batches, dropping what is already below the expected offset.
    fn accept(&mut self, batches: Bytes) {
        let total = batches.len() as u64;
        let mut kept = 0u64;
        if !self.halted {
            let mut iter = BatchIter::new(&batches);
            loop {
                let start = iter.position();
                match iter.next() {
                    None => break,
                    Some(Err(e)) => {
                        self.halt_with(format!("the source sent a malformed batch near offset {}: {e}", self.expected));
                        break;
                    }
                    Some(Ok((header, bytes))) => {
                        if header.last_offset() < self.expected {
                            continue;
                        }
                        let bytes = batches.slice(start..start + bytes.len());
                        kept += bytes.len() as u64;
                        self.expected = header.next_offset();
                        self.pending.push_back(Pending { header, bytes });
                    }
                }
            }
        }
        self.pending_bytes += kept;
        self.flow.consumed(total - kept);
    }

    async fn on_position(&mut self, pos: SourcePos, kill: &CancellationToken) {
        self.status.set_source(pos.log_start, pos.log_end);
        self.source = pos;
        if self.halted || self.reported_error.is_some() {
            self.reported_error = None;
        }
        if self.halted {
            return;
        }
        if !self.source.topic_id.is_empty() && self.source.topic_id != self.spec.topic_id {
            let msg = format!(
                "the source topic was re-created (id {} became {}); the target holds the old topic's records",
                self.spec.topic_id, self.source.topic_id
            );
            self.diverged(self.cache.min(self.source.log_end), msg, true, kill).await;
            return;
        }
        if self.source.log_end < self.cache {
            let msg = format!(
                "the source log end offset {} is below the cache offset {}: the source lost records the target holds",
                self.source.log_end, self.cache
            );
            let at = self.source.log_end;
            self.diverged(at, msg, false, kill).await;
            return;
        }
        if self.source.epoch > self.checked_epoch {
            self.check_epoch(self.source.epoch, kill).await;
        }
    }

    /// Asks the source where the last copied epoch ended; below the cache offset means the source reused offsets.
    /// Returns false when the partition diverged.
    async fn check_epoch(&mut self, seen: u32, kill: &CancellationToken) -> bool {
        let Some(copied) = self.copied_epoch else {
            self.checked_epoch = seen;
            return true;
        };
        if seen <= copied {
            self.checked_epoch = self.checked_epoch.max(seen);
            return true;
        }
        let source = Arc::clone(&self.ctx.egress.active().cluster);
        match source.epoch_end(&self.spec.topic, self.spec.partition, copied).await {
            Ok(Some((_, end))) if end < self.cache => {
                let msg = format!(
                    "source epoch {copied} ends at offset {end}, below the cache offset {}: the source lost and reused \
                     offsets the target already holds (source epoch now {seen})",
                    self.cache
                );
                self.diverged(end, msg, false, kill).await;
                false
            }
            Ok(_) => {
                self.checked_epoch = seen;
                true
            }
            Err(e) => {
                // Not verified yet; appending a newer-epoch batch waits until it is.
                self.status.set_error(format!("cannot check source epoch {copied}: {e}"));
                false
            }
        }
    }

    async fn on_error(&mut self, code: pb::ErrorCode, message: String, pos: SourcePos, kill: &CancellationToken) {
        if pos.log_end > 0 || pos.log_start > 0 {
            self.status.set_source(pos.log_start, pos.log_end);
        }
        if self.halted {
            return;
        }
        // Offsets in an error of a re-created topic say nothing about the mirrored one: it always halts.
        if !pos.topic_id.is_empty() && pos.topic_id != self.spec.topic_id {
            let msg = format!(
                "the source topic was re-created (id {} became {}); the target holds the old topic's records",
                self.spec.topic_id, pos.topic_id
            );
            self.diverged(self.cache, msg, true, kill).await;
            return;
        }
        match code {
            pb::ErrorCode::OffsetOutOfRange if pos.log_start > self.expected => {
                // Source retention deleted records before they were mirrored: carry the gap over.
                self.jump_to = Some(pos.log_start);
            }
            pb::ErrorCode::OffsetOutOfRange if pos.log_end < self.expected => {
                let msg = format!(
                    "the source log end offset {} is below the fetch position {}: the source lost records",
                    pos.log_end, self.expected
                );
                self.diverged(pos.log_end.min(self.cache), msg, false, kill).await;
            }
            pb::ErrorCode::CorruptBatch => {
                self.halt_with(format!("the source holds a corrupt batch: {message}"));
            }
            other => {
                self.status.set_error(format!("source: {message}"));
                if self.reported_error != Some(other) {
                    self.reported_error = Some(other);
                    if other != pb::ErrorCode::UnknownTopicOrPartition {
                        self.ctx.events.emit(
                            Event::new(
                                EventKind::SyncError,
                                format!("source error on {}/{}: {message}", self.spec.topic, self.spec.partition),
                            )
                            .partition(&self.spec.topic, self.spec.partition)
                            .detail("code", other.as_str_name()),
                        );
                    }
                }
            }
        }
    }

    fn halt_with(&mut self, reason: String) {
        self.halted = true;
        self.status.halt(reason.clone());
        self.clear_pending();
        self.ctx.events.emit(
            Event::new(EventKind::SyncError, format!("{}/{} halted: {reason}", self.spec.topic, self.spec.partition))
                .partition(&self.spec.topic, self.spec.partition)
                .detail("reason", reason),
        );
    }

    /// Handles a divergence: raise `partition_diverged`, then halt or truncate.
    async fn diverged(&mut self, at: u64, reason: String, force_halt: bool, kill: &CancellationToken) {
        let policy = if force_halt { OnDivergence::Halt } else { self.ctx.on_divergence };
        self.ctx.events.emit(
            Event::new(
                EventKind::PartitionDiverged,
                format!("{}/{} diverged at offset {at}: {reason}", self.spec.topic, self.spec.partition),
            )
            .partition(&self.spec.topic, self.spec.partition)
            .detail("offset", at)
            .detail("cache_offset", self.cache)
            .detail("reason", reason.clone())
            .detail("policy", if policy == OnDivergence::Halt { "halt" } else { "truncate" }),
        );
        self.clear_pending();
        match policy {
            OnDivergence::Halt => {
                self.halted = true;
                self.status.halt(format!("diverged at offset {at}: {reason}"));
            }
            OnDivergence::Truncate => {
                let target = self.ctx.target.clone();
                let result = tokio::select! {
                    _ = kill.cancelled() => return,
                    r = target.truncate(&self.spec.target_topic, self.spec.partition, at) => r,
                };
                match result {
                    Ok(leo) => {
                        tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, at, leo, "target truncated after divergence");
                        self.jump_to = None;
                        if self.resume(kill).await {
                            let _ = self.ctx.consumer.send(ConsumerCmd::Reseat(self.tp()));
                        }
                    }
                    Err(e) => {
                        self.halted = true;
                        self.status.halt(format!("diverged at offset {at} and truncation failed: {e}"));
                    }
                }
            }
        }
    }

    async fn append_raw(
        &self,
        batches: Bytes,
        source_log_start: u64,
    ) -> Result<pb::AppendWithOffsetsResponse, ClientError> {
        let r = self
            .ctx
            .target
            .append(&self.spec.target_topic, self.spec.partition, &self.spec.topic_id, source_log_start, batches)
            .await;
        match &r {
            Ok(_) => self.ctx.target_health.success(&self.ctx.events),
            Err(e) if e.is_transport() || e.is_timeout() || e.is_retriable() => {
                self.ctx.target_health.failure(&self.ctx.events, &e.to_string())
            }
            Err(_) => {}
        }
        r
    }

    /// Appends the next request's worth of pending batches (or performs a pending retention jump).
    async fn append_some(&mut self, kill: &CancellationToken) {
        if self.pending.is_empty() {
            if let Some(to) = self.jump_to.take() {
                self.jump(to).await;
            }
            return;
        }
        // A batch from a newer epoch is appended only after the source confirmed the old epoch's end.
        let front_epoch = self.pending[0].header.epoch;
        if self.copied_epoch.is_some_and(|c| front_epoch > c)
            && front_epoch > self.checked_epoch
            && !self.check_epoch(front_epoch, kill).await
        {
            if !self.halted {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            return;
        }
        // A batch starting above the next offset to copy is carried over as a gap only when the source really has
        // one there; otherwise it was fetched from an older position (a fetch in flight when the partition was
        // re-seated after a truncation or a resync) and must not be appended.
        let front_base = self.pending[0].header.base_offset;
        if front_base > self.cache {
            match self.source_gap(self.cache, front_base).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(
                        topic = %self.spec.topic,
                        partition = self.spec.partition,
                        cache = self.cache,
                        stale = front_base,
                        "dropping batches fetched from an older position; fetching again"
                    );
                    self.clear_pending();
                    let _ = self.ctx.consumer.send(ConsumerCmd::Reseat(self.tp()));
                    return;
                }
                Err(e) => {
                    self.status.set_error(format!("cannot check the source for a gap at offset {}: {e}", self.cache));
                    tokio::select! {
                        _ = kill.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                    return;
                }
            }
        }
        let mut body = BytesMut::new();
        let mut parts: Vec<Part> = Vec::new();
        let mut consumed = 0u64;
        let epoch = front_epoch;
        let mut cursor = self.cache;
        let request_limit = match self.flow.request.load(Ordering::Relaxed) {
            0 => self.ctx.max_request_bytes,
            r => r,
        };
        while let Some(p) = self.pending.front() {
            // Only the first batch of a request may start above the cursor (checked above); a later one waits to be
            // checked as the first of the next request.
            if p.header.epoch != epoch
                || (!body.is_empty()
                    && (p.header.base_offset > cursor || body.len() as u64 + p.bytes.len() as u64 > request_limit))
            {
                break;
            }
            let p = self.pending.pop_front().expect("front exists");
            consumed += p.bytes.len() as u64;
            if reshape::needs_reshape(&p.header, p.bytes.len(), cursor, self.ctx.target_max_batch) {
                match reshape::reshape(&p.header, &p.bytes, cursor, self.ctx.target_max_batch) {
                    Ok(pieces) => {
                        let mut pieces = pieces.into_iter().filter_map(|piece| {
                            BatchHeader::parse(&piece).ok().map(|header| Pending { header, bytes: piece })
                        });
                        for piece in pieces.by_ref() {
                            // The pieces of one large batch may not fit one request: the rest wait for the next.
                            if !body.is_empty() && body.len() + piece.bytes.len() > request_limit as usize {
                                self.requeue_front(std::iter::once(piece).chain(pieces).collect());
                                break;
                            }
                            parts.push(Part::of(&piece.header, piece.bytes.len()));
                            cursor = piece.header.next_offset();
                            body.extend_from_slice(&piece.bytes);
                        }
                    }
                    Err(e) if !body.is_empty() => {
                        // Append what precedes this batch first: the partition then halts exactly at the batch,
                        // when it comes up again as the first of the next request.
                        tracing::debug!(error = %e, "a batch that cannot be appended waits for the next request");
                        consumed -= p.bytes.len() as u64;
                        self.pending.push_front(p);
                        break;
                    }
                    Err(e) => {
                        self.pending_bytes -= consumed;
                        self.flow.consumed(consumed);
                        self.halt_with(e.to_string());
                        return;
                    }
                }
            } else {
                parts.push(Part::of(&p.header, p.bytes.len()));
                cursor = p.header.next_offset();
                body.extend_from_slice(&p.bytes);
            }
        }
        self.pending_bytes -= consumed;
        if parts.is_empty() {
            self.flow.consumed(consumed);
            return;
        }
        let records: u64 = parts.iter().map(|p| p.records).sum();
        let bytes = body.len() as u64;
        // The request body and its encoded gRPC message are copies of the pending bytes: they count against the
        // partition's memory cap until the append is answered (or abandoned), so fetching ahead pauses meanwhile.
        let _copies = InFlight::new(Arc::clone(&self.flow), 2 * bytes);
        self.ctx.limits.acquire(bytes, records).await;
        let body = body.freeze();
        let mut backoff = Duration::from_millis(100);
        // Whether an earlier attempt of this request may have been written (its answer never came).
        let mut unknown_outcome = false;
        loop {
            if kill.is_cancelled() {
                self.flow.consumed(consumed);
                return;
            }
            match self.append_raw(body.clone(), self.source.log_start).await {
                Ok(resp) => {
                    self.flow.consumed(consumed);
                    self.on_append_response(resp, &parts, unknown_outcome, kill).await;
                    return;
                }
                Err(e) if e.is_transport() || e.is_timeout() || e.is_retriable() => {
                    unknown_outcome = true;
                    self.status.set_error(format!("target: {e}"));
                    tokio::select! {
                        _ = kill.cancelled() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) if e.is_not_found() => {
                    // The target topic or partition vanished: discovery re-creates it; then resume from the target.
                    self.flow.consumed(consumed);
                    self.status.set_error(format!("target: {e}"));
                    self.clear_pending();
                    tokio::time::sleep(backoff).await;
                    if self.resume(kill).await {
                        let _ = self.ctx.consumer.send(ConsumerCmd::Reseat(self.tp()));
                    }
                    return;
                }
                Err(e) => {
                    self.flow.consumed(consumed);
                    self.halt_with(format!("target refused the batches: {e}"));
                    return;
                }
            }
        }
    }

    async fn on_append_response(
        &mut self,
        resp: pb::AppendWithOffsetsResponse,
        parts: &[Part],
        unknown_outcome: bool,
        kill: &CancellationToken,
    ) {
        let code = pb::ErrorCode::try_from(resp.error).unwrap_or(pb::ErrorCode::StorageError);
        match code {
            pb::ErrorCode::None => {
                let last = parts.last().expect("non-empty");
                self.cache = last.last + 1;
                self.copied_epoch = Some(last.epoch);
                self.checked_epoch = self.checked_epoch.max(last.epoch);
                self.status.set_cache(self.cache);
                self.status.set_target(resp.log_end_offset);
                self.status.clear_error();
                let now = now_ms();
                let latency = parts.iter().map(|p| p.max_timestamp).max().map(|ts| (now - ts) as f64 / 1000.0);
                self.status.set_latency_ms(latency.map_or(0, |l| (l.max(0.0) * 1000.0) as u64));
                let present = resp.present_batches as usize;
                if present > 0 {
                    tracing::info!(
                        topic = %self.spec.topic,
                        partition = self.spec.partition,
                        present,
                        written = resp.written_batches,
                        counted = unknown_outcome,
                        "batches already on the target were not written again{}",
                        if unknown_outcome {
                            " (a retry after a lost answer: the lost attempt wrote them, they count once)"
                        } else {
                            " (another writer put them there first: not counted)"
                        }
                    );
                }
                let (records, bytes) = counted(parts, present, unknown_outcome);
                self.ctx.metrics.appended(records, bytes, latency);
                self.ctx.shared.target_rates.add(records, bytes);
            }
            pb::ErrorCode::Diverged => {
                let at = resp.diverged_at.unwrap_or(self.cache);
                self.diverged(at, format!("the target holds different data: {}", resp.message), false, kill).await;
            }
            pb::ErrorCode::TopicIdMismatch => {
                self.diverged(self.cache, resp.message, true, kill).await;
            }
            pb::ErrorCode::EpochRegressed => {
                self.diverged(self.cache, resp.message, false, kill).await;
            }
            pb::ErrorCode::NotAMirrorTopic => {
                self.halt_with(format!(
                    "target topic {} was promoted (it is no longer a mirror topic); mirroring into it stopped",
                    self.spec.target_topic
                ));
            }
            pb::ErrorCode::GapRefused | pb::ErrorCode::StraddlesEnd => {
                // The target is not where this task thought: re-read it (the target is the truth) and fetch again.
                tracing::warn!(topic = %self.spec.topic, partition = self.spec.partition, message = %resp.message, "target log end moved; resyncing");
                self.clear_pending();
                if self.resume(kill).await {
                    let _ = self.ctx.consumer.send(ConsumerCmd::Reseat(self.tp()));
                }
            }
            _ => {
                self.halt_with(format!("target error {}: {}", code.as_str_name(), resp.message));
            }
        }
    }

    /// Whether the source partition holds nothing in `[at, base)`: a fetch at `at` answers with a first batch that
    /// starts at `base`.
    async fn source_gap(&self, at: u64, base: u64) -> Result<bool, ClientError> {
        let source = Arc::clone(&self.ctx.egress.active().cluster);
        let first = source.first_batch_at(&self.spec.topic, self.spec.partition, at).await?;
        Ok(first.is_some_and(|(b, topic_id)| b == base && topic_id == self.spec.topic_id))
    }

    /// Moves an empty stretch of the target forward to the source's new log start.
    async fn jump(&mut self, to: u64) {
        if to <= self.cache {
            return;
        }
        match self.append_raw(Bytes::new(), to).await {
            Ok(resp) if resp.error == pb::ErrorCode::None as i32 => {
                let lost = to - self.cache;
                self.ctx.events.emit(
                    Event::new(
                        EventKind::SyncError,
                        format!(
                            "{}/{}: source retention deleted offsets [{}, {to}) ({lost} records) before they were mirrored; \
                             the target records the gap",
                            self.spec.topic, self.spec.partition, self.cache
                        ),
                    )
                    .partition(&self.spec.topic, self.spec.partition)
                    .detail("gap_start", self.cache)
                    .detail("gap_end", to),
                );
                self.cache = resp.log_end_offset.max(to);
                self.expected = self.cache;
                self.status.set_cache(self.cache);
                self.status.set_target(resp.log_end_offset);
                self.flow.fetch_position.store(self.cache, Ordering::Release);
                let _ = self.ctx.consumer.send(ConsumerCmd::Reseat(self.tp()));
            }
            Ok(resp) => {
                self.halt_with(format!("cannot carry the source retention gap to offset {to}: {}", resp.message))
            }
            Err(e) => {
                self.status.set_error(format!("target: {e}"));
                self.jump_to = Some(to);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The records and bytes an acknowledged append adds to the out counters: what this process put on the target.
///
/// The target reports how many of the request's batches it already held (`present`); they lead the request,
/// since its batches are in offset order and present ones end below the target's log end. Present batches are
/// not counted when this was the request's first attempt: another writer (a scale-out process) put them there.
/// After an attempt whose answer was lost (`unknown_outcome`), present batches are most likely that attempt's
/// writes, and count once; only a second writer in that very window is counted twice.
fn counted(parts: &[Part], present: usize, unknown_outcome: bool) -> (u64, u64) {
    let from = if unknown_outcome { 0 } else { present.min(parts.len()) };
    parts[from..].iter().fold((0, 0), |(r, b), p| (r + p.records, b + p.bytes))
}

/// One batch of an append request, as the answer is accounted.
#[derive(Debug, Clone, Copy)]
struct Part {
    last: u64,
    epoch: u32,
    max_timestamp: i64,
    records: u64,
    bytes: u64,
}

impl Part {
    fn of(h: &BatchHeader, bytes: usize) -> Part {
        Part {
            last: h.last_offset(),
            epoch: h.epoch,
            max_timestamp: h.max_timestamp,
            records: u64::from(h.record_count),
            bytes: bytes as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_out_counters_take_written_batches_and_a_lost_attempts_present_ones() {
        let part = |records, bytes| Part { last: 0, epoch: 0, max_timestamp: 0, records, bytes };
        let parts = [part(10, 1_000), part(20, 2_000), part(30, 3_000)];
        // (present, unknown outcome) -> (records, bytes)
        let table = [
            ((0, false), (60, 6_000)),
            ((1, false), (50, 5_000)),
            ((3, false), (0, 0)),
            ((5, false), (0, 0)),
            ((0, true), (60, 6_000)),
            ((2, true), (60, 6_000)),
            ((3, true), (60, 6_000)),
        ];
        for ((present, unknown), expected) in table {
            assert_eq!(counted(&parts, present, unknown), expected, "present {present}, unknown outcome {unknown}");
        }
        assert_eq!(counted(&[], 0, false), (0, 0));
    }

    #[test]
    fn in_flight_copies_count_against_the_cap_until_dropped() {
        let flow = Arc::new(PartitionFlow::default());
        flow.queued.store(100, Ordering::Relaxed);
        let guard = InFlight::new(Arc::clone(&flow), 40);
        assert_eq!(flow.queued.load(Ordering::Relaxed), 140);
        drop(guard);
        assert_eq!(flow.queued.load(Ordering::Relaxed), 100);
    }
}
