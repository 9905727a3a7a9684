//! One partition: its log, its idempotent-producer state and the write path.
//!
//! Writes are serialised by an async mutex that also guards the producer state, so the duplicate check and the
//! append are one step. File writes (and fsync under `flush = "sync"`) run on the blocking pool. Reads go straight
//! to the log, which lets many readers in beside the writer.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use ferry_batch::{self as batch, BatchHeader, BatchIter};
use ferry_proto as pb;
use ferry_storage::fs::FsRef;
use ferry_storage::{Clock, Log, LogConfig, OffsetAppendOutcome, ReadResult, StorageError, SystemClock};
use tokio::sync::{Mutex, watch};

use crate::error::{BrokerError, RefusalKind, Result};
use crate::node::end_clock::EndClock;
use crate::node::leader_epochs::LeaderEpochs;
use crate::node::producer_state::{self, Check, ProducerStates};
use crate::node::replica::Replica;

/// How long a produced batch that may have overtaken earlier batches of its producer waits for them (a pipelining
/// producer's requests can arrive out of order) before it is judged: refused as out of sequence past a gap, or,
/// from a producer not known here, taken as the producer's start.
pub const SEQUENCE_GAP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

mod guard;
mod replicated;

pub use guard::WriteGuard;

/// What decides, under a replicated partition's write lock, whether this broker may take a write: its leader epoch, or
/// why not (the cluster's rules, `cluster::core::hw::may_write`, with the leader's authority). A single broker's
/// partitions need none.
pub type WriteGate<'a> = &'a (dyn Fn(&Replica) -> Result<u32> + Send + Sync);

/// What a produce request wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    /// Offset of the first record.
    pub base_offset: u64,
    /// Offset of the last record.
    pub last_offset: u64,
    /// Whether every batch was a retry of one already written.
    pub duplicate: bool,
    /// Log end offset afterwards.
    pub log_end_offset: u64,
    /// A replicated partition's leader epoch the write was made under (0 for a single broker's partition).
    pub leader_epoch: u32,
}

/// One partition of a topic.
#[derive(Debug)]
pub struct Partition {
    topic: String,
    index: u32,
    log: Arc<Log>,
    writer: Mutex<ProducerStates>,
    arrivals: watch::Sender<u64>,
    /// Set while a flush started by [`Partition::flush_behind`] is queued or running.
    flush_behind: Arc<AtomicBool>,
    /// A replicated partition's replication state (`None` for a single broker's partition).
    replica: Option<Arc<Replica>>,
    /// When the log end last moved by a write (a replicated partition's readers go by its HW's instead).
    appended: EndClock,
    /// The topic's fence and promotion floor, checked under the write lock.
    guard: parking_lot::RwLock<WriteGuard>,
}

