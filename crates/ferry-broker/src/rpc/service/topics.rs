//! The service's topic shape calls (create, delete, grow, config, promote) and the mirror's writes (append with
//! offsets, truncate). A replicated topic's shape lives in the cluster's catalog, so those calls go through the
//! replication manager; a single broker's topic is changed here, under the core's admin lock. A mirror's write to a
//! replicated partition is taken by its leader and answered once the in-sync set holds it.

use std::sync::Arc;

use ferry_proto as pb;
use ferry_storage::OffsetAppendOutcome;
use prost::Message;
use sha2::Digest;
use tonic::Request;

use super::{BrokerService, Rpc, SHAPE_MIRROR, append_error, ok, shape_scopes};
use crate::cluster::catalog::Replication as Mode;
use crate::error::{BrokerError, RefusalKind};
use crate::node::partition::Produced;
use crate::node::topic::{MirrorMark, TopicSettings, refuse_reserved};
use crate::rpc::auth::{Scopes, caller};

impl BrokerService {
    /// The mirror's append to `part`, through the serving side on a cluster member.
    async fn append_mirrored_to(
        &self,
        part: &crate::node::partition::Partition,
        batches: bytes::Bytes,
        source_log_start: u64,
    ) -> Result<(OffsetAppendOutcome, u32), BrokerError> {
        match self.replication.as_ref() {
            Some(r) => r.serving().append_mirrored(part, batches, source_log_start).await,
            None => part.append_mirrored(batches, source_log_start, None).await,
        }
    }

    /// The replication manager, when `name` is one of the cluster's replicated topics.
    pub(super) fn replicated(&self, name: &str) -> Option<&Arc<crate::cluster::manager::Replication>> {
        self.replication.as_ref().filter(|r| r.is_replicated(name))
    }

    /// Where fetches and subscriptions point a client for partitions this broker cannot answer for.
    pub(super) fn leader_hints(&self) -> crate::rpc::fetch::LeaderHints {
        let r = Arc::clone(self.replication.as_ref()?);
        Some(Arc::new(move |topic: &str, partition: u32| r.leader_hint(topic, partition)))
    }

    /// What reads go through: the partitions, and on a cluster member its serving side and leader hints.
    pub(super) fn reads(&self) -> crate::rpc::fetch::Reads {
        let serving = self.replication.as_ref().map(|r| r.serving().clone());
        crate::rpc::fetch::Reads::new(Arc::clone(&self.core), serving, self.leader_hints())
    }

