//! The sender task of one partition: lingers, forms a batch, delivers it with retries, resolves the futures.
//!
//! Invariants:
//! - One batch in flight per partition, so records are written in the order they were sent.
//! - A batch is encoded once; every retry sends the same bytes, so with idempotence the broker recognises a
//!   resend and answers with the original offsets.
//! - The sequence number advances only when the broker acknowledged the batch. A batch that fails for good
//!   (refused, or its outcome unknown after the delivery timeout) retires the producer id: the next batch of
//!   every partition starts a fresh id at sequence 0. So no later batch can be taken for a duplicate of a batch
//!   that may have been written, and a refusal for an out-of-order sequence cannot repeat forever.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use ferry_batch::{BatchBuilder, ProducerInfo};
use ferry_proto::{ProduceRequest, ProduceResponse};
use tokio::time::Instant;

use super::{Identity, PartitionQueue, Pending, RecordMetadata, Shared};
use crate::error::{ClientError, Result};

/// Per-partition sequence numbering under one producer id.
#[derive(Debug, Default)]
struct Sequence {
    generation: u64,
    next: i32,
}

/// Runs until the producer is cancelled and the partition's buffer is empty.
pub(crate) async fn run(shared: Arc<Shared>, queue: Arc<PartitionQueue>) {
    let mut sequence = Sequence::default();
    loop {
        let oldest = loop {
            let oldest = queue.buffer.lock().oldest();
            match oldest {
                Some(at) => break at,
                None if shared.cancel.is_cancelled() => return,
                None => tokio::select! {
                    _ = queue.wake.notified() => {}
                    _ = shared.cancel.cancelled() => {}
                },
            }
        };
        let deadline = oldest + shared.config.linger;
        loop {
            let full = queue.buffer.lock().is_full(shared.batch_limit);
            if full
                || shared.flushing.load(Ordering::SeqCst) > 0
                || shared.cancel.is_cancelled()
                || Instant::now() >= deadline
            {
                break;
            }
            tokio::select! {
                _ = queue.wake.notified() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = shared.cancel.cancelled() => {}
            }
        }
        let drained = queue.buffer.lock().drain(shared.batch_limit);
        let Some((records, oldest)) = drained else { continue };
        shared.on_new_batch(&queue.topic, queue.partition);
        let outcome = deliver(&shared, &queue, &mut sequence, &records, oldest).await;
        let count = records.len() as u64;
        complete(&queue, records, outcome);
        queue.completed.fetch_add(count, Ordering::SeqCst);
        shared.progress.notify_waiters();
    }
}

/// Encodes the records as one batch with offset deltas 0..n.
fn encode(records: &[Pending], producer: ProducerInfo, shared: &Shared) -> Bytes {
    let mut builder = BatchBuilder::new(shared.config.compression, producer);
    for (i, r) in records.iter().enumerate() {
        let delta = u32::try_from(i).unwrap_or(u32::MAX);
        builder.push(delta, r.timestamp, r.key.as_deref(), r.value.as_deref(), &r.headers);
    }
    builder.build(0, 0)
}

