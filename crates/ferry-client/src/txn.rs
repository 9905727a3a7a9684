//! Transactional messages (docs/transactions.md): a message is sent if and only if a local transaction happened.
//!
//! - [`Transactions::send_in_transaction`] prepares the messages (half messages no consumer sees), runs the local
//!   work, then commits on success or rolls back on failure.
//! - [`Transactions::prepare`], [`Transactions::commit`] and [`Transactions::rollback`] do the same by transaction
//!   id, for callers that keep the id in their own database.
//! - [`Transactions::start_checker`] keeps a check-back stream open: when a transaction stays unresolved (the
//!   producer died between its local work and the commit), the broker asks a live producer of the same group, which
//!   answers with its [`TransactionChecker`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto as pb;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};
use crate::producer::ProducerRecord;

/// The internal topic whose partition leaders own the transactions (by producer group).
const TXN_TOPIC: &str = "__ferry_transactions";
/// Its partition count.
const TXN_PARTITIONS: u32 = 8;
/// Pause before the check stream is opened again after it broke.
const REOPEN_AFTER: Duration = Duration::from_millis(200);

/// A transaction's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Its messages are visible, once each.
    Commit,
    /// Its messages are dropped.
    Rollback,
}

/// A checker's answer: the local transaction's outcome, or `Unknown` when it cannot tell yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckAnswer {
    /// The local transaction happened: commit.
    Commit,
    /// It did not: roll back.
    Rollback,
    /// Not known yet: the broker asks again later (and rolls back after its `max_checks`).
    Unknown,
}

/// What a resolution did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// The recorded outcome.
    pub outcome: TxnOutcome,
    /// A commit's messages: (topic, partition, first offset, last offset), per partition in the order prepared.
    pub offsets: Vec<(String, u32, u64, u64)>,
    /// The outcome had been recorded before this call.
    pub repeated: bool,
    /// Who decided it: producer, check, operator or expired.
    pub decided_by: String,
}

/// Answers the broker's check-back about a transaction of this producer group.
pub trait TransactionChecker: Send + Sync + 'static {
    /// The outcome of local transaction `txn_id`, whose half messages are `messages`.
    fn check(&self, txn_id: &str, messages: &[ProducerRecord]) -> impl Future<Output = CheckAnswer> + Send;
}

/// Why [`Transactions::send_in_transaction`] did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TxnError<E> {
    /// The local work failed: the transaction was rolled back.
    #[error("the local transaction failed and the messages were rolled back: {0}")]
    Local(E),
    /// A broker call failed; the transaction may still be resolved by the check-back.
    #[error(transparent)]
    Broker(#[from] ClientError),
}

/// Transactional messages of one producer group.
#[derive(Debug, Clone)]
pub struct Transactions {
    client: BrokerClient,
    group: String,
}

fn to_pb(r: ProducerRecord) -> pb::TxnMessage {
    pb::TxnMessage {
        topic: r.topic,
        partition: r.partition,
        key: r.key,
        value: r.value,
        headers: r.headers.into_iter().map(|h| pb::TxnHeader { key: h.key, value: h.value }).collect(),
        timestamp_ms: r.timestamp.unwrap_or(0),
    }
}

fn from_pb(m: pb::TxnMessage) -> ProducerRecord {
    ProducerRecord {
        topic: m.topic,
        partition: m.partition,
        key: m.key,
        value: m.value,
        headers: m.headers.into_iter().map(|h| ferry_batch::Header { key: h.key, value: h.value }).collect(),
        timestamp: Some(m.timestamp_ms),
        when: None,
    }
}

impl Transactions {
    /// The transactions of producer group `group` through `client`.
    pub fn new(client: BrokerClient, group: impl Into<String>) -> Transactions {
        Transactions { client, group: group.into() }
    }

    /// The producer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Prepares `records` as transaction `txn_id`; `Ok(true)` when the same was prepared before.
    pub async fn prepare(&self, txn_id: &str, records: Vec<ProducerRecord>) -> Result<bool> {
        let messages = records.into_iter().map(to_pb).collect();
        let req = pb::TxnPrepareRequest { group: self.group.clone(), txn_id: txn_id.to_owned(), messages };
        Ok(self.client.txn_prepare(req).await?.repeated)
    }

    /// Commits transaction `txn_id`: its messages become visible once each. A conflicting recorded outcome is an
    /// error with reason `txn_already_resolved` naming it.
    pub async fn commit(&self, txn_id: &str) -> Result<TxnResult> {
        self.resolve(txn_id, TxnOutcome::Commit, false).await
    }

