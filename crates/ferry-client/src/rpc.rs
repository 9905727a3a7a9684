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

macro_rules! unary {
    ($(#[$doc:meta])* $method:ident, $rpc:literal, $req:ty, $resp:ty, $retry:expr) => {
        $(#[$doc])*
        pub async fn $method(&self, request: $req) -> Result<$resp> {
            let retry: fn(&$req) -> Retry = $retry;
            let retry = retry(&request);
            self.call($rpc, retry, self.request_timeout(), |mut c| {
                let request = request.clone();
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
        self.call("Metadata", Retry::Idempotent, self.request_timeout(), |mut c| async move {
            c.metadata(pb::MetadataRequest {}).await
        })
        .await
    }

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
        /// Appends batches that carry offsets (mirror topics); safe to repeat: present batches are recognised.
        append_with_offsets, "AppendWithOffsets", pb::AppendWithOffsetsRequest, pb::AppendWithOffsetsResponse,
        idempotent);

    /// Appends batches that carry offsets, sent again only when the request provably never reached a broker: for
    /// a caller that retries by itself and must know when an attempt's outcome was unknown (the mirror then counts
    /// the batches the target reports present as its own lost attempt's).
    pub async fn append_with_offsets_once(
        &self,
        request: pb::AppendWithOffsetsRequest,
    ) -> Result<pb::AppendWithOffsetsResponse> {
        self.call("AppendWithOffsets", Retry::Once, self.request_timeout(), |mut c| {
            let request = request.clone();
            async move { c.append_with_offsets(request).await }
        })
        .await
    }

    unary!(
        /// The first offset after an epoch.
        epoch_end, "EpochEnd", pb::EpochEndRequest, pb::EpochEndResponse, idempotent);
    unary!(
        /// Truncates a mirror partition at or below an offset.
        truncate_partition, "TruncatePartition", pb::TruncatePartitionRequest, pb::TruncatePartitionResponse,
        idempotent);
    unary!(
        /// Offsets by earliest, latest or timestamp.
        list_offsets, "ListOffsets", pb::ListOffsetsRequest, pb::ListOffsetsResponse, idempotent);
    unary!(
        /// Joins a group. A first join (empty member id) is not repeated after an unknown outcome, which would
        /// leave a ghost member until its session expires; a rejoin with a member id is.
        join_group, "JoinGroup", pb::JoinGroupRequest, pb::JoinGroupResponse,
        |r| if r.member_id.is_empty() { Retry::Once } else { Retry::Idempotent });
    unary!(
        /// Keeps a membership alive and learns about new generations.
        heartbeat, "Heartbeat", pb::HeartbeatRequest, pb::HeartbeatResponse, idempotent);
    unary!(
        /// Leaves a group.
        leave_group, "LeaveGroup", pb::LeaveGroupRequest, pb::LeaveGroupResponse, idempotent);
    unary!(
        /// Commits offsets (the same offsets twice is the same commit).
        commit_offsets, "CommitOffsets", pb::CommitOffsetsRequest, pb::CommitOffsetsResponse, idempotent);
    unary!(
        /// Reads committed offsets.
        fetch_committed_offsets, "FetchCommittedOffsets", pb::FetchCommittedOffsetsRequest,
        pb::FetchCommittedOffsetsResponse, idempotent);
    unary!(
        /// Lists groups.
        list_groups, "ListGroups", pb::ListGroupsRequest, pb::ListGroupsResponse, idempotent);
    unary!(
        /// Describes a group: members, assignment, committed offsets.
        describe_group, "DescribeGroup", pb::DescribeGroupRequest, pb::DescribeGroupResponse, idempotent);

    /// Long-poll fetch. The timeout is the request timeout plus the request's `max_wait_ms`.
    pub async fn fetch(&self, request: pb::FetchRequest) -> Result<pb::FetchResponse> {
        let timeout = self.request_timeout() + Duration::from_millis(u64::from(request.max_wait_ms));
        self.call("Fetch", Retry::Idempotent, timeout, |mut c| {
            let request = request.clone();
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
