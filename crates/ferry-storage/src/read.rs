//! The read side: reads of whole batches, timestamp lookup and header scans.
//!
//! A reader holds the state lock only to snapshot what it needs (a segment's file handle, its committed size and
//! the index position to start from); the file I/O runs after the lock is released, with `pread`, so readers never
//! stall the writer and never see bytes past the committed size. A reader that raced a truncation or a retention
//! (`generation` moved) retries with a fresh snapshot.

use std::path::PathBuf;

use bytes::Bytes;
use ferry_batch::{self as batch, BatchError, BatchHeader, BatchIter, HEADER_LEN};

use crate::fs::FileRef;
use crate::open_files::SegmentFile;
use crate::recent::Now;
use crate::segment::{read_exact_at, scan_headers};
use crate::state::LogCore;
use crate::types::ReadResult;
use crate::{Result, StorageError};

/// Attempts before a reader that keeps racing truncations gives up and returns what it got.
const MAX_READ_ATTEMPTS: usize = 16;

/// What a read needs from one segment, taken under the lock.
struct SegmentSnapshot {
    file: SegmentFile,
    path: PathBuf,
    /// Position to start scanning headers at (a batch boundary at or before the wanted batch).
    start: u64,
    /// Committed size.
    end: u64,
}

impl SegmentSnapshot {
    /// The segment with its file open (a sealed one's is opened now, after the state lock was released).
    fn open(&self) -> Result<OpenSegment<'_>> {
        Ok(OpenSegment { file: self.file.get()?, path: &self.path, start: self.start, end: self.end })
    }
}

/// A [`SegmentSnapshot`] whose file is open, for the length of one segment's I/O.
struct OpenSegment<'a> {
    file: FileRef,
    path: &'a PathBuf,
    start: u64,
    end: u64,
}