    /// Rolls back transaction `txn_id`.
    pub async fn rollback(&self, txn_id: &str) -> Result<TxnResult> {
        self.resolve(txn_id, TxnOutcome::Rollback, false).await
    }

    /// Resolves `txn_id` with `outcome`; `operator` for an administrator's resolution (admin scope).
    pub async fn resolve(&self, txn_id: &str, outcome: TxnOutcome, operator: bool) -> Result<TxnResult> {
        let o = match outcome {
            TxnOutcome::Commit => pb::TxnOutcome::TxnCommit,
            TxnOutcome::Rollback => pb::TxnOutcome::TxnRollback,
        };
        let req =
            pb::TxnResolveRequest { group: self.group.clone(), txn_id: txn_id.to_owned(), outcome: o as i32, operator };
        let r = self.client.txn_resolve(req).await?;
        let outcome =
            if r.outcome == pb::TxnOutcome::TxnCommit as i32 { TxnOutcome::Commit } else { TxnOutcome::Rollback };
        Ok(TxnResult {
            outcome,
            offsets: r.offsets.into_iter().map(|o| (o.topic, o.partition, o.base_offset, o.last_offset)).collect(),
            repeated: r.repeated,
            decided_by: r.decided_by,
        })
    }

    /// Prepares `records` under a fresh transaction id, runs `local`, then commits when it succeeds or rolls back
    /// when it fails. Returns the local result and the commit's result.
    pub async fn send_in_transaction<T, E, F, Fut>(
        &self,
        records: Vec<ProducerRecord>,
        local: F,
    ) -> std::result::Result<(T, TxnResult), TxnError<E>>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        let txn_id = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        self.prepare(&txn_id, records).await?;
        match local(txn_id.clone()).await {
            Ok(v) => Ok((v, self.commit(&txn_id).await?)),
            Err(e) => {
                self.rollback(&txn_id).await?;
                Err(TxnError::Local(e))
            }
        }
    }

    /// Keeps this group's check-back stream open until `stop`, answering each check with `checker`. The stream is
    /// opened to the broker that owns the group's transactions, and again whenever it breaks.
    pub fn start_checker<C: TransactionChecker>(
        &self,
        checker: Arc<C>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Err(e) = this.serve_checks(&checker, &stop).await {
                    tracing::debug!(group = this.group, error = %e, "the check stream broke; opening it again");
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(REOPEN_AFTER) => {}
                }
            }
        })
    }

    async fn serve_checks<C: TransactionChecker>(&self, checker: &Arc<C>, stop: &CancellationToken) -> Result<()> {
        let k = ferry_proto::partition_for_key(self.group.as_bytes(), TXN_PARTITIONS);
        let client = self.client.for_partition(TXN_TOPIC, k);
        let (tx, rx) = mpsc::channel(16);
        let hello = pb::TxnCheckAnswer { group: self.group.clone(), ..Default::default() };
        tx.send(hello).await.map_err(|_| ClientError::Closed("the check stream"))?;
        let broker = client.address();
        let mut raw = client.raw().await?;
        let mut checks = match raw.txn_checks(ReceiverStream::new(rx)).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                if !client.follow_hint(&status) {
                    client.reconnect();
                }
                return Err(ClientError::from_status(&status, &broker));
            }
        };
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                next = checks.next() => next,
            };
            let check = match next {
                Some(Ok(c)) => c,
                Some(Err(status)) => {
                    // The owner moved (NOT_LEADER names the new one): open the stream there.
                    if !client.follow_hint(&status) {
                        client.reconnect();
                    }
                    return Err(ClientError::from_status(&status, &broker));
                }
                None => {
                    client.reconnect();
                    return Ok(());
                }
            };
            let records: Vec<ProducerRecord> = check.messages.into_iter().map(from_pb).collect();
            let outcome = match checker.check(&check.txn_id, &records).await {
                CheckAnswer::Commit => pb::TxnOutcome::TxnCommit,
                CheckAnswer::Rollback => pb::TxnOutcome::TxnRollback,
                CheckAnswer::Unknown => pb::TxnOutcome::TxnUnknown,
            };
            let answer = pb::TxnCheckAnswer {
                group: self.group.clone(),
                txn_id: check.txn_id,
                check_id: check.check_id,
                outcome: outcome as i32,
            };
            tx.send(answer).await.map_err(|_| ClientError::Closed("the check stream"))?;
        }
    }
}
