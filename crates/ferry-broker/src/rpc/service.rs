//! The `ferry.v1.Broker` gRPC service: the caller's permission for each call (the rules of docs/broker.md, "Tokens
//! and scopes", checked before anything else), request validation, and translation between protobuf messages and
//! the broker core. No broker logic lives here beyond picking a partition for produce.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_proto as pb;
use ferry_proto::broker_server::Broker;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::cluster::manager::Replication;
use crate::error::BrokerError;
use crate::groups::GroupCoordinator;
use crate::node::registry::BrokerCore;
use crate::node::topic::refuse_reserved;
use crate::rpc::auth::{Scopes, caller, require_member};
use crate::state::StateLogs;

mod build;
mod delay;
mod failover;
mod groups;
mod offsets;
mod share;
mod share_ack;
mod share_admin;
mod share_io;
mod share_redrive;
mod topics;
mod txn;

/// The service implementation.
#[derive(Debug, Clone)]
pub struct BrokerService {
    core: Arc<BrokerCore>,
    groups: Arc<GroupCoordinator>,
    advertised: String,
    max_batch_bytes: u64,
    max_fetch_wait: Duration,
    round_robin: Arc<AtomicU32>,
    /// Counts fetches, so each starts reading at a different partition (see `fetch::fetch`).
    fetch_turns: Arc<AtomicU32>,
    /// Permits for server-side decodes of record bodies (`broker.decode_concurrency`).
    decodes: Arc<Semaphore>,
    shutdown: CancellationToken,
    /// A cluster member's replication manager.
    replication: Option<Arc<Replication>>,
    /// Taken while a coordinator loads an offsets partition, so that it loads once.
    coordinator_loads: Arc<tokio::sync::Mutex<()>>,
    /// The internal state topics' reader and writer (see `crate::state`).
    state: Arc<StateLogs>,
    /// The job records this broker owns (see `crate::jobs`).
    jobs: Arc<crate::state::Owners<crate::jobs::Jobs>>,
    /// Transactional messages (see `crate::txn`).
    txns: Arc<crate::txn::Transactions>,
    /// The durable timer of delayed delivery (see `crate::delay`), once started.
    delays: Option<Arc<crate::delay::Delays>>,
    /// The message models' group states this broker owns (see `crate::share`).
    shares: Arc<crate::share::Shares>,
    /// Groups whose redrive job runs here now.
    redrives: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// The figures of the message-model groups owned here, for the metrics endpoint.
    share_gauges: crate::share::gauges::ShareGauges,
}

type Rpc<T> = Result<Response<T>, Status>;

const READ: Scopes = Scopes::READ;
/// Reading what a topic or group is: every scope but replica.
const DESCRIBE: Scopes = READ.or(Scopes::PRODUCE).or(Scopes::ADMIN);
/// Changing a mirror topic's shape: admins, and the mirror that keeps it.
const SHAPE_MIRROR: Scopes = Scopes::ADMIN.or(Scopes::MIRROR);

/// Who may change topic `name`'s shape or config: admins, and the mirror scope when it is a mirror topic.
fn shape_scopes(core: &BrokerCore, name: &str) -> Scopes {
    match core.topic(name) {
        Ok(t) if t.mirror().is_some() => SHAPE_MIRROR,
        _ => Scopes::ADMIN,
    }
}

fn ok<T>(v: T) -> Rpc<T> {
    Ok(Response::new(v))
}

fn append_error(code: pb::ErrorCode, message: String, leo: u64, log_start: u64) -> pb::AppendWithOffsetsResponse {
    pb::AppendWithOffsetsResponse {
        error: code as i32,
        message,
        log_end_offset: leo,
        written_batches: 0,
        present_batches: 0,
        diverged_at: None,
        log_start_offset: log_start,
    }
}

