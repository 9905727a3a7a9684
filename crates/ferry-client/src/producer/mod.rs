//! [`Producer`]: batching, partitioning, idempotent delivery with retries, bounded memory.
//!
//! `send` picks the partition, reserves the record's bytes in the memory budget (waiting while it is full) and
//! queues the record in its partition's buffer; it returns a [`DeliveryFuture`]. One sender task per partition
//! (see `sender`) forms batches after `linger` or when full, and keeps up to `max_in_flight` batches in flight,
//! in the partition's order (the idempotent sequence numbers keep it through retries); partitions proceed in
//! parallel. Memory is released when a record's future resolves.
//!
//! Closing: `close` refuses new sends, flushes, and stops the sender tasks. Dropping the last handle without
//! `close` lets the senders deliver what is queued and then stop.

mod accumulator;
mod config;
mod delayed;
mod partitioner;
mod sender;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferry_batch::{BatchBuilder, Header};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::accumulator::PartitionBuffer;
pub use self::config::{DeliverAt, MAX_IN_FLIGHT, ProducerConfig, ProducerRecord, RecordMetadata};
use self::partitioner::{Choice, TopicMeta};
use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};

/// Resolves when the record is acknowledged (or has failed for good).
#[derive(Debug)]
#[must_use = "a delivery future tells whether the record was written"]
pub struct DeliveryFuture {
    rx: oneshot::Receiver<Result<RecordMetadata>>,
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| r.unwrap_or(Err(ClientError::Closed("producer"))))
    }
}

/// A record waiting in a partition buffer or in flight.
#[derive(Debug)]
pub(crate) struct Pending {
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Vec<Header>,
    timestamp: i64,
    tx: oneshot::Sender<Result<RecordMetadata>>,
    _memory: OwnedSemaphorePermit,
}

/// One partition's buffer and its sender's wake-up signal.
#[derive(Debug)]
pub(crate) struct PartitionQueue {
    topic: String,
    partition: u32,
    buffer: parking_lot::Mutex<PartitionBuffer<Pending>>,
    wake: Notify,
    completed: AtomicU64,
}

/// The producer id and epoch in use, with a generation that changes whenever they are replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    producer_id: i64,
    producer_epoch: i16,
    generation: u64,
}

/// State shared by the handles and the sender tasks.
pub(crate) struct Shared {
    client: BrokerClient,
    config: ProducerConfig,
    batch_limit: usize,
    memory: Arc<Semaphore>,
    topics: parking_lot::Mutex<HashMap<String, TopicMeta>>,
    /// Per topic, per partition (looked up by `&str` for every record: no key is built to find a queue).
    queues: parking_lot::Mutex<HashMap<String, HashMap<u32, Arc<PartitionQueue>>>>,
    identity: tokio::sync::Mutex<Option<Identity>>,
    identity_generation: AtomicU64,
    /// The lanes of delayed records (`delayed`).
    delayed: delayed::Lanes,
    /// `true` once `close` began; held for reading while a record is queued so `close` sees every record.
    closed: parking_lot::RwLock<bool>,
    flushing: AtomicUsize,
    progress: Notify,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Senders deliver what is queued, then stop.
        self.shared.cancel.cancel();
        for queue in self.shared.queues.lock().values().flat_map(HashMap::values) {
            queue.wake.notify_one();
        }
    }
}

/// Sends records to a Ferry cluster. Cheap to clone; all clones share batching and memory.
#[derive(Clone)]
pub struct Producer {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.handle.shared;
        f.debug_struct("Producer").field("config", &s.config).field("batch_limit", &s.batch_limit).finish()
    }
}

impl Producer {
    /// A producer over `client`. Reads the broker's batch limit (Metadata) to cap `batch_bytes`.
    pub async fn new(client: BrokerClient, config: ProducerConfig) -> Result<Self> {
        config.validate()?;
        let metadata = client.metadata().await?;
        let broker_limit = usize::try_from(metadata.max_batch_bytes).unwrap_or(usize::MAX);
        let batch_limit = if broker_limit == 0 { config.batch_bytes } else { config.batch_bytes.min(broker_limit) };
        let shared = Shared {
            memory: Arc::new(Semaphore::new(config.buffer_bytes)),
            client,
            config,
            batch_limit,
            topics: Default::default(),
            queues: Default::default(),
            identity: tokio::sync::Mutex::new(None),
            identity_generation: AtomicU64::new(0),
            delayed: Default::default(),
            closed: parking_lot::RwLock::new(false),
            flushing: AtomicUsize::new(0),
            progress: Notify::new(),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
        };
        Ok(Producer { handle: Arc::new(Handle { shared: Arc::new(shared) }) })
    }

