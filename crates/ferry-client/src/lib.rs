//! The Ferry Rust client: [`Producer`], [`Consumer`] and [`Admin`] over the `ferry.v1.Broker` gRPC service, with
//! connection handling across the listed broker addresses, timeouts, retries with backoff, TLS and tokens.
//!
//! The record-batch codec is `ferry_storage::batch` (re-exported as [`batch`]): the wire and disk formats are one.

pub use ferry_storage::batch;
