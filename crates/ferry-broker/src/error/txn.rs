//! The refusals of transactional-message requests (`crate::txn`): which rule, its reason name and gRPC code.

use tonic::Code;

/// A transactional-message request that the transaction's recorded state refuses.
#[derive(Debug, thiserror::Error)]
#[error("transaction {txn_id:?} of group {group:?}: {reason}")]
pub struct TxnRefused {
    /// Producer group.
    pub group: String,
    /// Transaction id.
    pub txn_id: String,
    /// Which rule refused it.
    pub kind: TxnRefusal,
    /// What was wrong, naming the recorded outcome where there is one.
    pub reason: String,
}

/// Why a transaction request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnRefusal {
    /// The other outcome was recorded before (`txn_already_resolved`).
    AlreadyResolved,
    /// No such transaction was prepared (`txn_unknown`).
    Unknown,
    /// A repeated prepare with other messages (`txn_prepare_conflict`).
    PrepareConflict,
}

impl TxnRefused {
    /// The stable reason name.
    pub fn reason_name(&self) -> &'static str {
        match self.kind {
            TxnRefusal::AlreadyResolved => "txn_already_resolved",
            TxnRefusal::Unknown => "txn_unknown",
            TxnRefusal::PrepareConflict => "txn_prepare_conflict",
        }
    }

    /// The gRPC code.
    pub fn code(&self) -> Code {
        match self.kind {
            TxnRefusal::Unknown => Code::NotFound,
            TxnRefusal::AlreadyResolved | TxnRefusal::PrepareConflict => Code::FailedPrecondition,
        }
    }
}
