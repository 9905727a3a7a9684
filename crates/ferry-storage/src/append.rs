//! The write path: plain appends, writing one batch, rolling segments, gap jumps, the epoch history and flushing.
//!
//! Every function here runs with the writer mutex held (the `&mut Writer` argument proves it), so the segment
//! list only changes under our feet through our own hands; the state lock is taken briefly to read the active
//! segment and again to publish what was written.
//!
//! A batch goes to disk with one `writev` on the active segment's file (opened `O_APPEND`): the 21 header bytes
//! with the stamped base offset and epoch from a small copy, the CRC-covered rest straight from the caller's
//! buffer. Index entries are collected in memory and written in blocks.

use std::io::ErrorKind;

use ferry_batch::{self as batch, CRC_START};

use crate::checkpoint;
use crate::fs::OpenMode;
use crate::index;
use crate::segment::Segment;
use crate::state::{LogCore, SealedFiles, Writer};
use crate::types::{AppendInfo, BatchMeta, Caller};
use crate::{FlushPolicy, Result, StorageError};

/// Index bytes collected before they are written to the index file.
const INDEX_WRITE_BLOCK: usize = 4096;

impl LogCore {
    /// `Log::append`.
    pub(crate) fn append_batch(&self, batch: &[u8]) -> Result<AppendInfo> {
        let mut infos = self.append_batches(&[batch], Caller::Plain)?;
        Ok(infos.pop().expect("one batch in, one out"))
    }

