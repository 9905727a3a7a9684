//! Continuous verification: a background task that re-reads what was already mirrored, on both sides, and proves
//! that the target holds the source's batches byte for byte.
//!
//! - It reads with raw `Fetch` ([`FetchStream`]) from the source's active route and from the target, and compares
//!   ([`compare::compare`]): every batch's CRC is recomputed from the bytes each broker returned, and batch
//!   boundaries, epochs and CRCs must match (where the mirror split an oversized batch, the records are compared).
//! - It cycles through every partition this process owns and is mirroring (or has paused), one step of about a
//!   second's bytes at a time; a pass over a partition covers `[later log start, cache offset)` as of the pass's
//!   start ([`plan`]). A round over the partitions that read less than a second's bytes is followed by a second's
//!   rest. Progress shows per partition in `/api/v1/partitions` (`verify`).
//! - Both sides are read at most `[verify] bytes_per_sec` each (a rate limiter per side), which bounds what it
//!   costs: the source reads cross the WAN. Every request (a read, or the log-offsets lookup that starts a pass)
//!   counts at least [`reader::READ_COST_BYTES`], so the request rate is bounded too: with thousands of small
//!   partitions the verifier's rounds take longer instead of costing more. 0 turns it off.
//! - A mismatch, or a batch whose stored CRC does not match its bytes, raises `verify_mismatch` with the first
//!   mismatching offset and the side at fault, once per offset and side until a pass completes clean.
//!
//! Only Ferry clusters on both sides can be verified this way: a Kafka side stores batches of its own encoding.
//!
//! [`compare`] (the comparison, with no I/O) and [`FetchStream`] are also what `ferryctl mirror verify` runs.

pub mod compare;
pub mod plan;
mod reader;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_client::{Admin, BrokerClient, OffsetSpec};
use tokio_util::sync::CancellationToken;

use self::compare::{ReadError, Side};
use self::plan::{Plan, Step};
pub use self::reader::FetchStream;
use crate::cluster::TargetCluster;
use crate::egress::EgressHandle;
use crate::events::{Details, Event, EventBus, EventKind, MismatchFacts};
use crate::metrics::Metrics;
use crate::ratelimit::RateLimits;
use crate::state::{PartitionState, PartitionStatus, Shared};
use crate::tp::SourceTp;

/// How long the verifier rests after a round over the partitions that read less than a second's bytes (little or
/// nothing mirrored): without it, small partitions would be passed over again and again, a few requests each.
const IDLE: Duration = Duration::from_secs(1);

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Bytes asked for per read at `bytes_per_sec`: a quarter second's, within [16 KiB, 1 MiB].
pub fn chunk_bytes(bytes_per_sec: u64) -> u64 {
    (bytes_per_sec / 4).clamp(16 << 10, 1 << 20)
}

/// The verifier component.
pub struct Verifier {
    bytes_per_sec: u64,
    egress: EgressHandle,
    target: Arc<dyn TargetCluster>,
    shared: Arc<Shared>,
    events: EventBus,
    metrics: Metrics,
    source_limit: Arc<RateLimits>,
    target_limit: Arc<RateLimits>,
    plan: Plan,
}

impl Verifier {
    /// A verifier reading each side at most `bytes_per_sec` (0: it does nothing).
    pub fn new(
        bytes_per_sec: u64,
        egress: EgressHandle,
        target: Arc<dyn TargetCluster>,
        shared: Arc<Shared>,
        events: EventBus,
        metrics: Metrics,
    ) -> Verifier {
        Verifier {
            bytes_per_sec,
            egress,
            target,
            shared,
            events,
            metrics,
            source_limit: Arc::new(RateLimits::new(bytes_per_sec, 0)),
            target_limit: Arc::new(RateLimits::new(bytes_per_sec, 0)),
            plan: Plan::default(),
        }
    }