    /// The effective batch size limit: `batch_bytes` capped by the broker's `max_batch_bytes`.
    pub fn batch_limit(&self) -> usize {
        self.handle.shared.batch_limit
    }

    /// Queues a record. Waits while the memory budget is full. Fails at once for a closed producer, an unknown
    /// topic or partition, or a record larger than the batch limit; later failures resolve the returned future.
    /// A record with a delivery time to come (`deliver_at`, `delay`) goes to the delay store instead, one request
    /// per record in the partition's order (`delayed`); its future resolves once the broker stored it, with its
    /// delay id.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        let shared = &self.handle.shared;
        if *shared.closed.read() {
            return Err(ClientError::Closed("producer"));
        }
        let size = BatchBuilder::record_size(record.key.as_deref(), record.value.as_deref(), &record.headers);
        if size + ferry_batch::HEADER_LEN > shared.batch_limit {
            return Err(ClientError::RecordTooLarge { topic: record.topic, size, limit: shared.batch_limit });
        }
        let partition = shared.partition_for(&record).await?;
        if let Some(when) = record.when.filter(|w| !delayed::passed(*w, now_ms())) {
            return Ok(shared.send_delayed(record, partition, when));
        }
        let permits = u32::try_from(size).unwrap_or(u32::MAX);
        let memory = tokio::select! {
            permit = shared.memory.clone().acquire_many_owned(permits) => {
                permit.map_err(|_| ClientError::Closed("producer"))?
            }
            _ = shared.cancel.cancelled() => return Err(ClientError::Closed("producer")),
        };
        let timestamp = record.timestamp.unwrap_or_else(now_ms);
        let (tx, rx) = oneshot::channel();
        let pending =
            Pending { key: record.key, value: record.value, headers: record.headers, timestamp, tx, _memory: memory };
        let closed = shared.closed.read();
        if *closed {
            return Err(ClientError::Closed("producer"));
        }
        let queue = shared.queue(&record.topic, partition);
        let (first, full) = {
            let mut buffer = queue.buffer.lock();
            let first = buffer.push(pending, size, Instant::now());
            (first, buffer.is_full(shared.batch_limit))
        };
        drop(closed);
        if first || full {
            queue.wake.notify_one();
        }
        Ok(DeliveryFuture { rx })
    }

    /// Sends every record queued so far without waiting for `linger`, and waits until each is acknowledged or
    /// has failed (failures are reported through their futures).
    pub async fn flush(&self) {
        self.handle.shared.flush().await;
    }

    /// Refuses further sends, flushes, and stops the sender tasks.
    pub async fn close(&self) {
        let shared = &self.handle.shared;
        *shared.closed.write() = true;
        shared.flush().await;
        shared.cancel.cancel();
        for queue in shared.queues.lock().values().flat_map(HashMap::values) {
            queue.wake.notify_one();
        }
        shared.tracker.close();
        shared.tracker.wait().await;
    }
}

