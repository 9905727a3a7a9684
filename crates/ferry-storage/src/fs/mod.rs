//! The file layer under the log: every byte the storage engine reads or writes, and every directory entry it
//! creates, renames or removes, goes through [`FileSystem`] and [`FsFile`].
//!
//! Two implementations:
//! - [`OsFs`], the real one: `std::fs` and `pread`/`writev`/`fdatasync` on Unix files. Production uses it.
//! - [`SimFs`], for tests: an in-memory file system that keeps what has been made durable (fsynced data,
//!   fsynced directory entries) apart from what has only been written. [`SimFs::power_loss`] drops the unsynced
//!   part the way a power cut does (whole pages, an arbitrary tail of each file, directory entries that were
//!   never synced), and cuts off every handle the "crashed" process still holds. It can also run out of space.
//!
//! The contract the engine relies on (POSIX's, which `SimFs` holds it to):
//! - file data and size are durable only after `sync_data`/`sync_all` on that file;
//! - a created, renamed or removed directory entry is durable only after [`FileSystem::sync_dir`] of the
//!   directory that holds it; a new directory's own entry needs its parent synced;
//! - a write that fails may have written a prefix of what was asked.

mod journal;
mod os;
mod sim;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use journal::{DISK_FULL_FLAG_VAR, Dropped, JournalFs, SYNC_JOURNAL_VAR, drop_unsynced};
pub use os::OsFs;
pub use sim::{PowerLoss, SimFs};

/// How [`FileSystem::open`] opens a file. Every handle can read at any position and append at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create a new file; fail with `AlreadyExists` if the name is taken.
    CreateNew,
    /// Open the file, creating it empty if it does not exist.
    Create,
    /// Create the file, or empty it if it exists.
    CreateTruncate,
    /// Open an existing file; fail with `NotFound` if there is none.
    Existing,
}

/// An open file.
pub trait FsFile: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `pos`, returning how many were read (0 at or past the end).
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;

    /// Appends all of `parts` at the end of the file, in order. On error a prefix may have been written.
    fn append(&self, parts: &[&[u8]]) -> io::Result<()>;

    /// Cuts or extends (with zeros) the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes the file's data and size durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;

    /// Makes the file's data and metadata durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;

    /// Current size in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Creation time in ms since the Unix epoch, where the file system records one.
    fn created_ms(&self) -> Option<i64>;

    /// Last modification time in ms since the Unix epoch, where the file system records one.
    fn modified_ms(&self) -> Option<i64> {
        None
    }

    /// Reads exactly `buf.len()` bytes at `pos`.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_at(&mut buf[done..], pos + done as u64) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("file ends before byte {}", pos + buf.len() as u64),
                    ));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads exactly `len` bytes at `pos` into a new buffer (implementations may skip zeroing it).
    fn read_vec_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, pos)?;
        Ok(buf)
    }
}

/// A shared open file.
pub type FileRef = Arc<dyn FsFile>;

/// Directory-level operations.
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Opens a file (see [`OpenMode`]).
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef>;

    /// Creates a directory and any missing parents. The new entries are durable only after their parents are
    /// synced ([`sync_new_dirs`] does both).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Names of the entries of a directory, in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>>;

    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> io::Result<bool>;

    /// Whether `path` is a directory.
    fn is_dir(&self, path: &Path) -> io::Result<bool>;

    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Renames a file or directory, replacing a file at `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes the entries of a directory durable (creations, renames and removals inside it).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Takes an exclusive lock on the file at `path` (created if missing), held until the guard is dropped or the
    /// process ends. Fails with `WouldBlock` while another holder has it.
    fn lock_exclusive(&self, path: &Path) -> io::Result<LockGuard>;

    /// Reads a whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let file = self.open(path, OpenMode::Existing)?;
        let len = usize::try_from(file.len()?).map_err(|_| io::Error::other("file too large to read whole"))?;
        file.read_vec_at(0, len)
    }
}

/// A held lock from [`FileSystem::lock_exclusive`]; dropping it releases the lock.
pub struct LockGuard(#[allow(dead_code)] Box<dyn Send + Sync>);

impl LockGuard {
    /// Wraps whatever keeps the lock held.
    pub fn new(holder: impl Send + Sync + 'static) -> LockGuard {
        LockGuard(Box::new(holder))
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LockGuard")
    }
}

/// The shared file system handle the engine holds.
pub type FsRef = Arc<dyn FileSystem>;

/// The real file system.
pub fn os() -> FsRef {
    Arc::new(OsFs)
}

/// Creates `dir` and its missing parents, then makes every new entry durable: each directory created here is
/// synced into its parent, from the top down. Directories that already existed are left as they are.
pub fn sync_new_dirs(fs: &dyn FileSystem, dir: &Path) -> io::Result<()> {
    let mut missing: Vec<PathBuf> = Vec::new();
    let mut cur = Some(dir);
    while let Some(p) = cur {
        if p.as_os_str().is_empty() || fs.exists(p)? {
            break;
        }
        missing.push(p.to_path_buf());
        cur = p.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    fs.create_dir_all(dir)?;
    for p in missing.iter().rev() {
        if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs.sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Replaces `path` with `contents` atomically and durably: a temp file beside it (`NAME.tmp`), written and
/// fsynced, renamed over `path`, then the directory fsynced. A reader sees the old or the new file, never a torn
/// one.
pub fn write_atomic(fs: &dyn FileSystem, path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let file = fs.open(&tmp, OpenMode::CreateTruncate)?;
    file.append(&[contents])?;
    file.sync_all()?;
    drop(file);
    fs.rename(&tmp, path)?;
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => fs.sync_dir(dir),
        None => fs.sync_dir(Path::new(".")),
    }
}

/// Reads a whole file, `None` when it does not exist.
pub fn read_optional(fs: &dyn FileSystem, path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs.read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes a file; a missing one is fine (the goal is that it is gone).
pub fn remove_if_exists(fs: &dyn FileSystem, path: &Path) -> io::Result<()> {
    match fs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Suffix of files being replaced atomically by [`write_atomic`]; leftovers are removed on open.
pub const TMP_SUFFIX: &str = ".tmp";
