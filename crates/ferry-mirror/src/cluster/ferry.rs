//! Ferry brokers on either side: thin wrappers over [`ferry_client::Admin`].

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::batch::{self, Batch, BatchIter};
use ferry_client::proto as pb;
use ferry_client::{Admin, AppendWithOffsetsParts, BrokerClient, ClientError, OffsetSpec};

use super::{
    AppendOutcome, GroupState, Membership, Probed, Result, SourceCluster, TargetCluster, TargetLimits, TargetPartition,
};
use crate::cluster::{EpochAnswer, TailBatch};
use crate::tp::{SourceTp, TargetTp};
use futures::StreamExt;

/// Topics described at once by [`TargetCluster::partitions_many`].
const DESCRIBES_AT_ONCE: usize = 16;

/// The first stored batch at or after `offset` of a partition: its base offset, the topic id, and the batch
/// itself (one fetch of at most one batch).
async fn first_batch(admin: &Admin, topic: &str, partition: u32, offset: u64) -> Result<Option<(Batch, String)>> {
    let request = pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: topic.to_owned(),
            partition,
            offset,
            max_bytes: 1,
            leader_epoch: admin.client().known_leader_epoch(topic, partition),
        }],
        max_wait_ms: 0,
        max_bytes: 1,
    };
    // At the partition's leader (a cluster's followers serve no reads); an answer naming another one is followed once.
    let mut response = admin.client().for_partition(topic, partition).fetch(request.clone()).await?;
    if let Some(hint) = response
        .partitions
        .first()
        .filter(|d| d.error == pb::ErrorCode::NotLeader as i32 || d.error == pb::ErrorCode::FencedLeaderEpoch as i32)
        .and_then(|d| d.leader.clone())
    {
        admin.client().take_hint(topic, partition, &hint);
        let mut request = request;
        request.partitions[0].leader_epoch = admin.client().known_leader_epoch(topic, partition);
        response = admin.client().for_partition(topic, partition).fetch(request).await?;
    }
    let Some(data) = response.partitions.into_iter().next() else { return Ok(None) };
    if data.error != pb::ErrorCode::None as i32 {
        return Ok(None);
    }
    let first = BatchIter::new(&data.batches).next().and_then(|r| r.ok()).map(|(h, _)| h.total_len());
    let Some(len) = first else { return Ok(None) };
    Ok(Batch::parse(data.batches.slice(..len)).ok().map(|b| (b, data.topic_id)))
}

/// Decode limit of a side built without one: that of the default `sync.queue_bytes` (32 MiB), 64 MiB.
const DEFAULT_DECODE_LIMIT: usize = 64 << 20;

/// The batch holding `offset`, decoded within `decode_limit` decompressed bytes, for the resume rule's tail check.
async fn batch_holding(
    admin: &Admin,
    topic: &str,
    partition: u32,
    offset: u64,
    decode_limit: usize,
) -> Result<Option<TailBatch>> {
    let Some((b, _)) = first_batch(admin, topic, partition, offset).await? else { return Ok(None) };
    if b.base_offset() > offset {
        return Ok(None);
    }
    let Ok(records) = batch::decode_records_bounded(b.bytes(), decode_limit) else { return Ok(None) };
    Ok(Some(TailBatch { base: b.base_offset(), last: b.last_offset(), epoch: b.epoch(), crc: b.header().crc, records }))
}

/// A Ferry broker as the source (one route's client).
#[derive(Debug, Clone)]
pub struct FerrySource {
    admin: Admin,
    decode_limit: usize,
}

impl FerrySource {
    /// Wraps a client.
    pub fn new(client: BrokerClient) -> FerrySource {
        FerrySource { admin: Admin::new(client), decode_limit: DEFAULT_DECODE_LIMIT }
    }

