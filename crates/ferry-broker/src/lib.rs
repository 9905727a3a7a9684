//! The Ferry broker: topics with UUIDs and per-topic config, partitions backed by `ferry-storage` logs, produce
//! (explicit partition, by key, round robin) with idempotent producers, the mirror's append-with-offsets path,
//! long-poll fetch and a credit-based streaming subscribe, consumer groups with committed offsets, and the
//! `ferry.v1.Broker` gRPC service with the standard health service.
