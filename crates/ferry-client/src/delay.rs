//! Delayed delivery (docs/messaging.md, "Delay"): records that become readable at a chosen time, taking their
//! offsets in the topic then. A delayed produce returns an id per record, which [`Delayed::cancel`] takes.
//!
//! [`Delayed::send`] sends one request of its own, without a producer id: it is not retried after an unknown
//! outcome (a retry would store the records a second time). A [`crate::ProducerRecord`] with `deliver_at` or
//! `delay` sent through the [`crate::Producer`] carries the producer's id and is retried safely (the broker
//! answers a retry with the first attempt's ids).

use std::time::{SystemTime, UNIX_EPOCH};

use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_proto as pb;

use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};
pub use crate::producer::DeliverAt;
use crate::producer::ProducerRecord;

/// What a delayed produce returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedReceipt {
    /// The partition the records go to.
    pub partition: u32,
    /// When they fall due, ms since the Unix epoch.
    pub due_ms: i64,
    /// Each record's id, in order, for [`Delayed::cancel`]; empty when they were written at once.
    pub ids: Vec<String>,
    /// When written at once (their time had passed): the offsets of the first and last record.
    pub written: Option<(u64, u64)>,
}

/// Delayed produce, cancel and describe over a client.
#[derive(Debug, Clone)]
pub struct Delayed {
    client: BrokerClient,
}

impl Delayed {
    /// Over `client`.
    pub fn new(client: BrokerClient) -> Delayed {
        Delayed { client }
    }

    /// Sends `records` (all to the topic, and partition or key, of the first) to become readable at `when`, in
    /// their order. A record's `timestamp` is kept until it is moved; the moved record's timestamp is its due time.
    pub async fn send(&self, records: &[ProducerRecord], when: DeliverAt) -> Result<DelayedReceipt> {
        let Some(first) = records.first() else {
            return Err(ClientError::Usage("a delayed produce needs at least one record".into()));
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
        for (i, r) in records.iter().enumerate() {
            b.push(i as u32, r.timestamp.unwrap_or(now), r.key.as_deref(), r.value.as_deref(), &r.headers);
        }
        let produce = pb::ProduceRequest {
            topic: first.topic.clone(),
            partition: first.partition,
            key: if first.partition.is_none() { first.key.clone() } else { None },
            batches: b.build(0, 0),
        };
        let (deliver_at_ms, delay_ms) = match when {
            DeliverAt::Time(ms) => (Some(ms), None),
            DeliverAt::After(d) => (None, Some(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
        };
        let resp = self
            .client
            .produce_delayed(pb::ProduceDelayedRequest { produce: Some(produce), deliver_at_ms, delay_ms })
            .await?;
        Ok(DelayedReceipt {
            partition: resp.partition,
            due_ms: resp.due_ms,
            ids: resp.ids,
            written: resp.written.map(|w| (w.base_offset, w.last_offset)),
        })
    }

    /// Cancels the pending delayed record `id` of `topic`: it never appears. An error once it has fallen due.
    /// Returns its partition and due time.
    pub async fn cancel(&self, topic: &str, id: &str) -> Result<(u32, i64)> {
        let resp =
            self.client.cancel_delayed(pb::CancelDelayedRequest { topic: topic.to_owned(), id: id.to_owned() }).await?;
        Ok((resp.partition, resp.due_ms))
    }

    /// The delayed records pending for `topic`, per partition (partitions with none are left out).
    pub async fn describe(&self, topic: &str) -> Result<Vec<pb::DelayedPartition>> {
        Ok(self.describe_all(topic).await?.partitions)
    }

    /// [`Delayed::describe`]'s whole answer: on a cluster it also names the members that did not answer (their
    /// pending records are not counted).
    pub async fn describe_all(&self, topic: &str) -> Result<pb::DescribeDelayedResponse> {
        self.client.describe_delayed(pb::DescribeDelayedRequest { topic: topic.to_owned(), local: false }).await
    }
}
