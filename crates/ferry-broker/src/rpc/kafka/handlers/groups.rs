//! JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit and OffsetFetch over the service's group calls: a
//! Kafka group is the Ferry group of the same name (see `core::group`).

use bytes::{BufMut, Bytes, BytesMut};
use ferry_proto as pb;
use ferry_proto::broker_server::Broker;
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponsePartition, OffsetFetchResponseTopic};
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, DeleteGroupsRequest, DeleteGroupsResponse,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable};

use super::{s, topic};
use crate::rpc::kafka::Kafka;
use crate::rpc::kafka::core::group::{self, codes};
use crate::rpc::kafka::errors::{About, code};

/// The topics a consumer protocol subscription names.
fn subscribed(metadata: &Bytes) -> Option<Vec<String>> {
    if metadata.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([metadata[0], metadata[1]]);
    let mut rest = metadata.slice(2..);
    let sub = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ConsumerProtocolSubscription::decode(&mut rest, version.clamp(0, 3)).ok()
    }))
    .ok()
    .flatten()?;
    Some(sub.topics.into_iter().map(|t| t.to_string()).collect())
}

/// JoinGroup: the member joins the Ferry group, which deals the partitions at once. Every member is told it leads
/// (of a group of itself), since no member's assignment is used: SyncGroup answers Ferry's.
pub async fn join(k: &Kafka, req: JoinGroupRequest, client_id: &str) -> JoinGroupResponse {
    let mut r = JoinGroupResponse::default();
    r.generation_id = -1;
    r.member_id = req.member_id.clone();
    let chosen = group::pick_protocol(req.protocols.iter().map(|p| p.name.as_str()));
    let (Some(chosen), true) = (chosen, req.protocol_type.as_str() == "consumer") else {
        r.error_code = codes::INCONSISTENT_GROUP_PROTOCOL;
        return r;
    };
    let Some(proto) = req.protocols.iter().find(|p| p.name.as_str() == chosen) else {
        r.error_code = codes::INCONSISTENT_GROUP_PROTOCOL;
        return r;
    };
    let Some(topics) = subscribed(&proto.metadata) else {
        r.error_code = codes::INCONSISTENT_GROUP_PROTOCOL;
        return r;
    };
    let call = pb::JoinGroupRequest {
        group: req.group_id.0.to_string(),
        member_id: req.member_id.to_string(),
        topics,
        session_timeout_ms: req.session_timeout_ms.max(0) as u32,
        client_id: client_id.to_owned(),
    };
    match k.svc.join_group(k.rpc(call)).await {
        Ok(j) => {
            let j = j.into_inner();
            r.generation_id = group::kafka_generation(j.generation);
            r.protocol_type = Some(s("consumer"));
            r.protocol_name = Some(proto.name.clone());
            r.member_id = s(j.member_id.clone());
            r.leader = s(j.member_id.clone());
            let mut me = JoinGroupResponseMember::default();
            me.member_id = s(j.member_id);
            me.metadata = proto.metadata.clone();
            r.members = vec![me];
        }
        Err(e) => r.error_code = code(&e, About::Group),
    }
    r
}

/// The Ferry group's view of a member: whether it knows it, its generation, the member's partitions.
async fn view(k: &Kafka, group: &str, member: &str) -> Result<pb::HeartbeatResponse, i16> {
    let call = pb::HeartbeatRequest { group: group.to_owned(), member_id: member.to_owned(), generation: 0 };
    k.svc.heartbeat(k.rpc(call)).await.map(|h| h.into_inner()).map_err(|e| code(&e, About::Group))
}

/// A consumer protocol assignment (version 0) of `partitions`.
pub fn assignment(partitions: &[pb::TopicPartition]) -> Bytes {
    let mut a = ConsumerProtocolAssignment::default();
    for p in partitions {
        match a.assigned_partitions.iter_mut().find(|t| t.topic.0.as_str() == p.topic) {
            Some(t) => t.partitions.push(p.partition as i32),
            None => {
                let mut t = AssignedTopic::default();
                t.topic = topic(p.topic.clone());
                t.partitions = vec![p.partition as i32];
                a.assigned_partitions.push(t);
            }
        }
    }
    let mut out = BytesMut::new();
    out.put_i16(0);
    if a.encode(&mut out, 0).is_err() {
        return Bytes::new();
    }
    out.freeze()
}

/// SyncGroup: the member's partitions as Ferry dealt them (the leader's proposal is not used).
pub async fn sync(k: &Kafka, req: SyncGroupRequest) -> SyncGroupResponse {
    let mut r = SyncGroupResponse::default();
    r.protocol_type = req.protocol_type.clone();
    r.protocol_name = req.protocol_name.clone();
    match view(k, req.group_id.0.as_str(), req.member_id.as_str()).await {
        Ok(h) => {
            r.error_code = group::member_check(h.member_known, h.generation, req.generation_id);
            if r.error_code == codes::NONE {
                r.assignment = assignment(&h.assignment);
            }
        }
        Err(c) => r.error_code = c,
    }
    r
}

/// Heartbeat: REBALANCE_IN_PROGRESS once the Ferry group's generation moved past the member's.
pub async fn heartbeat(k: &Kafka, req: HeartbeatRequest) -> HeartbeatResponse {
    let mut r = HeartbeatResponse::default();
    r.error_code = match view(k, req.group_id.0.as_str(), req.member_id.as_str()).await {
        Ok(h) => group::member_check(h.member_known, h.generation, req.generation_id),
        Err(c) => c,
    };
    r
}

