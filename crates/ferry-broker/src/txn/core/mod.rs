//! The decisions of transactional messages, without I/O or clock reads: the table of transactions one partition of
//! `__ferry_transactions` holds (rebuilt by replaying its records), what a prepare or a resolution does to it, and
//! which transactions the check-back must ask about at a given time.
//!
//! Invariants:
//! - A transaction's outcome is recorded once ([`Txn::decided`]); every later request either repeats it or is a
//!   conflict naming it.
//! - A decided transaction is finished (its appends made, then `done` recorded) before anything else is asked of
//!   it; until then [`Resolve::Finish`] tells the caller to make the appends (again: they are idempotent).
//! - Half messages are kept until the transaction is done, then dropped from memory.

use std::collections::{BTreeMap, HashMap};

use ferry_proto as pb;
use prost::Message;

/// A transaction's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its messages are appended.
    Commit,
    /// Its messages are dropped.
    Rollback,
}

impl Outcome {
    /// From the wire: `None` for UNKNOWN or unspecified.
    pub fn from_pb(o: i32) -> Option<Outcome> {
        match pb::TxnOutcome::try_from(o) {
            Ok(pb::TxnOutcome::TxnCommit) => Some(Outcome::Commit),
            Ok(pb::TxnOutcome::TxnRollback) => Some(Outcome::Rollback),
            _ => None,
        }
    }

    /// To the wire.
    pub fn to_pb(self) -> pb::TxnOutcome {
        match self {
            Outcome::Commit => pb::TxnOutcome::TxnCommit,
            Outcome::Rollback => pb::TxnOutcome::TxnRollback,
        }
    }

    /// In words, as the errors and `txn list` say it.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Commit => "committed",
            Outcome::Rollback => "rolled back",
        }
    }
}

/// Who decided an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The producer, by id.
    Producer,
    /// A producer's answer to a check-back.
    Check,
    /// An operator (admin scope, audit-logged).
    Operator,
    /// Rolled back after `max_checks` answered checks left it unknown.
    Expired,
}

impl By {
    /// Its name in records and answers.
    pub fn name(self) -> &'static str {
        match self {
            By::Producer => "producer",
            By::Check => "check",
            By::Operator => "operator",
            By::Expired => "expired",
        }
    }

    fn parse(s: &str) -> By {
        match s {
            "check" => By::Check,
            "operator" => By::Operator,
            "expired" => By::Expired,
            _ => By::Producer,
        }
    }
}

/// A transaction's key: its producer group and id.
pub type Key = (String, String);

/// One transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Txn {
    /// When it was prepared, ms (the record's own clock value).
    pub prepared_ms: i64,
    /// Its half messages, partitions picked; empty once done.
    pub messages: Vec<pb::TxnMessage>,
    /// How many messages it had.
    pub count: u32,
    /// Their encoded size.
    pub bytes: u64,
    /// The producer id of its appends.
    pub producer_id: i64,
    /// Checks a producer answered.
    pub checks: u32,
    /// Its outcome once decided, and by whom.
    pub decided: Option<(Outcome, By)>,
    /// Once finished: where its messages went (empty for a rollback).
    pub done: Option<Vec<pb::TxnOffsets>>,
    /// When it was finished, ms.
    pub done_ms: i64,
}

impl Txn {
    /// Neither committed nor rolled back yet.
    pub fn pending(&self) -> bool {
        self.decided.is_none()
    }

    /// Its state's name in `txn list`.
    pub fn state(&self) -> &'static str {
        match (self.decided, &self.done) {
            (None, _) => "pending",
            (Some((Outcome::Commit, _)), None) => "committing",
            (Some((Outcome::Rollback, _)), None) => "rolling_back",
            (Some((Outcome::Commit, _)), Some(_)) => "committed",
            (Some((Outcome::Rollback, _)), Some(_)) => "rolled_back",
        }
    }
}

/// The transactions of one partition of `__ferry_transactions`.
#[derive(Debug, Default)]
pub struct Table {
    /// Every transaction remembered, by group and id.
    pub txns: BTreeMap<Key, Txn>,
    /// The check-back clock of each pending transaction: memory only (a new owner checks at once what is due).
    pub clocks: HashMap<Key, Clock>,
    /// Records applied since the log was last compacted (or replayed from its start).
    pub applied: usize,
    /// Compact again once `applied` reaches this: twice the last snapshot (at least 1000 records).
    pub compact_at: usize,
}

