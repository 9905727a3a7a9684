//! The Ferry MirrorMaker: copies chosen topics from a source datacenter to a target datacenter, partition by
//! partition, keeping offsets, order and every record byte, with exactly-once semantics through the target's
//! append-with-offsets. Components: `SyncManager`, `SourceDcConsumer`, `TargetDcProducer`,
//! `TopicAndOffsetManager`, `EventBus`, `Egress`, `Alarmer` and `Monitor`.