/// LeaveGroup: one member (v0-2) or several (v3+).
pub async fn leave(k: &Kafka, req: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let mut r = LeaveGroupResponse::default();
    let ids: Vec<String> = if version < 3 {
        vec![req.member_id.to_string()]
    } else {
        req.members.iter().map(|m| m.member_id.to_string()).collect()
    };
    for id in ids {
        let call = pb::LeaveGroupRequest { group: req.group_id.0.to_string(), member_id: id.clone() };
        let error = match k.svc.leave_group(k.rpc(call)).await {
            Ok(_) => codes::NONE,
            Err(e) => code(&e, About::Group),
        };
        if version >= 3 {
            let mut m = MemberResponse::default();
            m.member_id = s(id);
            m.error_code = error;
            r.members.push(m);
        } else {
            r.error_code = error;
        }
    }
    r
}

/// OffsetCommit, metadata kept. A member commits under its generation; an empty member id with generation -1 is a
/// commit without membership (manual assignment), as the service's.
pub async fn commit(k: &Kafka, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let member = req.member_id.to_string();
    let mut generation = 0;
    let mut failed = None;
    if !member.is_empty() {
        match view(k, &group, &member).await {
            Ok(h) => generation = group::commit_generation(h.generation, req.generation_id_or_member_epoch),
            Err(c) => failed = Some(c),
        }
    }
    let mut offsets = Vec::new();
    let mut r = OffsetCommitResponse::default();
    for t in &req.topics {
        let mut tr = OffsetCommitResponseTopic::default();
        tr.name = t.name.clone();
        for p in &t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            match (u32::try_from(p.partition_index), u64::try_from(p.committed_offset)) {
                (Ok(partition), Ok(offset)) => offsets.push(pb::CommittedOffset {
                    topic: t.name.0.to_string(),
                    partition,
                    offset,
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
                }),
                (Err(_), _) => pr.error_code = kafka_protocol::ResponseError::UnknownTopicOrPartition.code(),
                (_, Err(_)) => pr.error_code = kafka_protocol::ResponseError::InvalidCommitOffsetSize.code(),
            }
            tr.partitions.push(pr);
        }
        r.topics.push(tr);
    }
    let error = match failed {
        Some(c) => c,
        None => {
            let call = pb::CommitOffsetsRequest { group, member_id: member, generation, offsets };
            match k.svc.commit_offsets(k.rpc(call)).await {
                Ok(_) => codes::NONE,
                Err(e) if crate::rpc::kafka::errors::reason(&e) == "group_has_members" => codes::UNKNOWN_MEMBER_ID,
                Err(e) => code(&e, About::Group),
            }
        }
    };
    for p in r.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()).filter(|p| p.error_code == 0) {
        p.error_code = error;
    }
    r
}

/// OffsetFetch (v1-7): the asked partitions' committed offsets (-1 when none), or every one the group has.
pub async fn offset_fetch(k: &Kafka, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let mut r = OffsetFetchResponse::default();
    let asked: Option<Vec<pb::TopicPartition>> = req.topics.as_ref().map(|ts| {
        ts.iter()
            .flat_map(|t| {
                t.partition_indexes
                    .iter()
                    .map(|&p| pb::TopicPartition { topic: t.name.0.to_string(), partition: p.max(0) as u32 })
            })
            .collect()
    });
    let call = pb::FetchCommittedOffsetsRequest {
        group: req.group_id.0.to_string(),
        partitions: asked.clone().unwrap_or_default(),
    };
    let committed = match k.svc.fetch_committed_offsets(k.rpc(call)).await {
        Ok(c) => c.into_inner().offsets,
        Err(e) => {
            r.error_code = code(&e, About::Group);
            return r;
        }
    };
    let rows: Vec<(String, u32)> = match asked {
        Some(a) => a.into_iter().map(|p| (p.topic, p.partition)).collect(),
        None => committed.iter().map(|c| (c.topic.clone(), c.partition)).collect(),
    };
    for (name, partition) in rows {
        let found = committed.iter().find(|c| c.topic == name && c.partition == partition);
        let mut pr = OffsetFetchResponsePartition::default();
        pr.partition_index = partition as i32;
        pr.committed_offset = found.map_or(-1, |c| c.offset as i64);
        pr.committed_leader_epoch = -1;
        pr.metadata = Some(s(found.map(|c| c.metadata.clone()).unwrap_or_default()));
        match r.topics.iter_mut().find(|t| t.name.0.as_str() == name) {
            Some(t) => t.partitions.push(pr),
            None => {
                let mut t = OffsetFetchResponseTopic::default();
                t.name = topic(name);
                t.partitions = vec![pr];
                r.topics.push(t);
            }
        }
    }
    r
}

/// DeleteGroups: each group deleted on its own (its committed offsets dropped); NON_EMPTY_GROUP while it has
/// members, GROUP_ID_NOT_FOUND when there is no such group.
pub async fn delete_groups(k: &Kafka, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut r = DeleteGroupsResponse::default();
    for g in req.groups_names {
        let mut res = DeletableGroupResult::default();
        res.error_code = match k.svc.delete_group(k.rpc(g.0.to_string())).await {
            Ok(true) => codes::NONE,
            Ok(false) => kafka_protocol::ResponseError::GroupIdNotFound.code(),
            Err(e) => code(&e, About::Group),
        };
        res.group_id = g;
        r.results.push(res);
    }
    r
}
