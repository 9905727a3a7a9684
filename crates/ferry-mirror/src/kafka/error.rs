//! Errors: [`KafkaSetupError`] for building the Kafka clients from the config, and the mapping of librdkafka's
//! errors to [`ClientError`]s with the gRPC code that says the same thing, so the pipeline classifies a Kafka
//! side's failures exactly as a Ferry side's (NOT_FOUND, UNAUTHENTICATED, transport, retriable, ...).

use ferry_client::{ClientError, Code};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The Kafka clients cannot be built from the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KafkaSetupError {
    /// A librdkafka property is unknown or has a bad value.
    #[error("[{section}] {message}")]
    InvalidProperty {
        /// `source.kafka` or `target.kafka`.
        section: &'static str,
        /// librdkafka's description (the value is left out: it may be a secret).
        message: String,
    },
    /// No bootstrap server was given.
    #[error("[{section}]: no bootstrap servers (a route's or the target's `brokers` list is empty)")]
    NoBootstrapServers {
        /// `source.kafka` or `target.kafka`.
        section: &'static str,
    },
    /// librdkafka refused to create a client.
    #[error("cannot create the Kafka {role} client for [{brokers}]: {message}")]
    ClientCreation {
        /// Which client (source metadata, target producer, ...).
        role: String,
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's message.
        message: String,
    },
}

impl From<KafkaSetupError> for ClientError {
    fn from(e: KafkaSetupError) -> Self {
        let field = match &e {
            KafkaSetupError::InvalidProperty { section, .. } | KafkaSetupError::NoBootstrapServers { section } => {
                section
            }
            KafkaSetupError::ClientCreation { .. } => "kafka",
        };
        ClientError::Config { field, message: e.to_string() }
    }
}

/// The librdkafka error code inside `err`, including admin-operation codes.
pub(crate) fn code_of(err: &KafkaError) -> Option<RDKafkaErrorCode> {
    match err {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    }
}

/// The gRPC code that means the same as a librdkafka error code; `None` for transport-level failures.
pub(crate) fn grpc_code(code: RDKafkaErrorCode) -> Option<Code> {
    use RDKafkaErrorCode as K;
    Some(match code {
        K::UnknownTopicOrPartition | K::UnknownTopic | K::UnknownPartition | K::UnknownTopicId => Code::NotFound,
        K::GroupIdNotFound | K::UnknownGroup => Code::NotFound,
        K::TopicAlreadyExists => Code::AlreadyExists,
        K::Authentication
        | K::SaslAuthenticationFailed
        | K::UnsupportedSASLMechanism
        | K::IllegalSASLState
        | K::SSL => Code::Unauthenticated,
        K::TopicAuthorizationFailed
        | K::GroupAuthorizationFailed
        | K::ClusterAuthorizationFailed
        | K::TransactionalIdAuthorizationFailed => Code::PermissionDenied,
        K::UnsupportedFeature | K::UnsupportedVersion | K::NotImplemented => Code::Unimplemented,
        K::InvalidPartitions
        | K::InvalidReplicationFactor
        | K::InvalidReplicaAssignment
        | K::InvalidConfig
        | K::InvalidTopic
        | K::InvalidRequest
        | K::PolicyViolation
        | K::InvalidArgument
        | K::InvalidTimestamp
        | K::InvalidRecord => Code::InvalidArgument,
        K::MessageSizeTooLarge | K::MessageBatchTooLarge | K::InvalidMessageSize => Code::ResourceExhausted,
        K::UnknownMemberId
        | K::IllegalGeneration
        | K::RebalanceInProgress
        | K::NonEmptyGroup
        | K::Fenced
        | K::ProducerFenced
        | K::InvalidProducerEpoch
        | K::InvalidTransactionalState
        | K::State => Code::FailedPrecondition,
        K::OffsetOutOfRange => Code::OutOfRange,
        K::OperationTimedOut | K::RequestTimedOut | K::MessageTimedOut | K::TimedOutQueue => Code::DeadlineExceeded,
        K::QueueFull
        | K::LeaderNotAvailable
        | K::NotLeaderForPartition
        | K::CoordinatorLoadInProgress
        | K::CoordinatorNotAvailable
        | K::NotCoordinator
        | K::NotEnoughReplicas
        | K::NotEnoughReplicasAfterAppend
        | K::ConcurrentTransactions
        | K::ThrottlingQuotaExceeded => Code::Unavailable,
        K::BrokerTransportFailure | K::AllBrokersDown | K::Resolve | K::NetworkException | K::BrokerNotAvailable => {
            return None;
        }
        _ => Code::Unknown,
    })
}

/// Maps a librdkafka error of operation `op` on `subject` against the cluster at `brokers`. `cause` is appended
/// (the client's last reported error) so that the message names what an operator can act on.
pub(crate) fn map_error(err: &KafkaError, op: &str, subject: &str, brokers: &str, cause: &str) -> ClientError {
    let message = format!("Kafka {op} {subject}: {err}{cause}");
    match code_of(err) {
        None => ClientError::Status { code: Code::Unknown, message, broker: brokers.to_owned(), reason: None },
        Some(code) => match grpc_code(code) {
            Some(code) => ClientError::Status { code, message, broker: brokers.to_owned(), reason: None },
            None => ClientError::Transport { broker: brokers.to_owned(), message },
        },
    }
}

/// A Kafka-side refusal with an explicit gRPC code.
pub(crate) fn status(code: Code, message: impl Into<String>, brokers: &str) -> ClientError {
    ClientError::Status { code, message: message.into(), broker: brokers.to_owned(), reason: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_codes_map_to_the_grpc_codes_the_pipeline_checks() {
        let e = map_error(
            &KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
            "metadata of",
            "orders",
            "k:9092",
            "",
        );
        assert!(e.is_not_found(), "{e:?}");
        let e = map_error(&KafkaError::AdminOp(RDKafkaErrorCode::TopicAlreadyExists), "create", "t", "k", "");
        assert!(e.is_already_exists());
        let e = map_error(&KafkaError::MetadataFetch(RDKafkaErrorCode::AllBrokersDown), "probe", "", "k", "");
        assert!(e.is_transport() && e.is_retriable());
        let e = map_error(&KafkaError::Global(RDKafkaErrorCode::SaslAuthenticationFailed), "probe", "", "k", "");
        assert!(e.is_unauthenticated() && !e.is_retriable());
        let e = map_error(&KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut), "produce", "", "k", "");
        assert!(e.is_retriable());
        let e = map_error(&KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced), "commit", "", "k", "; x");
        assert!(e.is_failed_precondition(), "{e:?}");
        assert!(e.to_string().ends_with("; x (broker k)"), "{e}");
    }

    #[test]
    fn setup_errors_become_config_errors_naming_the_section() {
        let e: ClientError = KafkaSetupError::NoBootstrapServers { section: "target.kafka" }.into();
        assert!(matches!(e, ClientError::Config { field: "target.kafka", .. }), "{e:?}");
    }
}
