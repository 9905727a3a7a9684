//! The bounded set of open sealed-segment files.
//!
//! The active segment's `.log` file stays open (every append writes to it). A sealed segment's file is opened on
//! demand, when a read, a scan or a truncation needs it, and kept in a small least-recently-used cache of
//! [`LogConfig::max_open_segments`](crate::LogConfig::max_open_segments) files per log; the least recently used
//! one is closed when another is opened past the limit. So the file descriptors a log holds are bounded however
//! its segments roll (sparse mirrored batches, a short `segment_ms`, small segments): the cache and the active
//! segment's two files, plus the handles readers hold for the length of one read. Sealed segments awaiting their
//! fsync under the async policy are remembered by path and reopened by the flush.
//!
//! A reader that resolved a handle keeps it (an `Arc`) for its read even if the cache evicts it meanwhile, so an
//! eviction never fails a read. Removing a segment's files evicts its handle first, so a later segment with the
//! same base (after a truncation) never gets the removed file's handle.
//!
//! The cache is a `VecDeque` scanned linearly: it holds a handful of entries, and a scan of a few paths is cheaper
//! than the hashing and linking of a general LRU crate (none is in the workspace).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::fs::{FileRef, FsRef, OpenMode};
use crate::{Result, StorageError};

/// One log's cache of open sealed-segment files.
#[derive(Debug)]
pub(crate) struct OpenFiles {
    fs: FsRef,
    inner: Mutex<Lru>,
}

#[derive(Debug)]
struct Lru {
    capacity: usize,
    /// Least recently used first.
    entries: VecDeque<(PathBuf, FileRef)>,
}

impl Lru {
    fn trim(&mut self) {
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
    }
}

impl OpenFiles {
    /// An empty cache of at most `capacity` files (at least 1).
    pub fn new(fs: FsRef, capacity: usize) -> Arc<OpenFiles> {
        Arc::new(OpenFiles { fs, inner: Mutex::new(Lru { capacity: capacity.max(1), entries: VecDeque::new() }) })
    }

    /// Changes the limit, closing the least recently used files above it.
    pub fn set_capacity(&self, capacity: usize) {
        let mut lru = self.inner.lock();
        lru.capacity = capacity.max(1);
        lru.trim();
    }

    /// The open handle of `path`, opening the (existing) file if it is not cached.
    fn get(&self, path: &Path) -> Result<FileRef> {
        let mut lru = self.inner.lock();
        if let Some(i) = lru.entries.iter().position(|(p, _)| p == path) {
            let entry = lru.entries.remove(i).expect("the position was just found");
            let file = entry.1.clone();
            lru.entries.push_back(entry);
            return Ok(file);
        }
        // Opened under the cache's own lock (never the log's state lock), so two readers of one segment do not
        // both open it; an open is one short system call.
        let file = self
            .fs
            .open(path, OpenMode::Existing)
            .map_err(|source| StorageError::Io { path: path.to_path_buf(), source })?;
        lru.entries.push_back((path.to_path_buf(), file.clone()));
        lru.trim();
        Ok(file)
    }

    /// Caches an already open handle as the most recently used (a segment that was just sealed).
    fn insert(&self, path: &Path, file: FileRef) {
        let mut lru = self.inner.lock();
        lru.entries.retain(|(p, _)| p != path);
        lru.entries.push_back((path.to_path_buf(), file));
        lru.trim();
    }

    /// Closes the cached handle of `path`, if any.
    fn forget(&self, path: &Path) {
        self.inner.lock().entries.retain(|(p, _)| p != path);
    }

    /// Closes every cached handle (the log closed).
    pub fn clear(&self) {
        self.inner.lock().entries.clear();
    }

    /// Number of cached handles.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }
}

/// A segment's `.log` file: held open (pinned) while the segment is active, reached through the log's
/// [`OpenFiles`] once sealed. Cloning is cheap; a clone taken under the state lock resolves its handle after.
#[derive(Debug, Clone)]
pub(crate) struct SegmentFile {
    path: PathBuf,
    pinned: Option<FileRef>,
    cache: Arc<OpenFiles>,
}

