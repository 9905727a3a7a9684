//! End-to-end tests of the broker's Kafka listener (`[kafka] listen`, docs/kafka.md "The Kafka listener") with
//! stock Kafka clients no one here wrote: confluent-kafka (librdkafka) and kafka-python from PyPI, driven by
//! `client.py`, and Debian's kcat with its own librdkafka. Each client's records are checked exactly (partitions,
//! offsets, keys, values, ordered headers, timestamps) against what Ferry's gRPC API reads, and the reverse.
//! Build the binaries first: `cargo build -p ferry-broker --bins`; scripts/test.sh installs the clients.
//!
//! The ledger docs/kafka-compat.toml names these tests as the proof of each advertised API.

mod support;

mod bad_input;
mod clients;
mod cluster;
mod codecs;
mod kcat;
mod kill9;
mod mirror;
mod offsets;
mod sasl;