impl Partition {
    /// Opens (or creates) the partition's log in `dir` and rebuilds the producer state from the batch headers of
    /// its last two segments. `replica_on` is this broker's id and the smallest in-sync set of a write when the
    /// partition is replicated: its leader-epoch history is loaded and it starts idle. Blocking: call from the blocking pool or at startup.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        fs: &FsRef,
        topic: &str,
        index: u32,
        dir: PathBuf,
        config: LogConfig,
        producer_settings: producer_state::Settings,
        arrivals: watch::Sender<u64>,
        replica_on: Option<(u32, usize)>,
    ) -> Result<Partition> {
        let replica = match replica_on {
            Some((id, min_insync)) => {
                ferry_storage::fs::sync_new_dirs(&**fs, &dir)
                    .map_err(|source| BrokerError::Io { path: dir.clone(), source })?;
                Some(Arc::new(Replica::new(id, LeaderEpochs::load(&**fs, &dir)?, arrivals.clone(), min_insync)))
            }
            None => None,
        };
        let log = Log::open_on(fs.clone(), dir, config, Arc::new(SystemClock))
            .map_err(|e| BrokerError::storage(topic, index, e))?;
        let mut producers = ProducerStates::new(producer_settings);
        let bases = log.segment_base_offsets();
        let from = bases.len().checked_sub(2).map_or(0, |i| bases[i]);
        log.for_each_batch_header(from, &mut |h: &BatchHeader| producers.record(h, h.base_offset, h.last_offset()))
            .map_err(|e| BrokerError::storage(topic, index, e))?;
        Ok(Partition {
            topic: topic.to_owned(),
            index,
            log: Arc::new(log),
            writer: Mutex::new(producers),
            arrivals,
            flush_behind: Arc::new(AtomicBool::new(false)),
            replica,
            appended: EndClock::default(),
            guard: parking_lot::RwLock::new(WriteGuard::default()),
        })
    }

    /// The replication state, when the partition is replicated.
    pub fn replica(&self) -> Option<&Arc<Replica>> {
        self.replica.as_ref()
    }

    /// The log end offset clients see: the log's, or a replicated partition's high watermark.
    pub fn visible_end(&self) -> u64 {
        let leo = self.log.log_end_offset();
        match &self.replica {
            None => leo,
            Some(r) => r.hw().min(leo),
        }
    }

    /// How long ago the end readers see last moved: a replicated partition's HW, else the log end.
    pub fn end_age(&self) -> Option<std::time::Duration> {
        match &self.replica {
            Some(r) => r.hw_age(),
            None => self.appended.age(),
        }
    }

    /// Topic name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Partition index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The underlying log.
    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    fn err(&self, e: StorageError) -> BrokerError {
        BrokerError::storage(&self.topic, self.index, e)
    }

    /// Splits and fully verifies the batches of a request before anything is written.
    fn verified_batches(&self, batches: &Bytes) -> Result<Vec<(BatchHeader, Bytes)>> {
        let max = self.log.config().max_batch_bytes;
        let mut out = Vec::new();
        let mut iter = BatchIter::new(batches);
        loop {
            let start = iter.position();
            match iter.next() {
                None => break,
                Some(Err(e)) => {
                    return Err(BrokerError::MalformedBatch {
                        topic: self.topic.clone(),
                        partition: self.index,
                        reason: e.to_string(),
                    });
                }
                Some(Ok((header, bytes))) => {
                    if bytes.len() as u64 > max {
                        return Err(BrokerError::BatchTooLarge {
                            topic: self.topic.clone(),
                            partition: self.index,
                            size: bytes.len() as u64,
                            max,
                        });
                    }
                    batch::verify(bytes).map_err(|e| {
                        self.err(StorageError::InvalidBatch { dir: self.log.dir().to_owned(), offset: 0, source: e })
                    })?;
                    out.push((header, batches.slice(start..start + bytes.len())));
                }
            }
        }
        if out.is_empty() {
            return Err(BrokerError::MalformedBatch {
                topic: self.topic.clone(),
                partition: self.index,
                reason: "the request holds no batch".into(),
            });
        }
        Ok(out)
    }

    /// Appends the batches of a produce request, assigning offsets; retried idempotent batches get their original
    /// offsets back and are not written again. A request whose batches the producer state refuses (a sequence gap
    /// or a fenced epoch in any of them) writes nothing.
    pub async fn produce(&self, batches: Bytes) -> Result<Produced> {
        self.produce_gated(batches, None).await
    }

    /// [`Partition::produce`] on a replicated partition: `gate` decides, under the write lock, whether this broker
    /// may take the write and under which leader epoch.
    pub async fn produce_gated(&self, batches: Bytes, gate: Option<WriteGate<'_>>) -> Result<Produced> {
        let verified = self.verified_batches(&batches)?;
        // The log refuses a sparse batch on a plain append too; checking every batch first keeps a request with a
        // sparse batch after a good one from being half-written.
        for (header, _) in &verified {
            header.check_dense().map_err(|e| BrokerError::MalformedBatch {
                topic: self.topic.clone(),
                partition: self.index,
                reason: e.to_string(),
            })?;
            // The header's max_timestamp bounds every record's timestamp (retention and producer expiry read it,
            // and the bound below checks it): a first_timestamp above it is a lie about the records.
            if header.first_timestamp > header.max_timestamp {
                return Err(BrokerError::MalformedBatch {
                    topic: self.topic.clone(),
                    partition: self.index,
                    reason: format!(
                        "first_timestamp {} is above max_timestamp {}",
                        header.first_timestamp, header.max_timestamp
                    ),
                });
            }
        }
        // A pipelining producer's batches can reach the partition out of order (each request is a task of its
        // own): one that may have overtaken earlier ones (see `ProducerStates::request_may_have_overtaken`) waits, up to
        // SEQUENCE_GAP_WAIT, for them to be written before it is judged.
        let gap_deadline = tokio::time::Instant::now() + SEQUENCE_GAP_WAIT;
        let (mut producers, verdicts, leader_epoch) = loop {
            let producers = self.writer.lock().await;
            self.admit()?;
            let leader_epoch = self.writable_epoch(gate)?;
            self.raise_to_floor()?;
            // Time retention and producer expiry follow batch timestamps: one far in the future would pin
            // segments forever and expire every producer id, so a produced one may be only so far ahead of this
            // clock.
            let ahead = producers.settings().max_timestamp_ahead_ms;
            let limit = SystemClock.now_ms().saturating_add(ahead);
            if let Some((header, _)) = verified.iter().find(|(h, _)| h.max_timestamp > limit) {
                return Err(BrokerError::InvalidArgument(format!(
                    "{}/{}: a batch's newest record timestamp {} is more than storage.max_timestamp_ahead ({ahead} \
                     ms) ahead of the broker's clock; fix the producer's clock or its record timestamps",
                    self.topic, self.index, header.max_timestamp
                )));
            }
            // Every verdict first, then one write of all the batches to append: a request is refused, or written,
            // as a whole (a write that fails part-way, such as on a full disk, is taken back whole by the log).
            let plan = producers.plan(verified.iter().map(|(h, _)| h), self.log.log_end_offset());
            let judged = matches!(plan, Err((_, kind, _)) if kind != producer_state::SequenceRefusal::OutOfOrder)
                || tokio::time::Instant::now() >= gap_deadline
                || !producers.request_may_have_overtaken(verified.iter().map(|(h, _)| h));
            if !judged {
                // Subscribed under the write lock, so no append between here and the wait goes unseen; woken by
                // the next append of any producer, and the deadline bounds the wait.
                let mut arrivals = self.arrivals.subscribe();
                drop(producers);
                let _ = tokio::time::timeout_at(gap_deadline, arrivals.changed()).await;
                continue;
            }
            match plan {
                Ok(verdicts) => break (producers, verdicts, leader_epoch),
                Err((producer_id, kind, reason)) => {
                    return Err(BrokerError::ProducerSequence {
                        topic: self.topic.clone(),
                        partition: self.index,
                        producer_id,
                        kind,
                        reason,
                    });
                }
            }
        };
        let to_write: Vec<Bytes> = verified
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| matches!(v, Check::Append))
            .map(|((_, bytes), _)| bytes.clone())
            .collect();
        let all_duplicates = to_write.is_empty();
        let mut written = if all_duplicates {
            Vec::new()
        } else {
            let log = Arc::clone(&self.log);
            let (infos, over) = tokio::task::spawn_blocking(move || {
                let parts: Vec<&[u8]> = to_write.iter().map(|b| b.as_ref()).collect();
                // Verified above (`verified_batches`): the log makes every other check, not the CRC pass again.
                log.append_all_verified(&parts).map(|infos| (infos, log.over_flush_threshold()))
            })
            .await
            .map_err(|e| BrokerError::Internal(format!("append task failed: {e}")))?
            .map_err(|e| self.err(e))?;
            self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
            self.appended.moved();
            if let Some(r) = &self.replica {
                // Followers waiting in a long poll fetch it; the cluster's serving side moves the HW.
                r.nudge();
            }
            if over {
                self.flush_behind();
            }
            infos
        }
        .into_iter();
        let mut first: Option<u64> = None;
        let mut last = 0;
        for ((header, _), verdict) in verified.iter().zip(verdicts) {
            let (base, end) = match verdict {
                Check::Duplicate { base_offset, last_offset } => (base_offset, last_offset),
                Check::Append => {
                    let info = written.next().ok_or_else(|| {
                        BrokerError::Internal("the log answered fewer batches than it was given".into())
                    })?;
                    producers.record(header, info.base_offset, info.last_offset);
                    (info.base_offset, info.last_offset)
                }
                // A plan stops at its first refusal, with an error: no verdict of one comes back.
                Check::Refuse(kind, reason) => {
                    return Err(BrokerError::ProducerSequence {
                        topic: self.topic.clone(),
                        partition: self.index,
                        producer_id: header.producer_id,
                        kind,
                        reason,
                    });
                }
            };
            first.get_or_insert(base);
            last = end;
        }
        Ok(Produced {
            base_offset: first.unwrap_or(0),
            last_offset: last,
            duplicate: all_duplicates,
            log_end_offset: self.log.log_end_offset(),
            leader_epoch,
        })
    }

    /// The leader epoch a write goes under: 0 on a single partition; on a replicated one, what `gate` answers.
    /// Called under the write lock, which role changes take too, so no write slips past a change of leader.
    fn writable_epoch(&self, gate: Option<WriteGate<'_>>) -> Result<u32> {
        match (&self.replica, gate) {
            (None, _) => Ok(0),
            (Some(r), Some(gate)) => gate(r),
            (Some(_), None) => Err(BrokerError::Internal(format!(
                "{}/{}: a write to a replicated partition must go through the cluster's serving side",
                self.topic, self.index
            ))),
        }
    }

    /// The mirror's append to a mirror topic's partition (see [`Partition::append_with_offsets`]); on a
    /// replicated partition only its leader takes it, with at least two replicas in sync. Returns the outcome and
    /// the leader epoch it was written under (for the acknowledgement).
    pub async fn append_mirrored(
        &self,
        batches: Bytes,
        source_log_start: u64,
        gate: Option<WriteGate<'_>>,
    ) -> Result<(OffsetAppendOutcome, u32)> {
        let verified = if batches.is_empty() { Vec::new() } else { self.verified_batches(&batches)? };
        let mut producers = self.writer.lock().await;
        self.admit()?;
        let epoch = self.writable_epoch(gate)?;
        self.raise_to_floor()?;
        let outcome = self.append_offsets_locked(&mut producers, &verified, batches, source_log_start).await?;
        if let Some(r) = &self.replica {
            r.nudge();
        }
        Ok((outcome, epoch))
    }

    /// Appends batches that carry their offsets and epochs: the mirror's on a single partition, and a follower's
    /// copy of its leader's batches.
    pub async fn append_with_offsets(&self, batches: Bytes, source_log_start: u64) -> Result<OffsetAppendOutcome> {
        // Validate framing, size and CRC up front so a bad request gets its own status code; the log then makes
        // every other check without a second CRC pass, and the headers parsed here feed the producer state.
        let verified = if batches.is_empty() { Vec::new() } else { self.verified_batches(&batches)? };
        let mut producers = self.writer.lock().await;
        self.append_offsets_locked(&mut producers, &verified, batches, source_log_start).await
    }

    async fn append_offsets_locked(
        &self,
        producers: &mut ProducerStates,
        verified: &[(BatchHeader, Bytes)],
        batches: Bytes,
        source_log_start: u64,
    ) -> Result<OffsetAppendOutcome> {
        let log = Arc::clone(&self.log);
        let (outcome, over) = tokio::task::spawn_blocking(move || {
            log.append_with_offsets_verified(&batches, source_log_start).map(|o| (o, log.over_flush_threshold()))
        })
        .await
        .map_err(|e| BrokerError::Internal(format!("append task failed: {e}")))?
        .map_err(|e| self.offset_append_error(e))?;
        if over {
            self.flush_behind();
        }
        let leo = self.log.log_end_offset();
        for (header, _) in verified {
            if header.last_offset() < leo {
                producers.record(header, header.base_offset, header.last_offset());
            }
        }
        self.appended.moved();
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        Ok(outcome)
    }

    /// Starts the async policy's byte-threshold fsync on the blocking pool, unless one is queued or running
    /// already; the append that crossed the threshold does not wait for it (under `flush = "async"` an
    /// acknowledgement never waited for an fsync), and later appends go on while it runs.
    fn flush_behind(&self) {
        if self.flush_behind.swap(true, Ordering::AcqRel) {
            return;
        }
        let (log, flag) = (Arc::clone(&self.log), Arc::clone(&self.flush_behind));
        let (topic, index) = (self.topic.clone(), self.index);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = log.flush_over_threshold() {
                tracing::warn!(topic, partition = index, error = %e, "flush failed; will retry");
            }
            flag.store(false, Ordering::Release);
        });
    }

    /// A refused offset append becomes [`BrokerError::AppendRefused`] with its kind, or a malformed request when
    /// the offered batches themselves are out of order.
    fn offset_append_error(&self, e: StorageError) -> BrokerError {
        match e {
            StorageError::OffsetAppendRefused { offset, reason, .. } => match RefusalKind::of(&reason) {
                Some(kind) => BrokerError::AppendRefused {
                    topic: self.topic.clone(),
                    partition: self.index,
                    offset,
                    kind,
                    reason,
                },
                None => BrokerError::MalformedBatch {
                    topic: self.topic.clone(),
                    partition: self.index,
                    reason: format!("batch at offset {offset}: {reason}"),
                },
            },
            other => self.err(other),
        }
    }

    /// Truncates to the batch boundary at or below `offset`, returning the new log end offset.
    pub async fn truncate(&self, offset: u64) -> Result<u64> {
        let mut producers = self.writer.lock().await;
        let log = Arc::clone(&self.log);
        let leo = tokio::task::spawn_blocking(move || log.truncate_to(offset))
            .await
            .map_err(|e| BrokerError::Internal(format!("truncate task failed: {e}")))?
            .map_err(|e| self.err(e))?;
        producers.clear();
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        Ok(leo)
    }

    /// Reads whole batches from `offset`, up to `max_bytes` (at least one batch), for a client of a single broker's
    /// partition. A replicated partition is read through [`Partition::read_within`], with the end its leader's
    /// rules allow.
    pub fn read(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        match &self.replica {
            None => self.read_log(offset, max_bytes),
            Some(_) => Err(BrokerError::Internal(format!(
                "{}/{}: a client's read of a replicated partition must go through the cluster's serving side",
                self.topic, self.index
            ))),
        }
    }

    /// Reads whole batches from `offset` as stored, up to the log end: a leader's answer to its followers.
    pub fn read_log(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        self.log.read(offset, max_bytes).map_err(|e| self.err(e))
    }

    /// [`Partition::read_log`] for the followers' fetches, which ask the same moments apart (`Log::read_shared`).
    pub fn read_log_shared(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        self.log.read_shared(offset, max_bytes).map_err(|e| self.err(e))
    }

    /// Describe view of the partition.
    pub fn info(&self) -> pb::PartitionInfo {
        let s = self.log.stats();
        pb::PartitionInfo {
            partition: self.index,
            log_start_offset: s.log_start_offset,
            log_end_offset: self.replica.as_ref().map_or(s.log_end_offset, |r| r.hw().min(s.log_end_offset)),
            epoch: s.epoch,
            size_bytes: s.size_bytes,
            segments: s.segments,
            gaps: s.gaps.iter().map(|&(start, end)| pb::OffsetRange { start, end }).collect(),
            error: pb::ErrorCode::None as i32,
            message: String::new(),
            leader: None,
            leader_epoch: self.replica.as_ref().map_or(0, |r| r.leader_epoch()),
        }
    }
}

#[cfg(test)]
mod tests;
