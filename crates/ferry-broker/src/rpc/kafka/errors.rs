//! Kafka error codes for what the broker's service answers. Each Ferry refusal carries a stable reason
//! (`ferry-reason`, docs/broker.md); this table maps it to the Kafka code a Kafka client acts on.

use kafka_protocol::ResponseError as E;
use tonic::Status;

/// What a refusal is about, which picks the authorization code Kafka uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum About {
    /// A topic or partition.
    Topic,
    /// A consumer group.
    Group,
    /// The cluster (topic creation and the like).
    Cluster,
}

/// The stable reason of a refusal (`ferry-reason`), or "" when it has none.
pub fn reason(s: &Status) -> &str {
    s.metadata().get(crate::error::REASON_KEY).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The Kafka error code for `s` when it refuses something about `about`.
pub fn code(s: &Status, about: About) -> i16 {
    let e = match reason(s) {
        "unknown_topic" | "unknown_partition" => E::UnknownTopicOrPartition,
        "invalid_name" => E::InvalidTopicException,
        "topic_exists" => E::TopicAlreadyExists,
        "partitions_only_grow" => E::InvalidPartitions,
        // A mirror topic takes no writes but the mirror's: a request Kafka would call invalid, not retriable.
        "mirror_topic_read_only" | "not_a_mirror_topic" => E::InvalidRequest,
        "batch_too_large" => E::MessageTooLarge,
        "corrupt_batch" => E::CorruptMessage,
        "malformed_batch" => E::InvalidRecord,
        "offset_out_of_range" => E::OffsetOutOfRange,
        "producer_fenced" => E::InvalidProducerEpoch,
        "producer_expired" => E::UnknownProducerId,
        "out_of_sequence" => E::OutOfOrderSequenceNumber,
        "group_has_members" => E::NonEmptyGroup,
        "unknown_member" => E::UnknownMemberId,
        "stale_generation" => E::IllegalGeneration,
        "storage_error" | "io_error" => E::KafkaStorageError,
        "permission_denied" | "unauthenticated" => match about {
            About::Topic => E::TopicAuthorizationFailed,
            About::Group => E::GroupAuthorizationFailed,
            About::Cluster => E::ClusterAuthorizationFailed,
        },
        "not_leader" => E::NotLeaderOrFollower,
        "fenced_leader_epoch" => E::FencedLeaderEpoch,
        "not_coordinator" => E::NotCoordinator,
        "not_enough_replicas" => E::NotEnoughReplicas,
        "not_acknowledged" => E::RequestTimedOut,
        "cluster_unavailable" => match about {
            About::Group => E::CoordinatorNotAvailable,
            _ => E::LeaderNotAvailable,
        },
        "limit_reached" => match about {
            About::Cluster => E::PolicyViolation,
            _ => E::InvalidRequest,
        },
        "invalid_argument" => match about {
            About::Group => E::InvalidGroupId,
            _ => E::InvalidRequest,
        },
        _ => E::UnknownServerError,
    };
    e.code()
}

/// The message a Kafka response may carry next to the code.
pub fn message(s: &Status) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.message().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BrokerError;

    #[test]
    fn refusals_map_to_the_codes_kafka_clients_act_on() {
        let cases: Vec<(BrokerError, About, i16)> = vec![
            (BrokerError::UnknownTopic { topic: "t".into() }, About::Topic, 3),
            (BrokerError::TopicExists { topic: "t".into(), topic_id: "id".into() }, About::Cluster, 36),
            (BrokerError::MirrorTopicReadOnly { topic: "t".into(), source_cluster: "dc-a".into() }, About::Topic, 42),
            (
                BrokerError::NotLeader { topic: "t".into(), partition: 0, leader: 2, address: "a".into(), epoch: 3 },
                About::Topic,
                6,
            ),
            (
                BrokerError::NotCoordinator { group: "g".into(), leader: 2, address: "a".into(), epoch: 1 },
                About::Group,
                16,
            ),
            (BrokerError::Internal("x".into()), About::Topic, -1),
        ];
        for (err, about, want) in cases {
            let s: Status = err.into();
            assert_eq!(code(&s, about), want, "{s:?}");
        }
    }
}
