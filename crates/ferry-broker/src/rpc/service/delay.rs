//! The service's delayed-delivery calls (docs/messaging.md, "Delay"): a delayed produce stores its records in the
//! delay store until they fall due (or writes them at once when their time has passed), cancel withdraws one still
//! pending, describe counts what is pending per partition.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ferry_proto as pb;
use tonic::Request;

use super::{BrokerService, DESCRIBE, Rpc, ok};
use crate::delay::core::{DelayId, Due, decide_due};
use crate::delay::{Delays, produce};
use crate::error::BrokerError;
use crate::node::registry::now_ms;
use crate::node::topic::refuse_reserved;
use crate::rpc::auth::{Scopes, caller, require_member};

impl BrokerService {
    fn delays(&self) -> Result<&Arc<Delays>, BrokerError> {
        self.delays.as_ref().ok_or_else(|| BrokerError::Internal("delayed delivery is not running".into()))
    }

    pub(super) async fn produce_delayed_rpc(
        &self,
        req: Request<pb::ProduceDelayedRequest>,
    ) -> Rpc<pb::ProduceDelayedResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let Some(produce) = req.produce else {
            return Err(BrokerError::InvalidArgument("a delayed produce needs its produce request".into()).into());
        };
        who.allow_topic("ProduceDelayed", Scopes::PRODUCE, &produce.topic)?;
        refuse_reserved(&produce.topic)?;
        let delays = self.delays()?;
        let due = decide_due(now_ms(), req.deliver_at_ms, req.delay_ms, delays.max_delay_ms)
            .map_err(|e| BrokerError::InvalidArgument(format!("delayed produce to {:?}: {e}", produce.topic)))?;
        if produce.batches.len() as u64 > self.max_batch_bytes {
            return Err(BrokerError::BatchTooLarge {
                topic: produce.topic.clone(),
                partition: produce.partition.unwrap_or(0),
                size: produce.batches.len() as u64,
                max: self.max_batch_bytes,
            }
            .into());
        }
        let topic = self.local_topic(&produce.topic, produce.partition)?;
        if let Some(mark) = topic.mirror() {
            return Err(BrokerError::MirrorTopicReadOnly {
                topic: produce.topic,
                source_cluster: mark.source_display().to_owned(),
            }
            .into());
        }
        let count = topic.partition_count();
        let partition = match (produce.partition, &produce.key) {
            (Some(p), _) => p,
            (None, Some(key)) => ferry_proto::partition_for_key(key, count),
            (None, None) => self.round_robin.fetch_add(1, Ordering::Relaxed) % count.max(1),
        };
        if partition >= count {
            return Err(BrokerError::UnknownPartition { topic: produce.topic, partition, count }.into());
        }
        match due {
            Due::Now => {
                let part = self.placed(&topic, partition)?;
                let produced = self.produce_to(&part, produce.batches).await?;
                self.acknowledged(&part, &produced).await?;
                ok(pb::ProduceDelayedResponse {
                    partition,
                    due_ms: now_ms(),
                    ids: Vec::new(),
                    written: Some(pb::ProduceResponse {
                        partition,
                        base_offset: produced.base_offset,
                        last_offset: produced.last_offset,
                        duplicate: produced.duplicate,
                        log_end_offset: produced.log_end_offset,
                    }),
                })
            }
            Due::At(due_ms) => {
                let payloads = produce::payloads_of(&produce.topic, partition, &produce.batches)?;
                let key = produce::stream_key(&produce.topic, partition);
                let ids = delays.schedule(produce::KIND, key, due_ms, &payloads).await?;
                ok(pb::ProduceDelayedResponse {
                    partition,
                    due_ms,
                    ids: ids.iter().map(DelayId::to_string).collect(),
                    written: None,
                })
            }
        }
    }

    pub(super) async fn cancel_delayed_rpc(
        &self,
        req: Request<pb::CancelDelayedRequest>,
    ) -> Rpc<pb::CancelDelayedResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("CancelDelayed", Scopes::PRODUCE, &req.topic)?;
        let id: DelayId = req.id.parse().map_err(BrokerError::InvalidArgument)?;
        let topic = req.topic.clone();
        let check = |kind: u8, key: &bytes::Bytes| match produce::parse_key(key) {
            Some((t, _)) if kind == produce::KIND && t == topic => Ok(()),
            _ => Err(BrokerError::InvalidArgument(format!("delayed record {id} does not belong to topic {topic:?}"))),
        };
        let (key, due_ms) = self.delays()?.cancel(id, check).await?;
        let partition = produce::parse_key(&key).map_or(0, |(_, p)| p);
        ok(pb::CancelDelayedResponse { partition, due_ms })
    }

    pub(super) async fn describe_delayed_rpc(
        &self,
        req: Request<pb::DescribeDelayedRequest>,
    ) -> Rpc<pb::DescribeDelayedResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("DescribeDelayed", DESCRIBE, &req.topic)?;
        self.core.topic(&req.topic)?;
        let topic = req.topic.clone();
        let streams = self
            .delays()?
            .describe(produce::KIND, |key| produce::parse_key(key).is_some_and(|(t, _)| t == topic))
            .await?;
        let mut partitions: Vec<pb::DelayedPartition> = streams
            .into_iter()
            .filter_map(|s| {
                let (_, partition) = produce::parse_key(&s.key)?;
                Some(pb::DelayedPartition {
                    partition,
                    pending: s.pending,
                    pending_bytes: s.bytes,
                    earliest_due_ms: s.earliest_ms,
                    latest_due_ms: s.latest_ms,
                })
            })
            .collect();
        partitions.sort_by_key(|p| p.partition);
        ok(pb::DescribeDelayedResponse { partitions })
    }

    pub(super) async fn move_delayed_rpc(&self, req: Request<pb::MoveDelayedRequest>) -> Rpc<pb::ProduceResponse> {
        require_member(&req, "MoveDelayed", None)?;
        let req = req.into_inner();
        self.member_append(&req.topic, req.partition, req.batches).await
    }
}
