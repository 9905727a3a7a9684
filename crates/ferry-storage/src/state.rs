//! What the parts of a log share: [`LogCore`], the log's fields, and the [`State`] and [`Writer`] behind its
//! locks. The parts (`append`, `offsets`, `read`, `maintenance`, `recovery`) work on a `LogCore`; the public
//! [`Log`](crate::Log) handle in `log` wraps one and is the only module that depends on them all.
//!
//! Concurrency: one `writer` mutex serialises every operation that changes the log; the segment list and
//! positions live in `state` behind a read-write lock that is held only to snapshot or publish, never across file
//! I/O. Readers pread on shared file handles they cloned under the lock, and see bytes only up to the committed
//! size, published after a batch is completely written. Operations that shrink or delete files (truncation,
//! retention) bump `generation`, so a reader that raced one retries instead of returning stale bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::recent::RecentRead;

use crate::checkpoint::EpochState;
use crate::clock::Clock;
use crate::fs::{FileRef, FsRef};
use crate::open_files::{OpenFiles, SegmentFile};
use crate::segment::Segment;
use crate::{LogConfig, StorageError};

/// One partition's log, as its parts see it: every field, and the helpers they all use.
pub(crate) struct LogCore {
    /// The partition directory.
    pub dir: PathBuf,
    /// Every file the log touches is reached through this.
    pub fs: FsRef,
    /// Segment age and the async flush interval are measured on this.
    pub clock: Arc<dyn Clock>,
    /// Serialises every operation that changes the log.
    pub writer: Mutex<Writer>,
    /// Serialises the flushes that fsync without holding `writer` (`LogCore::flush_concurrently`).
    pub flushing: Mutex<()>,
    /// What readers snapshot and the writer publishes.
    pub state: RwLock<State>,
    /// Bumped whenever bytes a reader may have located are removed or rewritten.
    pub generation: AtomicU64,
    /// The open files of sealed segments, at most `max_open_segments`.
    pub files: Arc<OpenFiles>,
    /// The last read, for the next reader asking the same (see `recent`).
    pub recent: RecentRead,
}

impl LogCore {
    /// A core over freshly opened state (its generation starts at 0).
    pub fn new(parts: CoreParts) -> LogCore {
        let CoreParts { dir, fs, clock, files, writer, state } = parts;
        LogCore {
            dir,
            fs,
            clock,
            writer: Mutex::new(writer),
            flushing: Mutex::new(()),
            state: RwLock::new(state),
            generation: AtomicU64::new(0),
            files,
            recent: RecentRead::default(),
        }
    }

    /// The error of an operation on a closed log.
    pub fn closed_error(&self) -> StorageError {
        StorageError::Closed { dir: self.dir.clone() }
    }

    /// Maps an I/O error on `path` to a `StorageError` naming it.
    pub fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
        move |source| StorageError::Io { path: path.to_path_buf(), source }
    }

    /// Tells racing readers that bytes they may have located are gone.
    pub fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The generation a reader compares before and after its preads.
    pub fn current_generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// What a [`LogCore`] is made of (recovery assembles them).
pub(crate) struct CoreParts {
    pub dir: PathBuf,
    pub fs: FsRef,
    pub clock: Arc<dyn Clock>,
    pub files: Arc<OpenFiles>,
    pub writer: Writer,
    pub state: State,
}

/// What readers snapshot and the writer publishes.
#[derive(Debug)]
pub(crate) struct State {
    /// Set by `close()`/`delete()`.
    pub closed: bool,
    /// Current configuration.
    pub config: LogConfig,
    /// Segments ascending by base offset; the last is the active one. Never empty while open.
    pub segments: Vec<Segment>,
    /// Current epoch and history (persisted in the epoch checkpoint).
    pub epochs: EpochState,
    /// Offset ranges skipped by gap appends (persisted in the gaps record).
    pub gaps: Vec<(u64, u64)>,
    /// (log start, log end) as they were at close, so getters keep answering.
    pub closed_range: (u64, u64),
}

impl State {
    /// First offset held.
    pub fn log_start(&self) -> u64 {
        self.segments.first().map_or(self.closed_range.0, |s| s.base)
    }

    /// One past the last offset held.
    pub fn log_end(&self) -> u64 {
        self.segments.last().map_or(self.closed_range.1, |s| s.next_offset)
    }

    /// Gaps as the segment layout shows them: where a segment starts above the end of the one before it.
    pub fn layout_gaps(&self) -> Vec<(u64, u64)> {
        self.segments
            .windows(2)
            .filter(|w| w[1].base > w[0].next_offset)
            .map(|w| (w[0].next_offset, w[1].base))
            .collect()
    }
}

/// State only the writer touches (guarded by the writer mutex).
#[derive(Debug)]
pub(crate) struct Writer {
    /// The active segment's index file, opened for appending; `None` once closed.
    pub index_file: Option<FileRef>,
    /// Encoded index entries not yet written to `index_file`.
    pub index_pending: Vec<u8>,
    /// Position of the active segment's last index entry (0 when none).
    pub last_index_pos: u64,
    /// Bytes appended since the last fsync.
    pub unflushed: u64,
    /// Clock time of the last fsync.
    pub last_flush_ms: i64,
    /// Set when a failed append could not be undone; appends are refused until the log is reopened.
    pub poisoned: Option<String>,
    /// Segments sealed under the async policy and not fsynced yet (the next flush does it).
    pub sealed_unflushed: Vec<SealedFiles>,
    /// The persisted recovery point: every segment based below it is durable.
    pub recovery_point: u64,
    /// A segment file was created under the async policy and the directory not fsynced yet (the next flush does).
    pub dir_unsynced: bool,
}

/// The files of a sealed segment awaiting its fsync. They are not held open (a burst of rolls would hold a file
/// per segment): the flush reopens them, and an fsync through any handle makes the file durable.
#[derive(Debug)]
pub(crate) struct SealedFiles {
    /// The `.log` file (reached through the log's cache of open files).
    pub log: SegmentFile,
    /// Its path.
    pub log_path: PathBuf,
    /// The `.index` file.
    pub index_path: PathBuf,
}
