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
//!
//! [`fetch_many`] reads the start of many partitions' ranges in one request (paid once), and a stream given one
//! of its answers ([`FetchStream::starting_with`]) takes that answer as its first read: a verifier of thousands of
//! small partitions then makes one request per side for a group of them, not one each.

use std::collections::VecDeque;
use std::sync::Arc;

use ferry_batch::BatchIter;
use ferry_client::BrokerClient;
use ferry_client::proto::{self as pb, ErrorCode};

use super::compare::{BatchStream, Item, ReadError, Side};
use crate::ratelimit::RateLimits;
use crate::tp::Placer;

/// Bytes asked for per read without a limit.
const CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// What a limited read counts against its rate at least: a request costs the link and both brokers something even
/// when it returns a few bytes, and a rate limit on bytes alone would let a verifier of many small partitions send
/// thousands of requests a second. At `bytes_per_sec` a side makes at most `bytes_per_sec / READ_COST_BYTES`
/// requests a second.
pub const READ_COST_BYTES: u64 = 64 * 1024;

/// What each partition a request reads or looks up counts against the rate at least: each costs both brokers a
/// look-up and a read, and the mirror a comparison, however little it holds. A group of 64 near-empty partitions
/// then counts 256 KiB.
pub const PARTITION_COST_BYTES: u64 = 4 * 1024;

/// What a request that brought `bytes` for `partitions` partitions counts against its rate.
pub fn request_cost(bytes: u64, partitions: usize) -> u64 {
    bytes.max(READ_COST_BYTES).max(partitions as u64 * PARTITION_COST_BYTES)
}

/// One partition of a [`fetch_many`]: (topic, partition, from).
pub type Start<'a> = (&'a str, u32, u64);

/// Reads the start of every range in `starts` with one `Fetch` to `client`: at most `max_bytes` in all, the first
/// partitions first. The answer of partition `i` is `answers[i]`, `None` when the request failed or the answer
/// does not mention it. The request's [`request_cost`] is paid to `limits` once.
pub async fn fetch_many(
    client: &BrokerClient,
    starts: &[Start<'_>],
    max_bytes: u64,
    limits: &RateLimits,
) -> Vec<Option<pb::PartitionData>> {
    let mut answers = vec![None; starts.len()];
    if starts.is_empty() {
        return answers;
    }
    let request = pb::FetchRequest {
        partitions: starts
            .iter()
            .map(|&(topic, partition, offset)| pb::PartitionFetch {
                topic: topic.to_owned(),
                partition,
                offset,
                max_bytes,
                leader_epoch: client.known_leader_epoch(topic, partition),
            })
            .collect(),
        max_wait_ms: 0,
        max_bytes,
    };
    let response = client.fetch(request).await;
    let received = response.as_ref().map_or(0, |r| r.partitions.iter().map(|d| d.batches.len() as u64).sum());
    limits.acquire(request_cost(received, starts.len()), 0).await;
    let Ok(response) = response else { return answers };
    // The answer keeps the request's order; one out of it is placed by name.
    let asked: Vec<(String, u32)> = starts.iter().map(|&(t, p, _)| (t.to_owned(), p)).collect();
    let mut placer = Placer::new(&asked);
    for mut d in response.partitions {
        let named = (std::mem::take(&mut d.topic), d.partition);
        let at = placer.place(&named);
        d.topic = named.0;
        if let Some(at) = at {
            answers[at] = Some(d);
        }
    }
    answers
}

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
    /// An answer read already (by [`fetch_many`]), taken as the first read.
    first: Option<pb::PartitionData>,
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
            first: None,
        }
    }

    /// Takes `answer` (read from this stream's start by [`fetch_many`], and paid for there) as its first read. An
    /// answer with an error or without batches is left unused: the stream then reads as it would without it, so
    /// an error is met by this stream's own read, and a partition the shared request had no room for is read
    /// again rather than taken for the end of its log.
    pub fn starting_with(mut self, answer: Option<pb::PartitionData>) -> Self {
        self.first = answer.filter(|d| d.error == ErrorCode::None as i32 && !d.batches.is_empty());
        self
    }

    /// Reads at most `chunk` bytes at a time and pays every read's bytes to `limits` before the next one.
    pub fn limited(mut self, chunk: u64, limits: Arc<RateLimits>) -> Self {
        self.chunk = chunk.max(1);
        self.limits = Some(limits);
        self
    }

    /// Where a read of this stream is, for messages.
    fn at(&self) -> String {
        format!(
            "{}/{} at offset {} from the {} {}",
            self.topic,
            self.partition,
            self.pos,
            self.side.name(),
            self.client.address()
        )
    }

    async fn fetch_more(&mut self) -> Result<(), ReadError> {
        if let Some(data) = self.first.take() {
            return self.absorb(data, false);
        }
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
        let response =
            self.client.fetch(request).await.map_err(|e| ReadError(format!("cannot read {}: {e}", self.at())))?;
        let data = response
            .partitions
            .into_iter()
            .find(|d| d.topic == self.topic && d.partition == self.partition)
            .ok_or_else(|| ReadError(format!("the answer to reading {} does not mention the partition", self.at())))?;
        if let Some(limits) = &self.limits {
            limits.acquire(request_cost(data.batches.len() as u64, 1), 0).await;
        }
        self.absorb(data, careful)
    }

    /// Takes one read's answer: its batches from the stream's position on, or its error.
    fn absorb(&mut self, data: pb::PartitionData, careful: bool) -> Result<(), ReadError> {
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
                    "cannot read {}: the log now spans [{}, {}) (retention or truncation while verifying); verify \
                     again",
                    self.at(),
                    data.log_start_offset,
                    data.log_end_offset
                )));
            }
            code => {
                return Err(ReadError(format!("cannot read {}: {}: {}", self.at(), code.as_str_name(), data.message)));
            }
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
