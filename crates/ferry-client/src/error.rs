//! [`ClientError`]: every failure the client reports, with the gRPC code and the broker's message kept intact.
//!
//! Errors are `Clone` because one failed batch fails the delivery futures of all its records. Sources are kept as
//! text for the same reason; the text is the deepest cause, which is what an operator can act on
//! ("Connection refused (os error 111)", not "transport error").

use std::time::Duration;

use ferry_proto::ErrorCode;
use tonic::Code;

/// The gRPC metadata key under which the broker sends an error's reason name.
pub const REASON_KEY: &str = "ferry-reason";

/// Result alias of this crate.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A failure of a client call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The broker answered with a gRPC status.
    #[error("{message} (broker {broker})")]
    Status {
        /// The gRPC code.
        code: Code,
        /// The broker's message, unchanged.
        message: String,
        /// Address of the broker that answered.
        broker: String,
        /// The broker's stable reason name (its `ferry-reason` metadata: `producer_expired`, `unknown_topic`, ...),
        /// when it sent one. docs/broker.md lists them.
        reason: Option<String>,
    },
    /// The connection to a broker failed (refused, reset, keepalive timeout, TLS handshake).
    #[error("connection to broker {broker} failed: {message}")]
    Transport {
        /// Address of the broker.
        broker: String,
        /// The deepest cause, as text.
        message: String,
    },
    /// No listed broker could be reached.
    #[error("cannot reach any broker of [{brokers}]: {message}")]
    Unreachable {
        /// The addresses tried, comma separated.
        brokers: String,
        /// The last failure, as text.
        message: String,
    },
    /// A call got no answer within its timeout.
    #[error("{rpc} to broker {broker} timed out after {after:?}")]
    Timeout {
        /// The RPC name.
        rpc: &'static str,
        /// Address of the broker.
        broker: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// A per-partition error inside a response that covers many partitions (fetch, list offsets, offset append).
    #[error("{topic}/{partition}: {code_name}: {message}", code_name = code.as_str_name())]
    Partition {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The per-partition code.
        code: ErrorCode,
        /// The broker's message.
        message: String,
    },
    /// A fetched batch could not be decoded.
    #[error("{topic}/{partition}: batch at offset {offset} cannot be decoded: {message}")]
    Corrupt {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Base offset of the batch (or the fetch position when the header was unreadable).
        offset: u64,
        /// What was wrong.
        message: String,
    },
    /// A record is larger than the largest batch the producer may send.
    #[error("record of {size} bytes for topic {topic:?} exceeds the batch limit of {limit} bytes")]
    RecordTooLarge {
        /// Topic.
        topic: String,
        /// Encoded record size (upper bound).
        size: usize,
        /// The effective batch size limit.
        limit: usize,
    },
    /// A record could not be delivered within the delivery timeout.
    #[error("{topic}/{partition}: not acknowledged within {after:?}; last error: {last_error}")]
    DeliveryTimeout {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The delivery timeout.
        after: Duration,
        /// The last failure seen.
        last_error: String,
    },
    /// A partition number outside the topic's partitions.
    #[error("topic {topic:?} has {partitions} partitions; partition {partition} does not exist")]
    UnknownPartition {
        /// Topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// The topic's partition count.
        partitions: u32,
    },
    /// The broker's answer lacks something the protocol promises.
    #[error("broker {broker} sent a malformed {rpc} response: {message}")]
    Protocol {
        /// The RPC name.
        rpc: &'static str,
        /// Address of the broker.
        broker: String,
        /// What was missing or wrong.
        message: String,
    },
    /// The client configuration is invalid.
    #[error("invalid client configuration: {field}: {message}")]
    Config {
        /// The offending field (`brokers`, `tls.ca_file`, ...).
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A method was called in a state that does not allow it (no group for commit, ...).
    #[error("{0}")]
    Usage(String),
    /// The producer or consumer was closed.
    #[error("the {0} is closed")]
    Closed(&'static str),
}

impl ClientError {
    /// Builds the error for a status received from `broker`.
    pub fn from_status(status: &tonic::Status, broker: &str) -> Self {
        if is_transport_status(status) {
            return ClientError::Transport { broker: broker.to_owned(), message: status_cause(status) };
        }
        let reason = status.metadata().get(REASON_KEY).and_then(|v| v.to_str().ok()).map(str::to_owned);
        ClientError::Status {
            code: status.code(),
            message: status.message().to_owned(),
            broker: broker.to_owned(),
            reason,
        }
    }

    /// The broker's reason name, when it sent one (see [`ClientError::Status`]).
    pub fn reason(&self) -> Option<&str> {
        match self {
            ClientError::Status { reason, .. } => reason.as_deref(),
            _ => None,
        }
    }

    /// The broker refused an idempotent batch because its producer id expired (`producer_expired`): nothing was
    /// written, and a batch never sent before may go again under a new producer id.
    pub fn is_producer_expired(&self) -> bool {
        self.reason() == Some("producer_expired")
    }

    /// The broker refused the call before doing anything (`not_leader`, `not_enough_replicas`): sending it again
    /// is safe whatever the call.
    pub fn nothing_written(&self) -> bool {
        matches!(self.reason(), Some("not_leader" | "not_enough_replicas" | "not_coordinator"))
    }

    /// The gRPC code when the broker answered with a status.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The per-partition error code, when the error is one.
    pub fn partition_code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Partition { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// NOT_FOUND: unknown topic or partition (or group).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(Code::NotFound) || self.partition_code() == Some(ErrorCode::UnknownTopicOrPartition)
    }

    /// FAILED_PRECONDITION: shrinking partitions, produce to a mirror topic, stale generation, refused append.
    pub fn is_failed_precondition(&self) -> bool {
        self.code() == Some(Code::FailedPrecondition)
    }

    /// ALREADY_EXISTS: the topic exists.
    pub fn is_already_exists(&self) -> bool {
        self.code() == Some(Code::AlreadyExists)
    }

    /// INVALID_ARGUMENT: bad name, bad CRC, malformed batch, bad field.
    pub fn is_invalid_argument(&self) -> bool {
        self.code() == Some(Code::InvalidArgument)
    }

    /// OUT_OF_RANGE (offset outside the log) or the per-partition OFFSET_OUT_OF_RANGE.
    pub fn is_out_of_range(&self) -> bool {
        self.code() == Some(Code::OutOfRange) || self.partition_code() == Some(ErrorCode::OffsetOutOfRange)
    }

    /// RESOURCE_EXHAUSTED: a batch over the broker's `max_batch_bytes`.
    pub fn is_resource_exhausted(&self) -> bool {
        self.code() == Some(Code::ResourceExhausted)
    }

    /// DATA_LOSS: a batch whose CRC does not match its bytes.
    pub fn is_data_loss(&self) -> bool {
        self.code() == Some(Code::DataLoss)
    }

    /// UNAUTHENTICATED: missing or wrong token.
    pub fn is_unauthenticated(&self) -> bool {
        self.code() == Some(Code::Unauthenticated)
    }

    /// ABORTED: a diverged offset append.
    pub fn is_aborted(&self) -> bool {
        self.code() == Some(Code::Aborted)
    }

    /// The connection failed or no broker was reachable (the call may be retried elsewhere).
    pub fn is_transport(&self) -> bool {
        matches!(self, ClientError::Transport { .. } | ClientError::Unreachable { .. })
    }

    /// The call timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ClientError::Timeout { .. })
    }

    /// Whether retrying the same request (byte-identical) may succeed: transport failures, timeouts, and statuses
    /// that mean "not now" rather than "never".
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::Unreachable { .. } | ClientError::Timeout { .. } => true,
            ClientError::Status { code, .. } => matches!(
                code,
                Code::Unavailable | Code::Internal | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled
            ),
            _ => false,
        }
    }
}