    pub(super) async fn create_topic_rpc(&self, req: Request<pb::CreateTopicRequest>) -> Rpc<pb::CreateTopicResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let need = if req.mirror.is_some() { SHAPE_MIRROR } else { Scopes::ADMIN };
        who.allow_topic("CreateTopic", need, &req.name)?;
        let settings = TopicSettings::from_proto(req.config.as_ref())?;
        if req.mirror.is_none() {
            self.check_topic_delay(&req.name, &settings)?;
        }
        let mode = Mode::parse(&req.replication).map_err(BrokerError::InvalidArgument)?;
        let mirror = req.mirror.as_ref().map(MirrorMark::from_proto).transpose()?;
        if !mode.is_single() {
            let r = self.replication()?;
            let info = r.create_topic(&req.name, req.partitions, mode, req.risk_phase, settings, mirror).await?;
            return ok(pb::CreateTopicResponse { topic: Some(info) });
        }
        if req.risk_phase {
            return Err(BrokerError::InvalidArgument(format!(
                "topic \"{}\": the risk phase is a double_write setting, not single's",
                req.name
            ))
            .into());
        }
        let t = self.core.create_topic(&req.name, req.partitions, settings, mirror).await?;
        ok(pb::CreateTopicResponse { topic: Some(self.core.topic_info(&t)) })
    }

    pub(super) async fn delete_topic_rpc(&self, req: Request<pb::DeleteTopicRequest>) -> Rpc<pb::DeleteTopicResponse> {
        let who = caller(&req)?;
        let name = req.into_inner().name;
        who.allow_topic("DeleteTopic", Scopes::ADMIN, &name)?;
        refuse_reserved(&name)?;
        if let Some(r) = self.replicated(&name) {
            r.delete(&name).await?;
            return ok(pb::DeleteTopicResponse {});
        }
        // Its committed offsets go with it, under the same admin turn: a topic created later under the name starts
        // from offset 0, and one created right after keeps what is committed to it.
        let groups = Arc::clone(&self.groups);
        let gone = name.clone();
        self.core.delete_topic(&name, Box::new(move || groups.forget_topics(&|t| t == gone).map(drop))).await?;
        ok(pb::DeleteTopicResponse {})
    }

    pub(super) async fn alter_partitions_rpc(
        &self,
        req: Request<pb::AlterPartitionsRequest>,
    ) -> Rpc<pb::AlterPartitionsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("AlterPartitions", shape_scopes(&self.core, &req.name), &req.name)?;
        refuse_reserved(&req.name)?;
        if let Some(r) = self.replicated(&req.name) {
            let info = r.grow(&req.name, req.partitions).await?;
            return ok(pb::AlterPartitionsResponse { topic: Some(info) });
        }
        let t = self.core.alter_partitions(&req.name, req.partitions).await?;
        ok(pb::AlterPartitionsResponse { topic: Some(self.core.topic_info(&t)) })
    }

    pub(super) async fn alter_topic_config_rpc(
        &self,
        req: Request<pb::AlterTopicConfigRequest>,
    ) -> Rpc<pb::AlterTopicConfigResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("AlterTopicConfig", shape_scopes(&self.core, &req.name), &req.name)?;
        refuse_reserved(&req.name)?;
        let settings = TopicSettings::from_proto(req.config.as_ref())?;
        self.check_topic_delay(&req.name, &settings)?;
        if let Some(r) = self.replicated(&req.name) {
            let info = r.alter_config(&req.name, &settings).await?;
            return ok(pb::AlterTopicConfigResponse { topic: Some(info) });
        }
        let t = self.core.alter_config(&req.name, settings).await?;
        ok(pb::AlterTopicConfigResponse { topic: Some(self.core.topic_info(&t)) })
    }

    pub(super) async fn promote_rpc(&self, req: Request<pb::PromoteRequest>) -> Rpc<pb::PromoteResponse> {
        let who = caller(&req)?;
        let name = req.into_inner().name;
        who.allow_topic("Promote", Scopes::ADMIN, &name)?;
        refuse_reserved(&name)?;
        if let Some(r) = self.replicated(&name) {
            let (topic, was_mirror) = r.promote(&name).await?;
            return ok(pb::PromoteResponse { topic: Some(topic), was_mirror });
        }
        let (t, was_mirror) = self.core.promote(&name).await?;
        ok(pb::PromoteResponse { topic: Some(self.core.topic_info(&t)), was_mirror })
    }

    pub(super) async fn append_with_offsets_rpc(
        &self,
        req: Request<pb::AppendWithOffsetsRequest>,
    ) -> Rpc<pb::AppendWithOffsetsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("AppendWithOffsets", Scopes::MIRROR, &req.topic)?;
        refuse_reserved(&req.topic)?;
        let topic = self.local_topic(&req.topic, Some(req.partition))?;
        let part = self.placed(&topic, req.partition)?;
        let (leo, start) = (part.visible_end(), part.log().log_start_offset());
        let Some(mark) = topic.mirror() else {
            let err = BrokerError::NotAMirrorTopic { topic: req.topic.clone(), what: "append with offsets" };
            return ok(append_error(pb::ErrorCode::NotAMirrorTopic, err.to_string(), leo, start));
        };
        if mark.source_topic_id != req.source_topic_id {
            return ok(append_error(
                pb::ErrorCode::TopicIdMismatch,
                format!(
                    "topic \"{}\" mirrors source topic id {}, but the batches come from source topic id {}; \
                     the source topic was re-created",
                    req.topic, mark.source_topic_id, req.source_topic_id
                ),
                leo,
                start,
            ));
        }
        let (outcome, leader_epoch) =
            match self.append_mirrored_to(&part, req.batches, req.source_log_start_offset).await {
                Ok(o) => o,
                Err(BrokerError::AppendRefused { offset, kind, reason, .. }) => {
                    let code = match kind {
                        RefusalKind::Gap => pb::ErrorCode::GapRefused,
                        RefusalKind::Straddle => pb::ErrorCode::StraddlesEnd,
                        RefusalKind::EpochRegressed => pb::ErrorCode::EpochRegressed,
                    };
                    let (leo, start) = (part.visible_end(), part.log().log_start_offset());
                    return ok(append_error(code, format!("batch at offset {offset}: {reason}"), leo, start));
                }
                Err(e) => return Err(e.into()),
            };
        if let (Some(r), OffsetAppendOutcome::Appended { log_end_offset, .. }) = (&self.replication, &outcome)
            && part.replica().is_some()
            && *log_end_offset > 0
        {
            // What the leader holds up to its log end, written now or present before, counts once the in-sync set
            // holds it too: the mirror moves on from an answer, so it must survive the loss of this leader.
            let held = Produced {
                base_offset: 0,
                last_offset: log_end_offset - 1,
                duplicate: false,
                log_end_offset: *log_end_offset,
                leader_epoch,
            };
            r.serving().await_ack(&part, &held, r.ack_timeout()).await?;
        }
        let start = part.log().log_start_offset();
        let visible = |leo: u64| if part.replica().is_some() { part.visible_end().min(leo) } else { leo };
        ok(match outcome {
            OffsetAppendOutcome::Appended { written, present, log_end_offset } => pb::AppendWithOffsetsResponse {
                error: pb::ErrorCode::None as i32,
                message: String::new(),
                log_end_offset: visible(log_end_offset),
                written_batches: written,
                present_batches: present,
                diverged_at: None,
                log_start_offset: start,
            },
            OffsetAppendOutcome::Diverged { at, written, present, log_end_offset } => pb::AppendWithOffsetsResponse {
                error: pb::ErrorCode::Diverged as i32,
                message: format!(
                    "{}/{}: stored data differs from the offered batches at offset {at}",
                    req.topic, req.partition
                ),
                log_end_offset: visible(log_end_offset),
                written_batches: written,
                present_batches: present,
                diverged_at: Some(at),
                log_start_offset: start,
            },
        })
    }

    pub(super) async fn truncate_partition_rpc(
        &self,
        req: Request<pb::TruncatePartitionRequest>,
    ) -> Rpc<pb::TruncatePartitionResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let need = if self.core.topic(&req.topic).is_ok_and(|t| t.mirror().is_some()) {
            Scopes::MIRROR
        } else {
            Scopes::ADMIN
        };
        who.allow_topic("TruncatePartition", need, &req.topic)?;
        refuse_reserved(&req.topic)?;
        let topic = self.local_topic(&req.topic, Some(req.partition))?;
        if topic.mirror().is_none() {
            return Err(BrokerError::NotAMirrorTopic { topic: req.topic, what: "truncation" }.into());
        }
        let part = topic.partition(req.partition)?;
        let leo = match (&self.replication, part.replica().is_some()) {
            (Some(r), true) => r.truncate_leading(&part, req.offset).await?,
            _ => part.truncate(req.offset).await?,
        };
        tracing::warn!(topic = %req.topic, partition = req.partition, offset = req.offset, leo, "mirror partition truncated");
        ok(pb::TruncatePartitionResponse { log_end_offset: leo })
    }

    /// A cluster member's append for another feature's owner (a transaction's commit, a delayed record's move) to
    /// a partition this broker leads: a produce, answered once the in-sync replicas hold it.
    pub(super) async fn member_append(
        &self,
        topic: &str,
        partition: u32,
        batches: bytes::Bytes,
    ) -> Rpc<pb::ProduceResponse> {
        ok(self.append_here(topic, partition, batches).await?)
    }

    /// The append of [`BrokerService::member_append`], its error as the broker's.
    pub(super) async fn append_here(
        &self,
        topic: &str,
        partition: u32,
        batches: bytes::Bytes,
    ) -> Result<pb::ProduceResponse, BrokerError> {
        let t = self.local_topic(topic, Some(partition))?;
        let part = self.placed(&t, partition)?;
        let produced = self.produce_to(&part, batches).await?;
        self.acknowledged(&part, &produced).await?;
        Ok(pb::ProduceResponse {
            partition,
            base_offset: produced.base_offset,
            last_offset: produced.last_offset,
            duplicate: produced.duplicate,
            log_end_offset: part.visible_end(),
        })
    }
}

