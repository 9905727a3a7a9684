//! The requests the bounds test sends, built from their few varying fields.

use bytes::Bytes;
use ferry_client::proto as pb;
use ferry_client::proto::list_offsets_partition::Spec;

pub(super) fn create(name: &str, partitions: u32) -> pb::CreateTopicRequest {
    pb::CreateTopicRequest { name: name.into(), partitions, config: None, mirror: None, ..Default::default() }
}
pub(super) fn create_with(name: &str, edit: fn(&mut pb::TopicConfig)) -> pb::CreateTopicRequest {
    pb::CreateTopicRequest { config: Some(cfg(edit)), ..create(name, 1) }
}

pub(super) fn mirror_of(name: &str, source_topic_id: &str) -> pb::CreateTopicRequest {
    let (source_cluster_id, source_topic, source_cluster) = ("dc-a-cluster".into(), "orders".into(), "dc-a".into());
    let source =
        pb::MirrorSource { source_cluster_id, source_topic_id: source_topic_id.into(), source_topic, source_cluster };
    pb::CreateTopicRequest { mirror: Some(source), ..create(name, 1) }
}

pub(super) fn cfg(edit: fn(&mut pb::TopicConfig)) -> pb::TopicConfig {
    let mut c = pb::TopicConfig::default();
    edit(&mut c);
    c
}
pub(super) fn alter(name: &str, edit: fn(&mut pb::TopicConfig)) -> pb::AlterTopicConfigRequest {
    pb::AlterTopicConfigRequest { name: name.into(), config: Some(cfg(edit)) }
}
pub(super) fn grow(name: &str, partitions: u32) -> pb::AlterPartitionsRequest {
    pb::AlterPartitionsRequest { name: name.into(), partitions }
}
pub(super) fn delete(name: &str) -> pb::DeleteTopicRequest {
    pb::DeleteTopicRequest { name: name.into() }
}
pub(super) fn describe(name: &str) -> pb::DescribeTopicRequest {
    pb::DescribeTopicRequest { name: name.into(), leader_epochs: Default::default() }
}
pub(super) fn promote(name: &str) -> pb::PromoteRequest {
    pb::PromoteRequest { name: name.into() }
}
pub(super) fn produce(topic: &str, partition: u32, batches: impl Into<Bytes>) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: topic.into(), partition: Some(partition), key: None, batches: batches.into() }
}
pub(super) fn append(topic: &str, partition: u32, id: &str, batches: impl Into<Bytes>) -> pb::AppendWithOffsetsRequest {
    let (topic, source_topic_id, batches) = (topic.into(), id.into(), batches.into());
    pb::AppendWithOffsetsRequest { topic, partition, source_topic_id, source_log_start_offset: 0, batches }
}
pub(super) fn epoch_end(topic: &str, partition: u32, epoch: u32) -> pb::EpochEndRequest {
    pb::EpochEndRequest { topic: topic.into(), partition, epoch }
}
pub(super) fn truncate(topic: &str, partition: u32, offset: u64) -> pb::TruncatePartitionRequest {
    pb::TruncatePartitionRequest { topic: topic.into(), partition, offset }
}
pub(super) fn at(topic: &str, partition: u32, offset: u64) -> pb::PartitionFetch {
    pb::PartitionFetch { topic: topic.into(), partition, offset, max_bytes: u64::MAX, leader_epoch: None }
}
pub(super) fn spec(topic: &str, partition: u32, spec: Option<Spec>) -> pb::ListOffsetsPartition {
    pb::ListOffsetsPartition { topic: topic.into(), partition, spec, leader_epoch: None }
}

pub(super) fn join(group: &str, member_id: &str, client_id: &str, topics: &[&str]) -> pb::JoinGroupRequest {
    let (group, member_id, client_id) = (group.into(), member_id.into(), client_id.into());
    let topics = topics.iter().map(|t| (*t).to_owned()).collect();
    pb::JoinGroupRequest { group, member_id, topics, session_timeout_ms: 60_000, client_id }
}
pub(super) fn heartbeat(group: &str, member_id: &str, generation: u64) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest { group: group.into(), member_id: member_id.into(), generation }
}
pub(super) fn offset(topic: &str, partition: u32, offset: u64, metadata: &str) -> pb::CommittedOffset {
    pb::CommittedOffset { topic: topic.into(), partition, offset, metadata: metadata.into() }
}
pub(super) fn commit(
    group: &str,
    member_id: &str,
    generation: u64,
    o: pb::CommittedOffset,
) -> pb::CommitOffsetsRequest {
    pb::CommitOffsetsRequest { group: group.into(), member_id: member_id.into(), generation, offsets: vec![o] }
}
pub(super) fn tp(topic: &str, partition: u32) -> pb::TopicPartition {
    pb::TopicPartition { topic: topic.into(), partition }
}

/// ListOffsets asks in columns, all looking up `spec`: each run of the same topic named once.
pub(super) fn in_columns<'a>(
    asks: impl IntoIterator<Item = &'a pb::ListOffsetsPartition>,
    spec: Option<Spec>,
) -> pb::ListOffsetsColumns {
    let mut c = pb::ListOffsetsColumns { spec: spec.map(Into::into), ..Default::default() };
    for ask in asks {
        match (c.topics.last(), c.counts.last_mut()) {
            (Some(t), Some(n)) if *t == ask.topic => *n += 1,
            _ => {
                c.topics.push(ask.topic.clone());
                c.counts.push(1);
            }
        }
        c.partitions.push(ask.partition);
    }
    c
}