/// When a pending transaction is next checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    /// Not before this time, ms (0: at its timeout).
    pub next_ms: i64,
    /// The latest check sent.
    pub in_flight: Option<u64>,
    /// The check whose UNKNOWN answer was counted last (each check counts once).
    pub counted: Option<u64>,
    /// It is due, and no producer of its group is connected.
    pub waiting: bool,
}

impl Table {
    /// Pending transactions and their bytes.
    pub fn pending(&self) -> (usize, u64) {
        self.txns.values().filter(|t| t.done.is_none()).fold((0, 0), |(n, b), t| (n + 1, b + t.bytes))
    }

    /// Applies one record's change.
    pub fn apply_record(&mut self, rec: pb::TxnRecord) {
        self.applied += 1;
        let key = (rec.group, rec.txn_id);
        match rec.change {
            Some(pb::txn_record::Change::Prepared(p)) => {
                let bytes = p.messages.iter().map(|m| m.encoded_len() as u64).sum();
                let count = if p.messages.is_empty() { p.count } else { p.messages.len() as u32 };
                self.txns.entry(key).or_insert(Txn {
                    prepared_ms: rec.at_ms,
                    count,
                    messages: p.messages,
                    bytes,
                    producer_id: p.producer_id,
                    checks: 0,
                    decided: None,
                    done: None,
                    done_ms: 0,
                });
            }
            Some(pb::txn_record::Change::Decided(d)) => {
                if let (Some(t), Some(o)) = (self.txns.get_mut(&key), Outcome::from_pb(d.outcome))
                    && t.decided.is_none()
                {
                    t.decided = Some((o, By::parse(&d.by)));
                    self.clocks.remove(&key);
                }
            }
            Some(pb::txn_record::Change::Done(d)) => {
                if let Some(t) = self.txns.get_mut(&key) {
                    t.done = Some(d.offsets);
                    t.done_ms = rec.at_ms;
                    t.messages = Vec::new();
                    t.bytes = 0;
                }
            }
            Some(pb::txn_record::Change::Checked(c)) => {
                if let Some(t) = self.txns.get_mut(&key) {
                    t.checks = t.checks.max(c.checks);
                }
            }
            Some(pb::txn_record::Change::Snapshot(_)) => {
                self.txns.clear();
                self.clocks.clear();
                // What came before no longer counts towards the next compaction.
                self.applied = 1;
            }
            None => {}
        }
    }
}

impl crate::state::Replayed for Table {
    fn apply(&mut self, _offset: u64, record: &ferry_batch::Record) {
        // A record this version cannot read is skipped: the table is what it can rebuild.
        if let Some(rec) = record.value.as_ref().and_then(|v| pb::TxnRecord::decode(v.as_ref()).ok()) {
            self.apply_record(rec);
        }
    }
}

/// The limits a prepare is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Pending transactions at most (`transactions.max_pending`).
    pub max_pending: usize,
    /// Pending bytes at most (`transactions.max_pending_bytes`).
    pub max_pending_bytes: u64,
    /// Messages per transaction at most (`transactions.max_messages`).
    pub max_messages: usize,
    /// Bytes per transaction at most (the broker's batch limit: each partition's share is one batch).
    pub max_txn_bytes: u64,
}

/// What a prepare does.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepare {
    /// Record it.
    Write,
    /// The same transaction was prepared before: nothing to do.
    Repeat,
    /// Refused: the config key of the limit passed, or `None` for a conflicting repeat; and why.
    Refuse(Option<&'static str>, String),
}

/// Decides a prepare of `messages` (partitions picked) as `key`.
pub fn prepare(table: &Table, key: &Key, messages: &[pb::TxnMessage], limits: Limits) -> Prepare {
    if let Some(t) = table.txns.get(key) {
        return match &t.done {
            None if t.messages == messages => Prepare::Repeat,
            Some(_) if t.count as usize == messages.len() => Prepare::Repeat,
            _ => Prepare::Refuse(
                None,
                format!(
                    "transaction {:?} of group {:?} was prepared before with other messages ({} then, {} now); use \
                     a new transaction id",
                    key.1,
                    key.0,
                    t.count,
                    messages.len()
                ),
            ),
        };
    }
    if messages.is_empty() {
        return Prepare::Refuse(None, "a transaction needs at least one message".into());
    }
    if messages.len() > limits.max_messages {
        let what = format!("a transaction of {} messages is refused", messages.len());
        return Prepare::Refuse(Some("transactions.max_messages"), what);
    }
    let bytes: u64 = messages.iter().map(|m| m.encoded_len() as u64).sum();
    if bytes > limits.max_txn_bytes {
        let what = format!("a transaction of {bytes} bytes is refused");
        return Prepare::Refuse(Some("broker.max_batch_bytes"), what);
    }
    let (count, pending_bytes) = table.pending();
    if count >= limits.max_pending {
        let what = format!("{count} transactions are pending here; a new prepare is refused until some resolve");
        return Prepare::Refuse(Some("transactions.max_pending"), what);
    }
    if pending_bytes + bytes > limits.max_pending_bytes {
        let what = format!("{pending_bytes} bytes of half messages are pending here; {bytes} more are refused");
        return Prepare::Refuse(Some("transactions.max_pending_bytes"), what);
    }
    Prepare::Write
}

