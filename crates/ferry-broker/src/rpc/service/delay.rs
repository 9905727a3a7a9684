//! The service's delayed-delivery calls (docs/messaging.md, "Delay"): a delayed produce stores its records in the
//! delay store until they fall due (or writes them at once when their time has passed), cancel withdraws one still
//! pending, describe counts what is pending per partition.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ferry_proto as pb;
use tonic::Request;

use super::{BrokerService, DESCRIBE, Rpc, ok};
use crate::delay::core::{DelayId, Due, check_topic_max_delay, decide_due, topic_max_delay};
use crate::delay::{Delays, produce};
use crate::error::BrokerError;
use crate::node::registry::now_ms;
use crate::node::topic::{TopicSettings, refuse_reserved};
use crate::rpc::auth::{Member, Scopes, caller, require_member};

impl BrokerService {
    fn delays(&self) -> Result<&Arc<Delays>, BrokerError> {
        self.delays.as_ref().ok_or_else(|| BrokerError::Internal("delayed delivery is not running".into()))
    }

    /// Checks a topic's `max_delay_ms` (at create or alter) against this broker's `delay.max_delay`, its ceiling.
    pub(super) fn check_topic_delay(&self, topic: &str, settings: &TopicSettings) -> Result<(), BrokerError> {
        let Some(ms) = settings.max_delay_ms else { return Ok(()) };
        check_topic_max_delay(ms, self.delays.as_ref().map(|d| d.max_delay_ms))
            .map_err(|e| BrokerError::InvalidArgument(format!("topic {topic:?}: {e}")))
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
        let own_limit = topic.meta().settings.max_delay_ms;
        let max_delay_ms = topic_max_delay(own_limit, delays.max_delay_ms);
        let due = decide_due(now_ms(), req.deliver_at_ms, req.delay_ms, max_delay_ms).map_err(|e| {
            if !e.contains("maximum delay") {
                return BrokerError::InvalidArgument(format!("delayed produce to topic {:?}: {e}", produce.topic));
            }
            let limit = match own_limit {
                Some(_) => "its max_delay_ms, capped by the broker's delay.max_delay",
                None => "the broker's delay.max_delay, as the topic sets no max_delay_ms",
            };
            BrokerError::InvalidArgument(format!(
                "delayed produce to topic {:?}: {e} (topic {:?} allows at most {max_delay_ms} ms: {limit})",
                produce.topic, produce.topic
            ))
        })?;
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
                let batches = produce::without_producer(&produce.topic, partition, &produce.batches)?;
                let produced = self.produce_to(&part, batches.unwrap_or(produce.batches)).await?;
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
                let (payloads, origin) = produce::payloads_of(&produce.topic, partition, &produce.batches)?;
                let key = produce::stream_key(&produce.topic, partition);
                let scheduled = delays.schedule_from(produce::KIND, key, due_ms, &payloads, origin).await?;
                ok(pb::ProduceDelayedResponse {
                    partition,
                    due_ms: scheduled.due_ms,
                    ids: scheduled.ids.iter().map(DelayId::to_string).collect(),
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
        // Another member's `local` ask passes on its member credential (the replica scope), which may not name
        // the topic; anyone else needs describe on it.
        if req.get_ref().local && req.extensions().get::<Member>().is_some() {
            require_member(&req, "DescribeDelayed", None)?;
        } else {
            caller(&req)?.allow_topic("DescribeDelayed", DESCRIBE, &req.get_ref().topic)?;
        }
        let req = req.into_inner();
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
        let mut unanswered_members = Vec::new();
        if let (false, Some(r)) = (req.local, self.replication.as_ref()) {
            // Every other member answers for the delay-store partitions it owns; a topic partition's records all
            // live in one of them, so the answers do not overlap (but for an owner changing meanwhile: the larger
            // count is kept).
            let me = r.broker_id();
            let asks = r.brokers(None).into_iter().filter(|b| b.broker_id != me).map(|b| {
                let request = pb::DescribeDelayedRequest { topic: req.topic.clone(), local: true };
                let client = r.member_client(b.broker_id);
                let wait = r.ack_timeout();
                async move {
                    let answer = match client {
                        Some(mut c) => tokio::time::timeout(wait, c.describe_delayed(request)).await.ok(),
                        None => None,
                    };
                    (b.broker_id, answer.and_then(Result::ok).map(tonic::Response::into_inner))
                }
            });
            for (member, answer) in futures::future::join_all(asks).await {
                let Some(answer) = answer else {
                    unanswered_members.push(member);
                    continue;
                };
                for p in answer.partitions {
                    match partitions.iter_mut().find(|q| q.partition == p.partition) {
                        Some(q) if q.pending >= p.pending => {}
                        Some(q) => *q = p,
                        None => partitions.push(p),
                    }
                }
            }
            unanswered_members.sort_unstable();
        }
        partitions.sort_by_key(|p| p.partition);
        ok(pb::DescribeDelayedResponse { partitions, unanswered_members })
    }

    pub(super) async fn move_delayed_rpc(&self, req: Request<pb::MoveDelayedRequest>) -> Rpc<pb::ProduceResponse> {
        require_member(&req, "MoveDelayed", None)?;
        let req = req.into_inner();
        self.member_append(&req.topic, req.partition, req.batches).await
    }
}
