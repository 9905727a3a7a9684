//! The Ferry MirrorMaker: copies chosen topics from a source datacenter to a target datacenter, partition by
//! partition, keeping offsets, order and every record byte, with exactly-once semantics through the target's
//! append-with-offsets.
//!
//! Components (the seed's modules, each a struct with a `run(.., shutdown)` task):
//! - [`sync::SyncManager`]: the arranger; owns the lanes, the fetcher's partition sets, the scale-out share and
//!   commits, and reconciles on the events it listens to.
//! - [`fetch`]: the SourceDcConsumer's part: one credit-based fetch session per source broker (Ferry `Subscribe`,
//!   or a Kafka consumer), with one restart protocol.
//! - [`lane`]: the TargetDcProducer's part: one lane per partition, a decision core with no I/O
//!   ([`lane::core`]) and a thin driver that appends with offsets and owns the partition's flow control.
//! - [`topics::TopicAndOffsetManager`]: discovery and target topics.
//! - [`target_watch::TargetWatch`]: the target's health and log ends, probed whether or not data flows.
//! - [`source_watch::SourceWatch`]: the source's log ends and starts, probed independently of the fetch stream
//!   (the RPO clock, the stall watchdog, loss before mirroring).
//! - [`events::EventBus`]: typed events with the seed's snake_case names.
//! - [`egress::EgressHandle`]: source routes, probes, failover.
//! - [`group_sync::GroupSync`]: consumer-group offsets copied to the target for failover.
//! - [`alarm::Alarmer`]: alarm rules, the lag and stall checks, email and webhook notifications.
//! - [`kafka`] (feature `kafka`): Kafka-API clusters as source and target, through librdkafka.
//! - [`monitor`]: health, readiness, metrics, the JSON API, manual operations and the dashboard over HTTP.
//! - [`verify::Verifier`]: continuous verification of what was mirrored, on both sides, at a bounded byte rate.
//!
//! [`run::run`] boots them in order and stops them in reverse; the `ferry-mirror` binary and `ferryctl demo` call it.

#![deny(missing_docs)]

pub mod alarm;
pub mod cluster;
pub mod config;
pub mod egress;
pub mod events;
pub mod failover;
pub mod fetch;
pub mod group_sync;
pub mod handle;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod lane;
pub mod metrics;
pub mod monitor;
pub mod ratelimit;
pub mod reshape;
pub mod rpo;
pub mod run;
pub mod sides;
pub mod source_watch;
pub mod state;
pub mod sync;
pub mod target_health;
pub mod target_watch;
pub mod topics;
pub mod tp;
pub mod verify;

pub use config::MirrorConfig;
pub use handle::MirrorHandle;
pub use run::{RunOptions, run};