/// A [`ClientError::Config`] naming the offending `field` (the config checks of every module build theirs with
/// it).
pub(crate) fn config_err(field: &'static str, message: impl Into<String>) -> ClientError {
    ClientError::Config { field, message: message.into() }
}

/// Whether a status was produced on the client side by a broken connection, rather than sent by the broker.
///
/// A status the broker sends arrives in the trailers and has no source; one made from a hyper/h2/io error carries
/// that error as its source. UNAVAILABLE always counts: it is what gRPC uses for "try another server".
pub(crate) fn is_transport_status(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    // A status with a reason is the broker's own answer (a cluster member's `not_leader`, say), not a transport's.
    if status.metadata().get(REASON_KEY).is_some() {
        return false;
    }
    status.code() == Code::Unavailable
        || (status.source().is_some()
            && matches!(status.code(), Code::Unknown | Code::Cancelled | Code::Internal | Code::Unavailable))
}

/// Whether the status proves the request never reached the broker (the TCP connect itself failed), so even a
/// non-idempotent request may be sent again.
pub(crate) fn is_connect_failure(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::HostUnreachable
            ) {
                return true;
            }
        }
        cause = err.source();
    }
    false
}

/// The deepest cause of a status, or its message.
pub(crate) fn status_cause(status: &tonic::Status) -> String {
    use std::error::Error as _;
    match status.source() {
        Some(src) => deepest_cause(src),
        None => status.message().to_owned(),
    }
}

