//! The lane's I/O: performs one core [`Request`] against the target and the source's active route, and returns
//! its [`Answer`]. Failures that may pass (transport, timeouts, UNAVAILABLE) are retried here under the mirror's
//! one retry policy, and never reach the core; reads are retried on any failure (the partition cannot decide
//! anything without them); a target that refuses a write for good answers [`Failure`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_client::batch::Batch;

use ferry_client::{ClientError, Code, RetryPolicy};
use parking_lot::Mutex;

use super::core::{Answer, AppendPlan, CoreConfig, EpochAnswer, Failure, Request, ResumeFacts, TailFacts};
use crate::cluster::{AppendOutcome, SourceCluster, TargetCluster};
use crate::egress::EgressHandle;
use crate::events::{Event, EventBus, EventKind};
use crate::ratelimit::RateLimits;
use crate::target_health::TargetHealth;

/// What the lane's requests need.
pub struct LaneIo {
    /// The target.
    pub target: Arc<dyn TargetCluster>,
    /// The source routes (requests go over the active one).
    pub egress: EgressHandle,
    /// `sync.max_bytes_per_sec` and `sync.max_records_per_sec`.
    pub limits: Arc<RateLimits>,
    /// Target reachability (`target_net_not_available`).
    pub target_health: Arc<TargetHealth>,
    /// Events.
    pub events: EventBus,
    /// The mirror's source group.
    pub source_group: String,
    /// Backoff of retried calls.
    pub retry: RetryPolicy,
    /// The resume reads of many lanes in few calls.
    pub gather: super::gather::Gather,
}

impl std::fmt::Debug for LaneIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneIo").field("source_group", &self.source_group).finish_non_exhaustive()
    }
}

/// A failure worth retrying.
fn passing(e: &ClientError) -> bool {
    e.is_transport() || e.is_timeout() || e.is_retriable()
}

/// Whether a failed target call says the target cannot be reached (what `target_net_not_available` counts). A
/// status the target answered (a storage error on one partition, say) is retried, but says the target is there.
fn unreachable(e: &ClientError) -> bool {
    e.is_transport()
        || e.is_timeout()
        || matches!(e, ClientError::Status { code: Code::Unavailable | Code::DeadlineExceeded, .. })
}

/// Whether a failed target call is the target refusing it for good (a storage error, a full disk), rather than a
/// moment's unavailability (no connection, a leader change, a replica catching up): repeated, it is a `sync_error`.
fn refused_for_good(e: &ClientError) -> bool {
    !unreachable(e)
        && !matches!(
            e.reason(),
            Some(
                "not_leader"
                    | "not_enough_replicas"
                    | "not_acknowledged"
                    | "fenced_leader_epoch"
                    | "cluster_unavailable"
                    | "not_coordinator"
            )
        )
}

/// Consecutive refusals of one target call after which it is reported as a `sync_error`.
const REFUSALS_REPORTED: u32 = 3;

/// One request of one partition.
pub(super) struct Call {
    pub io: Arc<LaneIo>,
    pub config: Arc<CoreConfig>,
    /// The partition's budget (an append's copies are held against it).
    pub budget: Arc<crate::lane::budget::Budget>,
    /// The last retried failure, for the partition's status.
    pub note: Arc<Mutex<Option<String>>>,
}

impl Call {
    fn source(&self) -> Arc<dyn SourceCluster> {
        Arc::clone(&self.io.egress.active().cluster)
    }

