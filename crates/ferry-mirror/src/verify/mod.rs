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
//!   counts at least [`reader::READ_COST_BYTES`] (64 KiB), and at least [`reader::PARTITION_COST_BYTES`] (4 KiB)
//!   for each partition it reads or looks up, so the request rate is bounded too: with thousands of small
//!   partitions the verifier's rounds take longer instead of costing more. 0 turns it off.
//! - Partitions take their steps in groups of [`GROUP`]: the group's new passes are looked up in one request per
//!   side, and the start of every range read in one request per side. Small partitions then cost a request per
//!   side for a group, not one or two each: at the default rate a round over 10,000 near-empty partitions takes
//!   about 160 seconds, in 4 requests a second on both sides together.
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

use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, OffsetSpec};
use tokio_util::sync::CancellationToken;

use self::compare::{ReadError, Side};
use self::plan::{Plan, Step};
pub use self::reader::FetchStream;
use self::reader::Start;
use crate::cluster::TargetCluster;
use crate::egress::EgressHandle;
use crate::events::{Details, Event, EventBus, EventKind, MismatchFacts};
use crate::metrics::Metrics;
use crate::ratelimit::RateLimits;
use crate::state::{PartitionState, PartitionStatus, Shared};
use crate::tp::SourceTp;

/// Partitions that take a step together: their passes' ranges are looked up, and the start of each range read, in
/// one request per side for the group.
const GROUP: usize = 64;

