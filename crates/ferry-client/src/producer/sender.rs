//! The sender task of one partition: lingers, forms batches, delivers them with retries, resolves the futures.
//!
//! Invariants:
//! - Batches are sent, written and resolved in the order their records were sent.
//! - Up to `max_in_flight` batches are in flight at once (one without idempotence). Each is encoded once, its
//!   sequence numbers fixed, so the broker writes them in sequence order whatever order its request tasks run in,
//!   and every retry sends the same bytes: the broker recognises a resend and answers with the original offsets.
//! - The first batch under a producer id goes alone: a broker that does not know the id yet takes whatever
//!   sequence reaches it first, so a later batch of the window that overtook it (the first one was redirected to
//!   the leader, say) would be written ahead of it. Once it is acknowledged, the partition knows the id and its
//!   sequence, and the window opens.
//! - While first attempts succeed, batches pipeline. The first failed attempt stops the pipeline: the sender waits
//!   for the first attempts still out, then takes those batches one at a time, in order, through the retry loop,
//!   before it forms new ones. A batch whose first attempt was refused as out of sequence because an earlier one
//!   had not been written yet is retried, not failed.
//! - Batches under two producer ids are never in flight together: a batch under a new id waits until the window of
//!   the old one is settled, or the two could be written out of order.
//! - The sequence number advances when a batch is encoded. A batch that fails for good (refused, or its outcome
//!   unknown after the delivery timeout) retires the producer id: the next batch of every partition starts a fresh
//!   id at sequence 0, so no later batch can be taken for a duplicate of a batch that may have been written. A
//!   later batch of the window that no attempt can have written is encoded again under the new id; one that may
//!   have been written is never sent under another id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use ferry_batch::{BatchBuilder, ProducerInfo};
use ferry_proto::{ProduceRequest, ProduceResponse};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::time::Instant;

use super::{Identity, PartitionQueue, Pending, RecordMetadata, Shared};
use crate::connection::Failure;
use crate::error::{ClientError, Result};

/// Per-partition sequence numbering under one producer id.
#[derive(Debug, Default)]
struct Sequence {
    generation: u64,
    next: i32,
}

/// One batch's records, and its bytes once encoded.
struct Batch {
    records: Vec<Pending>,
    oldest: Instant,
    /// The encoded batch and the producer identity it was encoded under.
    encoded: Option<(Bytes, Option<Identity>)>,
}

type Attempt = std::result::Result<ProduceResponse, Failure>;
type InFlight = Pin<Box<dyn Future<Output = (Batch, Attempt)> + Send>>;

/// The batches in flight, in the order they were sent, the producer id generation they were encoded under, and
/// whether a batch under that generation was acknowledged (until then one batch is in flight at a time).
struct Window {
    batches: FuturesOrdered<InFlight>,
    generation: Option<u64>,
    opened: bool,
}

impl Window {
    /// How many batches may be in flight now, with `limit` once the window is open.
    fn limit(&self, limit: usize) -> usize {
        if self.opened { limit } else { 1 }
    }

    /// Notes a batch's outcome: an acknowledgement under the window's generation opens it.
    fn note(&mut self, batch: &Batch, outcome: &Result<ProduceResponse>) {
        let generation = batch.encoded.as_ref().and_then(|(_, identity)| identity.map(|i| i.generation));
        if outcome.is_ok() && generation == self.generation {
            self.opened = true;
        }
    }
}