    /// Runs `op` until it succeeds, or until it fails in a way `give_up` accepts; every other failure is noted
    /// and retried after the policy's delay.
    async fn retrying<T, F, Fut>(
        &self,
        target: bool,
        mut op: F,
        give_up: impl Fn(&ClientError) -> bool,
    ) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut backoff = self.io.retry.backoff();
        let (mut refusals, mut reported) = (0u32, false);
        loop {
            let began = self.io.target_health.ticket();
            let result = op().await;
            match &result {
                Ok(_) if target => {
                    self.io.target_health.success(&self.io.events, began);
                }
                Err(e) if target && unreachable(e) => self.io.target_health.failure(&self.io.events, &e.to_string()),
                _ => {}
            }
            // The target refusing the same call again and again (a full disk): a sync_error after a few attempts,
            // cleared once it succeeds (case 14 of the cluster analysis).
            match &result {
                Err(e) if target && refused_for_good(e) => {
                    refusals += 1;
                    if refusals == REFUSALS_REPORTED && !reported {
                        reported = true;
                        let (topic, partition) = (self.config.target.topic(), self.config.target.partition);
                        let reason = format!("the target refuses {topic}/{partition}: {e} (retrying)");
                        self.io.events.emit(Event::new(EventKind::SyncError, reason).partition(topic, partition));
                    }
                }
                Ok(_) if reported => {
                    let (topic, partition) = (self.config.target.topic(), self.config.target.partition);
                    let message = format!("the target takes {topic}/{partition} again");
                    self.io
                        .events
                        .emit(Event::new(EventKind::SyncError, message).partition(topic, partition).cleared());
                }
                _ => refusals = 0,
            }
            match result {
                Ok(v) => {
                    *self.note.lock() = None;
                    return Ok(v);
                }
                Err(e) if give_up(&e) => return Err(e),
                Err(e) => {
                    let side = if target { "target" } else { "source" };
                    *self.note.lock() = Some(format!("{side}: {e}"));
                    tokio::time::sleep(backoff.next().unwrap_or(self.io.retry.max_backoff)).await;
                }
            }
        }
    }

    /// Performs `request`.
    pub async fn perform(self, request: Request) -> Answer {
        match request {
            Request::ReadResume => Answer::Resume(self.read_resume().await),
            Request::CompareTail { at } => Answer::Tail(self.compare_tail(at).await),
            Request::Jump { to } => Answer::Appended(self.append(&[], to).await),
            Request::EpochEnd { epoch } => {
                let tp = &self.config.tp;
                let answer =
                    self.retrying(false, || async { self.source().epoch_end(tp, epoch).await }, |_| false).await;
                Answer::EpochEnd(answer.unwrap_or(EpochAnswer::Unknown))
            }
            Request::ProbeGap { at } => {
                let tp = &self.config.tp;
                let first =
                    self.retrying(false, || async { self.source().first_batch_at(tp, at).await }, |_| false).await;
                Answer::Gap(first.unwrap_or(None))
            }
            Request::Append(plan) => self.append_plan(plan).await,
            Request::Truncate { at } => {
                let target = &self.config.target;
                let r =
                    self.retrying(true, || async { self.io.target.truncate(target, at).await }, |e| !passing(e)).await;
                Answer::Truncated(r.map_err(|e| e.to_string()))
            }
        }
    }

    async fn read_resume(&self) -> ResumeFacts {
        let (tp, target) = (&self.config.tp, &self.config.target);
        let group = &self.io.source_group;
        // The batched answers are a prefix of the three reads: what they leave out is read here, in order.
        let began = self.io.target_health.ticket();
        let gathered = self.io.gather.resume(tp, target).await;
        let part = match gathered.target {
            Some(part) => {
                self.io.target_health.success(&self.io.events, began);
                Ok(part)
            }
            None => self.retrying(true, || async { self.io.target.partition(target).await }, |_| false).await,
        };
        let committed = match gathered.committed {
            Some(committed) => Ok(committed),
            None => self
                .retrying(false, || async { self.source().committed(group, std::slice::from_ref(tp)).await }, |_| false)
                .await
                .map(|c| c.first().map(|c| c.offset)),
        };
        let offsets = match gathered.offsets {
            Some(offsets) => Ok(offsets),
            None => self.retrying(false, || async { self.source().log_offsets(tp).await }, |_| false).await,
        };
        let (Ok(target), Ok(committed), Ok((source_earliest, source_latest))) = (part, committed, offsets) else {
            unreachable!("reads are retried until they succeed")
        };
        ResumeFacts { target, committed, source_earliest, source_latest }
    }

    async fn compare_tail(&self, at: u64) -> TailFacts {
        let (tp, target) = (&self.config.tp, &self.config.target);
        let on_target = self.retrying(true, || async { self.io.target.batch_at(target, at).await }, |_| false).await;
        let on_source = self.retrying(false, || async { self.source().batch_at(tp, at).await }, |_| false).await;
        TailFacts { target: on_target.unwrap_or(None), source: on_source.unwrap_or(None) }
    }

    async fn append_plan(&self, plan: AppendPlan) -> Answer {
        self.io.limits.acquire(plan.bytes, plan.records).await;
        // The encoded message is a copy of the batches, and with `sync.compression` its compressed form is another:
        // both count against the budget until the append is answered (without compression, the second is slack).
        let copies = self.budget.hold_copies(2 * plan.bytes);
        let unknown = AtomicBool::new(false);
        let result = self.append_noting(&plan.batches, plan.source_log_start, &unknown).await;
        drop(copies);
        drop(plan.held);
        let (records, bytes) = match &result {
            Ok(AppendOutcome::Appended { present, written, .. }) => {
                // Batches found present on a first attempt were another writer's; after a lost answer, the lost
                // attempt may have written them: they count once.
                let retried = unknown.load(Ordering::Relaxed);
                if *present > 0 {
                    tracing::info!(
                        tp = %self.config.tp,
                        present,
                        written,
                        counted = retried,
                        "batches already on the target were not written again{}",
                        if retried {
                            " (a retry after a lost answer: the lost attempt wrote them, they count once)"
                        } else {
                            " (another writer's: not counted)"
                        }
                    );
                }
                let skip = if retried { 0 } else { *present as usize };
                let put = plan.batches.iter().skip(skip);
                put.fold((0, 0), |(r, b), batch| (r + u64::from(batch.record_count()), b + batch.len() as u64))
            }
            _ => (0, 0),
        };
        Answer::Batches { result, records, bytes }
    }

    async fn append(&self, batches: &[Batch], source_log_start: u64) -> Result<AppendOutcome, Failure> {
        self.append_noting(batches, source_log_start, &AtomicBool::new(false)).await
    }

    /// Appends, retrying what may pass; `unknown` is set when an attempt failed after it may have been written.
    async fn append_noting(
        &self,
        batches: &[Batch],
        source_log_start: u64,
        unknown: &AtomicBool,
    ) -> Result<AppendOutcome, Failure> {
        let (target, topic_id) = (&self.config.target, &self.config.topic_id);
        let r = self
            .retrying(
                true,
                || async {
                    let r = self.io.target.append(target, topic_id, source_log_start, batches).await;
                    if r.as_ref().is_err_and(passing) {
                        unknown.store(true, Ordering::Relaxed);
                    }
                    r
                },
                |e| !passing(e),
            )
            .await;
        r.map_err(|e| if e.is_not_found() { Failure::NotFound(e.to_string()) } else { Failure::Refused(e.to_string()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code) -> ClientError {
        ClientError::Status { code, message: "m".into(), broker: "b:1".into(), reason: None }
    }

    #[test]
    fn only_failures_to_reach_the_target_count_against_its_health() {
        let transport = ClientError::Transport { broker: "b:1".into(), message: "connection refused".into() };
        assert!(unreachable(&transport) && passing(&transport));
        let timeout =
            ClientError::Timeout { rpc: "Append", broker: "b:1".into(), after: std::time::Duration::from_secs(1) };
        assert!(unreachable(&timeout) && passing(&timeout));
        assert!(unreachable(&status(Code::Unavailable)) && unreachable(&status(Code::DeadlineExceeded)));
        // A storage error on one partition is retried, but the target answered it: it is reachable.
        assert!(!unreachable(&status(Code::Internal)) && passing(&status(Code::Internal)));
        assert!(!unreachable(&status(Code::Unknown)) && passing(&status(Code::Unknown)));
        assert!(!unreachable(&status(Code::InvalidArgument)) && !passing(&status(Code::InvalidArgument)));
    }
}
