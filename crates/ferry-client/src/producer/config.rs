//! [`ProducerConfig`], [`ProducerRecord`] and [`RecordMetadata`]: what a producer is told and what it answers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferry_batch::{Compression, Header};

use crate::error::{Result, config_err};
use crate::retry::RetryPolicy;

/// Producer settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerConfig {
    /// How long a partition's first waiting record may wait for more before its batch is sent (5 ms).
    pub linger: Duration,
    /// Largest batch, header included (1 MiB); capped by the broker's `max_batch_bytes`.
    pub batch_bytes: usize,
    /// Bytes of records waiting or in flight (64 MiB); `send` waits while it is full.
    pub buffer_bytes: usize,
    /// Idempotent produce (on): a producer id with per-partition sequence numbers, so a retried batch is
    /// written once.
    pub idempotence: bool,
    /// How long a record may take from `send` to acknowledgement, retries included (120 s).
    pub delivery_timeout: Duration,
    /// Compression of the records section of each batch.
    pub compression: Compression,
    /// Backoff between retries of one batch (`max_attempts` is not used: the delivery timeout bounds retries).
    pub retry: RetryPolicy,
    /// Partition counts are re-read from the broker when older than this (60 s), so grown topics are used.
    pub metadata_max_age: Duration,
    /// Batches of one partition sent before the first is acknowledged (5, at most [`MAX_IN_FLIGHT`]), so a
    /// partition's rate is not one batch per round trip. Needs `idempotence`: without it one batch is in flight,
    /// because a retried batch could overtake a later one. A partition's first batch under a producer id goes
    /// alone: the broker takes whatever sequence of an unknown producer id comes first.
    pub max_in_flight: usize,
}

/// The most batches a partition may have in flight: the broker remembers a producer's last five batches per
/// partition, so a retry of any of them is recognised as a duplicate.
pub const MAX_IN_FLIGHT: usize = 5;

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger: Duration::from_millis(5),
            batch_bytes: 1024 * 1024,
            buffer_bytes: 64 * 1024 * 1024,
            idempotence: true,
            delivery_timeout: Duration::from_secs(120),
            compression: Compression::None,
            retry: RetryPolicy { max_backoff: Duration::from_secs(1), ..RetryPolicy::default() },
            metadata_max_age: Duration::from_secs(60),
            max_in_flight: MAX_IN_FLIGHT,
        }
    }
}

impl ProducerConfig {
    /// Checks the fields; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.batch_bytes <= ferry_batch::HEADER_LEN {
            return Err(config_err("producer.batch_bytes", format!("{} is too small for a batch", self.batch_bytes)));
        }
        if self.buffer_bytes < self.batch_bytes {
            return Err(config_err(
                "producer.buffer_bytes",
                format!("{} must be at least batch_bytes ({})", self.buffer_bytes, self.batch_bytes),
            ));
        }
        if u32::try_from(self.batch_bytes).is_err() {
            return Err(config_err("producer.batch_bytes", "must be below 4 GiB"));
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return Err(config_err(
                "producer.max_in_flight",
                format!("{} is not between 1 and {MAX_IN_FLIGHT}", self.max_in_flight),
            ));
        }
        if self.delivery_timeout.is_zero() {
            return Err(config_err("producer.delivery_timeout", "must be greater than zero"));
        }
        self.retry.validate()
    }
}

/// A record to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Topic.
    pub topic: String,
    /// Explicit partition; else by key, else round robin.
    pub partition: Option<u32>,
    /// Key (also the partitioning key).
    pub key: Option<Bytes>,
    /// Value; `None` is a null value.
    pub value: Option<Bytes>,
    /// Ordered headers; keys may repeat.
    pub headers: Vec<Header>,
    /// Timestamp in ms since the Unix epoch; `None` takes the time of `send`.
    pub timestamp: Option<i64>,
    /// When the record becomes readable (docs/messaging.md, "Delay"); `None`, or a time already passed, writes it
    /// at once. Set by [`ProducerRecord::deliver_at`] and [`ProducerRecord::delay`].
    pub when: Option<DeliverAt>,
}

impl ProducerRecord {
    /// A record with a value and nothing else.
    pub fn new(topic: impl Into<String>, value: impl Into<Bytes>) -> Self {
        ProducerRecord { topic: topic.into(), value: Some(value.into()), ..Default::default() }
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the partition.
    pub fn with_partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Appends a header.
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push(Header { key: key.into(), value: Some(value.into()) });
        self
    }

    /// Sets the timestamp (ms since the Unix epoch).
    pub fn with_timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// Makes the record readable at `time`: the producer sends it as a delayed produce, and its
    /// [`RecordMetadata::delay_id`] is the id `Delayed::cancel` takes. A time already passed writes it at once.
    pub fn deliver_at(mut self, time: SystemTime) -> Self {
        self.when = Some(DeliverAt::at(time));
        self
    }

    /// Makes the record readable `delay` after the broker receives it (see [`ProducerRecord::deliver_at`]).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.when = Some(DeliverAt::After(delay));
        self
    }
}

/// When delayed records become readable (docs/messaging.md, "Delay").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverAt {
    /// At this time, ms since the Unix epoch (a time passed writes them at once).
    Time(i64),
    /// This long after the broker receives them.
    After(Duration),
}

impl DeliverAt {
    /// At `time`.
    pub fn at(time: SystemTime) -> DeliverAt {
        let ms = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        DeliverAt::Time(ms)
    }
}

/// Where an acknowledged record was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordMetadata {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset; for a record kept for later delivery (`delay_id` set), 0: it takes its offset when it falls due.
    pub offset: u64,
    /// The record's timestamp, ms since the Unix epoch; for a delayed record, its due time.
    pub timestamp: i64,
    /// For a delayed record: its id (`PARTITION-OFFSET` in the delay store), for `Delayed::cancel`.
    pub delay_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_design_and_validate() {
        let c = ProducerConfig::default();
        assert_eq!(c.linger, Duration::from_millis(5));
        assert_eq!(c.batch_bytes, 1 << 20);
        assert_eq!(c.buffer_bytes, 64 << 20);
        assert!(c.idempotence);
        assert_eq!(c.delivery_timeout, Duration::from_secs(120));
        assert_eq!(c.max_in_flight, 5);
        c.validate().unwrap();
    }

    #[test]
    fn in_flight_batches_are_between_one_and_five() {
        for n in [0, 6] {
            let c = ProducerConfig { max_in_flight: n, ..Default::default() };
            assert!(
                matches!(c.validate(), Err(crate::ClientError::Config { field: "producer.max_in_flight", .. })),
                "{n}"
            );
        }
        ProducerConfig { max_in_flight: 1, ..Default::default() }.validate().unwrap();
    }

    #[test]
    fn a_buffer_smaller_than_a_batch_is_refused() {
        let c = ProducerConfig { buffer_bytes: 1000, batch_bytes: 2000, ..Default::default() };
        assert!(matches!(c.validate(), Err(crate::ClientError::Config { field: "producer.buffer_bytes", .. })));
    }

    #[test]
    fn record_builder_sets_every_field() {
        let r = ProducerRecord::new("t", "v").with_key("k").with_partition(2).with_header("h", "x").with_timestamp(5);
        assert_eq!(r.topic, "t");
        assert_eq!(r.partition, Some(2));
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.value.as_deref(), Some(&b"v"[..]));
        assert_eq!(r.headers, vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"x")) }]);
        assert_eq!(r.timestamp, Some(5));
    }
}
