//! The Ferry broker: topics with UUIDs and per-topic config, partitions backed by `ferry-storage` logs, produce
//! (explicit partition, by key, round robin) with idempotent producers, the mirror's append-with-offsets path,
//! long-poll fetch and a credit-based streaming subscribe, consumer groups with committed offsets, and the
//! `ferry.v1.Broker` gRPC service with the standard health service.
//!
//! [`run`] starts a broker from a [`BrokerConfig`]; the `ferry-broker` binary is a thin wrapper around it, and
//! `ferryctl demo` embeds it.

#![deny(missing_docs)]

pub mod cluster;
pub mod config;
pub mod delay;
pub mod error;
pub mod events;
pub mod groups;
pub mod jobs;
pub mod metrics;
pub mod node;
pub mod readiness;
pub mod rpc;
pub(crate) mod share;
pub mod state;
pub mod txn;

pub use config::{BrokerConfig, Overrides};
pub use error::BrokerError;
pub use rpc::server::{RunOptions, ServerError, Started, run};