impl SegmentFile {
    /// The file of the active segment, held open.
    pub fn pinned(path: PathBuf, file: FileRef, cache: &Arc<OpenFiles>) -> SegmentFile {
        SegmentFile { path, pinned: Some(file), cache: Arc::clone(cache) }
    }

    /// The file of a sealed segment, opened on demand.
    #[cfg(test)]
    pub fn sealed(path: PathBuf, cache: &Arc<OpenFiles>) -> SegmentFile {
        SegmentFile { path, pinned: None, cache: Arc::clone(cache) }
    }

    /// An open handle of the file.
    pub fn get(&self) -> Result<FileRef> {
        match &self.pinned {
            Some(file) => Ok(file.clone()),
            None => self.cache.get(&self.path),
        }
    }

    /// Stops holding the file open: the segment was sealed. Its handle goes to the cache as the most recent.
    pub fn unpin(&mut self) {
        if let Some(file) = self.pinned.take() {
            self.cache.insert(&self.path, file);
        }
    }

    /// Closes the file without caching it: a sealed segment found on open, which no one has asked to read yet.
    pub fn close(&mut self) {
        self.pinned = None;
    }

    /// Holds the file open again: the segment became the active one (a truncation cut the log back into it).
    pub fn pin(&mut self) -> Result<()> {
        if self.pinned.is_none() {
            let file = self.cache.get(&self.path)?;
            self.cache.forget(&self.path);
            self.pinned = Some(file);
        }
        Ok(())
    }

    /// Drops every handle of the file this log holds (before its removal).
    pub fn forget(&mut self) {
        self.pinned = None;
        self.cache.forget(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{FileSystem, SimFs};

    #[test]
    fn the_least_recently_used_file_is_closed_past_the_limit_and_reopened_on_demand() {
        let fs = Arc::new(SimFs::new());
        let dir = PathBuf::from("/p");
        fs.create_dir_all(&dir).unwrap();
        let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("{i}.log"))).collect();
        for (i, p) in paths.iter().enumerate() {
            fs.open(p, OpenMode::CreateNew).unwrap().append(&[format!("segment {i}").as_bytes()]).unwrap();
        }
        let cache = OpenFiles::new(fs.clone(), 2);
        let files: Vec<SegmentFile> = paths.iter().map(|p| SegmentFile::sealed(p.clone(), &cache)).collect();
        let read = |f: &SegmentFile| String::from_utf8(f.get().unwrap().read_vec_at(0, 9).unwrap()).unwrap();
        assert_eq!(read(&files[0]), "segment 0");
        assert_eq!(read(&files[1]), "segment 1");
        assert_eq!(read(&files[0]), "segment 0", "a hit makes 0 the most recent");
        assert_eq!(read(&files[2]), "segment 2", "evicts 1, the least recent");
        assert_eq!(cache.len(), 2);
        let held: Vec<PathBuf> = cache.inner.lock().entries.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(held, [paths[0].clone(), paths[2].clone()]);
        assert_eq!(read(&files[1]), "segment 1", "reopened on demand");
        cache.set_capacity(1);
        assert_eq!(cache.len(), 1);
        let mut last = files[3].clone();
        last.forget();
        let mut pinned = SegmentFile::pinned(paths[3].clone(), fs.open(&paths[3], OpenMode::Existing).unwrap(), &cache);
        pinned.unpin();
        assert_eq!(cache.inner.lock().entries.back().map(|(p, _)| p.clone()), Some(paths[3].clone()));
        pinned.pin().unwrap();
        assert_eq!(cache.len(), 0, "a pinned file is not in the cache");
        assert_eq!(read(&pinned), "segment 3");
        assert!(matches!(SegmentFile::sealed(dir.join("gone.log"), &cache).get(), Err(StorageError::Io { .. })));
    }
}
