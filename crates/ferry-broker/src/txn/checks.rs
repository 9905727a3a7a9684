//! The check-back: producers keep a stream open (`TxnChecks`) naming their group; the owner of a transaction's
//! partition asks one of them about each transaction due for a check, and acts on the answer.
//!
//! One background task walks the partitions this broker owns every tick: it finishes decided transactions whose
//! appends are not recorded done (a new owner's duty after a failover), and sends the checks that
//! [`super::core::due`] says are due. Answers come back on the streams and are decided by
//! [`super::core::answer`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_proto as pb;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::core::{self, Answer, By, CheckAction, Key, Outcome};
use super::{INTERNAL, Transactions, write};
use crate::error::Result;
use crate::node::registry::now_ms;

/// Checks queued per stream before a slow producer's are dropped (they are asked again at the next interval).
const STREAM_QUEUE: usize = 64;

/// The sender side of one producer's check stream.
pub type CheckSender = mpsc::Sender<Result<pb::TxnCheck, Status>>;

/// The connected producers' check streams, by group.
#[derive(Debug, Default)]
pub struct Checkers {
    streams: Mutex<HashMap<String, Vec<(u64, CheckSender)>>>,
    next: AtomicU64,
    turn: AtomicU64,
    /// The last check id given (ids only need to differ between the checks of one transaction).
    ids: AtomicU64,
}

impl Checkers {
    /// Registers a stream of `group`; returns its id and the receiver the RPC streams out.
    pub fn register(&self, group: &str) -> (u64, mpsc::Receiver<Result<pb::TxnCheck, Status>>) {
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().entry(group.to_owned()).or_default().push((id, tx));
        (id, rx)
    }

    /// Forgets stream `id` of `group`.
    pub fn unregister(&self, group: &str, id: u64) {
        let mut streams = self.streams.lock();
        if let Some(v) = streams.get_mut(group) {
            v.retain(|(i, _)| *i != id);
            if v.is_empty() {
                streams.remove(group);
            }
        }
    }

    /// Whether a producer of `group` is connected.
    pub fn online(&self, group: &str) -> bool {
        self.streams.lock().get(group).is_some_and(|v| v.iter().any(|(_, tx)| !tx.is_closed()))
    }

    /// Closes the streams of every group `keep` refuses, telling their producers why (a NOT_LEADER naming the new
    /// owner, after a failover), so that they open them again where the group's transactions are owned now.
    fn close_unless(&self, keep: impl Fn(&str) -> std::result::Result<(), Status>) {
        let mut streams = self.streams.lock();
        streams.retain(|group, v| match keep(group) {
            Ok(()) => true,
            Err(status) => {
                for (_, tx) in v.iter() {
                    let _ = tx.try_send(Err(status.clone()));
                }
                false
            }
        });
    }

    /// Sends `check` to one connected producer of `group`, taking turns; false when none took it.
    fn send(&self, group: &str, check: pb::TxnCheck) -> bool {
        let streams = self.streams.lock();
        let Some(v) = streams.get(group) else { return false };
        let open: Vec<&CheckSender> = v.iter().map(|(_, tx)| tx).filter(|tx| !tx.is_closed()).collect();
        if open.is_empty() {
            return false;
        }
        let first = self.turn.fetch_add(1, Ordering::Relaxed) as usize;
        (0..open.len()).any(|i| open[(first + i) % open.len()].try_send(Ok(check.clone())).is_ok())
    }
}