/// A `ListTopics` answer over `topics` (the list the caller may see, in name order): the list with its digest, or
/// `unchanged` and no topic when it is exactly the list `unless_digest` names. A mirror asks for the topics of both
/// sides every discovery round; with thousands of topics, a list that did not change then costs a digest, not the
/// list.
pub(super) fn list_answer(topics: Vec<pb::TopicInfo>, unless_digest: &[u8]) -> pb::ListTopicsResponse {
    let mut hash = sha2::Sha256::new();
    let mut buf = Vec::new();
    for t in &topics {
        buf.clear();
        t.encode_length_delimited(&mut buf).expect("a Vec grows as needed");
        hash.update(&buf);
    }
    let digest = bytes::Bytes::from(hash.finalize().to_vec());
    if !unless_digest.is_empty() && unless_digest == digest.as_ref() {
        return pb::ListTopicsResponse { topics: Vec::new(), digest, unchanged: true };
    }
    pb::ListTopicsResponse { topics, digest, unchanged: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str, partitions: u32) -> pb::TopicInfo {
        pb::TopicInfo { name: name.into(), topic_id: format!("id-{name}"), partitions, ..Default::default() }
    }

    #[test]
    fn a_list_named_by_its_digest_is_answered_unchanged_and_any_change_gives_the_list() {
        let list = vec![topic("a", 1), topic("b", 2)];
        let first = list_answer(list.clone(), &[]);
        assert_eq!((first.topics.clone(), first.unchanged, first.digest.len()), (list.clone(), false, 32));
        let again = list_answer(list.clone(), &first.digest);
        assert_eq!((again.topics, again.unchanged, &again.digest), (vec![], true, &first.digest));
        for changed in [
            vec![topic("a", 1), topic("b", 3)],
            vec![topic("a", 1)],
            vec![topic("a", 1), topic("b", 2), topic("c", 1)],
            vec![topic("ab", 1), topic("b", 2)],
            vec![pb::TopicInfo { mirror: Some(Default::default()), ..topic("a", 1) }, topic("b", 2)],
        ] {
            let answer = list_answer(changed.clone(), &first.digest);
            assert_eq!((answer.topics, answer.unchanged), (changed, false));
            assert_ne!(answer.digest, first.digest);
        }
        let wrong = list_answer(list.clone(), b"not a digest");
        assert_eq!((wrong.topics, wrong.unchanged), (list, false));
    }
}