/// Runs until the producer is cancelled, the partition's buffer is empty and nothing is in flight.
pub(crate) async fn run(shared: Arc<Shared>, queue: Arc<PartitionQueue>) {
    let mut sequence = Sequence::default();
    let limit = if shared.config.idempotence { shared.config.max_in_flight } else { 1 };
    let mut window = Window { batches: FuturesOrdered::new(), generation: None, opened: false };
    loop {
        if window.batches.len() >= window.limit(limit) {
            if let Some((batch, attempt)) = window.batches.next().await {
                settle(&shared, &queue, &mut sequence, &mut window, batch, attempt).await;
            }
            continue;
        }
        // Wait for records, settling batches in flight meanwhile.
        let oldest = loop {
            let oldest = queue.buffer.lock().oldest();
            if let Some(at) = oldest {
                break at;
            }
            if shared.cancel.is_cancelled() && window.batches.is_empty() {
                return;
            }
            let settled = tokio::select! {
                biased;
                Some(done) = window.batches.next(), if !window.batches.is_empty() => Some(done),
                _ = queue.wake.notified() => None,
                _ = shared.cancel.cancelled(), if !shared.cancel.is_cancelled() => None,
            };
            if let Some((batch, attempt)) = settled {
                settle(&shared, &queue, &mut sequence, &mut window, batch, attempt).await;
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
            let settled = tokio::select! {
                biased;
                Some(done) = window.batches.next(), if !window.batches.is_empty() => Some(done),
                _ = queue.wake.notified() => None,
                _ = tokio::time::sleep_until(deadline) => None,
                _ = shared.cancel.cancelled() => None,
            };
            if let Some((batch, attempt)) = settled {
                settle(&shared, &queue, &mut sequence, &mut window, batch, attempt).await;
            }
        }
        let drained = queue.buffer.lock().drain(shared.batch_limit);
        let Some((records, oldest)) = drained else { continue };
        shared.on_new_batch(&queue.topic, queue.partition);
        let mut batch = Batch { records, oldest, encoded: None };
        match encode_batch(&shared, &mut sequence, &batch.records).await {
            Ok(encoded) => {
                let generation = encoded.1.map(|i| i.generation);
                if generation != window.generation {
                    settle_all(&shared, &queue, &mut sequence, &mut window).await;
                    window.generation = generation;
                    window.opened = false;
                }
                batch.encoded = Some(encoded);
                window.batches.push_back(Box::pin(first_attempt(Arc::clone(&shared), Arc::clone(&queue), batch)));
            }
            Err(_) => {
                // No producer id now (no broker answers): once the window is settled, the retry loop takes it.
                settle_all(&shared, &queue, &mut sequence, &mut window).await;
                let outcome = deliver(&shared, &queue, &mut sequence, &mut batch, None).await;
                window.note(&batch, &outcome);
                finish(&shared, &queue, batch.records, outcome);
            }
        }
    }
}

/// Settles every batch in flight, in order.
async fn settle_all(shared: &Shared, queue: &PartitionQueue, sequence: &mut Sequence, window: &mut Window) {
    while let Some((batch, attempt)) = window.batches.next().await {
        settle(shared, queue, sequence, window, batch, attempt).await;
    }
}

/// Settles the oldest batch in flight. A failed first attempt stops the pipeline: the other first attempts come
/// back, then each batch goes through the retry loop in turn.
async fn settle(
    shared: &Shared,
    queue: &PartitionQueue,
    sequence: &mut Sequence,
    window: &mut Window,
    mut batch: Batch,
    attempt: Attempt,
) {
    let failure = match attempt {
        Ok(response) => {
            let outcome = Ok(response);
            window.note(&batch, &outcome);
            return finish(shared, queue, batch.records, outcome);
        }
        Err(failure) => failure,
    };
    let mut rest = Vec::with_capacity(window.batches.len());
    while let Some(done) = window.batches.next().await {
        rest.push(done);
    }
    let outcome = deliver(shared, queue, sequence, &mut batch, Some((failure, false))).await;
    window.note(&batch, &outcome);
    finish(shared, queue, batch.records, outcome);
    for (mut batch, attempt) in rest {
        let outcome = match attempt {
            Ok(response) => Ok(response),
            // It raced earlier batches that were not written then: an out-of-sequence refusal is no verdict.
            Err(failure) => deliver(shared, queue, sequence, &mut batch, Some((failure, true))).await,
        };
        window.note(&batch, &outcome);
        finish(shared, queue, batch.records, outcome);
    }
}

/// Resolves a batch's futures and counts it complete.
fn finish(shared: &Shared, queue: &PartitionQueue, records: Vec<Pending>, outcome: Result<ProduceResponse>) {
    let count = records.len() as u64;
    complete(queue, records, outcome);
    queue.completed.fetch_add(count, Ordering::SeqCst);
    shared.progress.notify_waiters();
}

/// Encodes the records as one batch with offset deltas 0..n, under the current producer id (fetching one if
/// needed) at the partition's next sequence, which it advances.
async fn encode_batch(
    shared: &Shared,
    sequence: &mut Sequence,
    records: &[Pending],
) -> Result<(Bytes, Option<Identity>)> {
    let count = i32::try_from(records.len()).unwrap_or(i32::MAX);
    let identity = if shared.config.idempotence {
        let mut identity = shared.identity().await?;
        if sequence.generation == identity.generation && sequence.next.checked_add(count).is_none() {
            // Sequence space exhausted: continue under a fresh producer id.
            shared.reset_identity(identity.generation).await;
            identity = shared.identity().await?;
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
    if identity.is_some() {
        sequence.next += count;
    }
    let mut builder = BatchBuilder::new(shared.config.compression, info);
    for (i, r) in records.iter().enumerate() {
        let delta = u32::try_from(i).unwrap_or(u32::MAX);
        builder.push(delta, r.timestamp, r.key.as_deref(), r.value.as_deref(), &r.headers);
    }
    Ok((builder.build(0, 0), identity))
}

/// One produce attempt of `bytes`.
async fn send(shared: &Shared, queue: &PartitionQueue, bytes: Bytes) -> Attempt {
    let request =
        ProduceRequest { topic: queue.topic.clone(), partition: Some(queue.partition), key: None, batches: bytes };
    let timeout = shared.client.request_timeout();
    let produce = |conn: &crate::connection::Conn| {
        let mut c = conn.raw();
        async move { c.produce(request).await }
    };
    // At the partition's leader as last learnt: a NOT_LEADER answer names the next one.
    shared.client.for_partition(&queue.topic, queue.partition).attempt("Produce", timeout, produce).await
}

/// The first attempt of an encoded batch, in flight beside the others of the window.
async fn first_attempt(shared: Arc<Shared>, queue: Arc<PartitionQueue>, batch: Batch) -> (Batch, Attempt) {
    let bytes = batch.encoded.as_ref().map(|(b, _)| b.clone()).unwrap_or_default();
    let attempt = send(&shared, &queue, bytes).await;
    (batch, attempt)
}

/// Delivers `batch` with retries until it is acknowledged, refused, or its delivery timeout passes. `first` is a
/// failed attempt made already, and whether it raced earlier batches of the window.
async fn deliver(
    shared: &Shared,
    queue: &PartitionQueue,
    sequence: &mut Sequence,
    batch: &mut Batch,
    mut first: Option<(Failure, bool)>,
) -> Result<ProduceResponse> {
    let deadline = batch.oldest + shared.config.delivery_timeout;
    let mut backoff = shared.config.retry.backoff();
    // Whether an earlier attempt of this batch may have been written (its answer was lost): then it must never be
    // sent under another producer id, or it could be written twice.
    let mut maybe_written = false;
    let mut redirected_last = false;
    loop {
        let (error, mut retriable, redirected) = match first.take() {
            Some((failure, raced)) => judge(failure, batch, &mut maybe_written, raced),
            None => {
                // Encoded under a producer id retired since, and never possibly written: it goes under the current id.
                if !maybe_written
                    && let Some((_, Some(identity))) = &batch.encoded
                    && shared.retired(identity.generation).await
                {
                    batch.encoded = None;
                }
                let encoded = match &batch.encoded {
                    Some(encoded) => Ok(encoded.0.clone()),
                    None => encode_batch(shared, sequence, &batch.records).await.map(|encoded| {
                        let bytes = encoded.0.clone();
                        batch.encoded = Some(encoded);
                        bytes
                    }),
                };
                match encoded {
                    Ok(bytes) => match send(shared, queue, bytes).await {
                        Ok(response) => return Ok(response),
                        Err(failure) => judge(failure, batch, &mut maybe_written, false),
                    },
                    Err(e) => {
                        let retriable = e.is_retriable();
                        (e, retriable, false)
                    }
                }
            }
        };
        let mut final_error = None;
        if error.is_producer_expired()
            && !maybe_written
            && let Some((_, Some(identity))) = batch.encoded.take()
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
        let delay = backoff.next().unwrap_or(shared.config.retry.max_backoff);
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
            if let Some((_, Some(identity))) = &batch.encoded {
                shared.reset_identity(identity.generation).await;
            }
            return Err(final_error);
        }
        if redirected && !std::mem::replace(&mut redirected_last, true) {
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

/// What a failed attempt means: the error, whether to retry, and whether the broker named the leader. Notes in
/// `maybe_written` whether the attempt may have been written. An out-of-sequence refusal of a batch that `raced`
/// earlier unwritten batches of its window is retried: the earlier ones go first.
fn judge(failure: Failure, batch: &Batch, maybe_written: &mut bool, raced: bool) -> (ClientError, bool, bool) {
    let unwritten = failure.never_sent || failure.error.nothing_written();
    *maybe_written |= !unwritten && failure.error.is_retriable();
    let idempotent = batch.encoded.as_ref().is_some_and(|(_, identity)| identity.is_some());
    let retriable = if idempotent {
        failure.error.is_retriable() || (raced && failure.error.reason() == Some("out_of_sequence"))
    } else {
        unwritten
    };
    (failure.error, retriable, failure.redirected)
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
                    delay_id: None,
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
