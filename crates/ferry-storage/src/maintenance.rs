//! Operations that remove data: truncation to an offset, retention, and deleting the segments below an offset.
//!
//! Both hold the writer mutex and, while they change files, the state write lock: readers wait for them rather
//! than read a file being cut. They bump `generation` before touching any file, so a reader that snapshotted
//! earlier and read during the change retries.
//!
//! Crash safety comes from the order of the steps: truncation removes later segments from the last one down and
//! then cuts the segment holding the new end, so every intermediate state is a prefix of the log; a reset below
//! the log start creates the new empty segment before removing the old ones, and recovery discards an empty
//! segment that is not the last. The epoch history and the gaps record are brought in line after the files
//! (recovery does the same if a crash came first).

use crate::Result;
use crate::checkpoint;
use crate::index;
use crate::segment::{Segment, scan_headers, walk_headers};
use crate::state::{LogCore, Writer};

impl LogCore {
    /// `Log::truncate_to`.
    pub(crate) fn truncate(&self, offset: u64) -> Result<u64> {
        let mut w = self.writer.lock();
        let (log_start, log_end) = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            (st.log_start(), st.log_end())
        };
        if offset >= log_end {
            return Ok(log_end);
        }
        // Everything left after the cut must be durable before the recovery point can move down to it.
        self.flush_locked(&mut w)?;
        let new_end = if offset < log_start { self.reset_to(&mut w, offset)? } else { self.cut_at(&mut w, offset)? };
        let active_base = self.state.read().segments.last().map_or(new_end, |s| s.base);
        self.set_recovery_point(&mut w, active_base)?;
        let epochs = {
            let st = self.state.read();
            let mut epochs = st.epochs.clone();
            epochs.truncate_to(new_end).then_some(epochs)
        };
        if let Some(epochs) = epochs {
            epochs.store(&*self.fs, &self.dir)?;
            self.state.write().epochs = epochs;
        }
        self.refresh_gaps()?;
        tracing::info!(dir = %self.dir.display(), offset, log_end = new_end, "log truncated");
        Ok(new_end)
    }

    /// Empties the log and restarts it at `offset` (below the current log start).
    fn reset_to(&self, w: &mut Writer, offset: u64) -> Result<u64> {
        let segment = Segment::create(&*self.fs, &self.files, &self.dir, offset)?;
        checkpoint::sync_dir(&*self.fs, &self.dir)?;
        let index_file = index::open_append(&*self.fs, &segment.index_path)?;
        let mut st = self.state.write();
        self.bump_generation();
        let old = std::mem::replace(&mut st.segments, vec![segment]);
        w.index_file = Some(index_file);
        w.index_pending.clear();
        w.last_index_pos = 0;
        w.unflushed = 0;
        for seg in old.into_iter().rev() {
            seg.remove_files(&*self.fs)?;
        }
        drop(st);
        checkpoint::sync_dir(&*self.fs, &self.dir)?;
        Ok(offset)
    }

    /// Cuts the log at the batch boundary <= `offset` (log start <= offset < log end).
    fn cut_at(&self, w: &mut Writer, offset: u64) -> Result<u64> {
        let mut st = self.state.write();
        self.bump_generation();
        let idx = st.segments.partition_point(|s| s.base <= offset).saturating_sub(1);
        let (cut_pos, new_end) = {
            let seg = st.segments.get(idx).ok_or_else(|| self.closed_error())?;
            if offset >= seg.next_offset {
                // Inside the gap above this segment: the data below the gap stays.
                (seg.size, seg.next_offset)
            } else {
                let mut found = None;
                scan_headers(
                    &*seg.file.get()?,
                    &seg.log_path,
                    seg.scan_start(offset),
                    seg.size,
                    &mut |pos, header| {
                        if header.last_offset() >= offset {
                            found = Some((pos, header.base_offset));
                            return false;
                        }
                        true
                    },
                )?;
                found.unwrap_or((seg.size, seg.next_offset))
            }
        };
        for seg in st.segments.drain(idx + 1..).rev() {
            seg.remove_files(&*self.fs)?;
        }
        let seg = st.segments.get_mut(idx).ok_or_else(|| self.closed_error())?;
        // It is the active segment now (if it was sealed, its file is held open again).
        seg.file.pin()?;
        let file = seg.file.get()?;
        file.set_len(cut_pos).and_then(|()| file.sync_all()).map_err(LogCore::io_error(&seg.log_path))?;
        let (walked, stop) = walk_headers(&*file, &seg.log_path, seg.base, cut_pos)?;
        if let Some(stop) = stop {
            return Err(stop.into_error(&seg.log_path));
        }
        seg.index.retain(|e| u64::from(e.pos) < cut_pos);
        let index_len = (seg.index.len() * index::ENTRY_LEN) as u64;
        let index_file = index::open_append(&*self.fs, &seg.index_path)?;
        index_file
            .set_len(index_len)
            .and_then(|()| index_file.sync_all())
            .map_err(LogCore::io_error(&seg.index_path))?;
        seg.size = cut_pos;
        seg.next_offset = new_end;
        seg.max_timestamp = walked.iter().map(|b| b.max_timestamp).max().unwrap_or(i64::MIN);
        if seg.is_empty() {
            seg.created_ms = None;
            seg.appended_ms = None;
        }
        w.last_index_pos = seg.index.last().map_or(0, |e| u64::from(e.pos));
        w.index_file = Some(index_file);
        w.index_pending.clear();
        w.unflushed = 0;
        drop(st);
        checkpoint::sync_dir(&*self.fs, &self.dir)?;
        Ok(new_end)
    }

    /// `Log::delete_segments_before`.
    pub(crate) fn delete_before(&self, offset: u64) -> Result<usize> {
        let _w = self.writer.lock();
        let count = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            let sealed = st.segments.len().saturating_sub(1);
            st.segments[..sealed].iter().take_while(|s| s.next_offset <= offset).count()
        };
        if count == 0 {
            return Ok(0);
        }
        {
            let mut st = self.state.write();
            self.bump_generation();
            for seg in st.segments.drain(..count) {
                seg.remove_files(&*self.fs)?;
            }
            tracing::info!(dir = %self.dir.display(), deleted = count, log_start = st.log_start(), "deleted segments below an offset");
        }
        checkpoint::sync_dir(&*self.fs, &self.dir)?;
        self.refresh_gaps()?;
        Ok(count)
    }

    /// `Log::apply_retention`.
    pub(crate) fn retain(&self, now_ms: i64) -> Result<usize> {
        let _w = self.writer.lock();
        let count = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            let (by_bytes, by_time) = (st.config.retention_bytes, st.config.retention_ms);
            let cutoff = by_time.map(|ms| now_ms.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)));
            let mut total: u64 = st.segments.iter().map(|s| s.size).sum();
            let sealed = st.segments.len().saturating_sub(1);
            let mut count = 0;
            for seg in &st.segments[..sealed] {
                let too_big = by_bytes.is_some_and(|limit| total > limit);
                let age_from = if st.config.retention_caps_timestamps_at_append_time {
                    seg.max_timestamp.min(seg.appended_ms.unwrap_or(i64::MAX))
                } else {
                    seg.max_timestamp
                };
                let too_old = cutoff.is_some_and(|cutoff| age_from < cutoff);
                if !(too_big || too_old) {
                    break;
                }
                total -= seg.size;
                count += 1;
            }
            count
        };
        if count == 0 {
            return Ok(0);
        }
        {
            let mut st = self.state.write();
            self.bump_generation();
            for seg in st.segments.drain(..count) {
                seg.remove_files(&*self.fs)?;
            }
            tracing::info!(dir = %self.dir.display(), deleted = count, log_start = st.log_start(), "retention deleted segments");
        }
        checkpoint::sync_dir(&*self.fs, &self.dir)?;
        self.refresh_gaps()?;
        Ok(count)
    }
}