impl Shared {
    async fn flush(&self) {
        let targets: Vec<(Arc<PartitionQueue>, u64)> = self
            .queues
            .lock()
            .values()
            .flat_map(HashMap::values)
            .map(|q| (q.clone(), q.buffer.lock().enqueued()))
            .collect();
        self.flushing.fetch_add(1, Ordering::SeqCst);
        let _guard = FlushGuard(&self.flushing);
        for (queue, _) in &targets {
            queue.wake.notify_one();
        }
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if targets.iter().all(|(q, target)| q.completed.load(Ordering::SeqCst) >= *target) {
                return;
            }
            notified.await;
        }
    }

    /// The queue of a partition, starting its sender task on first use.
    fn queue(self: &Arc<Self>, topic: &str, partition: u32) -> Arc<PartitionQueue> {
        let mut queues = self.queues.lock();
        if let Some(q) = queues.get(topic).and_then(|t| t.get(&partition)) {
            return q.clone();
        }
        let queue = Arc::new(PartitionQueue {
            topic: topic.to_owned(),
            partition,
            buffer: Default::default(),
            wake: Notify::new(),
            completed: AtomicU64::new(0),
        });
        queues.entry(topic.to_owned()).or_default().insert(partition, queue.clone());
        self.tracker.spawn(sender::run(self.clone(), queue.clone()));
        queue
    }

    /// Chooses the partition of a record, reading or refreshing the topic's partition count as needed.
    async fn partition_for(&self, record: &ProducerRecord) -> Result<u32> {
        let now = Instant::now();
        let cached = self
            .topics
            .lock()
            .get(&record.topic)
            .filter(|m| !m.is_stale(now, self.config.metadata_max_age))
            .map(|m| m.choose(record.partition, record.key.as_deref()));
        let choice = match cached {
            Some(Choice::Partition(p)) => return Ok(p),
            Some(Choice::OutOfRange) | None => {
                self.refresh_topic(&record.topic).await?;
                let topics = self.topics.lock();
                let meta = topics.get(&record.topic).expect("refresh_topic inserts the topic");
                (meta.choose(record.partition, record.key.as_deref()), meta.partitions)
            }
        };
        match choice {
            (Choice::Partition(p), _) => Ok(p),
            (Choice::OutOfRange, partitions) => Err(ClientError::UnknownPartition {
                topic: record.topic.clone(),
                partition: record.partition.unwrap_or_default(),
                partitions,
            }),
        }
    }

    /// Re-reads a topic's partition count (DescribeTopic). NOT_FOUND is returned as the broker said it.
    async fn refresh_topic(&self, topic: &str) -> Result<u32> {
        let response = self
            .client
            .describe_topic(ferry_proto::DescribeTopicRequest {
                name: topic.to_owned(),
                leader_epochs: Default::default(),
            })
            .await?;
        let partitions = response.topic.map(|t| t.partitions).ok_or_else(|| ClientError::Protocol {
            rpc: "DescribeTopic",
            broker: self.client.address(),
            message: "the topic field is missing".into(),
        })?;
        let now = Instant::now();
        let mut topics = self.topics.lock();
        topics
            .entry(topic.to_owned())
            .and_modify(|m| m.update(partitions, now))
            .or_insert_with(|| TopicMeta::new(partitions, now, rand::random::<u32>()));
        Ok(partitions)
    }

    /// A batch for `partition` was formed: rotate the topic's sticky partition.
    fn on_new_batch(&self, topic: &str, partition: u32) {
        if let Some(meta) = self.topics.lock().get_mut(topic) {
            meta.on_new_batch(partition);
        }
    }

    /// The producer id in use, allocating one (InitProducer) when there is none.
    async fn identity(&self) -> Result<Identity> {
        let mut current = self.identity.lock().await;
        if let Some(identity) = *current {
            return Ok(identity);
        }
        let response = self.client.init_producer(ferry_proto::InitProducerRequest {}).await?;
        let epoch = i16::try_from(response.producer_epoch).map_err(|_| ClientError::Protocol {
            rpc: "InitProducer",
            broker: self.client.address(),
            message: format!("producer epoch {} does not fit the batch header", response.producer_epoch),
        })?;
        let identity = Identity {
            producer_id: response.producer_id,
            producer_epoch: epoch,
            generation: self.identity_generation.fetch_add(1, Ordering::SeqCst) + 1,
        };
        tracing::debug!(producer_id = identity.producer_id, epoch, "producer id allocated");
        *current = Some(identity);
        Ok(identity)
    }

    /// Whether the producer id of `generation` was retired (another one is in use, or none yet).
    async fn retired(&self, generation: u64) -> bool {
        self.identity.lock().await.is_none_or(|i| i.generation != generation)
    }

    /// Forgets the producer id of `generation` (after a batch whose outcome is unknown): the next batch of every
    /// partition starts a new id at sequence 0, so a later batch can never be mistaken for that one.
    async fn reset_identity(&self, generation: u64) {
        let mut current = self.identity.lock().await;
        if current.is_some_and(|i| i.generation == generation) {
            *current = None;
        }
    }
}

struct FlushGuard<'a>(&'a AtomicUsize);

impl Drop for FlushGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
