//! Transactional messages (docs/transactions.md): half messages kept in the internal topic
//! `__ferry_transactions`, where no consumer sees them; an outcome recorded once, first writer wins; then the
//! commit's appends into the real partitions under the transaction's own producer id, so that a repeated append
//! (after a crash, or on a new owner) is acknowledged as a duplicate instead of written twice; then a `done` record.
//!
//! The state is [`core::Table`] per internal partition, owned by that partition's leader (`crate::state`); the
//! decisions are in [`core`], this module performs them. The check-back is in [`checks`].

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use bytes::Bytes;
use ferry_batch::{BatchBuilder, Compression, Header, ProducerInfo};
use ferry_proto as pb;
use prost::Message;

use crate::cluster::manager::Replication;
use crate::config::TransactionsSection;
use crate::error::txn::{TxnRefusal, TxnRefused};
use crate::error::{BrokerError, Result};
use crate::node::internal::TRANSACTIONS;
use crate::node::registry::{BrokerCore, now_ms};
use crate::node::topic::RESERVED_PREFIX;
use crate::state::{Entry, OwnerGuard, Owners, StateLogs};

pub mod checks;
pub mod core;

use self::core::{By, Key, Limits, Outcome, Retention, Table, Timing};

/// Tests only: `FERRY_TEST_TXN_CRASH=POINT:FILE` aborts the process at POINT (`after_decision`, `mid_appends`,
/// `after_appends`) once, while FILE exists (it is removed first): a crash at an exact step of a commit.
pub const CRASH_VAR: &str = "FERRY_TEST_TXN_CRASH";

fn crash_point(point: &str) {
    if let Ok(v) = std::env::var(CRASH_VAR)
        && let Some((p, file)) = v.split_once(':')
        && p == point
        && std::fs::remove_file(file).is_ok()
    {
        tracing::error!(point, "{CRASH_VAR}: crashing on purpose");
        std::process::abort();
    }
}

/// Longest producer group and transaction id, in bytes.
pub const MAX_ID_BYTES: usize = 255;

/// The settings of `[transactions]`, as the decisions take them.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The check-back's timing.
    pub timing: Timing,
    /// Answered checks before an unknown transaction expires.
    pub max_checks: u32,
    /// Limits on prepares.
    pub limits: Limits,
    /// How long and how many finished transactions are remembered.
    pub retention: Retention,
}

impl Settings {
    /// From the config section and the broker's batch limit (a transaction's messages fit one batch).
    pub fn of(section: &TransactionsSection, max_batch_bytes: u64) -> Settings {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Settings {
            timing: Timing { timeout_ms: ms(section.transaction_timeout), interval_ms: ms(section.check_interval) },
            max_checks: section.max_checks,
            limits: Limits {
                max_pending: section.max_pending,
                max_pending_bytes: section.max_pending_bytes.as_u64(),
                max_messages: section.max_messages,
                // The batch header and record framing take a little more than the messages' protobuf size.
                max_txn_bytes: max_batch_bytes.saturating_sub(4096) / 2,
            },
            retention: Retention { resolved_ms: ms(section.resolved_retention), max_resolved: section.max_resolved },
        }
    }
}

/// The counts behind the `ferry_broker_txn_*` metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Pending transactions this broker owns (set by each check-back round).
    pub pending: AtomicI64,
    /// Of them, waiting for a producer of their group.
    pub waiting: AtomicI64,
    /// Transactions committed here.
    pub committed: AtomicU64,
    /// Transactions rolled back here (expired ones included).
    pub rolled_back: AtomicU64,
    /// Transactions rolled back after max_checks unknown answers.
    pub expired: AtomicU64,
    /// Checks sent.
    pub checks_sent: AtomicU64,
    /// Checks answered.
    pub checks_answered: AtomicU64,
    /// Times a due transaction started waiting because no producer of its group was connected.
    pub waits: AtomicU64,
}

/// The transactions of this broker.
pub struct Transactions {
    logs: Arc<StateLogs>,
    core: Arc<BrokerCore>,
    replication: Option<Arc<Replication>>,
    owners: Owners<Table>,
    settings: Settings,
    /// The producers' check-back streams.
    pub(crate) checkers: checks::Checkers,
    /// The metrics' counts.
    pub counters: Counters,
}

impl std::fmt::Debug for Transactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactions").field("settings", &self.settings).finish_non_exhaustive()
    }
}

