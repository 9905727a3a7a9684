//! One segment: a `.log` file of whole batches back to back and its sparse `.index`.
//!
//! Invariants of a segment:
//! - its file name is its base offset, 20 digits, and its first batch (if any) starts at that offset;
//! - batches are contiguous: each starts at the previous batch's last offset + 1;
//! - `size` is the committed length: readers never look past it, and the writer publishes a new size only after
//!   the batch is completely written;
//! - relative offsets and positions fit in `u32` (the writer rolls before they would not).
//!
//! This module also holds the two scans over a segment: a header walk (one 61-byte pread per batch, no CRC) and a
//! verifying walk (sequential chunked reads, every CRC checked) used for the tail of an uncleanly closed log.

use std::path::{Path, PathBuf};

use ferry_batch::{self as batch, BatchError, BatchHeader, HEADER_LEN};

use std::sync::Arc;

use crate::fs::{FileSystem, FsFile, OpenMode};
use crate::index::IndexEntry;
use crate::open_files::{OpenFiles, SegmentFile};
use crate::types::BatchMeta;
use crate::{Result, StorageError};

/// Suffix of segment data files.
pub(crate) const LOG_SUFFIX: &str = ".log";
/// Suffix of segment index files.
pub(crate) const INDEX_SUFFIX: &str = ".index";

/// Read size of the verifying walk.
const WALK_CHUNK: usize = 1024 * 1024;

/// `{base:020}.log`
pub(crate) fn log_file_name(base: u64) -> String {
    format!("{base:020}{LOG_SUFFIX}")
}

/// `{base:020}.index`
pub(crate) fn index_file_name(base: u64) -> String {
    format!("{base:020}{INDEX_SUFFIX}")
}

/// What a directory entry is to the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A segment's data file.
    Log(u64),
    /// A segment's index file.
    Index(u64),
}

/// Classifies a file name: `None` for names that are not segment files, `Some(Err(reason))` for names that look
/// like segment files but are malformed.
pub(crate) fn parse_file_name(name: &str) -> Option<std::result::Result<FileKind, String>> {
    let (stem, is_log) = if let Some(stem) = name.strip_suffix(LOG_SUFFIX) {
        (stem, true)
    } else {
        (name.strip_suffix(INDEX_SUFFIX)?, false)
    };
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Err(format!("segment file names are a 20-digit base offset, got \"{name}\"")));
    }
    match stem.parse::<u64>() {
        Ok(base) => Some(Ok(if is_log { FileKind::Log(base) } else { FileKind::Index(base) })),
        Err(_) => Some(Err(format!("base offset in \"{name}\" does not fit in 64 bits"))),
    }
}

/// A segment as the log holds it in memory.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Base offset (the file name).
    pub base: u64,
    /// The `.log` file.
    pub log_path: PathBuf,
    /// The `.index` file.
    pub index_path: PathBuf,
    /// The `.log` file: held open while the segment is active, opened on demand (through the log's bounded
    /// cache) once it is sealed. Readers pread on their own clone of the handle.
    pub file: SegmentFile,
    /// Committed bytes.
    pub size: u64,
    /// One past the last offset held; `base` when empty.
    pub next_offset: u64,
    /// Largest record timestamp held; `i64::MIN` when empty.
    pub max_timestamp: i64,
    /// The sparse index, complete for the committed bytes.
    pub index: Vec<IndexEntry>,
    /// Wall-clock time of the first append, for `segment_ms` (see `recovery` for reopened segments).
    pub created_ms: Option<i64>,
    /// Wall-clock time of the last append, for time retention capped at append time (a reopened segment takes
    /// its file's modification time where the file system records it, else the time it was opened).
    pub appended_ms: Option<i64>,
}

impl Segment {
    /// Creates a new empty segment's files in `dir`.
    pub fn create(fs: &dyn FileSystem, files: &Arc<OpenFiles>, dir: &Path, base: u64) -> Result<Segment> {
        let log_path = dir.join(log_file_name(base));
        let index_path = dir.join(index_file_name(base));
        let file = fs
            .open(&log_path, OpenMode::CreateNew)
            .map_err(|source| StorageError::Io { path: log_path.clone(), source })?;
        fs.open(&index_path, OpenMode::CreateTruncate)
            .map_err(|source| StorageError::Io { path: index_path.clone(), source })?;
        Ok(Segment {
            base,
            file: SegmentFile::pinned(log_path.clone(), file, files),
            log_path,
            index_path,
            size: 0,
            next_offset: base,
            max_timestamp: i64::MIN,
            index: Vec::new(),
            created_ms: None,
            appended_ms: None,
        })
    }

    /// Whether the segment holds no batch.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Position to start scanning at for `offset`.
    pub fn scan_start(&self, offset: u64) -> u64 {
        crate::index::lookup(&self.index, self.base, offset)
    }

