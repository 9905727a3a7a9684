//! [`OsFs`]: the real file system, through `std::fs` and positional I/O on Unix files.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{FileRef, FileSystem, FsFile, LockGuard, OpenMode};

/// The operating system's file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsFs;

/// A file of [`OsFs`]: opened for reading and `O_APPEND` writing.
#[derive(Debug)]
struct OsFile(File);

impl FsFile for OsFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.0.read_at(buf, pos)
    }

    fn append(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
        let mut bufs = &mut slices[..];
        let mut file = &self.0;
        while !bufs.is_empty() {
            match file.write_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn created_ms(&self) -> Option<i64> {
        epoch_ms(self.0.metadata().ok()?.created())
    }

    fn modified_ms(&self) -> Option<i64> {
        epoch_ms(self.0.metadata().ok()?.modified())
    }

    /// Skips zeroing the buffer: every read's buffer is handed to the caller, so none can be reused, and the
    /// memset is worth a tenth of a read's time.
    fn read_vec_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        while buf.len() < len {
            let at = pos + buf.len() as u64;
            let n = rustix::io::pread(&self.0, rustix::buffer::spare_capacity(&mut buf), at)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("file ends before byte {}", pos + len as u64),
                ));
            }
        }
        // The capacity may exceed `len`; bytes past it were never asked for.
        buf.truncate(len);
        Ok(buf)
    }
}

impl FileSystem for OsFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        let mut opts = OpenOptions::new();
        opts.read(true).append(true);
        match mode {
            OpenMode::CreateNew => opts.create_new(true),
            OpenMode::Create => opts.create(true),
            OpenMode::CreateTruncate => opts.create(true),
            OpenMode::Existing => &mut opts,
        };
        let file = opts.open(path)?;
        if mode == OpenMode::CreateTruncate {
            file.set_len(0)?;
        }
        Ok(Arc::new(OsFile(file)))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            match entry.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(raw) => tracing::warn!(
                    path = %path.join(&raw).display(),
                    "ignoring a file with a non-UTF-8 name"
                ),
            }
        }
        Ok(names)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(m.is_dir()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    /// `flock`: released by the kernel when the process ends, even by kill -9.
    fn lock_exclusive(&self, path: &Path) -> io::Result<LockGuard> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(LockGuard::new(file)),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A file time in ms since the Unix epoch, where the file system records it.
fn epoch_ms(time: io::Result<std::time::SystemTime>) -> Option<i64> {
    let since = time.ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
}
