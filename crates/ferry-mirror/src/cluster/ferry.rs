//! Ferry brokers on either side: thin wrappers over [`ferry_client::Admin`].

use std::time::Duration;

use bytes::Bytes;
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient, ClientError, OffsetSpec};

use super::{GroupState, Membership, Result, SourceCluster, TargetCluster, TargetLimits, TargetPartition};

/// A Ferry broker as the source (one route's client).
#[derive(Debug, Clone)]
pub struct FerrySource {
    admin: Admin,
}

impl FerrySource {
    /// Wraps a client.
    pub fn new(client: BrokerClient) -> FerrySource {
        FerrySource { admin: Admin::new(client) }
    }

    /// The underlying client (the fetch stream uses it).
    pub fn client(&self) -> &BrokerClient {
        self.admin.client()
    }
}

#[async_trait::async_trait]
impl SourceCluster for FerrySource {
    async fn probe(&self, timeout: Duration) -> Result<String> {
        Ok(self.admin.client().probe(timeout).await?.cluster_id)
    }

    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>> {
        self.admin.list_topics().await
    }

    async fn log_offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64)> {
        let o = self.admin.list_offset(topic, partition, OffsetSpec::Latest).await?;
        Ok((o.log_start_offset, o.log_end_offset))
    }

    async fn epoch_end(&self, topic: &str, partition: u32, epoch: u32) -> Result<Option<(u32, u64)>> {
        let r = self.admin.epoch_end(topic, partition, epoch).await?;
        Ok(r.found.then_some((r.epoch, r.end_offset)))
    }

    async fn committed(&self, group: &str, partitions: &[(String, u32)]) -> Result<Vec<pb::CommittedOffset>> {
        self.admin.fetch_committed_offsets(group, partitions).await
    }

    async fn commit(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()> {
        self.admin.commit_offsets(group, offsets).await
    }

    async fn list_groups(&self) -> Result<Vec<String>> {
        Ok(self.admin.list_groups().await?.into_iter().map(|g| g.group).collect())
    }

    async fn first_batch_at(&self, topic: &str, partition: u32, offset: u64) -> Result<Option<(u64, String)>> {
        let request = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch { topic: topic.to_owned(), partition, offset, max_bytes: 1 }],
            max_wait_ms: 0,
            max_bytes: 1,
        };
        let response = self.admin.client().fetch(request).await?;
        let Some(data) = response.partitions.into_iter().next() else { return Ok(None) };
        if data.error != pb::ErrorCode::None as i32 {
            return Ok(None);
        }
        let base =
            ferry_client::batch::BatchIter::new(&data.batches).next().and_then(|r| r.ok()).map(|(h, _)| h.base_offset);
        Ok(base.map(|b| (b, data.topic_id)))
    }

    fn reconnect(&self) {
        self.admin.client().reconnect();
    }
}

/// A Ferry broker as the target.
#[derive(Debug, Clone)]
pub struct FerryTarget {
    admin: Admin,
}

impl FerryTarget {
    /// Wraps a client.
    pub fn new(client: BrokerClient) -> FerryTarget {
        FerryTarget { admin: Admin::new(client) }
    }
}

fn membership(member_id: String, generation: u64, assignment: Vec<pb::TopicPartition>, members: usize) -> Membership {
    Membership {
        member_id,
        generation,
        assignment: assignment.into_iter().map(|tp| (tp.topic, tp.partition)).collect(),
        members,
    }
}

#[async_trait::async_trait]
impl TargetCluster for FerryTarget {
    async fn limits(&self) -> Result<TargetLimits> {
        let m = self.admin.metadata().await?;
        Ok(TargetLimits { max_batch_bytes: m.max_batch_bytes, max_message_bytes: m.max_message_bytes })
    }

    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>> {
        self.admin.list_topics().await
    }

    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: pb::TopicConfig,
        mirror: pb::MirrorSource,
    ) -> Result<()> {
        self.admin.create_topic(name, partitions, config, Some(mirror)).await.map(drop)
    }

    async fn alter_partitions(&self, name: &str, partitions: u32) -> Result<()> {
        self.admin.alter_partitions(name, partitions).await.map(drop)
    }

    async fn alter_topic_config(&self, name: &str, config: pb::TopicConfig) -> Result<()> {
        self.admin.alter_topic_config(name, config).await.map(drop)
    }

    async fn partition(&self, topic: &str, partition: u32) -> Result<TargetPartition> {
        let desc = self.admin.describe_topic(topic).await?;
        let p = desc.partitions.iter().find(|p| p.partition == partition).ok_or_else(|| ClientError::Protocol {
            rpc: "DescribeTopic",
            broker: self.admin.client().address(),
            message: format!("target topic {topic} has no partition {partition}"),
        })?;
        // The last epoch is the history's newest entry (EpochEnd of the largest epoch), not the partition's
        // current epoch, which an unclean restart of the target bumps without any batch carrying it.
        let last_epoch = if p.log_end_offset > p.log_start_offset {
            let end = self.admin.epoch_end(topic, partition, u32::MAX).await?;
            end.found.then_some(end.epoch)
        } else {
            None
        };
        Ok(TargetPartition { log_start: p.log_start_offset, log_end: p.log_end_offset, last_epoch })
    }

    async fn append(
        &self,
        topic: &str,
        partition: u32,
        source_topic_id: &str,
        source_log_start: u64,
        batches: Bytes,
    ) -> Result<pb::AppendWithOffsetsResponse> {
        // Not retried inside the client after an unknown outcome: the task's own retry must know when an earlier
        // attempt may have written the batches (see `target::counted`).
        let request = pb::AppendWithOffsetsRequest {
            topic: topic.to_owned(),
            partition,
            source_topic_id: source_topic_id.to_owned(),
            source_log_start_offset: source_log_start,
            batches,
        };
        self.admin.client().append_with_offsets_once(request).await
    }

    async fn truncate(&self, topic: &str, partition: u32, offset: u64) -> Result<u64> {
        self.admin.truncate_partition(topic, partition, offset).await
    }

    async fn group_state(&self, group: &str) -> Result<GroupState> {
        let d = self.admin.describe_group(group).await?;
        Ok(GroupState { active_members: d.members.len(), offsets: d.offsets })
    }

    async fn commit_group(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()> {
        self.admin.commit_offsets(group, offsets).await
    }

    async fn join(&self, group: &str, member_id: &str, topics: Vec<String>, session: Duration) -> Result<Membership> {
        let j = self
            .admin
            .client()
            .join_group(pb::JoinGroupRequest {
                group: group.to_owned(),
                member_id: member_id.to_owned(),
                topics,
                session_timeout_ms: session.as_millis().min(u128::from(u32::MAX)) as u32,
                client_id: format!("ferry-mirror-{}", std::process::id()),
            })
            .await?;
        let members = j.members.len();
        Ok(membership(j.member_id, j.generation, j.assignment, members))
    }

    async fn heartbeat(&self, group: &str, member_id: &str, generation: u64) -> Result<Option<Membership>> {
        let hb = self
            .admin
            .client()
            .heartbeat(pb::HeartbeatRequest { group: group.to_owned(), member_id: member_id.to_owned(), generation })
            .await?;
        Ok(hb.member_known.then(|| membership(member_id.to_owned(), hb.generation, hb.assignment, 0)))
    }

    async fn leave(&self, group: &str, member_id: &str) -> Result<()> {
        self.admin
            .client()
            .leave_group(pb::LeaveGroupRequest { group: group.to_owned(), member_id: member_id.to_owned() })
            .await
            .map(drop)
    }
}