    /// `Log::append_all` (and, with [`Caller::Verified`], `Log::append_all_verified`): every batch is checked and
    /// given its offsets before anything is written, and then all of them go to disk in one write, published
    /// together. A failed write is taken back whole.
    pub(crate) fn append_batches(&self, batches: &[&[u8]], caller: Caller) -> Result<Vec<AppendInfo>> {
        let mut w = self.writer.lock();
        let (leo, epoch, max) = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            (st.log_end(), st.epochs.latest(), st.config.max_batch_bytes)
        };
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let mut next = leo;
        let mut prefixes = Vec::with_capacity(batches.len());
        let mut metas = Vec::with_capacity(batches.len());
        for batch in batches {
            // A plain append takes one offset per record: a sparse header (say one record claiming a span of
            // 2^32) would move the log end by billions and roll a segment per append. Sparse batches from a
            // compacted source come through append-with-offsets only.
            let header = caller
                .check(batch)
                .and_then(|h| h.check_dense().map(|()| h))
                .map_err(|source| StorageError::InvalidBatch { dir: self.dir.clone(), offset: next, source })?;
            if batch.len() as u64 > max {
                return Err(StorageError::BatchTooLarge {
                    dir: self.dir.clone(),
                    offset: next,
                    size: batch.len() as u64,
                    max,
                });
            }
            let last = next
                .checked_add(u64::from(header.last_offset_delta))
                .filter(|&l| l <= crate::MAX_OFFSET)
                .ok_or_else(|| StorageError::OffsetOverflow { dir: self.dir.clone(), offset: next })?;
            let mut prefix = [0u8; CRC_START];
            prefix.copy_from_slice(&batch[..CRC_START]);
            batch::set_base_offset(&mut prefix, next);
            batch::set_epoch(&mut prefix, epoch);
            prefixes.push(prefix);
            metas.push(BatchMeta {
                pos: 0,
                len: batch.len() as u64,
                base: next,
                last,
                max_timestamp: header.max_timestamp,
                epoch,
            });
            next = last + 1;
        }
        let parts: Vec<&[u8]> =
            prefixes.iter().zip(batches).flat_map(|(p, b)| [p.as_slice(), &b[CRC_START..]]).collect();
        self.write_batches(&mut w, &parts, &metas, caller)?;
        Ok(metas
            .iter()
            .map(|m| AppendInfo { base_offset: m.base, last_offset: m.last, epoch, log_end_offset: next })
            .collect())
    }

    /// Writes one verified batch whose offsets start at the log end (see [`LogCore::write_batches`]).
    pub(crate) fn write_batch(&self, w: &mut Writer, parts: &[&[u8]], meta: BatchMeta, caller: Caller) -> Result<()> {
        self.write_batches(w, parts, &[meta], caller)
    }

    /// Writes verified batches whose offsets run on from the log end, back to back, with one write: rolls first if
    /// the active segment is full or old, records new epochs in the history, writes, indexes, publishes all of them
    /// at once, and applies the flush policy (the async byte threshold only for a [`Caller::Plain`]). `parts` are
    /// the batches' bytes in order; `metas` say where each batch starts and ends in offsets (their `pos` is set
    /// here). A write that fails part-way is taken back whole, so the log holds all of the batches or none.
    pub(crate) fn write_batches(
        &self,
        w: &mut Writer,
        parts: &[&[u8]],
        metas: &[BatchMeta],
        caller: Caller,
    ) -> Result<()> {
        let (Some(first), Some(final_meta)) = (metas.first(), metas.last()) else { return Ok(()) };
        let total: u64 = metas.iter().map(|m| m.len).sum();
        let now = self.clock.now_ms();
        let (roll, config) = {
            let st = self.state.read();
            let active = st.segments.last().ok_or_else(|| self.closed_error())?;
            let age_limit = i64::try_from(st.config.segment_ms).unwrap_or(i64::MAX);
            let roll = !active.is_empty()
                && (active.size + total > st.config.segment_bytes
                    || active.created_ms.is_some_and(|c| now.saturating_sub(c) >= age_limit)
                    || active.size + total > u64::from(u32::MAX)
                    || final_meta.last - active.base > u64::from(u32::MAX));
            (roll, st.config.clone())
        };
        if roll {
            self.roll(w, first.base)?;
        }
        for meta in metas {
            self.note_epoch(meta.epoch, meta.base)?;
        }
        let (file, pos, path, segment_base) = {
            let st = self.state.read();
            let active = st.segments.last().ok_or_else(|| self.closed_error())?;
            (active.file.get()?, active.size, active.log_path.clone(), active.base)
        };
        if let Some(problem) = &w.poisoned {
            return Err(StorageError::Io { path, source: std::io::Error::other(problem.clone()) });
        }
        let written = file.append(parts).and_then(|()| match config.flush {
            FlushPolicy::Sync => file.sync_data(),
            FlushPolicy::Async { .. } => Ok(()),
        });
        if let Err(source) = written {
            // Take back whatever part of the batches reached the file, so the next append lands at `pos`.
            if let Err(e) = file.set_len(pos) {
                w.poisoned = Some(format!(
                    "a failed append could not be undone ({e}); the file is longer than the log: reopen the log"
                ));
            }
            return Err(StorageError::Io { path, source });
        }
        let mut entries = Vec::new();
        let mut at = pos;
        for meta in metas {
            let meta = BatchMeta { pos: at, ..*meta };
            if index::should_index(w.last_index_pos, at, config.index_interval_bytes)
                && let Some(entry) = index::entry_for(segment_base, &meta)
            {
                entries.push(entry);
                w.index_pending.extend_from_slice(&entry.encode());
                w.last_index_pos = at;
            }
            at += meta.len;
        }
        {
            let mut st = self.state.write();
            let active = st.segments.last_mut().ok_or_else(|| self.closed_error())?;
            active.size = pos + total;
            active.next_offset = final_meta.last + 1;
            let newest = metas.iter().map(|m| m.max_timestamp).max().unwrap_or(i64::MIN);
            active.max_timestamp = active.max_timestamp.max(newest);
            active.created_ms.get_or_insert(now);
            active.appended_ms = Some(now);
            active.index.extend(entries);
        }
        match config.flush {
            FlushPolicy::Sync => {
                w.unflushed = 0;
                w.last_flush_ms = now;
                // Left over from an async period (the policy was changed): make it durable now, too.
                if (!w.sealed_unflushed.is_empty() || w.dir_unsynced)
                    && let Err(e) = self.flush_locked(w)
                {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "flush failed; will retry");
                }
            }
            FlushPolicy::Async { .. } => w.unflushed += total,
        }
        // The batches are in the log now: failures below are the index cache or an early fsync, which the next
        // flush retries, so they are reported in the log rather than failing an append that happened.
        if w.index_pending.len() >= INDEX_WRITE_BLOCK
            && let Err(e) = self.write_pending_index(w)
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "index write failed; will retry");
        }
        if let FlushPolicy::Async { bytes, .. } = config.flush
            && caller == Caller::Plain
            && w.unflushed >= bytes
            && let Err(e) = self.flush_locked(w)
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "flush failed; will retry");
        }
        Ok(())
    }

    /// Adds `(epoch, base)` to the history (durably, before the batch is written) when `epoch` is new.
    pub(crate) fn note_epoch(&self, epoch: u32, base: u64) -> Result<()> {
        let mut epochs = {
            let st = self.state.read();
            if !st.epochs.starts_new_epoch(epoch) {
                return Ok(());
            }
            st.epochs.clone()
        };
        epochs.history.push((epoch, base));
        epochs.store(&*self.fs, &self.dir)?;
        self.state.write().epochs = epochs;
        Ok(())
    }

    /// Writes collected index entries to the active index file.
    pub(crate) fn write_pending_index(&self, w: &mut Writer) -> Result<()> {
        if w.index_pending.is_empty() {
            return Ok(());
        }
        let path = self.state.read().segments.last().map(|s| s.index_path.clone()).unwrap_or_default();
        let file = w.index_file.as_mut().ok_or_else(|| StorageError::Closed { dir: self.dir.clone() })?;
        file.append(&[&w.index_pending]).map_err(LogCore::io_error(&path))?;
        w.index_pending.clear();
        Ok(())
    }

    /// fsyncs everything appended so far: segments sealed since the last flush, then the active segment (and
    /// writes pending index entries). Moves the recovery point up to the active segment.
    pub(crate) fn flush_locked(&self, w: &mut Writer) -> Result<()> {
        self.write_pending_index(w)?;
        if w.dir_unsynced {
            checkpoint::sync_dir(&*self.fs, &self.dir)?;
            w.dir_unsynced = false;
        }
        self.sync_sealed(&w.sealed_unflushed)?;
        w.sealed_unflushed.clear();
        let (file, path, active_base) = {
            let st = self.state.read();
            let active = st.segments.last().ok_or_else(|| self.closed_error())?;
            (active.file.get()?, active.log_path.clone(), active.base)
        };
        file.sync_data().map_err(LogCore::io_error(&path))?;
        w.unflushed = 0;
        w.last_flush_ms = self.clock.now_ms();
        self.set_recovery_point(w, active_base)
    }

    /// fsyncs everything appended before the call, as [`LogCore::flush_locked`] does, but holds the writer lock only
    /// to take stock and to record the result, not over the fsync: appends go on meanwhile, and their bytes are
    /// left for the next flush. Such flushes run one at a time.
    ///
    /// Only the common case runs unlocked: the active segment's data, with the recovery point already at the
    /// active segment. When segments were sealed or created since the last flush, it is [`LogCore::flush_locked`]:
    /// those files, the directory and the recovery point move together under the lock, so no flush ever records
    /// a point past a file that is not durable yet.
    pub(crate) fn flush_concurrently(&self) -> Result<()> {
        let _one_at_a_time = self.flushing.lock();
        let (file, path, taken) = {
            let mut w = self.writer.lock();
            if self.state.read().closed {
                return Err(self.closed_error());
            }
            let active_base = self.state.read().segments.last().map(|s| s.base);
            if !w.sealed_unflushed.is_empty() || w.dir_unsynced || active_base != Some(w.recovery_point) {
                return self.flush_locked(&mut w);
            }
            self.write_pending_index(&mut w)?;
            let st = self.state.read();
            let active = st.segments.last().ok_or_else(|| self.closed_error())?;
            (active.file.get()?, active.log_path.clone(), w.unflushed)
        };
        file.sync_data().map_err(LogCore::io_error(&path))?;
        let mut w = self.writer.lock();
        // What was appended meanwhile stays unflushed (a flush under the lock meanwhile may have counted it).
        w.unflushed = w.unflushed.saturating_sub(taken);
        w.last_flush_ms = self.clock.now_ms();
        Ok(())
    }

    /// fsyncs sealed segments' files (a segment removed since it was sealed has nothing left to sync).
    fn sync_sealed(&self, sealed: &[SealedFiles]) -> Result<()> {
        for sealed in sealed {
            let log = match sealed.log.get() {
                Err(StorageError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => continue,
                other => other?,
            };
            log.sync_data().map_err(LogCore::io_error(&sealed.log_path))?;
            match self.fs.open(&sealed.index_path, OpenMode::Existing) {
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                index => index.and_then(|i| i.sync_all()).map_err(LogCore::io_error(&sealed.index_path))?,
            }
        }
        Ok(())
    }

    /// Persists a new recovery point (every segment based below it is durable) if it changed.
    pub(crate) fn set_recovery_point(&self, w: &mut Writer, offset: u64) -> Result<()> {
        if w.recovery_point != offset {
            checkpoint::store_recovery_point(&*self.fs, &self.dir, offset)?;
            w.recovery_point = offset;
        }
        Ok(())
    }

    /// `Log::roll`.
    pub(crate) fn roll_now(&self) -> Result<bool> {
        let mut w = self.writer.lock();
        let (empty, leo) = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            (st.segments.last().is_none_or(Segment::is_empty), st.log_end())
        };
        if empty {
            return Ok(false);
        }
        self.roll(&mut w, leo)?;
        if !w.sealed_unflushed.is_empty() || w.dir_unsynced {
            self.flush_locked(&mut w)?;
        }
        Ok(true)
    }

    /// Seals the active segment and starts a new empty one at `new_base`.
    ///
    /// Under the sync policy the sealed segment is already durable (every append was fsynced). Under the async
    /// policy its fsync is left to the next flush, like any other unflushed bytes, so a roll does not stall the
    /// writer; until then the recovery point stays below it, and recovery after a crash checks it batch by batch.
    pub(crate) fn roll(&self, w: &mut Writer, new_base: u64) -> Result<()> {
        self.write_pending_index(w)?;
        let (old_file, old_log_path, old_index_path, sync) = {
            let st = self.state.read();
            let active = st.segments.last().ok_or_else(|| self.closed_error())?;
            let sync = matches!(st.config.flush, FlushPolicy::Sync);
            let mut sealed = active.file.clone();
            sealed.unpin();
            (sealed, active.log_path.clone(), active.index_path.clone(), sync)
        };
        let segment = Segment::create(&*self.fs, &self.files, &self.dir, new_base)?;
        // The new file's directory entry needs to be durable no sooner than its first bytes: at once under the
        // sync policy, with the next flush under the async one.
        if sync {
            checkpoint::sync_dir(&*self.fs, &self.dir)?;
        } else {
            w.dir_unsynced = true;
        }
        w.index_file = Some(index::open_append(&*self.fs, &segment.index_path)?);
        w.last_index_pos = 0;
        if !sync || !w.sealed_unflushed.is_empty() {
            w.sealed_unflushed.push(SealedFiles { log: old_file, log_path: old_log_path, index_path: old_index_path });
        }
        tracing::debug!(dir = %self.dir.display(), base = new_base, "rolled a new segment");
        {
            let mut st = self.state.write();
            if let Some(sealed) = st.segments.last_mut() {
                // Sealed: its file is no longer held open, only through the bounded cache.
                sealed.file.unpin();
            }
            st.segments.push(segment);
        }
        if w.sealed_unflushed.is_empty() {
            self.set_recovery_point(w, new_base)?;
        }
        Ok(())
    }

    /// Moves the log end up to `target` for a gap left by source retention: the next batch goes to a new segment
    /// based at `target`. An empty active segment is replaced rather than sealed; when it was the only one, the
    /// log is empty and its start simply moves.
    pub(crate) fn jump(&self, w: &mut Writer, target: u64) -> Result<()> {
        let active_empty = {
            let st = self.state.read();
            st.segments.last().ok_or_else(|| self.closed_error())?.is_empty()
        };
        if active_empty {
            // Create the new segment before removing the old one: a crash in between leaves an empty segment
            // that recovery discards, never a directory without segments.
            let segment = Segment::create(&*self.fs, &self.files, &self.dir, target)?;
            checkpoint::sync_dir(&*self.fs, &self.dir)?;
            w.index_file = Some(index::open_append(&*self.fs, &segment.index_path)?);
            w.index_pending.clear();
            w.last_index_pos = 0;
            let old = {
                let mut st = self.state.write();
                let old = st.segments.pop();
                st.segments.push(segment);
                old
            };
            if let Some(old) = old {
                old.remove_files(&*self.fs)?;
                checkpoint::sync_dir(&*self.fs, &self.dir)?;
            }
        } else {
            self.roll(w, target)?;
        }
        tracing::info!(dir = %self.dir.display(), log_end = target, "log end moved past a gap left by source retention");
        self.refresh_gaps()
    }

    /// Brings the gaps record in line with the segment layout (the layout is the truth) and persists it.
    pub(crate) fn refresh_gaps(&self) -> Result<()> {
        let gaps = {
            let st = self.state.read();
            let gaps = st.layout_gaps();
            if gaps == st.gaps {
                return Ok(());
            }
            gaps
        };
        checkpoint::store_gaps(&*self.fs, &self.dir, &gaps)?;
        self.state.write().gaps = gaps;
        Ok(())
    }
}
