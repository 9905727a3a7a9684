//! Kafka-API clusters on either side of the mirror, through librdkafka (the `rdkafka` crate, feature `kafka`).
//!
//! - [`KafkaSource`] implements [`crate::cluster::SourceCluster`] for one source route (its bootstrap servers):
//!   probes, topic listing, watermarks, committed offsets of groups.
//! - [`KafkaSession`] is the fetch session of a Kafka source, behind the same [`crate::fetch::FetchSession`] trait
//!   and restart protocol as the Ferry session. It turns Kafka messages into Ferry record batches that keep every
//!   record's source offset, so a Ferry target preserves offsets exactly.
//! - [`KafkaTarget`] implements [`crate::cluster::TargetCluster`]. Kafka assigns its own offsets, so every record
//!   written carries provenance headers (source cluster, topic, partition, offset); a partition's "log end" is one
//!   past the last source offset found at its tail, which makes a restart after kill -9 resume without duplicates
//!   or loss. Writes go through one idempotent producer per target partition, transactional (zombie fencing) when
//!   the target supports transactions.
//!
//! Offsets crossing these types are always source offsets (see [`crate::cluster`]). Errors are
//! [`ferry_client::ClientError`]s carrying the gRPC code that means the same thing as the Kafka error.
//!
//! librdkafka properties from `[source.kafka]` / `[target.kafka]` pass through unchanged; the few the mirror owns
//! (bootstrap servers, offset handling, idempotence, transactional ids) are set over them. Values of properties
//! whose names contain "password", "secret" or "key" are never logged ([`redacted`]).

mod client;
mod consumer;
mod convert;
mod error;
mod props;
mod reader;
mod source;
mod target;
mod topic_config;
mod watermarks;

pub use consumer::{KafkaConsumerSettings, KafkaSession, RouteReports};
pub use convert::{PartitionBatcher, Pushed};
pub use error::KafkaSetupError;
pub use props::redacted;
pub use source::KafkaSource;
pub use target::{KafkaTarget, KafkaTargetOptions, TransactionSupport};

/// Provenance header: alias of the source cluster (`source.cluster`).
pub const HEADER_SOURCE_CLUSTER: &str = "ferry.source.cluster";
/// Provenance header: source topic name.
pub const HEADER_SOURCE_TOPIC: &str = "ferry.source.topic";
/// Provenance header: source partition, decimal.
pub const HEADER_SOURCE_PARTITION: &str = "ferry.source.partition";
/// Provenance header: source offset, decimal.
pub const HEADER_SOURCE_OFFSET: &str = "ferry.source.offset";
/// Provenance header: source topic id (a Ferry topic UUID, or `kafka:{name}` for a Kafka source), so that a
/// re-created source topic is told apart from the one a target topic holds.
pub const HEADER_SOURCE_TOPIC_ID: &str = "ferry.source.topic_id";

/// The topic id reported for a Kafka topic: librdkafka does not expose Kafka's own topic ids, so the id is derived
/// from the name. A Kafka topic deleted and re-created under the same name keeps its id.
pub fn kafka_topic_id(topic: &str) -> String {
    format!("kafka:{topic}")
}

/// Whether a Kafka topic is internal (`__consumer_offsets`, `__transaction_state`, ...) and never mirrored.
pub fn is_internal_topic(topic: &str) -> bool {
    topic.starts_with("__")
}
