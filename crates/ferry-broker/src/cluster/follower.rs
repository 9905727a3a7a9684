//! A follower's fetcher: first it truncates to the end of the last leader epoch it shares with its leader
//! (KIP-101, KIP-279), then it fetches from its log end, writes the leader's epoch boundaries durably before the
//! batches they describe, appends the batches with their offsets (the gap record and the log start come along),
//! and takes the leader's high watermark. It runs until the replica's role changes. A gap in the leader's log (left
//! by a mirror topic's source retention) reaches the follower as a first batch above its log end; it copies it as
//! the same gap.

use std::sync::Arc;
use std::time::Duration;

use ferry_proto as pb;
use tokio_util::sync::CancellationToken;

use ferry_storage::StorageError;

use crate::cluster::peers::PeerClient;
use crate::error::BrokerError;
use crate::events::{Event, Events};
use crate::node::leader_epochs::EpochEntry;
use crate::node::partition::Partition;

/// What a fetcher follows, and how.
#[derive(Debug, Clone)]
pub struct Follow {
    /// This broker's id.
    pub me: u32,
    /// The leader's broker id.
    pub leader: u32,
    /// The leader epoch followed.
    pub epoch: u32,
    /// The topic's id.
    pub topic_id: String,
    /// Bytes per fetch.
    pub max_bytes: u64,
    /// How long a fetch may wait at the leader for data.
    pub max_wait: Duration,
    /// Pause after a failed call.
    pub retry: Duration,
    /// The broker's event counters.
    pub events: Arc<Events>,
}

/// Runs the fetcher of `part` against `client` (the leader) until `stop`.
pub async fn run(part: Arc<Partition>, client: PeerClient, follow: Follow, stop: CancellationToken) {
    if let Some(r) = part.replica()
        && part.log().log_end_offset() == part.log().log_start_offset()
    {
        // Nothing held: nothing to check.
        r.set_verified();
    }
    // What the replica held at its start is checked once the leader has seen one unverified fetch of it, which
    // takes it out of the ISR until the check is done (see `verify`).
    let mut unverified = part.replica().is_some_and(|r| !r.verified());
    let mut reconciled = false;
    let mut failing = false;
    // A beat after the first failure, growing to four beats while it lasts (the leader may be gone: the manager
    // stops this fetcher once etcd names the next one).
    let backoff = || {
        backon::ExponentialBuilder::default()
            .with_min_delay(follow.retry)
            .with_max_delay(follow.retry * 4)
            .with_jitter()
            .without_max_times()
    };
    let mut delays = backon::BackoffBuilder::build(backoff());
    while !stop.is_cancelled() {
        let step = if reconciled {
            let fetched = fetch_once(&part, client.clone(), &follow, &stop).await;
            if fetched.is_ok() && std::mem::take(&mut unverified) {
                let (part, stop) = (Arc::clone(&part), stop.clone());
                let events = Arc::clone(&follow.events);
                tokio::spawn(async move { verify(&part, &stop, &events).await });
            }
            fetched
        } else {
            reconcile(&part, client.clone(), &follow).await.map(|()| reconciled = true)
        };
        match step {
            Ok(()) => {
                if failing {
                    delays = backon::BackoffBuilder::build(backoff());
                    tracing::info!(
                        topic = part.topic(),
                        partition = part.index(),
                        leader = follow.leader,
                        "replication resumed"
                    );
                    failing = false;
                }
            }
            Err(Step::Reconcile(why)) => {
                tracing::info!(
                    topic = part.topic(),
                    partition = part.index(),
                    why,
                    "reconciling with the leader again"
                );
                reconciled = false;
            }
            Err(Step::Failed(why)) => {
                if !failing {
                    tracing::warn!(
                        topic = part.topic(),
                        partition = part.index(),
                        leader = follow.leader,
                        epoch = follow.epoch,
                        error = why,
                        "replica fetch failed; retrying"
                    );
                    failing = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delays.next().unwrap_or(follow.retry)) => {}
                }
            }
        }
    }
}

enum Step {
    /// Truncate again before fetching more.
    Reconcile(String),
    /// Retry after a pause.
    Failed(String),
}

/// CRC-checks what the replica holds (every batch below the log end of now; later ones are checked on the way
/// in). Until it is done, the replica's fetches say it is unverified, and the leader keeps it out of the ISR. A
/// corrupt batch, and everything after it, is truncated away and fetched again from the leader.
/// Then the replica counts as verified.
async fn verify(part: &Partition, stop: &CancellationToken, events: &Events) {
    let Some(replica) = part.replica() else { return };
    let end = part.log().log_end_offset();
    let mut offset = part.log().log_start_offset();
    let (topic, index) = (part.topic(), part.index());
    while offset < end && !stop.is_cancelled() {
        match part.read_log(offset, 4 << 20) {
            Ok(r) if r.next_offset > offset => offset = r.next_offset,
            Ok(_) => break,
            Err(BrokerError::Storage { source: StorageError::CorruptSegment { offset: at, .. }, .. }) => {
                let from = at.unwrap_or(offset).max(offset);
                events.note(Event::ReplicaRepair);
                tracing::warn!(
                    event = "replica_repair",
                    topic,
                    partition = index,
                    from,
                    "corrupt batch in this replica's log; truncating and fetching it again from the leader"
                );
                if let Err(e) = part.truncate_replica(from).await {
                    tracing::error!(topic, partition = index, error = %e, "truncating the corrupt tail failed");
                    return;
                }
                break;
            }
            Err(e) => {
                // Retention moved the log start meanwhile, or a read failed: check from where the log is now.
                let start = part.log().log_start_offset();
                if start > offset {
                    offset = start;
                    continue;
                }
                tracing::error!(topic, partition = index, error = %e, "verifying the replica failed; it stays out of the ISR");
                return;
            }
        }
    }
    if !stop.is_cancelled() {
        replica.set_verified();
        tracing::info!(topic, partition = index, checked_to = offset.min(end), "replica verified");
    }
}

