//! The Ferry Rust client: [`Producer`], [`Consumer`] and [`Admin`] over the `ferry.v1.Broker` gRPC service, with
//! connection handling across the listed broker addresses, timeouts, retries with backoff, TLS and tokens.
//!
//! - [`BrokerClient`] owns the connection (failover across [`ClientConfig::brokers`], retries of idempotent
//!   calls) and has a typed method per RPC; [`BrokerClient::raw`] gives the generated client for `Subscribe`.
//! - [`Admin`] is thin, typed administration; [`Producer`] batches and delivers idempotently; [`Consumer`]
//!   fetches, decodes and commits.
//!
//! The record-batch codec is the `ferry-batch` crate (re-exported as [`batch`]): the wire and disk formats are one.

#![deny(missing_docs)]

pub mod admin;
pub mod config;
pub mod connection;
pub mod consumer;
pub mod delay;
pub mod error;
pub mod listener;
mod parts_call;
pub mod producer;
pub mod retry;
mod rpc;
pub mod share;
pub mod txn;

pub use ferry_batch as batch;
pub use ferry_proto as proto;
/// The gRPC status code carried by [`ClientError::Status`].
pub use tonic::Code;

pub use admin::{Admin, OffsetSpec, PartitionOffsets, Promoted, TopicDescription};
pub use config::{ClientConfig, TlsOptions};
pub use connection::{AuthInterceptor, BrokerClient, RawClient};
pub use consumer::{Consumer, ConsumerConfig, ConsumerRecord, OffsetReset, StartAt};
pub use delay::{Delayed, DelayedReceipt, DeliverAt};
pub use error::{ClientError, Result};
pub use ferry_h2::H2Channel;
pub use listener::{Listener, ListenerConfig};
pub use parts_call::AppendWithOffsetsParts;
pub use producer::{DeliveryFuture, Producer, ProducerConfig, ProducerRecord, RecordMetadata};
pub use retry::RetryPolicy;
pub use share::{Outcome, ShareAdmin, ShareConfig, ShareConsumer, ShareMessage, ShareMode};
pub use txn::{CheckAnswer, TransactionChecker, Transactions, TxnError, TxnOutcome, TxnResult};
