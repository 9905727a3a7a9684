//! [`FetchStream`]: one partition's batches as stored, read with raw `Fetch` from an offset up to an end offset,
//! without decoding records.
//!
//! The broker checks every batch's CRC when it reads and refuses the whole read with CORRUPT_BATCH (and the corrupt
//! batch's base offset in `error_offset`) when one is bad. Such a read may hold good batches before the bad one, so
//! the stream then reads one batch at a time up to that offset, hands those batches on, and ends with
//! [`Item::Corrupt`] at the bad batch: the comparison sees everything before it.
//!
//! With a limit ([`FetchStream::limited`]) each read asks for at most a chunk and the bytes received, at least
//! [`READ_COST_BYTES`], are paid to a rate limiter before the next read, so a background verifier reads at a bounded
//! byte rate and makes a bounded number of requests, however little each read returns.

use std::collections::VecDeque;
use std::sync::Arc;

use ferry_batch::BatchIter;
use ferry_client::BrokerClient;
use ferry_client::proto::{self as pb, ErrorCode};

use super::compare::{BatchStream, Item, ReadError, Side};
use crate::ratelimit::RateLimits;

/// Bytes asked for per read without a limit.
const CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// What a limited read counts against its rate at least: a request costs the link and both brokers something even
/// when it returns a few bytes, and a rate limit on bytes alone would let a verifier of many small partitions send
/// thousands of requests a second. At `bytes_per_sec` a side makes at most `bytes_per_sec / READ_COST_BYTES`
/// requests a second.
pub const READ_COST_BYTES: u64 = 16 * 1024;

/// Reads `[pos, end)` of one partition.
pub struct FetchStream {
    client: BrokerClient,
    /// Which side, for messages.
    side: Side,
    topic: String,
    partition: u32,
    pos: u64,
    end: u64,
    /// After a CORRUPT_BATCH at this offset: read one batch at a time until it.
    careful_until: Option<u64>,
    queue: VecDeque<Item>,
    done: bool,
    chunk: u64,
    limits: Option<Arc<RateLimits>>,
}

impl FetchStream {
    /// A stream of `topic`/`partition` from `start` up to (not including) `end`.
    pub fn new(client: BrokerClient, side: Side, topic: &str, partition: u32, start: u64, end: u64) -> Self {
        FetchStream {
            client,
            side,
            topic: topic.to_owned(),
            partition,
            pos: start,
            end,
            careful_until: None,
            queue: VecDeque::new(),
            done: false,
            chunk: CHUNK_BYTES,
            limits: None,
        }
    }

    /// Reads at most `chunk` bytes at a time and pays every read's bytes to `limits` before the next one.
    pub fn limited(mut self, chunk: u64, limits: Arc<RateLimits>) -> Self {
        self.chunk = chunk.max(1);
        self.limits = Some(limits);
        self
    }

    async fn fetch_more(&mut self) -> Result<(), ReadError> {
        let careful = self.careful_until.is_some_and(|x| self.pos < x);
        // One byte asks for exactly one batch: the broker always returns at least one whole batch.
        let max_bytes = if careful { 1 } else { self.chunk };
        let request = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: self.topic.clone(),
                partition: self.partition,
                offset: self.pos,
                max_bytes,
                leader_epoch: self.client.known_leader_epoch(&self.topic, self.partition),
            }],
            max_wait_ms: 0,
            max_bytes,
        };
        let at = format!(
            "{}/{} at offset {} from the {} {}",
            self.topic,
            self.partition,
            self.pos,
            self.side.name(),
            self.client.address()
        );
        let response = self.client.fetch(request).await.map_err(|e| ReadError(format!("cannot read {at}: {e}")))?;
        let data = response
            .partitions
            .into_iter()
            .find(|d| d.topic == self.topic && d.partition == self.partition)
            .ok_or_else(|| ReadError(format!("the answer to reading {at} does not mention the partition")))?;
        if let Some(limits) = &self.limits {
            limits.acquire((data.batches.len() as u64).max(READ_COST_BYTES), 0).await;
        }
        match ErrorCode::try_from(data.error).unwrap_or(ErrorCode::StorageError) {
            ErrorCode::None => {}
            ErrorCode::CorruptBatch => {
                let offset = data.error_offset.unwrap_or(self.pos).max(self.pos);
                if offset > self.pos && !careful {
                    self.careful_until = Some(offset);
                } else {
                    self.queue.push_back(Item::Corrupt { offset, message: data.message });
                    self.done = true;
                }
                return Ok(());
            }
            ErrorCode::OffsetOutOfRange => {
                return Err(ReadError(format!(
                    "cannot read {at}: the log now spans [{}, {}) (retention or truncation while verifying); verify \
                     again",
                    data.log_start_offset, data.log_end_offset
                )));
            }
            code => return Err(ReadError(format!("cannot read {at}: {}: {}", code.as_str_name(), data.message))),
        }
        let before = self.pos;
        for batch in BatchIter::new(&data.batches) {
            let (header, bytes) = match batch {
                Ok(b) => b,
                Err(e) => {
                    self.queue.push_back(Item::Corrupt {
                        offset: self.pos,
                        message: format!("malformed batch in the answer: {e}"),
                    });
                    self.done = true;
                    return Ok(());
                }
            };
            if header.base_offset >= self.end {
                self.done = true;
                break;
            }
            if header.last_offset() < self.pos {
                continue;
            }
            self.pos = header.next_offset();
            self.queue.push_back(Item::Batch(header, data.batches.slice_ref(bytes)));
        }
        if self.pos == before {
            // Nothing at or after pos: the log ends here (or moved down while verifying).
            self.done = true;
        }
        Ok(())
    }
}

impl BatchStream for FetchStream {
    async fn next(&mut self) -> Result<Option<Item>, ReadError> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Ok(Some(item));
            }
            if self.done || self.pos >= self.end {
                return Ok(None);
            }
            self.fetch_more().await?;
        }
    }
}