/// What a resolution does.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolve {
    /// Record the decision, then finish.
    Decide,
    /// Decided before with this outcome, not finished: make the appends and record them done.
    Finish,
    /// Decided and finished before with this outcome: answer with the recorded result.
    Answer,
    /// Decided before with the other outcome, by this one.
    Conflict(Outcome, By),
    /// No such transaction.
    Unknown,
}

/// Decides asking `outcome` of `key`.
pub fn resolve(table: &Table, key: &Key, outcome: Outcome) -> Resolve {
    match table.txns.get(key) {
        None => Resolve::Unknown,
        Some(t) => match (t.decided, &t.done) {
            (None, _) => Resolve::Decide,
            (Some((o, by)), _) if o != outcome => Resolve::Conflict(o, by),
            (Some(_), None) => Resolve::Finish,
            (Some(_), Some(_)) => Resolve::Answer,
        },
    }
}

/// What the check-back does now about one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckAction {
    /// Ask a live producer of its group (check `id`).
    Send(Key, u64),
    /// Due, but no producer of its group is connected: it waits (reported once, when it starts waiting).
    StartedWaiting(Key),
    /// Decided but not finished (its owner changed, or an append failed): finish it.
    Finish(Key),
}

/// The check-back's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// ms before the first check.
    pub timeout_ms: i64,
    /// ms between checks (and before an unanswered check is asked again).
    pub interval_ms: i64,
}

/// The check-back's actions at `now_ms`, given which groups have a live producer; `next_id` numbers checks.
pub fn due(
    table: &mut Table,
    now_ms: i64,
    timing: Timing,
    online: &dyn Fn(&str) -> bool,
    next_id: &mut u64,
) -> Vec<CheckAction> {
    let mut actions = Vec::new();
    for (key, t) in &table.txns {
        if t.decided.is_some() {
            if t.done.is_none() {
                actions.push(CheckAction::Finish(key.clone()));
            }
            continue;
        }
        let clock = table.clocks.entry(key.clone()).or_default();
        if clock.next_ms == 0 {
            clock.next_ms = t.prepared_ms + timing.timeout_ms;
        }
        if now_ms < clock.next_ms {
            continue;
        }
        if !online(&key.0) {
            // The clock pauses: nothing counts while nobody can answer.
            if !clock.waiting {
                clock.waiting = true;
                actions.push(CheckAction::StartedWaiting(key.clone()));
            }
            continue;
        }
        *next_id += 1;
        *clock = Clock { next_ms: now_ms + timing.interval_ms, in_flight: Some(*next_id), waiting: false, ..*clock };
        actions.push(CheckAction::Send(key.clone(), *next_id));
    }
    actions
}

/// What an answer to a check does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Ignored: the transaction is resolved, the check was never sent, or an UNKNOWN answers an older check.
    Stale,
    /// Resolve it with this outcome, by the check.
    Resolve(Outcome),
    /// Unknown: record `checks` answered checks.
    Count(u32),
    /// Unknown for the last allowed time: record the count and roll it back as expired.
    Expire(u32),
}

/// Decides an answer `outcome` (`None`: UNKNOWN) to check `id` of `key`.
pub fn answer(table: &mut Table, key: &Key, id: u64, outcome: Option<Outcome>, max_checks: u32) -> Answer {
    let Some(t) = table.txns.get(key) else { return Answer::Stale };
    let Some(clock) = table.clocks.get_mut(key) else { return Answer::Stale };
    if t.decided.is_some() || clock.in_flight.is_none_or(|latest| id > latest) {
        return Answer::Stale;
    }
    match outcome {
        // Any producer's definite answer about a pending transaction is its outcome, even to an earlier check.
        Some(o) => Answer::Resolve(o),
        // UNKNOWN counts once per check sent: only the answer to the latest.
        None if clock.in_flight != Some(id) || clock.counted == Some(id) => Answer::Stale,
        None => {
            clock.counted = Some(id);
            if t.checks + 1 >= max_checks { Answer::Expire(t.checks + 1) } else { Answer::Count(t.checks + 1) }
        }
    }
}