#[tonic::async_trait]
impl Broker for BrokerService {
    async fn metadata(&self, req: Request<pb::MetadataRequest>) -> Rpc<pb::MetadataResponse> {
        // Every token may ask what the broker is: clients read its limits before anything else.
        caller(&req)?;
        let req = req.into_inner();
        let (topics, listener) = (req.topics, Some(req.listener.as_str()).filter(|l| !l.is_empty()));
        let r = self.replication.as_ref();
        ok(pb::MetadataResponse {
            cluster_id: self.core.cluster_id().to_owned(),
            broker_address: self.advertised.clone(),
            max_batch_bytes: self.max_batch_bytes,
            max_message_bytes: ferry_proto::max_message_bytes(self.max_batch_bytes as usize) as u64,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            broker_id: r.map_or(0, |r| r.broker_id()),
            brokers: r.map(|r| r.brokers(listener)).unwrap_or_default(),
            partitions: match r {
                Some(r) if !topics.is_empty() => r.placements(&topics, listener),
                _ => Vec::new(),
            },
        })
    }

    async fn create_topic(&self, req: Request<pb::CreateTopicRequest>) -> Rpc<pb::CreateTopicResponse> {
        self.create_topic_rpc(req).await
    }

    async fn delete_topic(&self, req: Request<pb::DeleteTopicRequest>) -> Rpc<pb::DeleteTopicResponse> {
        self.delete_topic_rpc(req).await
    }

    async fn list_topics(&self, req: Request<pb::ListTopicsRequest>) -> Rpc<pb::ListTopicsResponse> {
        let who = caller(&req)?;
        who.allow("ListTopics", DESCRIBE)?;
        let mut topics: BTreeMap<String, pb::TopicInfo> =
            self.core.topics().iter().map(|t| self.core.topic_info(t)).map(|i| (i.name.clone(), i)).collect();
        // A cluster member lists the catalog's replicated topics, also those it holds no replica of.
        if let Some(r) = &self.replication {
            for info in r.catalog_topics() {
                topics.entry(info.name.clone()).or_insert(info);
            }
        }
        let topics = topics
            .into_values()
            .filter(|info| who.sees_topic(&info.name) && !info.name.starts_with(crate::node::topic::RESERVED_PREFIX))
            .collect();
        ok(topics::list_answer(topics, &req.get_ref().unless_digest))
    }

