//! Typed wrappers for every unary RPC of `ferry.v1.Broker` on [`BrokerClient`]: proto request in, proto response
//! out, with the connection's timeout, failover and retry rules. Which calls are idempotent is decided here, per
//! RPC (and for Produce and JoinGroup, per request).
//!
//! `Subscribe` is a bidirectional stream and is used through [`BrokerClient::raw`].

use std::time::Duration;

use ferry_batch::BatchIter;
use ferry_proto as pb;

use crate::connection::{BrokerClient, Retry};
use crate::error::Result;
use crate::parts_call::{self, AppendWithOffsetsParts, PartsBody};

/// The broker's internal topic of job records (one partition).
pub const JOBS_TOPIC: &str = "__ferry_jobs";

macro_rules! unary {
    ($(#[$doc:meta])* $method:ident, $rpc:literal, $req:ty, $resp:ty, $retry:expr) => {
        $(#[$doc])*
        pub async fn $method(&self, request: $req) -> Result<$resp> {
            let retry: fn(&$req) -> Retry = $retry;
            let retry = retry(&request);
            self.call($rpc, retry, self.request_timeout(), |conn| {
                let (mut c, request) = (conn.raw(), request.clone());
                async move { c.$method(request).await }
            })
            .await
        }
    };
    ($(#[$doc:meta])* $method:ident, $rpc:literal, $req:ty, $resp:ty, $retry:expr, at_coordinator) => {
        $(#[$doc])*
        /// Sent to the group's coordinator as last learnt (see [`BrokerClient::for_group`]).
        pub async fn $method(&self, request: $req) -> Result<$resp> {
            let retry: fn(&$req) -> Retry = $retry;
            let retry = retry(&request);
            self.call_group(&request.group, $rpc, retry, |conn| {
                let (mut c, request) = (conn.raw(), request.clone());
                async move { c.$method(request).await }
            })
            .await
        }
    };
    ($(#[$doc:meta])* $method:ident, $rpc:literal, $req:ty, $resp:ty, $retry:expr, at_leader) => {
        $(#[$doc])*
        /// Sent to the partition's leader as last learnt (see [`BrokerClient::for_partition`]).
        pub async fn $method(&self, request: $req) -> Result<$resp> {
            let retry: fn(&$req) -> Retry = $retry;
            let retry = retry(&request);
            self.call_partition(&request.topic, request.partition, $rpc, retry, |conn| {
                let (mut c, request) = (conn.raw(), request.clone());
                async move { c.$method(request).await }
            })
            .await
        }
    };
}

const fn idempotent<T>(_: &T) -> Retry {
    Retry::Idempotent
}

const fn once<T>(_: &T) -> Retry {
    Retry::Once
}

impl BrokerClient {
    /// Cluster id, advertised address and limits.
    pub async fn metadata(&self) -> Result<pb::MetadataResponse> {
        self.metadata_for(Vec::new()).await
    }

    /// [`Self::metadata`] with the placement of `topics`' replicated partitions (a cluster member's), on this
    /// client's listener; the brokers and leaders it names are where this client's calls go from then on.
    pub async fn metadata_for(&self, topics: Vec<String>) -> Result<pb::MetadataResponse> {
        let listener = self.config().listener.clone().unwrap_or_default();
        let response = self
            .call("Metadata", Retry::Idempotent, self.request_timeout(), |conn| {
                let (mut c, topics, listener) = (conn.raw(), topics.clone(), listener.clone());
                async move { c.metadata(pb::MetadataRequest { topics, listener }).await }
            })
            .await?;
        self.learn_brokers(response.brokers.iter().map(|b| (b.broker_id, b.address.clone())));
        for p in response.partitions.iter().filter(|p| p.leader_id != 0) {
            self.learn_leader(&p.topic, p.partition, p.leader_epoch, &p.leader_address);
        }
        Ok(response)
    }

    unary!(
        /// The cluster as the answering member sees it.
        cluster_status, "ClusterStatus", pb::ClusterStatusRequest, pb::ClusterStatusResponse, idempotent);
    unary!(
        /// Marks a broker as being drained, or no longer (setting a mark: repeating it changes nothing).
        drain_broker, "DrainBroker", pb::DrainBrokerRequest, pb::DrainBrokerResponse, idempotent);
    unary!(
        /// Elects a partition's leader by hand; not repeated after an unknown outcome (a second election would
        /// move the leadership again).
        elect_leader, "ElectLeader", pb::ElectLeaderRequest, pb::ElectLeaderResponse, once);

    unary!(
        /// Creates a topic. Not retried after an unknown outcome (a retry would answer ALREADY_EXISTS).
        create_topic, "CreateTopic", pb::CreateTopicRequest, pb::CreateTopicResponse, once);
    unary!(
        /// Deletes a topic. Not retried after an unknown outcome (a retry would answer NOT_FOUND).
        delete_topic, "DeleteTopic", pb::DeleteTopicRequest, pb::DeleteTopicResponse, once);
    unary!(
        /// Lists topics.
        list_topics, "ListTopics", pb::ListTopicsRequest, pb::ListTopicsResponse, idempotent);
    unary!(
        /// Describes a topic and its partitions.
        describe_topic, "DescribeTopic", pb::DescribeTopicRequest, pb::DescribeTopicResponse, idempotent);
    unary!(
        /// Grows the partition count (setting the same count twice is harmless).
        alter_partitions, "AlterPartitions", pb::AlterPartitionsRequest, pb::AlterPartitionsResponse, idempotent);
    unary!(
        /// Changes topic config fields that are set.
        alter_topic_config, "AlterTopicConfig", pb::AlterTopicConfigRequest, pb::AlterTopicConfigResponse,
        idempotent);
    unary!(
        /// Clears a topic's mirror mark (idempotent by protocol).
        promote, "Promote", pb::PromoteRequest, pb::PromoteResponse, idempotent);
    unary!(
        /// Allocates a producer id and epoch (a retry only wastes an id).
        init_producer, "InitProducer", pb::InitProducerRequest, pb::InitProducerResponse, idempotent);
    unary!(
        /// Produces batches. Retried only when the first batch carries a producer id (the broker deduplicates
        /// it); plain batches are sent again only if no connection could be made.
        produce, "Produce", pb::ProduceRequest, pb::ProduceResponse, produce_retry);
    unary!(
        /// Stores a transaction's half messages; repeating it with the same messages is harmless.
        txn_prepare, "TxnPrepare", pb::TxnPrepareRequest, pb::TxnPrepareResponse, idempotent);
    unary!(
        /// Commits or rolls back a transaction; a repeat answers the recorded result.
        txn_resolve, "TxnResolve", pb::TxnResolveRequest, pb::TxnResolveResponse, idempotent);
    unary!(
        /// The transactions the answering broker owns.
        txn_list, "TxnList", pb::TxnListRequest, pb::TxnListResponse, idempotent);
    unary!(
        /// Produces records delivered later (docs/messaging.md, "Delay"). Retried only when every batch carries a
        /// producer id (the broker answers a retry with the first attempt's ids and stores nothing); plain batches
        /// are sent again only if no connection could be made.
        produce_delayed, "ProduceDelayed", pb::ProduceDelayedRequest, pb::ProduceDelayedResponse,
        produce_delayed_retry);
    unary!(
        /// Cancels a pending delayed record (a retry after success answers FAILED_PRECONDITION).
        cancel_delayed, "CancelDelayed", pb::CancelDelayedRequest, pb::CancelDelayedResponse, once);
    unary!(
        /// The delayed records pending for a topic, per partition.
        describe_delayed, "DescribeDelayed", pb::DescribeDelayedRequest, pb::DescribeDelayedResponse, idempotent);
    unary!(
        /// Appends batches that carry offsets (mirror topics); safe to repeat: present batches are recognised.
        append_with_offsets, "AppendWithOffsets", pb::AppendWithOffsetsRequest, pb::AppendWithOffsetsResponse,
        idempotent, at_leader);

    /// Appends batches that carry offsets, sent again only when the request provably never reached a broker: for
    /// a caller that retries by itself and must know when an attempt's outcome was unknown (the mirror then counts
    /// the batches the target reports present as its own lost attempt's).
    pub async fn append_with_offsets_once(
        &self,
        request: pb::AppendWithOffsetsRequest,
    ) -> Result<pb::AppendWithOffsetsResponse> {
        self.call_partition(&request.topic, request.partition, "AppendWithOffsets", Retry::Once, |conn| {
            let (mut c, request) = (conn.raw(), request.clone());
            async move { c.append_with_offsets(request).await }
        })
        .await
    }

    /// [`Self::append_with_offsets_once`] for batches held in several buffers. Without compression they are sent
    /// from those buffers, uncopied (see `parts_call`); with it, each is copied once, straight into the message
    /// being compressed (see [`AppendWithOffsetsParts`]).
    pub async fn append_with_offsets_parts_once(
        &self,
        request: AppendWithOffsetsParts,
    ) -> Result<pb::AppendWithOffsetsResponse> {
        self.call_partition(&request.topic, request.partition, "AppendWithOffsets", Retry::Once, |conn| {
            let uncompressed = self.uncompressed_service(conn);
            let mut grpc = self.grpc(conn);
            let request = request.clone();
            async move {
                if let Some((service, max_message_bytes)) = uncompressed {
                    let body = PartsBody::new(&request, max_message_bytes)?;
                    return parts_call::append(service, body, max_message_bytes).await;
                }
                grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("service was not ready: {e}")))?;
                let codec =
                    ferry_proto::codec::SizedCodec::<AppendWithOffsetsParts, pb::AppendWithOffsetsResponse>::default();
                let path = http::uri::PathAndQuery::from_static("/ferry.v1.Broker/AppendWithOffsets");
                grpc.unary(tonic::Request::new(request), path, codec).await
            }
        })
        .await
    }

    unary!(
        /// The first offset after an epoch.
        epoch_end, "EpochEnd", pb::EpochEndRequest, pb::EpochEndResponse, idempotent, at_leader);
    unary!(
        /// Truncates a mirror partition at or below an offset.
        truncate_partition, "TruncatePartition", pb::TruncatePartitionRequest, pb::TruncatePartitionResponse,
        idempotent, at_leader);
    unary!(
        /// Offsets by earliest, latest or timestamp.
        list_offsets, "ListOffsets", pb::ListOffsetsRequest, pb::ListOffsetsResponse, idempotent);
    unary!(
        /// Joins a group. A first join (empty member id) is not repeated after an unknown outcome, which would
        /// leave a ghost member until its session expires; a rejoin with a member id is.
        join_group, "JoinGroup", pb::JoinGroupRequest, pb::JoinGroupResponse,
        |r| if r.member_id.is_empty() { Retry::Once } else { Retry::Idempotent }, at_coordinator);
    unary!(
        /// Keeps a membership alive and learns about new generations.
        heartbeat, "Heartbeat", pb::HeartbeatRequest, pb::HeartbeatResponse, idempotent, at_coordinator);
    unary!(
        /// Leaves a group.
        leave_group, "LeaveGroup", pb::LeaveGroupRequest, pb::LeaveGroupResponse, idempotent, at_coordinator);
    unary!(
        /// Commits offsets (the same offsets twice is the same commit).
        commit_offsets, "CommitOffsets", pb::CommitOffsetsRequest, pb::CommitOffsetsResponse, idempotent,
        at_coordinator);
    unary!(
        /// Reads committed offsets.
        fetch_committed_offsets, "FetchCommittedOffsets", pb::FetchCommittedOffsetsRequest,
        pb::FetchCommittedOffsetsResponse, idempotent, at_coordinator);
    unary!(
        /// Lists groups.
        list_groups, "ListGroups", pb::ListGroupsRequest, pb::ListGroupsResponse, idempotent);
    unary!(
        /// Describes a group: members, assignment, committed offsets.
        describe_group, "DescribeGroup", pb::DescribeGroupRequest, pb::DescribeGroupResponse, idempotent,
        at_coordinator);

    unary!(
        /// Fences topics, or lifts their fences (setting a state: repeating it changes nothing).
        fence_topics, "FenceTopics", pb::FenceTopicsRequest, pb::FenceTopicsResponse, idempotent);
    unary!(
        /// Promotes topics as one cut (idempotent by protocol).
        promote_topics, "PromoteTopics", pb::PromoteTopicsRequest, pb::PromoteTopicsResponse, idempotent);
    unary!(
        /// Marks a topic as a mirror topic (setting a state).
        mark_mirror, "MarkMirror", pb::MarkMirrorRequest, pb::MarkMirrorResponse, idempotent);

    /// Writes a job record, at the leader of the jobs topic; not repeated after an unknown outcome (a repeat
    /// would be refused as a version conflict: the caller reads the job again).
    pub async fn put_job(&self, request: pb::PutJobRequest) -> Result<pb::PutJobResponse> {
        self.call_partition(JOBS_TOPIC, 0, "PutJob", Retry::Once, |conn| {
            let (mut c, request) = (conn.raw(), request.clone());
            async move { c.put_job(request).await }
        })
        .await
    }

    /// Reads a job record, at the leader of the jobs topic.
    pub async fn get_job(&self, request: pb::GetJobRequest) -> Result<pb::GetJobResponse> {
        self.call_partition(JOBS_TOPIC, 0, "GetJob", Retry::Idempotent, |conn| {
            let (mut c, request) = (conn.raw(), request.clone());
            async move { c.get_job(request).await }
        })
        .await
    }

    /// Long-poll fetch. The timeout is the request timeout plus the request's `max_wait_ms`.
    pub async fn fetch(&self, request: pb::FetchRequest) -> Result<pb::FetchResponse> {
        let timeout = self.request_timeout() + Duration::from_millis(u64::from(request.max_wait_ms));
        self.call("Fetch", Retry::Idempotent, timeout, |conn| {
            let (mut c, request) = (conn.raw(), request.clone());
            async move { c.fetch(request).await }
        })
        .await
    }
}

/// Produce is idempotent exactly when the broker can recognise a resend of every batch in it: each one carries a
/// producer id (a request whose first batch is idempotent but a later one is not would write that one twice).
fn produce_retry(request: &pb::ProduceRequest) -> Retry {
    let mut batches = BatchIter::new(&request.batches).peekable();
    if batches.peek().is_none() {
        return Retry::Once;
    }
    if batches.all(|b| b.is_ok_and(|(header, _)| header.is_idempotent())) { Retry::Idempotent } else { Retry::Once }
}

/// A delayed produce retries as its produce request would.
fn produce_delayed_retry(request: &pb::ProduceDelayedRequest) -> Retry {
    request.produce.as_ref().map_or(Retry::Once, produce_retry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_batch::{BatchBuilder, Compression, ProducerInfo};

    fn batch(producer: ProducerInfo) -> bytes::Bytes {
        let mut b = BatchBuilder::new(Compression::None, producer);
        b.push(0, 1, None, Some(b"v"), &[]);
        b.build(0, 0)
    }

    #[test]
    fn produce_is_retried_only_with_a_producer_id() {
        let plain = pb::ProduceRequest { batches: batch(ProducerInfo::NONE), ..Default::default() };
        assert_eq!(produce_retry(&plain), Retry::Once);
        let idem = pb::ProduceRequest {
            batches: batch(ProducerInfo { producer_id: 7, producer_epoch: 0, base_sequence: 0 }),
            ..Default::default()
        };
        assert_eq!(produce_retry(&idem), Retry::Idempotent);
        assert_eq!(produce_retry(&pb::ProduceRequest::default()), Retry::Once);
        // Every batch counts, not only the first.
        let idem_batch = batch(ProducerInfo { producer_id: 7, producer_epoch: 0, base_sequence: 1 });
        let both = |first: &bytes::Bytes, second: &bytes::Bytes| pb::ProduceRequest {
            batches: [first.as_ref(), second.as_ref()].concat().into(),
            ..Default::default()
        };
        assert_eq!(produce_retry(&both(&idem.batches, &idem_batch)), Retry::Idempotent);
        assert_eq!(produce_retry(&both(&idem.batches, &plain.batches)), Retry::Once);
        assert_eq!(produce_retry(&both(&plain.batches, &idem.batches)), Retry::Once);
        // A cut-short later batch: the broker refuses the request anyway; never retried.
        let cut = pb::ProduceRequest {
            batches: both(&idem.batches, &idem_batch).batches.slice(..idem.batches.len() + 10),
            ..Default::default()
        };
        assert_eq!(produce_retry(&cut), Retry::Once);
    }
}
