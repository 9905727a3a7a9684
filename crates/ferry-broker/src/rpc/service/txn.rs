//! The transactional-message RPCs (docs/transactions.md): scopes and request checks, then `crate::txn`.

use std::sync::Arc;

use ferry_proto as pb;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{BrokerService, Rpc, ok};
use crate::error::BrokerError;
use crate::node::internal::TRANSACTIONS;
use crate::rpc::auth::{Scopes, caller, require_member};
use crate::txn::core::{By, Outcome};

impl BrokerService {
    pub(super) async fn txn_prepare_rpc(&self, req: Request<pb::TxnPrepareRequest>) -> Rpc<pb::TxnPrepareResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        for m in &req.messages {
            who.allow_topic("TxnPrepare", Scopes::PRODUCE, &m.topic)?;
        }
        let repeated = self.txns.prepare(&req.group, &req.txn_id, req.messages).await?;
        ok(pb::TxnPrepareResponse { repeated })
    }

    pub(super) async fn txn_resolve_rpc(&self, req: Request<pb::TxnResolveRequest>) -> Rpc<pb::TxnResolveResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let by = if req.operator {
            who.allow("TxnResolve by an operator", Scopes::ADMIN)?;
            By::Operator
        } else {
            // A producer may resolve only transactions of topics it may produce to.
            for topic in self.txns.topics_of(&req.group, &req.txn_id).await? {
                who.allow_topic("TxnResolve", Scopes::PRODUCE, &topic)?;
            }
            who.allow("TxnResolve", Scopes::PRODUCE)?;
            By::Producer
        };
        let outcome = Outcome::from_pb(req.outcome)
            .ok_or_else(|| BrokerError::InvalidArgument("outcome must be TXN_COMMIT or TXN_ROLLBACK".into()))?;
        ok(self.txns.resolve(&req.group, &req.txn_id, outcome, by).await?)
    }

    pub(super) async fn txn_list_rpc(&self, req: Request<pb::TxnListRequest>) -> Rpc<pb::TxnListResponse> {
        caller(&req)?.allow("TxnList", Scopes::ADMIN)?;
        ok(pb::TxnListResponse { transactions: self.txns.list(req.get_ref().all).await? })
    }

    pub(super) async fn txn_checks_rpc(
        &self,
        req: Request<tonic::Streaming<pb::TxnCheckAnswer>>,
    ) -> Rpc<ReceiverStream<Result<pb::TxnCheck, Status>>> {
        caller(&req)?.allow("TxnChecks", Scopes::PRODUCE)?;
        let mut answers = req.into_inner();
        let hello = match answers.next().await {
            Some(Ok(hello)) => hello,
            Some(Err(e)) => return Err(e),
            None => return Err(BrokerError::InvalidArgument("the check stream closed before its hello".into()).into()),
        };
        let group = hello.group;
        if group.is_empty() || group.len() > crate::txn::MAX_ID_BYTES {
            return Err(BrokerError::InvalidArgument(format!(
                "the hello must name the producer group (1..{} bytes)",
                crate::txn::MAX_ID_BYTES
            ))
            .into());
        }
        // The owner of the group's transactions asks the checks: a producer connected elsewhere is sent there.
        self.state.own(&TRANSACTIONS, TRANSACTIONS.partition_of(group.as_bytes()))?;
        let txns = Arc::clone(&self.txns);
        let (id, rx) = txns.checkers.register(&group);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    next = answers.next() => next,
                };
                match next {
                    Some(Ok(a)) => {
                        if let Err(e) = txns.answered(&group, &a.txn_id, a.check_id, a.outcome).await {
                            tracing::debug!(group, txn_id = a.txn_id, error = %e, "a check answer was not recorded");
                        }
                    }
                    Some(Err(_)) | None => break,
                }
            }
            txns.checkers.unregister(&group, id);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    pub(super) async fn txn_append_rpc(&self, req: Request<pb::TxnAppendRequest>) -> Rpc<pb::ProduceResponse> {
        require_member(&req, "TxnAppend", None)?;
        let req = req.into_inner();
        self.member_append(&req.topic, req.partition, req.batches).await
    }
}
