//! The Ferry MirrorMaker: copies chosen topics from a source datacenter to a target datacenter, partition by
//! partition, keeping offsets, order and every record byte, with exactly-once semantics through the target's
//! append-with-offsets.
//!
//! Components (the seed's modules, each a struct with a `run(.., shutdown)` task):
//! - [`sync::SyncManager`]: the arranger; owns the partition tasks, the scale-out share, commits.
//! - [`source::SourceDcConsumer`]: one credit-based fetch stream over the active route.
//! - [`target::TargetDcProducer`]: one task per partition; appends with offsets, guards the history.
//! - [`topics::TopicAndOffsetManager`]: discovery, target topics, the resume rule.
//! - [`events::EventBus`]: typed events with the seed's snake_case names.
//! - [`egress::EgressHandle`]: source routes, probes, failover.
//! - [`group_sync::GroupSync`]: consumer-group offsets copied to the target for failover.
//! - [`alarm::Alarmer`]: alarm rules, the lag and stall checks, email and webhook notifications.
//! - [`kafka`] (feature `kafka`): Kafka-API clusters as source and target, through librdkafka.
//! - [`monitor`]: health, readiness, metrics, the JSON API, manual operations and the dashboard over HTTP.
//!
//! [`run::run`] boots them in order and stops them in reverse; the `ferry-mirror` binary and `ferryctl demo` call it.

#![deny(missing_docs)]

pub mod alarm;
pub mod cluster;
pub mod config;
pub mod egress;
pub mod events;
pub mod group_sync;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
pub mod monitor;
pub mod ratelimit;
pub mod reshape;
pub mod run;
pub mod sides;
pub mod source;
pub mod state;
pub mod sync;
pub mod target;
pub mod topics;

pub use config::MirrorConfig;
pub use run::{MirrorHandle, RunOptions, run};
