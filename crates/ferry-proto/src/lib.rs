//! Ferry's wire protocol: `proto/broker.proto` (package `ferry.v1`) and the tonic/prost code generated from it.
//!
//! Nothing else lives here, apart from the one rule both ends of a connection must agree on: how large a gRPC
//! message may be, given the broker's `max_batch_bytes` ([`max_message_bytes`]).

#![allow(missing_docs, clippy::all)]

/// Generated types of package `ferry.v1`.
pub mod v1 {
    tonic::include_proto!("ferry.v1");
}

pub use v1::*;

/// Bytes reserved in every gRPC message for framing and fields other than batch payloads.
pub const MESSAGE_OVERHEAD_BYTES: usize = 1024 * 1024;

/// The gRPC message size limit that server and client both apply, so that tonic's 4 MiB default never caps a
/// batch silently: room for a fetch or produce of `max_batch_bytes` worth of batches, twice over, plus overhead.
pub const fn max_message_bytes(max_batch_bytes: usize) -> usize {
    max_batch_bytes.saturating_mul(2).saturating_add(MESSAGE_OVERHEAD_BYTES)
}