async fn deliver(
    shared: &Shared,
    queue: &PartitionQueue,
    sequence: &mut Sequence,
    records: &[Pending],
    oldest: Instant,
) -> Result<ProduceResponse> {
    let deadline = oldest + shared.config.delivery_timeout;
    let count = i32::try_from(records.len()).unwrap_or(i32::MAX);
    let mut batch: Option<(Bytes, Option<Identity>)> = None;
    let mut retry = 0u32;
    // Whether an earlier attempt of this batch may have been written (its answer was lost): then it must never be
    // sent under another producer id, or it could be written twice.
    let mut maybe_written = false;
    let mut redirected = false;
    let mut redirected_last = false;
    loop {
        let attempt: Result<ProduceResponse, (ClientError, bool)> = async {
            if batch.is_none() {
                let identity = if shared.config.idempotence {
                    let retriable = |e: ClientError| {
                        let r = e.is_retriable();
                        (e, r)
                    };
                    let mut identity = shared.identity().await.map_err(retriable)?;
                    if sequence.generation == identity.generation && sequence.next.checked_add(count).is_none() {
                        // Sequence space exhausted: continue under a fresh producer id.
                        shared.reset_identity(identity.generation).await;
                        identity = shared.identity().await.map_err(retriable)?;
                    }
                    if sequence.generation != identity.generation {
                        *sequence = Sequence { generation: identity.generation, next: 0 };
                    }
                    Some(identity)
                } else {
                    None
                };
                let info = identity.map_or(ProducerInfo::NONE, |i| ProducerInfo {
                    producer_id: i.producer_id,
                    producer_epoch: i.producer_epoch,
                    base_sequence: sequence.next,
                });
                batch = Some((encode(records, info, shared), identity));
            }
            let (bytes, identity) = batch.clone().expect("batch was just built");
            let request = ProduceRequest {
                topic: queue.topic.clone(),
                partition: Some(queue.partition),
                key: None,
                batches: bytes,
            };
            let timeout = shared.client.request_timeout();
            let produce = |conn: &crate::connection::Conn| {
                let mut c = conn.raw();
                async move { c.produce(request).await }
            };
            match shared.client.attempt("Produce", timeout, produce).await {
                Ok(response) => {
                    if identity.is_some() {
                        sequence.next += count;
                    }
                    Ok(response)
                }
                Err(failure) => {
                    let unwritten = failure.never_sent || failure.error.nothing_written();
                    maybe_written |= !unwritten && failure.error.is_retriable();
                    let retriable = if identity.is_some() { failure.error.is_retriable() } else { unwritten };
                    redirected = failure.redirected;
                    Err((failure.error, retriable))
                }
            }
        }
        .await;
        let (error, mut retriable) = match attempt {
            Ok(response) => return Ok(response),
            Err(e) => e,
        };
        let mut final_error = None;
        if error.is_producer_expired()
            && !maybe_written
            && let Some((_, Some(identity))) = batch.take()
        {
            // The producer id was idle past the broker's expiry and the broker wrote nothing. No attempt of this
            // batch can have been written, so it goes again under a new producer id, from sequence 0.
            tracing::info!(
                topic = %queue.topic,
                partition = queue.partition,
                producer_id = identity.producer_id,
                "producer id expired on the broker; continuing under a new producer id"
            );
            shared.reset_identity(identity.generation).await;
            retriable = true;
        }
        if error.is_not_found() {
            // The topic may have been deleted, or the partition may be new: ask again before deciding.
            match shared.refresh_topic(&queue.topic).await {
                Ok(partitions) if queue.partition < partitions => retriable = true,
                Ok(partitions) => {
                    final_error = Some(ClientError::UnknownPartition {
                        topic: queue.topic.clone(),
                        partition: queue.partition,
                        partitions,
                    });
                }
                Err(e) if e.is_not_found() => final_error = Some(e),
                Err(_) => retriable = true,
            }
        }
        let delay = shared.config.retry.delay(retry);
        retry = retry.saturating_add(1);
        if final_error.is_none() && !retriable {
            final_error = Some(error.clone());
        }
        if final_error.is_none() && Instant::now() + delay >= deadline {
            final_error = Some(ClientError::DeliveryTimeout {
                topic: queue.topic.clone(),
                partition: queue.partition,
                after: shared.config.delivery_timeout,
                last_error: error.to_string(),
            });
        }
        if let Some(final_error) = final_error {
            if let Some((_, Some(identity))) = &batch {
                shared.reset_identity(identity.generation).await;
            }
            return Err(final_error);
        }
        if std::mem::take(&mut redirected) && !std::mem::replace(&mut redirected_last, true) {
            // A NOT_LEADER answer named the leader: go there at once (once in a row: two brokers that still name
            // each other during an election wait for the backoff).
            tracing::debug!(topic = %queue.topic, partition = queue.partition, %error, "retrying batch at the leader");
            continue;
        }
        redirected_last = false;
        tracing::debug!(topic = %queue.topic, partition = queue.partition, %error, ?delay, "retrying batch");
        tokio::time::sleep(delay).await;
    }
}

/// Resolves each record's future: its offset is the batch's base offset plus its position.
fn complete(queue: &PartitionQueue, records: Vec<Pending>, outcome: Result<ProduceResponse>) {
    match outcome {
        Ok(response) => {
            let expected_last = response.base_offset + records.len() as u64 - 1;
            if response.last_offset != expected_last || response.partition != queue.partition {
                tracing::warn!(
                    topic = %queue.topic,
                    partition = queue.partition,
                    answered_partition = response.partition,
                    base_offset = response.base_offset,
                    last_offset = response.last_offset,
                    records = records.len(),
                    "broker acknowledged a batch with an unexpected offset range"
                );
            }
            for (i, record) in records.into_iter().enumerate() {
                let metadata = RecordMetadata {
                    topic: queue.topic.clone(),
                    partition: response.partition,
                    offset: response.base_offset + i as u64,
                    timestamp: record.timestamp,
                };
                let _ = record.tx.send(Ok(metadata));
            }
        }
        Err(error) => {
            tracing::debug!(topic = %queue.topic, partition = queue.partition, %error, "batch failed");
            for record in records {
                let _ = record.tx.send(Err(error.clone()));
            }
        }
    }
}