    async fn describe_topic(&self, req: Request<pb::DescribeTopicRequest>) -> Rpc<pb::DescribeTopicResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let name = req.name;
        who.allow_topic("DescribeTopic", DESCRIBE, &name)?;
        let reads = self.reads();
        let (info, count) = match self.core.topic(&name) {
            Ok(t) => (self.core.topic_info(&t), t.partition_count()),
            // A member holding no replica of a replicated topic describes it from the catalog.
            Err(e) => match &self.replication {
                Some(r) if r.is_replicated(&name) => {
                    let info = r.describe(&name).await?;
                    let count = info.partitions;
                    (info, count)
                }
                _ => return Err(e.into()),
            },
        };
        // Each replicated partition is described by its leader only, at the epoch the client names (KIP-320); the
        // others point at the leader.
        let partitions = (0..count)
            .map(|i| {
                let asked = req.leader_epochs.get(&i).copied();
                match self.core.partition(&name, i).and_then(|p| reads.check(&p, asked).map(|_| p)) {
                    Ok(p) => p.info(),
                    Err(e) => {
                        let (code, message, leader) = crate::rpc::fetch::classify(&reads, &name, i, &e);
                        pb::PartitionInfo { partition: i, error: code as i32, message, leader, ..Default::default() }
                    }
                }
            })
            .collect();
        ok(pb::DescribeTopicResponse { topic: Some(info), partitions })
    }

    async fn alter_partitions(&self, req: Request<pb::AlterPartitionsRequest>) -> Rpc<pb::AlterPartitionsResponse> {
        self.alter_partitions_rpc(req).await
    }

    async fn alter_topic_config(&self, req: Request<pb::AlterTopicConfigRequest>) -> Rpc<pb::AlterTopicConfigResponse> {
        self.alter_topic_config_rpc(req).await
    }

    async fn promote(&self, req: Request<pb::PromoteRequest>) -> Rpc<pb::PromoteResponse> {
        self.promote_rpc(req).await
    }

    async fn init_producer(&self, req: Request<pb::InitProducerRequest>) -> Rpc<pb::InitProducerResponse> {
        caller(&req)?.allow("InitProducer", Scopes::PRODUCE)?;
        // Random 63-bit ids: unique across clusters without coordination (a collision needs ~3e9 producers).
        let producer_id = (rand::random::<u64>() >> 1) as i64;
        ok(pb::InitProducerResponse { producer_id, producer_epoch: 0 })
    }

    async fn produce(&self, req: Request<pb::ProduceRequest>) -> Rpc<pb::ProduceResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("Produce", Scopes::PRODUCE, &req.topic)?;
        refuse_reserved(&req.topic)?;
        let topic = self.local_topic(&req.topic, req.partition)?;
        if let Some(mark) = topic.mirror() {
            return Err(BrokerError::MirrorTopicReadOnly {
                topic: req.topic,
                source_cluster: mark.source_display().to_owned(),
            }
            .into());
        }
        let count = topic.partition_count();
        let partition = match (req.partition, &req.key) {
            (Some(p), _) => p,
            (None, Some(key)) => ferry_proto::partition_for_key(key, count),
            (None, None) => self.round_robin.fetch_add(1, Ordering::Relaxed) % count.max(1),
        };
        let part = self.placed(&topic, partition)?;
        let produced = self.produce_to(&part, req.batches).await?;
        self.acknowledged(&part, &produced).await?;
        ok(pb::ProduceResponse {
            partition,
            base_offset: produced.base_offset,
            last_offset: produced.last_offset,
            duplicate: produced.duplicate,
            log_end_offset: if part.replica().is_some() { part.visible_end() } else { produced.log_end_offset },
        })
    }

    async fn append_with_offsets(
        &self,
        req: Request<pb::AppendWithOffsetsRequest>,
    ) -> Rpc<pb::AppendWithOffsetsResponse> {
        self.append_with_offsets_rpc(req).await
    }

    async fn epoch_end(&self, req: Request<pb::EpochEndRequest>) -> Rpc<pb::EpochEndResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("EpochEnd", Scopes::MIRROR, &req.topic)?;
        let topic = self.local_topic(&req.topic, Some(req.partition))?;
        let part = self.placed(&topic, req.partition)?;
        self.reads().check(&part, None)?;
        ok(match part.log().epoch_end(req.epoch) {
            Some(e) => pb::EpochEndResponse { found: true, epoch: e.epoch, end_offset: e.end_offset },
            // An epoch older than all the partition knows ended where its known history begins (KIP-279): the
            // first entry's start, or the log end of a partition with no history.
            None => {
                let log = part.log();
                let first = log.epoch_history().first().map_or(log.log_end_offset(), |&(_, start)| start);
                pb::EpochEndResponse { found: false, epoch: 0, end_offset: first }
            }
        })
    }

    async fn truncate_partition(
        &self,
        req: Request<pb::TruncatePartitionRequest>,
    ) -> Rpc<pb::TruncatePartitionResponse> {
        self.truncate_partition_rpc(req).await
    }

    async fn fetch(&self, req: Request<pb::FetchRequest>) -> Rpc<pb::FetchResponse> {
        let who = caller(&req)?;
        // A cluster member reads for a feature it owns (a queue group's records), with its member credential.
        if req.extensions().get::<crate::rpc::auth::Member>().is_none() {
            for p in &req.get_ref().partitions {
                who.allow_topic("Fetch", READ, &p.topic)?;
            }
        }
        let limit = crate::rpc::fetch::response_limit(self.max_batch_bytes);
        let turn = self.fetch_turns.fetch_add(1, Ordering::Relaxed) as usize;
        let req = req.into_inner();
        ok(crate::rpc::fetch::fetch(&self.reads(), req, self.max_fetch_wait, limit, turn, &self.shutdown).await)
    }

    type SubscribeStream = ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(&self, req: Request<tonic::Streaming<pb::SubscribeRequest>>) -> Rpc<Self::SubscribeStream> {
        let who = caller(&req)?;
        who.allow("Subscribe", READ)?;
        let (tx, rx) = mpsc::channel(4);
        let shutdown = self.shutdown.clone();
        let limit = crate::rpc::fetch::response_limit(self.max_batch_bytes);
        tokio::spawn(crate::rpc::fetch::subscribe(self.reads(), who, req.into_inner(), tx, limit, shutdown));
        ok(ReceiverStream::new(rx))
    }

    async fn list_offsets(&self, req: Request<pb::ListOffsetsRequest>) -> Rpc<pb::ListOffsetsResponse> {
        self.list_offsets_rpc(req).await
    }

    async fn join_group(&self, req: Request<pb::JoinGroupRequest>) -> Rpc<pb::JoinGroupResponse> {
        self.join_group_rpc(req).await
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Rpc<pb::HeartbeatResponse> {
        self.heartbeat_rpc(req).await
    }

    async fn leave_group(&self, req: Request<pb::LeaveGroupRequest>) -> Rpc<pb::LeaveGroupResponse> {
        self.leave_group_rpc(req).await
    }

    async fn commit_offsets(&self, req: Request<pb::CommitOffsetsRequest>) -> Rpc<pb::CommitOffsetsResponse> {
        self.commit_offsets_rpc(req).await
    }

    async fn fetch_committed_offsets(
        &self,
        req: Request<pb::FetchCommittedOffsetsRequest>,
    ) -> Rpc<pb::FetchCommittedOffsetsResponse> {
        self.fetch_committed_offsets_rpc(req).await
    }

    async fn list_groups(&self, req: Request<pb::ListGroupsRequest>) -> Rpc<pb::ListGroupsResponse> {
        self.list_groups_rpc(req).await
    }

    async fn replica_fetch(&self, req: Request<pb::ReplicaFetchRequest>) -> Rpc<pb::ReplicaFetchResponse> {
        require_member(&req, "ReplicaFetch", Some(req.get_ref().replica_id))?;
        let req = req.into_inner();
        let part = self.core.partition(&req.topic, req.partition)?;
        if self.core.topic(&req.topic)?.id() != req.topic_id {
            return Err(BrokerError::InvalidArgument(format!(
                "topic \"{}\" here is not the follower's topic id {}",
                req.topic, req.topic_id
            ))
            .into());
        }
        ok(self.replication()?.serving().replica_fetch(&part, req, self.max_fetch_wait).await)
    }

    async fn leader_epoch_end(&self, req: Request<pb::LeaderEpochEndRequest>) -> Rpc<pb::LeaderEpochEndResponse> {
        require_member(&req, "LeaderEpochEnd", None)?;
        let req = req.into_inner();
        let part = self.core.partition(&req.topic, req.partition)?;
        ok(crate::cluster::serving::leader_epoch_end(&part, &req))
    }

    async fn replica_state(&self, req: Request<pb::ReplicaStateRequest>) -> Rpc<pb::ReplicaStateResponse> {
        require_member(&req, "ReplicaState", None)?;
        ok(self.replication()?.answer_replica_state(req.get_ref()))
    }

    async fn confirm_leader(&self, req: Request<pb::ConfirmLeaderRequest>) -> Rpc<pb::ConfirmLeaderResponse> {
        let member = require_member(&req, "ConfirmLeader", Some(req.get_ref().leader_id))?;
        ok(self.replication()?.answer_confirm(member, req.get_ref()))
    }

    async fn produce_delayed(&self, req: Request<pb::ProduceDelayedRequest>) -> Rpc<pb::ProduceDelayedResponse> {
        self.produce_delayed_rpc(req).await
    }

    async fn cancel_delayed(&self, req: Request<pb::CancelDelayedRequest>) -> Rpc<pb::CancelDelayedResponse> {
        self.cancel_delayed_rpc(req).await
    }

    async fn describe_delayed(&self, req: Request<pb::DescribeDelayedRequest>) -> Rpc<pb::DescribeDelayedResponse> {
        self.describe_delayed_rpc(req).await
    }

    async fn move_delayed(&self, req: Request<pb::MoveDelayedRequest>) -> Rpc<pb::ProduceResponse> {
        self.move_delayed_rpc(req).await
    }

    async fn share_join(&self, req: Request<pb::ShareJoinRequest>) -> Rpc<pb::ShareJoinResponse> {
        self.share_join_rpc(req).await
    }

    async fn share_poll(&self, req: Request<pb::SharePollRequest>) -> Rpc<pb::SharePollResponse> {
        self.share_poll_rpc(req).await
    }

    async fn share_ack(&self, req: Request<pb::ShareAckRequest>) -> Rpc<pb::ShareAckResponse> {
        self.share_ack_rpc(req).await
    }

    async fn share_leave(&self, req: Request<pb::ShareLeaveRequest>) -> Rpc<pb::ShareLeaveResponse> {
        self.share_leave_rpc(req).await
    }

    async fn share_describe(&self, req: Request<pb::ShareDescribeRequest>) -> Rpc<pb::ShareDescribeResponse> {
        self.share_describe_rpc(req).await
    }

    async fn share_unpin(&self, req: Request<pb::ShareUnpinRequest>) -> Rpc<pb::ShareUnpinResponse> {
        self.share_unpin_rpc(req).await
    }

    async fn message_status(&self, req: Request<pb::MessageStatusRequest>) -> Rpc<pb::MessageStatusResponse> {
        self.message_status_rpc(req).await
    }

    async fn redrive(&self, req: Request<pb::RedriveRequest>) -> Rpc<pb::RedriveResponse> {
        self.redrive_rpc(req).await
    }

    async fn share_list(&self, req: Request<pb::ShareListRequest>) -> Rpc<pb::ShareListResponse> {
        self.share_list_rpc(req).await
    }

    async fn cluster_status(&self, req: Request<pb::ClusterStatusRequest>) -> Rpc<pb::ClusterStatusResponse> {
        caller(&req)?.allow("ClusterStatus", DESCRIBE)?;
        ok(self.replication()?.status())
    }

    async fn drain_broker(&self, req: Request<pb::DrainBrokerRequest>) -> Rpc<pb::DrainBrokerResponse> {
        caller(&req)?.allow("DrainBroker", Scopes::ADMIN)?;
        let req = req.into_inner();
        let draining = self.replication()?.drain(req.broker_id, req.cancel).await?;
        ok(pb::DrainBrokerResponse { draining })
    }

    async fn elect_leader(&self, req: Request<pb::ElectLeaderRequest>) -> Rpc<pb::ElectLeaderResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_topic("ElectLeader", Scopes::ADMIN, &req.topic)?;
        let (state, unclean) = self.replication()?.elect(&req.topic, req.partition, req.unclean, &req.dead).await?;
        ok(pb::ElectLeaderResponse { leader_id: state.leader, leader_epoch: state.leader_epoch, unclean })
    }

    async fn describe_group(&self, req: Request<pb::DescribeGroupRequest>) -> Rpc<pb::DescribeGroupResponse> {
        self.describe_group_rpc(req).await
    }

    async fn fence_topics(&self, req: Request<pb::FenceTopicsRequest>) -> Rpc<pb::FenceTopicsResponse> {
        self.fence_topics_rpc(req).await
    }

    async fn promote_topics(&self, req: Request<pb::PromoteTopicsRequest>) -> Rpc<pb::PromoteTopicsResponse> {
        self.promote_topics_rpc(req).await
    }

    async fn mark_mirror(&self, req: Request<pb::MarkMirrorRequest>) -> Rpc<pb::MarkMirrorResponse> {
        self.mark_mirror_rpc(req).await
    }

    async fn put_job(&self, req: Request<pb::PutJobRequest>) -> Rpc<pb::PutJobResponse> {
        self.put_job_rpc(req).await
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Rpc<pb::GetJobResponse> {
        self.get_job_rpc(req).await
    }

    async fn txn_prepare(&self, req: Request<pb::TxnPrepareRequest>) -> Rpc<pb::TxnPrepareResponse> {
        self.txn_prepare_rpc(req).await
    }

    async fn txn_resolve(&self, req: Request<pb::TxnResolveRequest>) -> Rpc<pb::TxnResolveResponse> {
        self.txn_resolve_rpc(req).await
    }

    async fn txn_list(&self, req: Request<pb::TxnListRequest>) -> Rpc<pb::TxnListResponse> {
        self.txn_list_rpc(req).await
    }

    type TxnChecksStream = ReceiverStream<Result<pb::TxnCheck, Status>>;

    async fn txn_checks(&self, req: Request<tonic::Streaming<pb::TxnCheckAnswer>>) -> Rpc<Self::TxnChecksStream> {
        self.txn_checks_rpc(req).await
    }

    async fn txn_append(&self, req: Request<pb::TxnAppendRequest>) -> Rpc<pb::ProduceResponse> {
        self.txn_append_rpc(req).await
    }
}
