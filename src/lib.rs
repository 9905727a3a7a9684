//! Ferry: a message broker and the cross-datacenter mirror that runs around it.
//!
//! This crate is the facade most applications need: it re-exports the client API
//! (`ferry::Producer`, `ferry::Consumer`, `ferry::Admin`). The broker, the mirror and
//! the operator CLI live in their own crates under `crates/`.
//!
//! The package also owns the end-to-end tests in `tests/` and the benchmarks in
//! `benches/`, which start the real binaries through `ferry-testkit`.

pub use ferry_client::*;