impl LogCore {
    /// Runs `f` until it completes without a concurrent truncation or retention having moved `generation`.
    fn with_retry<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let mut attempt = 0;
        loop {
            let generation = self.current_generation();
            let result = f();
            attempt += 1;
            if self.current_generation() == generation || attempt >= MAX_READ_ATTEMPTS {
                return result;
            }
        }
    }

    /// `Log::read`.
    pub(crate) fn read_batches(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        self.with_retry(|| self.read_once(offset, max_bytes))
    }

    /// `Log::read_shared`: the last shared read's answer when a fresh read would return the same batches (see
    /// `recent`), else a read of the segment file, kept for the next shared reader.
    pub(crate) fn read_batches_shared(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        let now = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            // The generation moves only under the state's write lock: this view is consistent.
            Now {
                generation: self.current_generation(),
                log_start_offset: st.log_start(),
                log_end_offset: st.log_end(),
                epoch: st.epochs.latest(),
            }
        };
        if let Some(kept) = self.recent.take(offset, max_bytes, &now) {
            return Ok(kept);
        }
        let result = self.read_batches(offset, max_bytes)?;
        if self.current_generation() == now.generation {
            self.recent.keep(offset, max_bytes, now.generation, &result);
        }
        Ok(result)
    }

    fn read_once(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        let (snapshot, log_start_offset, log_end_offset, epoch) = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            let (start, end) = (st.log_start(), st.log_end());
            if offset < start || offset > end {
                return Err(StorageError::OffsetOutOfRange {
                    dir: self.dir.clone(),
                    offset,
                    log_start: start,
                    log_end: end,
                });
            }
            // The first segment holding an offset >= `offset` (after a gap, the segment above it).
            let idx = st.segments.partition_point(|s| s.next_offset <= offset);
            let snapshot = st.segments.get(idx).map(|s| SegmentSnapshot {
                file: s.file.clone(),
                path: s.log_path.clone(),
                start: s.scan_start(offset),
                end: s.size,
            });
            (snapshot, start, end, st.epochs.latest())
        };
        let empty = ReadResult { batches: Bytes::new(), next_offset: offset, log_start_offset, log_end_offset, epoch };
        let Some(snapshot) = snapshot else { return Ok(empty) };
        let seg = snapshot.open()?;
        let Some((pos, header)) = find_batch(&seg, offset)? else { return Ok(empty) };
        let first_len = header.total_len() as u64;
        if first_len > seg.end - pos {
            return Err(StorageError::CorruptSegment {
                file: seg.path.clone(),
                position: pos,
                offset: Some(header.base_offset),
                source: BatchError::Truncated { needed: first_len as usize, available: (seg.end - pos) as usize },
            });
        }
        let want = max_bytes.min(seg.end - pos).max(first_len) as usize;
        let mut buf =
            seg.file.read_vec_at(pos, want).map_err(|source| StorageError::Io { path: seg.path.clone(), source })?;
        let mut used = 0usize;
        let mut next_offset = offset;
        for item in BatchIter::new(&buf) {
            // A batch cut by the end of the chunk (or anything unparsable after the first batch) ends this read;
            // the next read starts there and reports it if it is really corrupt.
            let Ok((header, bytes)) = item else { break };
            batch::verify(bytes).map_err(|source| StorageError::CorruptSegment {
                file: seg.path.clone(),
                position: pos + used as u64,
                offset: Some(header.base_offset),
                source,
            })?;
            used += bytes.len();
            next_offset = header.next_offset();
        }
        buf.truncate(used);
        Ok(ReadResult { batches: Bytes::from(buf), next_offset, log_start_offset, log_end_offset, epoch })
    }

    /// `Log::offset_for_timestamp`.
    pub(crate) fn lookup_timestamp(&self, timestamp_ms: i64) -> Result<Option<u64>> {
        self.with_retry(|| {
            let (segments, limit): (Vec<SegmentSnapshot>, usize) = {
                let st = self.state.read();
                if st.closed {
                    return Err(self.closed_error());
                }
                let limit = batch::decode_limit(st.config.max_batch_bytes);
                // Whole segments whose newest record is older are skipped without reading them.
                let segments = st
                    .segments
                    .iter()
                    .filter(|s| s.max_timestamp >= timestamp_ms && !s.is_empty())
                    .map(|s| SegmentSnapshot { file: s.file.clone(), path: s.log_path.clone(), start: 0, end: s.size })
                    .collect();
                (segments, limit)
            };
            for snapshot in &segments {
                let seg = &snapshot.open()?;
                let mut found = None;
                let mut failure = None;
                scan_headers(&*seg.file, seg.path, seg.start, seg.end, &mut |pos, header| {
                    if header.max_timestamp < timestamp_ms {
                        return true;
                    }
                    match first_record_at_or_after(seg, pos, header, timestamp_ms, limit) {
                        Ok(Some(offset)) => {
                            found = Some(offset);
                            false
                        }
                        // A header whose max timestamp overstates its records: keep looking.
                        Ok(None) => true,
                        Err(e) => {
                            failure = Some(e);
                            false
                        }
                    }
                })?;
                if let Some(e) = failure {
                    return Err(e);
                }
                if found.is_some() {
                    return Ok(found);
                }
            }
            Ok(None)
        })
    }

    /// `Log::for_each_batch_header`.
    pub(crate) fn scan_headers(&self, from_offset: u64, f: &mut dyn FnMut(&BatchHeader)) -> Result<()> {
        let generation = self.current_generation();
        let segments: Vec<SegmentSnapshot> = {
            let st = self.state.read();
            if st.closed {
                return Err(self.closed_error());
            }
            st.segments
                .iter()
                .filter(|s| s.next_offset > from_offset)
                .map(|s| SegmentSnapshot {
                    file: s.file.clone(),
                    path: s.log_path.clone(),
                    start: s.scan_start(from_offset),
                    end: s.size,
                })
                .collect()
        };
        for snapshot in &segments {
            let seg = match snapshot.open() {
                // A sealed segment is opened only now: if retention or a truncation removed it since the
                // snapshot, its headers are gone from the log too.
                Err(StorageError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound && self.current_generation() != generation =>
                {
                    continue;
                }
                other => other?,
            };
            scan_headers(&*seg.file, seg.path, seg.start, seg.end, &mut |_, header| {
                if header.last_offset() >= from_offset {
                    f(header);
                }
                true
            })?;
        }
        Ok(())
    }
}

/// The first batch in `seg` (from its scan start) whose last offset is >= `offset`.
fn find_batch(seg: &OpenSegment<'_>, offset: u64) -> Result<Option<(u64, BatchHeader)>> {
    let mut found = None;
    scan_headers(&*seg.file, seg.path, seg.start, seg.end, &mut |pos, header| {
        if header.last_offset() >= offset {
            found = Some((pos, *header));
            return false;
        }
        true
    })?;
    Ok(found)
}

/// Reads the batch at `pos` and returns the offset of its first record with a timestamp >= `timestamp_ms`.
fn first_record_at_or_after(
    seg: &OpenSegment<'_>,
    pos: u64,
    header: &BatchHeader,
    timestamp_ms: i64,
    decode_limit: usize,
) -> Result<Option<u64>> {
    let mut buf = vec![0u8; header.total_len().max(HEADER_LEN)];
    read_exact_at(&*seg.file, seg.path, &mut buf, pos)?;
    // The one place the log decodes record bodies: bounded, so a small batch cannot inflate without limit.
    let records = batch::decode_records_bounded(&buf, decode_limit).map_err(|source| StorageError::CorruptSegment {
        file: seg.path.clone(),
        position: pos,
        offset: Some(header.base_offset),
        source,
    })?;
    Ok(records.iter().find(|r| r.timestamp >= timestamp_ms).map(|r| r.offset))
}