/// The message of the innermost error of a chain.
pub(crate) fn deepest_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(next) = last.source() {
        last = next;
    }
    let text = last.to_string();
    if text.is_empty() { err.to_string() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_status_keeps_code_and_message() {
        let status = tonic::Status::not_found("unknown topic \"orders\"");
        let err = ClientError::from_status(&status, "127.0.0.1:7411");
        assert_eq!(
            err,
            ClientError::Status {
                code: Code::NotFound,
                message: "unknown topic \"orders\"".into(),
                broker: "127.0.0.1:7411".into(),
                reason: None,
            }
        );
        assert!(err.is_not_found());
        assert!(!err.is_retriable());
        assert_eq!(err.to_string(), "unknown topic \"orders\" (broker 127.0.0.1:7411)");
    }

    #[test]
    fn unavailable_is_a_transport_failure() {
        let err = ClientError::from_status(&tonic::Status::unavailable("going away"), "b:1");
        assert!(err.is_transport());
        assert!(err.is_retriable());
    }

    #[test]
    fn client_side_status_with_io_source_is_transport_and_connect_failure() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let status = tonic::Status::from_error(Box::new(io));
        assert!(is_transport_status(&status));
        assert!(is_connect_failure(&status));
        let err = ClientError::from_status(&status, "b:1");
        assert_eq!(err, ClientError::Transport { broker: "b:1".into(), message: "Connection refused".into() });
    }

    #[test]
    fn broker_sent_unknown_is_not_transport() {
        let status = tonic::Status::unknown("storage failed");
        assert!(!is_transport_status(&status));
        assert!(!is_connect_failure(&status));
    }

    #[test]
    fn helpers_match_their_codes() {
        let s = |code| ClientError::Status { code, message: String::new(), broker: String::new(), reason: None };
        assert!(s(Code::FailedPrecondition).is_failed_precondition());
        assert!(s(Code::AlreadyExists).is_already_exists());
        assert!(s(Code::InvalidArgument).is_invalid_argument());
        assert!(s(Code::OutOfRange).is_out_of_range());
        assert!(s(Code::Unauthenticated).is_unauthenticated());
        assert!(s(Code::Aborted).is_aborted());
        assert!(s(Code::ResourceExhausted).is_resource_exhausted());
        assert!(!s(Code::ResourceExhausted).is_retriable(), "a too-large batch stays too large");
        assert!(s(Code::DataLoss).is_data_loss());
        assert!(!s(Code::DataLoss).is_retriable());
        assert!(s(Code::Internal).is_retriable());
        assert!(!s(Code::FailedPrecondition).is_retriable());
        let p = ClientError::Partition {
            topic: "t".into(),
            partition: 3,
            code: ErrorCode::OffsetOutOfRange,
            message: "offset 5 is below the log start 9".into(),
        };
        assert!(p.is_out_of_range());
        assert_eq!(p.to_string(), "t/3: OFFSET_OUT_OF_RANGE: offset 5 is below the log start 9");
    }
}
