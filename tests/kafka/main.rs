//! End-to-end tests of Kafka-API clusters on either side of the real `ferry-mirror` (issue 7): tansu 0.6 as the
//! Kafka cluster (in-memory storage, so no restart tests on that side), real `ferry-broker` processes as Ferry
//! DCs, and confluent-kafka (`kafka_tool.py`) producing and reading the Kafka side, never the code under test.
//! Build the binaries first: `cargo build -p ferry-broker -p ferry-mirror --bins`; scripts/test.sh installs tansu
//! and confluent-kafka.
//!
//! Every scenario compares exact data: offsets (preserved into Ferry; carried in provenance headers into Kafka),
//! timestamps, keys, values and ordered headers, by count and SHA-256 digest.

#[path = "../../crates/ferry-mirror/tests/kafka_support/mod.rs"]
mod kafka_support;

mod common;

mod bad_input;
mod failover;
mod kill9;
mod pipelines;