impl Transactions {
    /// Runs the check-back until `shutdown`.
    pub async fn run_checks(self: Arc<Self>, shutdown: CancellationToken) {
        let t = self.settings.timing;
        let tick = Duration::from_millis((t.timeout_ms.min(t.interval_ms) / 4).clamp(20, 1000) as u64);
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticker.tick() => self.round().await,
            }
        }
    }

    /// One round over the owned partitions.
    async fn round(&self) {
        let (mut pending, mut waiting) = (0, 0);
        for owned in self.logs.owned(&INTERNAL) {
            match self.round_on(owned.k).await {
                Ok((p, w)) => (pending, waiting) = (pending + p, waiting + w),
                Err(e) => tracing::debug!(partition = owned.k, error = %e, "transaction check round failed; retried"),
            }
        }
        let topic = &INTERNAL;
        self.checkers.close_unless(|group| {
            self.logs.own(topic, topic.partition_of(group.as_bytes())).map(|_| ()).map_err(Status::from)
        });
        self.counters.pending.store(pending, Ordering::Relaxed);
        self.counters.waiting.store(waiting, Ordering::Relaxed);
    }

    async fn round_on(&self, k: u32) -> Result<(i64, i64)> {
        let mut guard = self.owners.lock(&self.logs, k).await?;
        let mut next_id = self.checkers.ids.load(Ordering::Relaxed);
        let online = |g: &str| self.checkers.online(g);
        let actions = core::due(guard.state_mut(), now_ms(), self.settings.timing, &online, &mut next_id);
        self.checkers.ids.fetch_max(next_id, Ordering::Relaxed);
        for action in actions {
            match action {
                CheckAction::Finish(key) => self.finish(&mut guard, &key).await?,
                CheckAction::StartedWaiting(key) => {
                    self.counters.waits.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        event = "txn_waiting_for_producer",
                        group = key.0,
                        txn_id = key.1,
                        "a transaction is due for a check, but no producer of its group is connected; it waits"
                    );
                }
                CheckAction::Send(key, id) => {
                    let messages = guard.state().txns.get(&key).map(|t| t.messages.clone()).unwrap_or_default();
                    let check = pb::TxnCheck { txn_id: key.1.clone(), check_id: id, messages };
                    if self.checkers.send(&key.0, check) {
                        self.counters.checks_sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if core::should_compact(guard.state()) {
            let forget = core::to_forget(guard.state(), now_ms(), self.settings.retention);
            let table = guard.state_mut();
            for key in &forget {
                table.txns.remove(key);
                table.clocks.remove(key);
            }
            let entries: Vec<_> = core::snapshot(table).iter().map(super::entry).collect();
            let dropped = guard.compact(&entries).await?;
            let table = guard.state_mut();
            (table.applied, table.compact_at) = (entries.len(), 2 * entries.len());
            tracing::debug!(
                partition = k,
                forgotten = forget.len(),
                kept = entries.len(),
                dropped,
                "transactions compacted"
            );
        }
        let table = guard.state();
        let pending = table.txns.values().filter(|t| t.pending()).count() as i64;
        let waiting = table.clocks.values().filter(|c| c.waiting).count() as i64;
        Ok((pending, waiting))
    }

    /// Acts on a producer's answer to check `check_id` of `group`/`txn_id`.
    pub async fn answered(&self, group: &str, txn_id: &str, check_id: u64, outcome: i32) -> Result<()> {
        let key: Key = (group.to_owned(), txn_id.to_owned());
        let outcome = match pb::TxnOutcome::try_from(outcome) {
            Ok(pb::TxnOutcome::TxnUnknown) => None,
            _ => match Outcome::from_pb(outcome) {
                Some(o) => Some(o),
                None => return Ok(()),
            },
        };
        self.counters.checks_answered.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.owners.lock_key(&self.logs, group.as_bytes()).await?;
        let verdict = core::answer(guard.state_mut(), &key, check_id, outcome, self.settings.max_checks);
        match verdict {
            Answer::Stale => Ok(()),
            Answer::Resolve(o) => match self.resolve_locked(&mut guard, &key, o, By::Check).await {
                Ok(_) => Ok(()),
                // The producer's own request won the race: its outcome stands, and the check's answer is moot.
                Err(crate::error::BrokerError::Transaction(_)) => Ok(()),
                Err(e) => Err(e),
            },
            Answer::Count(n) => {
                write(&mut guard, &key, now_ms(), pb::txn_record::Change::Checked(pb::TxnChecked { checks: n })).await
            }
            Answer::Expire(n) => {
                write(&mut guard, &key, now_ms(), pb::txn_record::Change::Checked(pb::TxnChecked { checks: n }))
                    .await?;
                tracing::warn!(
                    event = "txn_expired",
                    group = key.0,
                    txn_id = key.1,
                    checks = n,
                    "a transaction stayed unknown after max_checks answered checks; it is rolled back"
                );
                self.resolve_locked(&mut guard, &key, Outcome::Rollback, By::Expired).await.map(|_| ())
            }
        }
    }
}