    /// Removes both files (missing files are fine: the goal is that they are gone).
    pub fn remove_files(mut self, fs: &dyn FileSystem) -> Result<()> {
        self.file.forget();
        for path in [&self.log_path, &self.index_path] {
            crate::fs::remove_if_exists(fs, path).map_err(|source| StorageError::Io { path: path.clone(), source })?;
        }
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes at `pos`.
pub(crate) fn read_exact_at(file: &dyn FsFile, path: &Path, buf: &mut [u8], pos: u64) -> Result<()> {
    file.read_exact_at(buf, pos).map_err(|source| StorageError::Io { path: path.to_path_buf(), source })
}

/// Why a walk stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WalkStop {
    /// Position of the bad batch.
    pub pos: u64,
    /// The offset the bad batch should have started at.
    pub expected_offset: u64,
    /// What was wrong.
    pub error: BatchError,
}

impl WalkStop {
    /// The `CorruptSegment` error for this stop in `file`.
    pub fn into_error(self, file: &Path) -> StorageError {
        StorageError::CorruptSegment {
            file: file.to_path_buf(),
            position: self.pos,
            offset: Some(self.expected_offset),
            source: self.error,
        }
    }
}

/// Result of a walk: the good batches, and where and why it stopped early (if it did).
pub(crate) type Walk = (Vec<BatchMeta>, Option<WalkStop>);

fn chain_error(header: &BatchHeader, expected: u64, segment_base: u64) -> Option<BatchError> {
    if header.base_offset != expected {
        return Some(BatchError::Malformed { what: "base offset does not follow the previous batch", position: 0 });
    }
    if header.last_offset().checked_sub(segment_base).is_none_or(|rel| rel > u64::from(u32::MAX))
        || header.last_offset() == u64::MAX
    {
        return Some(BatchError::Malformed { what: "offset too far from the segment base", position: 23 });
    }
    None
}

/// Walks the chain of batch headers of a segment, one pread per batch, from position 0 to `end`. Checks each
/// header, that batches are whole and contiguous in offsets, and that the last one ends exactly at `end`; CRCs are
/// not checked.
pub(crate) fn walk_headers(file: &dyn FsFile, path: &Path, segment_base: u64, end: u64) -> Result<Walk> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    let mut expected = segment_base;
    let mut buf = [0u8; HEADER_LEN];
    while pos < end {
        let stop = |error| Some(WalkStop { pos, expected_offset: expected, error });
        let left = end - pos;
        if left < HEADER_LEN as u64 {
            return Ok((out, stop(BatchError::Truncated { needed: HEADER_LEN, available: left as usize })));
        }
        read_exact_at(file, path, &mut buf, pos)?;
        let header = match BatchHeader::parse(&buf) {
            Ok(h) => h,
            Err(error) => return Ok((out, stop(error))),
        };
        let total = header.total_len() as u64;
        if total > left {
            return Ok((out, stop(BatchError::Truncated { needed: total as usize, available: left as usize })));
        }
        if header.record_count == 0 {
            return Ok((out, stop(BatchError::Empty)));
        }
        if let Some(error) = chain_error(&header, expected, segment_base) {
            return Ok((out, stop(error)));
        }
        out.push(BatchMeta::from_header(pos, &header));
        expected = header.next_offset();
        pos += total;
    }
    Ok((out, None))
}

/// Walks every batch of a segment from position 0 to `end` with sequential reads, verifying each fully (header,
/// whole batch, CRC, record count) and that offsets are contiguous.
pub(crate) fn walk_verified(file: &dyn FsFile, path: &Path, segment_base: u64, end: u64) -> Result<Walk> {
    walk_verified_from(file, path, segment_base, 0, segment_base, end)
}

/// [`walk_verified`], but past batches that fail only their CRC when valid batches follow that continue their
/// offsets: those are kept (reads of them fail, as in a sealed segment) and the walk goes on. A batch that fails
/// its CRC with nothing valid after it is a torn tail and stops the walk, as do framing errors.
pub(crate) fn walk_verified_past_corruption(
    file: &dyn FsFile,
    path: &Path,
    segment_base: u64,
    end: u64,
) -> Result<Walk> {
    let (mut out, mut stop) = walk_verified(file, path, segment_base, end)?;
    while let Some(s) = &stop {
        if !matches!(s.error, BatchError::CrcMismatch { .. }) {
            break;
        }
        // The walk parsed this header and found the whole batch in the file before the CRC check failed.
        let mut buf = [0u8; HEADER_LEN];
        read_exact_at(file, path, &mut buf, s.pos)?;
        let header = BatchHeader::parse(&buf).map_err(|source| StorageError::CorruptSegment {
            file: path.to_owned(),
            position: s.pos,
            offset: Some(s.expected_offset),
            source,
        })?;
        let next = s.pos + header.total_len() as u64;
        let (more, more_stop) = walk_verified_from(file, path, segment_base, next, header.next_offset(), end)?;
        if header.base_offset != s.expected_offset || more.is_empty() {
            break;
        }
        out.push(BatchMeta::from_header(s.pos, &header));
        out.extend(more);
        stop = more_stop;
    }
    Ok((out, stop))
}

