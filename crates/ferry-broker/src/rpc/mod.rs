//! The broker's edge: the gRPC server and its `ferry.v1.Broker` service, the caller's permissions, and the fetch
//! and subscribe paths.

pub mod auth;
pub mod fetch;
pub mod kafka;
pub mod server;
pub mod service;