    /// Bounds the decompressed bytes of a batch decoded for a tail check (`reshape::decode_limit`).
    pub fn with_decode_limit(mut self, decode_limit: usize) -> FerrySource {
        self.decode_limit = decode_limit;
        self
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

    async fn list_topics_since(&self, digest: &[u8]) -> Result<(Option<Vec<pb::TopicInfo>>, Vec<u8>)> {
        self.admin.list_topics_since(digest).await
    }

    async fn log_offsets(&self, tp: &SourceTp) -> Result<(u64, u64)> {
        let o = self.admin.list_offset(tp.topic(), tp.partition, OffsetSpec::Latest).await?;
        Ok((o.log_start_offset, o.log_end_offset))
    }

    async fn log_offsets_many(&self, tps: &[SourceTp], within: Duration) -> Result<Vec<Probed>> {
        // Each partition at its leader (independently of the fetch stream, which may still be at a deposed one);
        // partitions whose leader answers with an error (an election runs), fails or is late are left out.
        let asked: Vec<(&str, u32, OffsetSpec)> =
            tps.iter().map(|tp| (tp.topic(), tp.partition, OffsetSpec::Latest)).collect();
        // Answers come aligned with the asks: each probed partition is the asked value, no name is built.
        let answers = self.admin.list_offsets_rows_within(&asked, within).await;
        Ok(tps
            .iter()
            .zip(answers)
            .filter_map(|(tp, o)| Some((tp, o?)))
            .map(|(tp, o)| Probed {
                tp: tp.clone(),
                log_start: o.log_start_offset,
                log_end: o.log_end_offset,
                end_age: o.log_end_age_ms.map(Duration::from_millis),
            })
            .collect())
    }

    async fn epoch_end(&self, tp: &SourceTp, epoch: u32) -> Result<EpochAnswer> {
        let r = self.admin.epoch_end(tp.topic(), tp.partition, epoch).await?;
        Ok(if r.found {
            EpochAnswer::Found { epoch: r.epoch, end: r.end_offset }
        } else {
            // The broker answers with where its known history starts.
            EpochAnswer::Before { first: r.end_offset }
        })
    }

    async fn committed(&self, group: &str, partitions: &[SourceTp]) -> Result<Vec<pb::CommittedOffset>> {
        let partitions: Vec<(String, u32)> =
            partitions.iter().map(|tp| (tp.topic().to_owned(), tp.partition)).collect();
        self.admin.fetch_committed_offsets(group, &partitions).await
    }

    async fn commit(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()> {
        self.admin.commit_offsets(group, offsets).await
    }

    async fn list_groups(&self) -> Result<Vec<String>> {
        Ok(self.admin.list_groups().await?.into_iter().map(|g| g.group).collect())
    }

    async fn first_batch_at(&self, tp: &SourceTp, offset: u64) -> Result<Option<(u64, String)>> {
        let first = first_batch(&self.admin, tp.topic(), tp.partition, offset).await?;
        Ok(first.map(|(b, topic_id)| (b.base_offset(), topic_id)))
    }

    async fn batch_at(&self, tp: &SourceTp, offset: u64) -> Result<Option<TailBatch>> {
        batch_holding(&self.admin, tp.topic(), tp.partition, offset, self.decode_limit).await
    }

    fn reconnect(&self) {
        self.admin.client().reconnect();
    }
}

/// A Ferry broker as the target.
#[derive(Debug, Clone)]
pub struct FerryTarget {
    admin: Admin,
    decode_limit: usize,
}

impl FerryTarget {
    /// Wraps a client.
    pub fn new(client: BrokerClient) -> FerryTarget {
        FerryTarget { admin: Admin::new(client), decode_limit: DEFAULT_DECODE_LIMIT }
    }

    /// Bounds the decompressed bytes of a batch decoded for a tail check (`reshape::decode_limit`).
    pub fn with_decode_limit(mut self, decode_limit: usize) -> FerryTarget {
        self.decode_limit = decode_limit;
        self
    }
}

/// The typed outcome of a Ferry broker's answer.
fn outcome(r: pb::AppendWithOffsetsResponse) -> AppendOutcome {
    let code = pb::ErrorCode::try_from(r.error).unwrap_or(pb::ErrorCode::StorageError);
    match code {
        pb::ErrorCode::None => AppendOutcome::Appended {
            log_end: r.log_end_offset,
            written: r.written_batches,
            present: r.present_batches,
        },
        pb::ErrorCode::Diverged => AppendOutcome::Diverged { at: r.diverged_at.unwrap_or(0), message: r.message },
        pb::ErrorCode::TopicIdMismatch => AppendOutcome::TopicIdMismatch(r.message),
        pb::ErrorCode::EpochRegressed => AppendOutcome::EpochRegressed(r.message),
        pb::ErrorCode::NotAMirrorTopic => AppendOutcome::NotAMirrorTopic(r.message),
        pb::ErrorCode::GapRefused => AppendOutcome::GapRefused(r.message),
        pb::ErrorCode::StraddlesEnd => AppendOutcome::StraddlesEnd(r.message),
        other => AppendOutcome::Refused { code: other.as_str_name().to_owned(), message: r.message },
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

impl FerryTarget {
    /// [`TargetCluster::partition`] of `tps`, all of one topic, with one DescribeTopic; what cannot be read is left
    /// out.
    async fn describe_partitions(&self, tps: Vec<TargetTp>) -> Vec<(TargetTp, TargetPartition)> {
        let Some(topic) = tps.first().map(|tp| std::sync::Arc::clone(&tp.topic)) else { return Vec::new() };
        let Ok(desc) = self.admin.describe_topic(&topic).await else { return Vec::new() };
        let mut out = Vec::with_capacity(tps.len());
        for tp in tps {
            let Some(p) = desc.partitions.iter().find(|p| p.partition == tp.partition) else { continue };
            if p.error != pb::ErrorCode::None as i32 {
                continue;
            }
            // As in `partition`: the last epoch is the history's newest entry.
            let last_epoch = if p.log_end_offset > p.log_start_offset {
                match self.admin.epoch_end(&topic, tp.partition, u32::MAX).await {
                    Ok(end) => end.found.then_some(end.epoch),
                    Err(_) => continue,
                }
            } else {
                None
            };
            out.push((tp, TargetPartition { log_start: p.log_start_offset, log_end: p.log_end_offset, last_epoch }));
        }
        out
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

    async fn list_topics_since(&self, digest: &[u8]) -> Result<(Option<Vec<pb::TopicInfo>>, Vec<u8>)> {
        self.admin.list_topics_since(digest).await
    }

    async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: pb::TopicConfig,
        mirror: pb::MirrorSource,
        replication: &str,
        risk_phase: bool,
    ) -> Result<()> {
        self.admin
            .create_topic_kept(name, partitions, Some(config), Some(mirror), replication, risk_phase)
            .await
            .map(drop)
    }

    async fn alter_partitions(&self, name: &str, partitions: u32) -> Result<()> {
        self.admin.alter_partitions(name, partitions).await.map(drop)
    }

    async fn alter_topic_config(&self, name: &str, config: pb::TopicConfig) -> Result<()> {
        self.admin.alter_topic_config(name, config).await.map(drop)
    }

    async fn partition(&self, tp: &TargetTp) -> Result<TargetPartition> {
        let (topic, partition) = (tp.topic(), tp.partition);
        let desc = self.admin.describe_topic(topic).await?;
        let p = desc.partitions.iter().find(|p| p.partition == partition).ok_or_else(|| ClientError::Protocol {
            rpc: "DescribeTopic",
            broker: self.admin.client().address(),
            message: format!("target topic {topic} has no partition {partition}"),
        })?;
        // A replicated partition whose leader did not answer (an election runs): unknown for now, never "empty".
        if p.error != pb::ErrorCode::None as i32 {
            return Err(ClientError::Partition {
                topic: topic.to_owned(),
                partition,
                code: pb::ErrorCode::try_from(p.error).unwrap_or(pb::ErrorCode::StorageError),
                message: p.message.clone(),
            });
        }
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

    async fn partitions_many(&self, tps: &[TargetTp]) -> Result<Vec<(TargetTp, TargetPartition)>> {
        // One DescribeTopic per topic, not per partition, a few topics at a time. A topic or partition that cannot
        // be described is left out (its lane reads it alone, and tells why).
        let mut by_topic: BTreeMap<std::sync::Arc<str>, Vec<TargetTp>> = BTreeMap::new();
        for tp in tps {
            by_topic.entry(std::sync::Arc::clone(&tp.topic)).or_default().push(tp.clone());
        }
        let reads: Vec<_> = by_topic.into_values().map(|tps| self.describe_partitions(tps)).collect();
        let answers: Vec<Vec<(TargetTp, TargetPartition)>> =
            futures::stream::iter(reads).buffer_unordered(DESCRIBES_AT_ONCE).collect().await;
        Ok(answers.into_iter().flatten().collect())
    }

    async fn append(
        &self,
        tp: &TargetTp,
        source_topic_id: &str,
        source_log_start: u64,
        batches: &[Batch],
    ) -> Result<AppendOutcome> {
        // Each batch is a slice of the buffer it was received in. Uncompressed, a long one is sent from there as it
        // is and short ones are copied together; compressed, each is copied once, into the message (see
        // `append_with_offsets_parts_once`).
        // Not retried inside the client after an unknown outcome: the lane's own retry must know when an earlier
        // attempt may have written the batches (see `lane::io`).
        let request = AppendWithOffsetsParts {
            topic: tp.topic().to_owned(),
            partition: tp.partition,
            source_topic_id: source_topic_id.to_owned(),
            source_log_start_offset: source_log_start,
            batches: batches.iter().map(|b| b.bytes().clone()).collect(),
        };
        Ok(outcome(self.admin.client().append_with_offsets_parts_once(request).await?))
    }

    async fn truncate(&self, tp: &TargetTp, offset: u64) -> Result<u64> {
        self.admin.truncate_partition(tp.topic(), tp.partition, offset).await
    }

    async fn batch_at(&self, tp: &TargetTp, offset: u64) -> Result<Option<TailBatch>> {
        batch_holding(&self.admin, tp.topic(), tp.partition, offset, self.decode_limit).await
    }

    async fn log_ends(&self, topic: &str) -> Result<Vec<(u32, u64)>> {
        let desc = self.admin.describe_topic(topic).await?;
        // Partitions whose leader did not answer are left out: unknown, not at 0 (case 15 of the cluster analysis).
        Ok(desc
            .partitions
            .iter()
            .filter(|p| p.error == pb::ErrorCode::None as i32)
            .map(|p| (p.partition, p.log_end_offset))
            .collect())
    }

    async fn log_ends_many(&self, tps: &[TargetTp]) -> Result<Vec<(TargetTp, u64)>> {
        // One ListOffsets per leader for every partition, instead of a DescribeTopic per topic: a probe of thousands
        // of partitions is a request or two. Partitions whose leader answered with an error are unknown, not at 0.
        let asked: Vec<(&str, u32, OffsetSpec)> =
            tps.iter().map(|tp| (tp.topic(), tp.partition, OffsetSpec::Latest)).collect();
        let answers = self.admin.list_offsets_rows(&asked).await?;
        Ok(tps.iter().zip(answers).filter_map(|(tp, o)| Some((tp.clone(), o?.log_end_offset))).collect())
    }

    fn ferry_client(&self) -> Option<BrokerClient> {
        Some(self.admin.client().clone())
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
