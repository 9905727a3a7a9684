//! Delayed records through the [`super::Producer`] (a [`ProducerRecord`] with `deliver_at` or `delay`): each is
//! sent as a delayed produce of its own, under the producer's id and epoch, with a sequence from a space of its
//! own per partition (apart from the plain records' sequences, which the partition checks; the delay store checks
//! these). One lane per partition sends them one at a time, in the order they were sent, so a retry (the client
//! retries a delayed produce carrying a producer id after an unknown outcome) is always of the lane's last
//! request, which the broker answers with the first attempt's ids without storing anything again.
//!
//! A lane moves its sequence on after every request, answered or not: a later request never reuses a sequence
//! whose request may have been stored. Closing the producer delivers what the lanes hold, then stops them.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_proto as pb;
use tokio::sync::{mpsc, oneshot};

use super::{DeliverAt, DeliveryFuture, ProducerRecord, RecordMetadata, Shared, now_ms};
use crate::error::{ClientError, Result};

/// A delayed record waiting in its lane.
pub(crate) struct Job {
    record: ProducerRecord,
    when: DeliverAt,
    tx: oneshot::Sender<Result<RecordMetadata>>,
}

/// The lanes of the partitions delayed records were sent to.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: parking_lot::Mutex<HashMap<(String, u32), mpsc::UnboundedSender<Job>>>,
}

/// Whether `when` has already passed at `now_ms` (the record then goes the ordinary way).
pub(crate) fn passed(when: DeliverAt, now_ms: i64) -> bool {
    match when {
        DeliverAt::Time(ms) => ms <= now_ms,
        DeliverAt::After(d) => d.is_zero(),
    }
}

impl Shared {
    /// Queues `record` on the lane of `partition`, to become readable at `when`.
    pub(crate) fn send_delayed(
        self: &Arc<Self>,
        record: ProducerRecord,
        partition: u32,
        when: DeliverAt,
    ) -> DeliveryFuture {
        let (tx, rx) = oneshot::channel();
        let mut lanes = self.delayed.lanes.lock();
        let lane = lanes.entry((record.topic.clone(), partition)).or_insert_with(|| {
            let (lane, jobs) = mpsc::unbounded_channel();
            self.tracker.spawn(run(Arc::clone(self), record.topic.clone(), partition, jobs));
            lane
        });
        if let Err(refused) = lane.send(Job { record, when, tx }) {
            let _ = refused.0.tx.send(Err(ClientError::Closed("producer")));
        }
        DeliveryFuture { rx }
    }
}

/// One partition's lane: sends its jobs one at a time until the producer closes, then the ones left.
async fn run(shared: Arc<Shared>, topic: String, partition: u32, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut seq: Option<(u64, i32)> = None;
    loop {
        let job = tokio::select! {
            biased;
            job = jobs.recv() => job,
            _ = shared.cancel.cancelled() => None,
        };
        let Some(job) = job else { break };
        let result = deliver(&shared, &topic, partition, &mut seq, job.record, job.when).await;
        let _ = job.tx.send(result);
    }
    jobs.close();
    while let Ok(job) = jobs.try_recv() {
        let result = deliver(&shared, &topic, partition, &mut seq, job.record, job.when).await;
        let _ = job.tx.send(result);
    }
}

/// Sends one delayed record under the producer's id and the lane's next sequence.
async fn deliver(
    shared: &Shared,
    topic: &str,
    partition: u32,
    seq: &mut Option<(u64, i32)>,
    record: ProducerRecord,
    when: DeliverAt,
) -> Result<RecordMetadata> {
    let identity = shared.identity().await?;
    let next = match *seq {
        Some((generation, n)) if generation == identity.generation => n,
        _ => 0,
    };
    *seq = Some((identity.generation, next.checked_add(1).unwrap_or(0)));
    let timestamp = record.timestamp.unwrap_or_else(now_ms);
    let producer = ProducerInfo {
        producer_id: identity.producer_id,
        producer_epoch: identity.producer_epoch,
        base_sequence: next,
    };
    let mut b = BatchBuilder::new(Compression::None, producer);
    b.push(0, timestamp, record.key.as_deref(), record.value.as_deref(), &record.headers);
    let (deliver_at_ms, delay_ms) = match when {
        DeliverAt::Time(ms) => (Some(ms), None),
        DeliverAt::After(d) => (None, Some(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
    };
    let produce =
        pb::ProduceRequest { topic: topic.to_owned(), partition: Some(partition), key: None, batches: b.build(0, 0) };
    let resp = shared
        .client
        .produce_delayed(pb::ProduceDelayedRequest { produce: Some(produce), deliver_at_ms, delay_ms })
        .await?;
    Ok(match resp.written {
        Some(w) => RecordMetadata {
            topic: topic.to_owned(),
            partition: resp.partition,
            offset: w.base_offset,
            timestamp,
            delay_id: None,
        },
        None => RecordMetadata {
            topic: topic.to_owned(),
            partition: resp.partition,
            offset: 0,
            timestamp: resp.due_ms,
            delay_id: resp.ids.into_iter().next(),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_a_time_to_come_goes_through_a_lane() {
        assert!(passed(DeliverAt::Time(10), 10));
        assert!(!passed(DeliverAt::Time(11), 10));
        assert!(passed(DeliverAt::After(Duration::ZERO), 10));
        assert!(!passed(DeliverAt::After(Duration::from_millis(1)), 10));
    }
}
