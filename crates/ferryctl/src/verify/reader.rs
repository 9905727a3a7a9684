//! [`FetchStream`]: one partition's batches as stored, read with raw `Fetch` from an offset up to an end offset,
//! without decoding records.
//!
//! The broker checks every batch's CRC when it reads and refuses the whole read with CORRUPT_BATCH (and the corrupt
//! batch's base offset in `error_offset`) when one is bad. Such a read may hold good batches before the bad one, so
//! the stream then reads one batch at a time up to that offset, hands those batches on, and ends with
//! [`Item::Corrupt`] at the bad batch: the comparison sees everything before it.

use std::collections::VecDeque;

use anyhow::{Context, anyhow};
use ferry_batch::BatchIter;
use ferry_client::BrokerClient;
use ferry_client::proto::{self as pb, ErrorCode};

use super::compare::{BatchStream, Item};

/// Bytes asked for per read.
const CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// Reads `[pos, end)` of one partition.
pub struct FetchStream {
    client: BrokerClient,
    /// "source" or "target", for messages.
    side: &'static str,
    topic: String,
    partition: u32,
    pos: u64,
    end: u64,
    /// After a CORRUPT_BATCH at this offset: read one batch at a time until it.
    careful_until: Option<u64>,
    queue: VecDeque<Item>,
    done: bool,
}

impl FetchStream {
    /// A stream of `topic`/`partition` from `start` up to (not including) `end`.
    pub fn new(client: BrokerClient, side: &'static str, topic: &str, partition: u32, start: u64, end: u64) -> Self {
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
        }
    }

    async fn fetch_more(&mut self) -> anyhow::Result<()> {
        let careful = self.careful_until.is_some_and(|x| self.pos < x);
        // One byte asks for exactly one batch: the broker always returns at least one whole batch.
        let max_bytes = if careful { 1 } else { CHUNK_BYTES };
        let request = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: self.topic.clone(),
                partition: self.partition,
                offset: self.pos,
                max_bytes,
            }],
            max_wait_ms: 0,
            max_bytes,
        };
        let at = format!(
            "{}/{} at offset {} from the {} {}",
            self.topic,
            self.partition,
            self.pos,
            self.side,
            self.client.address()
        );
        let response = self.client.fetch(request).await.with_context(|| format!("cannot read {at}"))?;
        let data = response
            .partitions
            .into_iter()
            .find(|d| d.topic == self.topic && d.partition == self.partition)
            .ok_or_else(|| anyhow!("the answer to reading {at} does not mention the partition"))?;
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
                return Err(anyhow!(
                    "cannot read {at}: the log now spans [{}, {}) (retention or truncation while verifying); run \
                     verify again",
                    data.log_start_offset,
                    data.log_end_offset
                ));
            }
            code => return Err(anyhow!("cannot read {at}: {}: {}", code.as_str_name(), data.message)),
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
    async fn next(&mut self) -> anyhow::Result<Option<Item>> {
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