/// How long and how many finished transactions are remembered (so that a repeat answers the first result).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished longer ago than this, ms, they are forgotten (`transactions.resolved_retention`).
    pub resolved_ms: i64,
    /// At most this many per partition, the oldest forgotten first (`transactions.max_resolved`).
    pub max_resolved: usize,
}

/// The finished transactions to forget at `now_ms`: those past the retention, then the oldest past the count.
pub fn to_forget(table: &Table, now_ms: i64, retention: Retention) -> Vec<Key> {
    let mut finished: Vec<(i64, &Key)> =
        table.txns.iter().filter(|(_, t)| t.done.is_some()).map(|(k, t)| (t.done_ms, k)).collect();
    finished.sort();
    let over = finished.len().saturating_sub(retention.max_resolved);
    finished
        .iter()
        .enumerate()
        .filter(|(i, (done_ms, _))| *i < over || now_ms - done_ms > retention.resolved_ms)
        .map(|(_, (_, k))| (*k).clone())
        .collect()
}

/// Whether the log holds enough records beyond what rebuilds the table to be worth rewriting.
pub fn should_compact(table: &Table) -> bool {
    table.applied >= table.compact_at.max(1000)
}

/// The records that rebuild `table` from nothing: a snapshot marker (a replay drops what came before it), then in key
/// order per transaction its prepare (without the messages once finished), answered checks, decision and finish.
pub fn snapshot(table: &Table) -> Vec<pb::TxnRecord> {
    let start = pb::txn_record::Change::Snapshot(pb::TxnSnapshot {});
    let mut out = vec![pb::TxnRecord { change: Some(start), ..Default::default() }];
    for (key, t) in &table.txns {
        let rec = |at_ms: i64, change: pb::txn_record::Change| pb::TxnRecord {
            group: key.0.clone(),
            txn_id: key.1.clone(),
            at_ms,
            change: Some(change),
        };
        let prepared = pb::TxnPrepared { messages: t.messages.clone(), producer_id: t.producer_id, count: t.count };
        out.push(rec(t.prepared_ms, pb::txn_record::Change::Prepared(prepared)));
        if t.checks > 0 {
            out.push(rec(t.prepared_ms, pb::txn_record::Change::Checked(pb::TxnChecked { checks: t.checks })));
        }
        if let Some((o, by)) = t.decided {
            let decided = pb::TxnDecided { outcome: o.to_pb() as i32, by: by.name().into() };
            out.push(rec(t.prepared_ms, pb::txn_record::Change::Decided(decided)));
        }
        if let (Some((o, _)), Some(offsets)) = (t.decided, &t.done) {
            let done = pb::TxnDone { outcome: o.to_pb() as i32, offsets: offsets.clone() };
            out.push(rec(t.done_ms, pb::txn_record::Change::Done(done)));
        }
    }
    out
}

/// Picks the partition of the `index`-th message of transaction `txn_id` in a topic of `count` partitions: the
/// asked one, else the key's hash, else the transaction id's hash plus the position (spread, and the same on every
/// repeat of the prepare).
pub fn pick_partition(txn_id: &str, index: usize, asked: Option<u32>, key: Option<&[u8]>, count: u32) -> u32 {
    match (asked, key) {
        (Some(p), _) => p,
        (None, Some(k)) => ferry_proto::partition_for_key(k, count),
        (None, None) => {
            let base = ferry_proto::partition_for_key(txn_id.as_bytes(), count);
            ((u64::from(base) + index as u64) % u64::from(count.max(1))) as u32
        }
    }
}

/// The producer id of a transaction's appends: from its group, id and prepare time, never negative.
pub fn producer_id(key: &Key, prepared_ms: i64) -> i64 {
    // FNV-1a over the parts: stable across builds (the std hasher's seed is not promised to be).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [key.0.as_bytes(), &[0], key.1.as_bytes(), &[0], &prepared_ms.to_be_bytes()] {
        for b in part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    (h >> 1) as i64
}

/// Groups `messages` by partition, in the order each partition first appears, each keeping the prepared order.
pub fn by_partition(messages: &[pb::TxnMessage]) -> Vec<((String, u32), Vec<&pb::TxnMessage>)> {
    let mut out: Vec<((String, u32), Vec<&pb::TxnMessage>)> = Vec::new();
    for m in messages {
        let tp = (m.topic.clone(), m.partition.unwrap_or(0));
        match out.iter_mut().find(|(k, _)| *k == tp) {
            Some((_, v)) => v.push(m),
            None => out.push((tp, vec![m])),
        }
    }
    out
}

#[cfg(test)]
mod tests;