/// Truncates the log to the end of the last epoch shared with the leader.
async fn reconcile(part: &Partition, mut client: PeerClient, f: &Follow) -> Result<(), Step> {
    let Some(replica) = part.replica() else { return Ok(()) };
    let leo = part.log().log_end_offset();
    let Some(latest) = replica.epochs().last().copied() else {
        // No history: nothing written under any leader, unless the log holds data from before (then it goes).
        if leo > part.log().log_start_offset() {
            part.truncate_replica(0).await.map_err(|e| Step::Failed(e.to_string()))?;
        }
        return Ok(());
    };
    let request = pb::LeaderEpochEndRequest {
        topic: part.topic().to_owned(),
        partition: part.index(),
        leader_epoch: latest.epoch,
        current_leader_epoch: f.epoch,
    };
    let answer = client.leader_epoch_end(request).await.map_err(|s| Step::Failed(s.message().to_owned()))?.into_inner();
    if answer.error != pb::ErrorCode::None as i32 {
        return Err(Step::Failed(answer.message));
    }
    // Our entries of epochs the leader never had diverge from where the first of them starts.
    let history = replica.epochs();
    let ours_after = history.iter().find(|e| e.epoch > answer.leader_epoch).map_or(u64::MAX, |e| e.start);
    let target = answer.end_offset.min(ours_after).min(leo);
    if target < leo {
        let after = part.truncate_replica(target).await.map_err(|e| Step::Failed(e.to_string()))?;
        tracing::info!(
            topic = part.topic(),
            partition = part.index(),
            from = leo,
            to = after,
            leader_epoch = answer.leader_epoch,
            "truncated to the end of the last leader epoch shared with the leader"
        );
    }
    Ok(())
}

async fn fetch_once(
    part: &Partition,
    mut client: PeerClient,
    f: &Follow,
    stop: &CancellationToken,
) -> Result<(), Step> {
    let Some(replica) = part.replica() else { return Ok(()) };
    let leo = part.log().log_end_offset();
    let request = pb::ReplicaFetchRequest {
        topic: part.topic().to_owned(),
        partition: part.index(),
        offset: leo,
        leader_epoch: f.epoch,
        replica_id: f.me,
        max_bytes: f.max_bytes,
        max_wait_ms: u32::try_from(f.max_wait.as_millis()).unwrap_or(u32::MAX),
        topic_id: f.topic_id.clone(),
        verified: replica.verified(),
    };
    let answer = tokio::select! {
        _ = stop.cancelled() => return Ok(()),
        a = client.replica_fetch(request) => a,
    };
    let answer = answer.map_err(|s| Step::Failed(s.message().to_owned()))?.into_inner();
    match pb::ErrorCode::try_from(answer.error) {
        Ok(pb::ErrorCode::None) => {}
        Ok(pb::ErrorCode::OffsetOutOfRange) => return Err(Step::Reconcile(answer.message)),
        _ => return Err(Step::Failed(answer.message)),
    }
    if stop.is_cancelled() {
        return Ok(());
    }
    let epochs: Vec<EpochEntry> =
        answer.epochs.iter().map(|e| EpochEntry { epoch: e.leader_epoch, start: e.start_offset }).collect();
    let fresh: Vec<EpochEntry> = {
        let known = replica.epochs();
        epochs.into_iter().filter(|e| known.last().is_none_or(|l| e.epoch > l.epoch)).collect()
    };
    if !fresh.is_empty() {
        let (r, log) = (Arc::clone(replica), Arc::clone(part.log()));
        tokio::task::spawn_blocking(move || r.learn_epochs(&**log.file_system(), &fresh))
            .await
            .map_err(|e| Step::Failed(e.to_string()))?
            .map_err(|e| Step::Failed(e.to_string()))?;
    }
    if !answer.batches.is_empty() || answer.log_start_offset > leo {
        // A first batch above this replica's log end, answered to a fetch at that end, follows a gap in the
        // leader's log (mirrored retention): it is copied as a gap from here to that batch, as the leader has it.
        let first_base =
            ferry_batch::BatchIter::new(&answer.batches).next().and_then(|b| b.ok()).map(|(h, _)| h.base_offset);
        let start = match first_base {
            Some(base) if base > leo => answer.log_start_offset.max(base),
            _ => answer.log_start_offset,
        };
        if let Err(e) = part.append_with_offsets(answer.batches, start).await {
            return Err(Step::Reconcile(e.to_string()));
        }
    }
    // The leader's log start (its retention, or a compaction of the offsets partitions): the segments wholly
    // before it go here too.
    let leader_start = answer.log_start_offset;
    if leader_start > part.log().log_start_offset() && leader_start <= part.log().log_end_offset() {
        let log = Arc::clone(part.log());
        let deleted = tokio::task::spawn_blocking(move || log.delete_segments_before(leader_start))
            .await
            .map_err(|e| Step::Failed(e.to_string()))?;
        if let Err(e) = deleted {
            tracing::warn!(topic = part.topic(), partition = part.index(), error = %e, "cannot follow the leader's log start");
        }
    }
    // The leader's HW, capped at what this replica holds.
    replica.raise_hw(answer.high_watermark.min(part.log().log_end_offset()));
    replica.learn_leader(answer.leader_epoch, f.leader);
    Ok(())
}