    /// Verifies until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        if self.bytes_per_sec == 0 {
            return;
        }
        let Some(target) = self.target.ferry_client() else {
            tracing::info!("the target is not a Ferry cluster: continuous verification is off");
            return;
        };
        if self.egress.active().client.is_none() {
            tracing::info!("the source is not a Ferry cluster: continuous verification is off");
            return;
        }
        let target = Admin::new(target);
        let (mut round_steps, mut round_bytes) = (0usize, 0u64);
        // The partitions of the round, listed (and sorted) once per round rather than before every step: with
        // thousands of partitions, that listing was most of what the verifier cost.
        let mut eligible = Vec::new();
        loop {
            if round_steps == 0 {
                eligible = self.eligible();
            }
            let Some(tp) = self.plan.next(&eligible) else {
                if sleep_or_stop(&stop, IDLE).await {
                    return;
                }
                continue;
            };
            let bytes = tokio::select! {
                _ = stop.cancelled() => return,
                bytes = self.step(&tp, &target) => bytes,
            };
            round_steps += 1;
            round_bytes += bytes;
            if round_steps >= eligible.len() {
                let light = round_bytes < self.bytes_per_sec;
                (round_steps, round_bytes) = (0, 0);
                if light && sleep_or_stop(&stop, IDLE).await {
                    return;
                }
            }
        }
    }

    /// The partitions to verify now, sorted: owned, and mirroring or paused (a starting partition has no cache
    /// offset yet; a halted one has diverged already). Progress of partitions that left is forgotten.
    fn eligible(&mut self) -> Vec<SourceTp> {
        let shared = &self.shared;
        self.plan.retain(|tp| shared.partitions.contains_key(tp));
        let mut out: Vec<SourceTp> = shared
            .partitions
            .iter()
            .filter(|e| matches!(e.value().state(), PartitionState::Mirroring | PartitionState::Paused))
            .map(|e| e.key().clone())
            .collect();
        out.sort();
        out
    }

    /// One step on `tp`: starts a pass if none is going, compares up to about a second's bytes, publishes the
    /// progress and raises a mismatch. Returns the source bytes compared.
    async fn step(&mut self, tp: &SourceTp, target: &Admin) -> u64 {
        let Some(status) = self.shared.partitions.get(tp).map(|e| Arc::clone(e.value())) else { return 0 };
        let route = self.egress.active();
        let Some(source) = route.client.clone() else { return 0 };
        if self.egress.leads_elsewhere(&route.name).is_some() {
            return 0;
        }
        if !self.plan.in_pass(tp) {
            match pass_range(&source, target, tp, &status, (&self.source_limit, &self.target_limit)).await {
                Ok((start, end)) => self.plan.start_pass(tp, start, end, now_ms()),
                Err(e) => {
                    tracing::debug!(%tp, error = %e, "cannot start a verification pass");
                    return 0;
                }
            }
        }
        let mut bytes = 0;
        if let Some((from, to)) = self.plan.range(tp) {
            let chunk = chunk_bytes(self.bytes_per_sec);
            let budget = self.bytes_per_sec.max(chunk);
            let (topic, partition) = (tp.topic(), tp.partition);
            let src = FetchStream::new(source, Side::Source, topic, partition, from, to)
                .limited(chunk, Arc::clone(&self.source_limit));
            let tgt =
                FetchStream::new(target.client().clone(), Side::Target, &status.target_topic, partition, from, to)
                    .limited(chunk, Arc::clone(&self.target_limit));
            let step = match compare::compare(src, tgt, from, to, budget, &mut |_| {}).await {
                Ok(outcome) => {
                    bytes = outcome.bytes;
                    self.metrics.verified(outcome.bytes);
                    match outcome.difference {
                        None => Step::Verified { to: outcome.verified_to },
                        Some(d) => Step::Mismatch { offset: d.offset.unwrap_or(from), side: d.side, reason: d.reason },
                    }
                }
                Err(ReadError(e)) => {
                    tracing::debug!(%tp, error = %e, "a verification read failed; the pass starts again");
                    Step::Unreadable
                }
            };
            if let Some(m) = self.plan.on_step(tp, step, now_ms()) {
                self.metrics.verify_mismatch();
                let message = format!(
                    "{tp}: continuous verification found a mismatch at offset {} on the {} side: {}",
                    m.offset, m.side, m.reason
                );
                self.events.emit(Event::new(EventKind::VerifyMismatch, message).partition(topic, partition).with(
                    Details::Mismatch(MismatchFacts {
                        offset: m.offset,
                        side: m.side,
                        reason: m.reason,
                        target_topic: status.target_topic.clone(),
                    }),
                ));
            }
        }
        if let Some(progress) = self.plan.progress(tp) {
            status.set_verify(progress.clone());
        }
        bytes
    }
}

/// A new pass's range: from the later of the two log starts up to the cache offset (never past the target's end).
/// Each side's lookup is paid to that side's limiter as a read.
async fn pass_range(
    source: &BrokerClient,
    target: &Admin,
    tp: &SourceTp,
    status: &PartitionStatus,
    (source_limit, target_limit): (&RateLimits, &RateLimits),
) -> Result<(u64, u64), ferry_client::ClientError> {
    let cache = status.cache_offset();
    source_limit.acquire(reader::READ_COST_BYTES, 0).await;
    let s = Admin::new(source.clone()).list_offset(tp.topic(), tp.partition, OffsetSpec::Latest).await?;
    target_limit.acquire(reader::READ_COST_BYTES, 0).await;
    let t = target.list_offset(&status.target_topic, tp.partition, OffsetSpec::Latest).await?;
    let start = s.log_start_offset.max(t.log_start_offset);
    Ok((start, cache.min(t.log_end_offset).max(start)))
}

/// Sleeps `d`; true when `stop` came first.
async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}