/// [`walk_verified`] from position `start`, where the batch starting at offset `expected` lies.
fn walk_verified_from(
    file: &dyn FsFile,
    path: &Path,
    segment_base: u64,
    start: u64,
    expected: u64,
    end: u64,
) -> Result<Walk> {
    let mut out = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_start = 0u64;
    let mut pos = start;
    let mut expected = expected;
    // Makes `buf` hold [pos, pos + need) (need <= end - pos), reading ahead in large chunks.
    let fill = |buf: &mut Vec<u8>, buf_start: &mut u64, pos: u64, need: u64| -> Result<()> {
        if pos >= *buf_start && pos + need <= *buf_start + buf.len() as u64 {
            return Ok(());
        }
        let len = need.max(WALK_CHUNK as u64).min(end - pos) as usize;
        buf.clear();
        buf.resize(len, 0);
        *buf_start = pos;
        read_exact_at(file, path, buf, pos)
    };
    while pos < end {
        let stop = |error| WalkStop { pos, expected_offset: expected, error };
        let left = end - pos;
        if left < HEADER_LEN as u64 {
            return Ok((out, Some(stop(BatchError::Truncated { needed: HEADER_LEN, available: left as usize }))));
        }
        fill(&mut buf, &mut buf_start, pos, HEADER_LEN as u64)?;
        let at = (pos - buf_start) as usize;
        let header = match BatchHeader::parse(&buf[at..]) {
            Ok(h) => h,
            Err(error) => return Ok((out, Some(stop(error)))),
        };
        let total = header.total_len() as u64;
        if total > left {
            let error = BatchError::Truncated { needed: total as usize, available: left as usize };
            return Ok((out, Some(stop(error))));
        }
        fill(&mut buf, &mut buf_start, pos, total)?;
        let at = (pos - buf_start) as usize;
        if let Err(error) = batch::verify(&buf[at..at + total as usize]) {
            return Ok((out, Some(stop(error))));
        }
        if let Some(error) = chain_error(&header, expected, segment_base) {
            return Ok((out, Some(stop(error))));
        }
        out.push(BatchMeta::from_header(pos, &header));
        expected = header.next_offset();
        pos += total;
    }
    Ok((out, None))
}

/// Calls `f(position, header)` for each batch from `start` (a batch boundary) up to `end`, reading headers only,
/// until `f` returns `false`. A header that does not parse, or a batch running past `end`, is `CorruptSegment`.
pub(crate) fn scan_headers(
    file: &dyn FsFile,
    path: &Path,
    start: u64,
    end: u64,
    f: &mut dyn FnMut(u64, &BatchHeader) -> bool,
) -> Result<()> {
    let mut pos = start;
    let mut buf = [0u8; HEADER_LEN];
    let mut prev_next: Option<u64> = None;
    while pos < end {
        let corrupt = |source| StorageError::CorruptSegment {
            file: path.to_path_buf(),
            position: pos,
            offset: prev_next,
            source,
        };
        let left = end - pos;
        if left < HEADER_LEN as u64 {
            return Err(corrupt(BatchError::Truncated { needed: HEADER_LEN, available: left as usize }));
        }
        read_exact_at(file, path, &mut buf, pos)?;
        let header = BatchHeader::parse(&buf).map_err(corrupt)?;
        let total = header.total_len() as u64;
        if total > left {
            return Err(StorageError::CorruptSegment {
                file: path.to_path_buf(),
                position: pos,
                offset: Some(header.base_offset),
                source: BatchError::Truncated { needed: total as usize, available: left as usize },
            });
        }
        if !f(pos, &header) {
            return Ok(());
        }
        prev_next = Some(header.next_offset());
        pos += total;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_parse_strictly() {
        assert_eq!(parse_file_name("00000000000000000042.log"), Some(Ok(FileKind::Log(42))));
        assert_eq!(parse_file_name("00000000000000000042.index"), Some(Ok(FileKind::Index(42))));
        assert_eq!(parse_file_name("epoch.checkpoint"), None);
        assert_eq!(parse_file_name("readme.txt"), None);
        assert!(matches!(parse_file_name("42.log"), Some(Err(_))));
        assert!(matches!(parse_file_name("0000000000000000004x.index"), Some(Err(_))));
        assert!(matches!(parse_file_name("99999999999999999999.log"), Some(Err(_))));
        assert_eq!(log_file_name(7), "00000000000000000007.log");
    }
}
