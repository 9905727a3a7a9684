//! Disaster recovery's calls: fence, promote as one cut, and mark as a mirror topic again. Each covers many topics
//! and answers per topic, so a failover of a thousand topics is a handful of calls with one status.

use ferry_proto as pb;
use tonic::Request;

use super::{BrokerService, Rpc, ok};
use crate::error::BrokerError;
use crate::node::dr::FenceEdit;
use crate::node::topic::{MirrorMark, refuse_reserved};
use crate::rpc::auth::{Scopes, caller};

/// Most topics in one call.
pub const MAX_TOPICS_PER_CALL: usize = 10_000;

fn result(topic: String, outcome: Result<(pb::TopicInfo, bool), BrokerError>) -> pb::TopicResult {
    match outcome {
        Ok((info, was_mirror)) => pb::TopicResult { topic, info: Some(info), was_mirror, ..Default::default() },
        Err(e) => {
            pb::TopicResult { topic, error: e.reason().to_owned(), message: e.client_message(), ..Default::default() }
        }
    }
}

fn check_count(op: &str, n: usize) -> Result<(), BrokerError> {
    if n == 0 || n > MAX_TOPICS_PER_CALL {
        return Err(BrokerError::InvalidArgument(format!("{op} takes 1 to {MAX_TOPICS_PER_CALL} topics, got {n}")));
    }
    Ok(())
}

impl BrokerService {
    pub(super) async fn fence_topics_rpc(&self, req: Request<pb::FenceTopicsRequest>) -> Rpc<pb::FenceTopicsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        check_count("FenceTopics", req.topics.len())?;
        // The mirror fences a source when a failover asks it to; only an admin lifts a fence.
        let need = if req.unfence { Scopes::ADMIN } else { Scopes::ADMIN.or(Scopes::MIRROR) };
        for t in &req.topics {
            who.allow_topic("FenceTopics", need, t)?;
        }
        let edit = if req.unfence {
            FenceEdit::Lift
        } else {
            if req.reason.trim().is_empty() {
                return Err(BrokerError::InvalidArgument("a fence needs a reason naming the failover".into()).into());
            }
            FenceEdit::Set { epoch: req.epoch, reason: req.reason.clone() }
        };
        let mut results = Vec::with_capacity(req.topics.len());
        for name in req.topics {
            let outcome = async {
                refuse_reserved(&name)?;
                match self.replicated(&name) {
                    Some(r) => r.fence(&name, &edit).await,
                    None => self.core.fence(&name, &edit).await.map(|t| self.core.topic_info(&t)),
                }
            }
            .await;
            results.push(result(name, outcome.map(|i| (i, false))));
        }
        if let Some(epoch) = matches!(edit, FenceEdit::Set { .. }).then_some(req.epoch) {
            tracing::warn!(who = who.name(), epoch, reason = req.reason, topics = results.len(), "FenceTopics");
        } else {
            tracing::warn!(who = who.name(), topics = results.len(), "FenceTopics: fences lifted");
        }
        ok(pb::FenceTopicsResponse { results })
    }

    pub(super) async fn promote_topics_rpc(
        &self,
        req: Request<pb::PromoteTopicsRequest>,
    ) -> Rpc<pb::PromoteTopicsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        check_count("PromoteTopics", req.topics.len())?;
        for t in &req.topics {
            who.allow_topic("PromoteTopics", Scopes::ADMIN.or(Scopes::MIRROR), t)?;
        }
        let mut results = Vec::with_capacity(req.topics.len());
        for name in req.topics {
            let outcome = async {
                refuse_reserved(&name)?;
                match self.replicated(&name) {
                    Some(r) => r.promote_cut(&name, req.epoch_floor).await,
                    None => {
                        let (t, was) = self.core.promote_cut(&name, req.epoch_floor).await?;
                        Ok((self.core.topic_info(&t), was))
                    }
                }
            }
            .await;
            results.push(result(name, outcome));
        }
        tracing::warn!(who = who.name(), epoch_floor = req.epoch_floor, topics = results.len(), "PromoteTopics");
        ok(pb::PromoteTopicsResponse { results })
    }

    pub(super) async fn mark_mirror_rpc(&self, req: Request<pb::MarkMirrorRequest>) -> Rpc<pb::MarkMirrorResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("MarkMirror", Scopes::ADMIN, &req.topic)?;
        refuse_reserved(&req.topic)?;
        let mark = MirrorMark::from_proto(
            req.mirror
                .as_ref()
                .ok_or_else(|| BrokerError::InvalidArgument("MarkMirror needs a mirror source".into()))?,
        )?;
        let info = match self.replicated(&req.topic) {
            Some(r) => r.mark_mirror(&req.topic, &mark).await?,
            None => self.core.topic_info(&*self.core.mark_mirror(&req.topic, &mark).await?),
        };
        tracing::warn!(who = who.name(), topic = req.topic, source = mark.source_display(), "MarkMirror");
        ok(pb::MarkMirrorResponse { topic: Some(info) })
    }

    pub(super) async fn put_job_rpc(&self, req: Request<pb::PutJobRequest>) -> Rpc<pb::PutJobResponse> {
        caller(&req)?.allow("PutJob", Scopes::ADMIN.or(Scopes::MIRROR))?;
        let req = req.into_inner();
        let version = crate::jobs::put(&self.jobs, &self.state, &req.job_id, req.expected_version, &req.body).await?;
        ok(pb::PutJobResponse { version })
    }

    pub(super) async fn get_job_rpc(&self, req: Request<pb::GetJobRequest>) -> Rpc<pb::GetJobResponse> {
        caller(&req)?.allow("GetJob", Scopes::ADMIN.or(Scopes::MIRROR))?;
        let job = crate::jobs::get(&self.jobs, &self.state, &req.get_ref().job_id).await?;
        ok(match job {
            Some((version, body)) => pb::GetJobResponse { found: true, version, body },
            None => pb::GetJobResponse::default(),
        })
    }
}