/// How long the verifier rests after a round over the partitions that read less than a second's bytes (little or
/// nothing mirrored): without it, small partitions would be passed over again and again, a few requests each.
const IDLE: Duration = Duration::from_secs(1);

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Bytes asked for per read at `bytes_per_sec`: a quarter second's, within [`reader::READ_COST_BYTES`, 1 MiB] (a
/// read costs at least the former whatever it asks for).
pub fn chunk_bytes(bytes_per_sec: u64) -> u64 {
    (bytes_per_sec / 4).clamp(reader::READ_COST_BYTES, 1 << 20)
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
            let group = self.plan.next_group(&eligible, GROUP.min(eligible.len().saturating_sub(round_steps)));
            if group.is_empty() {
                if sleep_or_stop(&stop, IDLE).await {
                    return;
                }
                continue;
            }
            let bytes = tokio::select! {
                _ = stop.cancelled() => return,
                bytes = self.step_group(&group, &target) => bytes,
            };
            round_steps += group.len();
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

    /// One step on each partition of `group`: starts the passes not going (their ranges looked up in one request
    /// per side), reads the start of every range in one request per side, then compares each partition's range up
    /// to about a second's bytes, publishes its progress and raises a mismatch. Returns the source bytes compared.
    async fn step_group(&mut self, group: &[SourceTp], target: &Admin) -> u64 {
        let route = self.egress.active();
        let Some(source) = route.client.clone() else { return 0 };
        if self.egress.leads_elsewhere(&route.name).is_some() {
            return 0;
        }
        let parts: Vec<(&SourceTp, Arc<PartitionStatus>)> =
            group.iter().filter_map(|tp| Some((tp, Arc::clone(self.shared.partitions.get(tp)?.value())))).collect();
        let starting: Vec<&(&SourceTp, Arc<PartitionStatus>)> =
            parts.iter().filter(|(tp, _)| !self.plan.in_pass(tp)).collect();
        if !starting.is_empty() {
            let ranges = pass_ranges(&source, target, &starting, (&self.source_limit, &self.target_limit)).await;
            for ((tp, _), range) in starting.into_iter().zip(ranges) {
                match range {
                    Ok((start, end)) => self.plan.start_pass(tp, start, end, now_ms()),
                    Err(e) => tracing::debug!(%tp, error = %e, "cannot start a verification pass"),
                }
            }
        }
        // The start of every range with something to compare, read for the whole group at once (a single
        // partition reads on its own, as its stream would).
        let chunk = chunk_bytes(self.bytes_per_sec);
        let open: Vec<(usize, u64)> = parts
            .iter()
            .enumerate()
            .filter_map(|(i, (tp, _))| self.plan.range(tp).filter(|(from, to)| from < to).map(|(from, _)| (i, from)))
            .collect();
        let mut firsts: Vec<(Option<pb::PartitionData>, Option<pb::PartitionData>)> = vec![(None, None); parts.len()];
        if open.len() > 1 {
            let starts: Vec<Start<'_>> =
                open.iter().map(|&(i, from)| (parts[i].0.topic(), parts[i].0.partition, from)).collect();
            let on_source = reader::fetch_many(&source, &starts, chunk, &self.source_limit).await;
            let starts: Vec<Start<'_>> =
                open.iter().map(|&(i, from)| (parts[i].1.target_topic.as_str(), parts[i].0.partition, from)).collect();
            let on_target = reader::fetch_many(target.client(), &starts, chunk, &self.target_limit).await;
            for ((&(i, _), s), t) in open.iter().zip(on_source).zip(on_target) {
                firsts[i] = (s, t);
            }
        }
        let mut bytes = 0;
        for ((tp, status), (on_source, on_target)) in parts.iter().zip(firsts) {
            bytes += self.compare_one(tp, status, &source, target, on_source, on_target).await;
        }
        bytes
    }

    /// Compares `tp`'s range of its pass, up to about a second's bytes, each side's stream starting with the answer
    /// read for it already (if any); publishes the progress and raises a mismatch. Returns the source bytes compared.
    async fn compare_one(
        &mut self,
        tp: &SourceTp,
        status: &PartitionStatus,
        source: &BrokerClient,
        target: &Admin,
        on_source: Option<pb::PartitionData>,
        on_target: Option<pb::PartitionData>,
    ) -> u64 {
        let mut bytes = 0;
        if let Some((from, to)) = self.plan.range(tp) {
            let chunk = chunk_bytes(self.bytes_per_sec);
            let budget = self.bytes_per_sec.max(chunk);
            let (topic, partition) = (tp.topic(), tp.partition);
            let src = FetchStream::new(source.clone(), Side::Source, topic, partition, from, to)
                .limited(chunk, Arc::clone(&self.source_limit))
                .starting_with(on_source);
            let tgt =
                FetchStream::new(target.client().clone(), Side::Target, &status.target_topic, partition, from, to)
                    .limited(chunk, Arc::clone(&self.target_limit))
                    .starting_with(on_target);
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

/// Each new pass's range: from the later of the two log starts up to the cache offset (never past the target's
/// end). Each side's lookup of the whole group is one request, paid to that side's limiter as a read of nothing.
async fn pass_ranges(
    source: &BrokerClient,
    target: &Admin,
    parts: &[&(&SourceTp, Arc<PartitionStatus>)],
    (source_limit, target_limit): (&RateLimits, &RateLimits),
) -> Vec<Result<(u64, u64), String>> {
    let caches: Vec<u64> = parts.iter().map(|(_, status)| status.cache_offset()).collect();
    let asked: Vec<(&str, u32, OffsetSpec)> =
        parts.iter().map(|(tp, _)| (tp.topic(), tp.partition, OffsetSpec::Latest)).collect();
    source_limit.acquire(reader::request_cost(0, parts.len()), 0).await;
    let on_source = Admin::new(source.clone()).list_offsets_rows(&asked).await;
    let asked: Vec<(&str, u32, OffsetSpec)> =
        parts.iter().map(|(tp, status)| (status.target_topic.as_str(), tp.partition, OffsetSpec::Latest)).collect();
    target_limit.acquire(reader::request_cost(0, parts.len()), 0).await;
    let on_target = target.list_offsets_rows(&asked).await;
    let (on_source, on_target) = match (on_source, on_target) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => return parts.iter().map(|_| Err(e.to_string())).collect(),
    };
    caches
        .into_iter()
        .zip(on_source.into_iter().zip(on_target))
        .map(|(cache, rows)| match rows {
            (Some(s), Some(t)) => {
                let start = s.log_start_offset.max(t.log_start_offset);
                Ok((start, cache.min(t.log_end_offset).max(start)))
            }
            (None, _) => Err("the source's leader did not answer for the partition".to_owned()),
            (_, None) => Err("the target's leader did not answer for the partition".to_owned()),
        })
        .collect()
}

/// Sleeps `d`; true when `stop` came first.
async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}