fn refused(key: &Key, kind: TxnRefusal, reason: String) -> BrokerError {
    BrokerError::Transaction(TxnRefused { group: key.0.clone(), txn_id: key.1.clone(), kind, reason })
}

fn check_ids(group: &str, txn_id: &str) -> Result<()> {
    for (what, v) in [("group", group), ("txn_id", txn_id)] {
        if v.is_empty() || v.len() > MAX_ID_BYTES {
            return Err(BrokerError::InvalidArgument(format!(
                "{what} must be 1..{MAX_ID_BYTES} bytes, got {}",
                v.len()
            )));
        }
    }
    Ok(())
}

impl Transactions {
    /// Over the internal state `logs`, appending through `core` (and a cluster member's `replication`).
    pub fn new(
        logs: Arc<StateLogs>,
        core: Arc<BrokerCore>,
        replication: Option<Arc<Replication>>,
        settings: Settings,
    ) -> Transactions {
        Transactions {
            logs,
            core,
            replication,
            owners: Owners::new(&INTERNAL),
            settings,
            checkers: checks::Checkers::default(),
            counters: Counters::default(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Stores `messages` as transaction `txn_id` of `group`; `Ok(true)` when the same was prepared before.
    pub async fn prepare(&self, group: &str, txn_id: &str, messages: Vec<pb::TxnMessage>) -> Result<bool> {
        check_ids(group, txn_id)?;
        let key: Key = (group.to_owned(), txn_id.to_owned());
        let mut picked = Vec::with_capacity(messages.len());
        let mut stamped = Vec::with_capacity(messages.len());
        for (i, mut m) in messages.into_iter().enumerate() {
            let count = self.partition_count(&m.topic).await?;
            if let Some(p) = m.partition
                && p >= count
            {
                return Err(BrokerError::UnknownPartition { topic: m.topic, partition: p, count });
            }
            m.partition = Some(core::pick_partition(txn_id, i, m.partition, m.key.as_deref(), count));
            stamped.push(m.timestamp_ms <= 0);
            if m.timestamp_ms <= 0 {
                m.timestamp_ms = now_ms();
            }
            picked.push(m);
        }
        let mut guard = self.owners.lock_key(&self.logs, group.as_bytes()).await?;
        // A repeat compares the messages as prepared: the timestamps the broker gave stand for the ones left unset.
        let compare: Vec<pb::TxnMessage> = match guard.state().txns.get(&key) {
            Some(t) if t.messages.len() == picked.len() => picked
                .iter()
                .zip(&t.messages)
                .zip(&stamped)
                .map(|((m, old), stamped)| {
                    let timestamp_ms = if *stamped { old.timestamp_ms } else { m.timestamp_ms };
                    pb::TxnMessage { timestamp_ms, ..m.clone() }
                })
                .collect(),
            _ => picked.clone(),
        };
        match core::prepare(guard.state(), &key, &compare, self.settings.limits) {
            core::Prepare::Repeat => Ok(true),
            core::Prepare::Refuse(Some(limit), what) => Err(BrokerError::LimitReached { what, key: limit }),
            core::Prepare::Refuse(None, why) => Err(refused(&key, TxnRefusal::PrepareConflict, why)),
            core::Prepare::Write => {
                let at_ms = now_ms();
                let producer_id = core::producer_id(&key, at_ms);
                let change = pb::txn_record::Change::Prepared(pb::TxnPrepared {
                    count: picked.len() as u32,
                    messages: picked,
                    producer_id,
                });
                write(&mut guard, &key, at_ms, change).await?;
                Ok(false)
            }
        }
    }

    /// The topics of `group`/`txn_id`'s messages (empty once it is finished, or when there is no such transaction).
    pub async fn topics_of(&self, group: &str, txn_id: &str) -> Result<Vec<String>> {
        check_ids(group, txn_id)?;
        let guard = self.owners.lock_key(&self.logs, group.as_bytes()).await?;
        let key: Key = (group.to_owned(), txn_id.to_owned());
        let mut topics: Vec<String> = guard
            .state()
            .txns
            .get(&key)
            .map(|t| t.messages.iter().map(|m| m.topic.clone()).collect())
            .unwrap_or_default();
        topics.sort();
        topics.dedup();
        Ok(topics)
    }

    /// Records `outcome` for `group`/`txn_id` (first writer wins) and finishes it; the result of the recorded
    /// outcome, or a conflict naming it.
    pub async fn resolve(&self, group: &str, txn_id: &str, outcome: Outcome, by: By) -> Result<pb::TxnResolveResponse> {
        check_ids(group, txn_id)?;
        let key: Key = (group.to_owned(), txn_id.to_owned());
        let mut guard = self.owners.lock_key(&self.logs, group.as_bytes()).await?;
        self.resolve_locked(&mut guard, &key, outcome, by).await
    }

    async fn resolve_locked(
        &self,
        guard: &mut OwnerGuard<'_, Table>,
        key: &Key,
        outcome: Outcome,
        by: By,
    ) -> Result<pb::TxnResolveResponse> {
        let repeated = match core::resolve(guard.state(), key, outcome) {
            core::Resolve::Unknown => {
                return Err(refused(key, TxnRefusal::Unknown, "no such transaction was prepared here".into()));
            }
            core::Resolve::Conflict(recorded, recorded_by) => {
                return Err(refused(
                    key,
                    TxnRefusal::AlreadyResolved,
                    format!(
                        "it was already {} (decided by {}); it cannot be {} now",
                        recorded.name(),
                        recorded_by.name(),
                        outcome.name()
                    ),
                ));
            }
            core::Resolve::Decide => {
                let decided = pb::TxnDecided { outcome: outcome.to_pb() as i32, by: by.name().into() };
                write(guard, key, now_ms(), pb::txn_record::Change::Decided(decided)).await?;
                crash_point("after_decision");
                if by == By::Operator {
                    tracing::warn!(target: "audit", group = key.0, txn_id = key.1, outcome = outcome.name(),
                        "an operator resolved a transaction");
                }
                false
            }
            core::Resolve::Finish => false,
            core::Resolve::Answer => true,
        };
        if !repeated {
            self.finish(guard, key).await?;
        }
        let t = &guard.state().txns[key];
        let (o, decided_by) = t.decided.unwrap_or((outcome, by));
        Ok(pb::TxnResolveResponse {
            outcome: o.to_pb() as i32,
            offsets: t.done.clone().unwrap_or_default(),
            repeated,
            decided_by: decided_by.name().into(),
        })
    }

    /// Makes a decided transaction's appends (a commit's; none for a rollback) and records it done.
    async fn finish(&self, guard: &mut OwnerGuard<'_, Table>, key: &Key) -> Result<()> {
        let Some(t) = guard.state().txns.get(key) else { return Ok(()) };
        let (Some((outcome, by)), None) = (t.decided, &t.done) else { return Ok(()) };
        let mut offsets = Vec::new();
        if outcome == Outcome::Commit {
            for ((topic, p), messages) in core::by_partition(&t.messages) {
                let batch = encode(t.producer_id, &messages);
                let (base_offset, last_offset) = self.append(&topic, p, batch).await?;
                offsets.push(pb::TxnOffsets { topic, partition: p, base_offset, last_offset });
                crash_point("mid_appends");
            }
            crash_point("after_appends");
        }
        let done = pb::TxnDone { outcome: outcome.to_pb() as i32, offsets };
        write(guard, key, now_ms(), pb::txn_record::Change::Done(done)).await?;
        let c = &self.counters;
        match (outcome, by) {
            (Outcome::Commit, _) => c.committed.fetch_add(1, Ordering::Relaxed),
            (Outcome::Rollback, By::Expired) => {
                c.expired.fetch_add(1, Ordering::Relaxed);
                c.rolled_back.fetch_add(1, Ordering::Relaxed)
            }
            (Outcome::Rollback, _) => c.rolled_back.fetch_add(1, Ordering::Relaxed),
        };
        Ok(())
    }

    /// Appends one transaction batch to `topic`/`p` as a client produce does; a retried batch is a duplicate and
    /// answers the offsets of its first write. On a cluster, a partition led by another member gets it through that
    /// leader (`TxnAppend`, with this member's credential).
    async fn append(&self, topic: &str, p: u32, batch: Bytes) -> Result<(u64, u64)> {
        let Some(r) = &self.replication else {
            let produced = self.core.partition(topic, p)?.produce(batch).await?;
            return Ok((produced.base_offset, produced.last_offset));
        };
        let refused = match self.core.partition(topic, p) {
            Ok(part) => match r.serving().produce(&part, batch.clone()).await {
                Ok(produced) => {
                    r.serving().await_ack(&part, &produced, r.ack_timeout()).await?;
                    return Ok((produced.base_offset, produced.last_offset));
                }
                Err(e) => e,
            },
            Err(e) => r.not_here(topic, p).unwrap_or(e),
        };
        let BrokerError::NotLeader { leader, .. } = refused else { return Err(refused) };
        if leader == 0 || leader == r.broker_id() {
            return Err(refused);
        }
        let mut peer = r.peer(leader, &r.snapshot()).ok_or_else(|| {
            BrokerError::Cluster(format!("{topic}/{p}: no address is known for its leader, broker {leader}; retry"))
        })?;
        let req = pb::TxnAppendRequest { topic: topic.to_owned(), partition: p, batches: batch };
        let resp = peer.txn_append(req).await.map_err(|s| {
            BrokerError::Cluster(format!(
                "{topic}/{p}: its leader, broker {leader}, did not take the append: {}",
                s.message()
            ))
        })?;
        let resp = resp.into_inner();
        Ok((resp.base_offset, resp.last_offset))
    }

    /// How many partitions `topic` has, refusing internal and mirror topics.
    async fn partition_count(&self, topic: &str) -> Result<u32> {
        if topic.starts_with(RESERVED_PREFIX) {
            return Err(BrokerError::InvalidArgument(format!("topic {topic:?} is internal; it takes no messages")));
        }
        match self.core.topic(topic) {
            Ok(t) => match t.mirror() {
                Some(mark) => Err(BrokerError::MirrorTopicReadOnly {
                    topic: topic.to_owned(),
                    source_cluster: mark.source_display().to_owned(),
                }),
                None => Ok(t.partition_count()),
            },
            Err(e) => match &self.replication {
                Some(r) if r.is_replicated(topic) => Ok(r.describe(topic).await?.partitions),
                _ => Err(e),
            },
        }
    }

    /// The transactions of the internal partitions this broker owns; resolved ones too with `all`.
    pub async fn list(&self, all: bool) -> Result<Vec<pb::TxnInfo>> {
        let mut out = Vec::new();
        let now = now_ms();
        for owned in self.logs.owned(&INTERNAL) {
            let guard = self.owners.lock(&self.logs, owned.k).await?;
            let table = guard.state();
            for (key, t) in &table.txns {
                if !all && t.done.is_some() {
                    continue;
                }
                out.push(pb::TxnInfo {
                    group: key.0.clone(),
                    txn_id: key.1.clone(),
                    state: t.state().into(),
                    age_ms: u64::try_from(now - t.prepared_ms).unwrap_or(0),
                    checks: t.checks,
                    messages: t.count,
                    bytes: t.bytes,
                    waiting_for_producer: table.clocks.get(key).is_some_and(|c| c.waiting),
                    decided_by: t.decided.map(|(_, by)| by.name().to_owned()).unwrap_or_default(),
                    producer_id: t.producer_id,
                    offsets: t.done.clone().unwrap_or_default(),
                });
            }
        }
        Ok(out)
    }
}

/// The internal topic, as a static the state owners refer to.
static INTERNAL: crate::node::internal::InternalTopic = TRANSACTIONS;

/// One record about `key` as a state entry.
fn entry(rec: &pb::TxnRecord) -> Entry {
    Entry { key: Bytes::from(format!("{}\u{0}{}", rec.group, rec.txn_id)), value: Bytes::from(rec.encode_to_vec()) }
}

/// Writes one record about `key`.
async fn write(guard: &mut OwnerGuard<'_, Table>, key: &Key, at_ms: i64, change: pb::txn_record::Change) -> Result<()> {
    let rec = pb::TxnRecord { group: key.0.clone(), txn_id: key.1.clone(), at_ms, change: Some(change) };
    guard.write(&[entry(&rec)]).await
}

/// One partition's share of a transaction as one idempotent batch: sequence 0 of the transaction's producer id.
fn encode(producer_id: i64, messages: &[&pb::TxnMessage]) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None, ProducerInfo { producer_id, producer_epoch: 0, base_sequence: 0 });
    for (i, m) in messages.iter().enumerate() {
        let headers: Vec<Header> =
            m.headers.iter().map(|h| Header { key: h.key.clone(), value: h.value.clone() }).collect();
        b.push(i as u32, m.timestamp_ms, m.key.as_deref(), m.value.as_deref(), &headers);
    }
    b.build(0, 0)
}
