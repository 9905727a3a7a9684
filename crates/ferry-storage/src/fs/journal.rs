//! [`JournalFs`]: the real file system, plus a journal of what was made durable, so that a test can cut the
//! power under a *real process*: kill it with SIGKILL (which keeps the page cache, so the journal is whole), then
//! [`drop_unsynced`] takes every file back to what its last sync made durable, and every directory back to the
//! entries its last directory sync made durable, as a power cut would. (In-process tests use [`super::SimFs`],
//! which also tears pages; this layer drops the unsynced bytes whole.)
//!
//! The journal is a text file of one record per line, appended after each operation succeeded:
//! - `S <len> <path>`: the file at `path` was synced at `len` bytes;
//! - `D <dir>\t<name>\t<name>...`: the directory was synced with these entries;
//! - `R <from>\t<to>`: a rename (what was durable at `from` is now known under `to`);
//! - `X <path>`: a removal (of a file, or of a directory and what it held).
//!
//! A broker runs on it when `FERRY_TEST_SYNC_JOURNAL` names the journal file (tests only). It can also play a full
//! disk: while the file `FERRY_TEST_DISK_FULL_FLAG` names exists, every append fails with `StorageFull`, as a
//! write to a full disk does.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{FileRef, FileSystem, FsFile, LockGuard, OpenMode, OsFs};

/// The environment variable that makes a broker run on a [`JournalFs`] writing to the file it names.
pub const SYNC_JOURNAL_VAR: &str = "FERRY_TEST_SYNC_JOURNAL";

/// The environment variable naming the file whose existence makes a broker's [`JournalFs`] act as a full disk.
pub const DISK_FULL_FLAG_VAR: &str = "FERRY_TEST_DISK_FULL_FLAG";

/// The real file system with a journal of what was made durable (see the module docs).
#[derive(Debug, Clone)]
pub struct JournalFs {
    journal: Option<Arc<Mutex<File>>>,
    full_flag: Option<PathBuf>,
}

impl JournalFs {
    /// Journals to `path` (appended to: a restarted process goes on with the same journal).
    pub fn open(path: &Path) -> io::Result<JournalFs> {
        JournalFs::with(Some(path), None)
    }

    /// Journals to `journal` when given, and acts as a full disk while `full_flag` exists.
    pub fn with(journal: Option<&Path>, full_flag: Option<PathBuf>) -> io::Result<JournalFs> {
        let journal = match journal {
            Some(p) => Some(Arc::new(Mutex::new(OpenOptions::new().create(true).append(true).open(p)?))),
            None => None,
        };
        Ok(JournalFs { journal, full_flag })
    }

    fn record(&self, line: String) -> io::Result<()> {
        // One write per record: a kill between records leaves whole lines.
        match &self.journal {
            Some(j) => j.lock().write_all(line.as_bytes()),
            None => Ok(()),
        }
    }

    fn full(&self) -> bool {
        self.full_flag.as_ref().is_some_and(|f| f.exists())
    }
}

#[derive(Debug)]
struct JournalFile {
    inner: FileRef,
    path: PathBuf,
    fs: JournalFs,
}

impl FsFile for JournalFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.inner.read_at(buf, pos)
    }

    fn append(&self, parts: &[&[u8]]) -> io::Result<()> {
        if self.fs.full() && parts.iter().any(|p| !p.is_empty()) {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left on device (a test's full disk)"));
        }
        self.inner.append(parts)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()?;
        self.fs.record(format!("S {} {}\n", self.inner.len()?, self.path.display()))
    }

    fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all()?;
        self.fs.record(format!("S {} {}\n", self.inner.len()?, self.path.display()))
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn created_ms(&self) -> Option<i64> {
        self.inner.created_ms()
    }

    fn modified_ms(&self) -> Option<i64> {
        self.inner.modified_ms()
    }

    fn read_vec_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        self.inner.read_vec_at(pos, len)
    }
}

impl FileSystem for JournalFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        let inner = OsFs.open(path, mode)?;
        Ok(Arc::new(JournalFile { inner, path: path.to_owned(), fs: self.clone() }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        OsFs.create_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        OsFs.read_dir(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        OsFs.exists(path)
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        OsFs.is_dir(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        OsFs.remove_file(path)?;
        self.record(format!("X {}\n", path.display()))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        OsFs.remove_dir_all(path)?;
        self.record(format!("X {}\n", path.display()))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        OsFs.rename(from, to)?;
        self.record(format!("R {}\t{}\n", from.display(), to.display()))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        OsFs.sync_dir(path)?;
        let mut names = OsFs.read_dir(path)?;
        names.sort();
        let mut line = format!("D {}", path.display());
        for n in names {
            line.push('\t');
            line.push_str(&n);
        }
        line.push('\n');
        self.record(line)
    }

    fn lock_exclusive(&self, path: &Path) -> io::Result<LockGuard> {
        OsFs.lock_exclusive(path)
    }
}

/// What [`drop_unsynced`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Files cut back to their synced length: (path, length before, length after).
    pub truncated: Vec<(PathBuf, u64, u64)>,
    /// Files and directories removed: created, or renamed into place, after their directory's last sync.
    pub removed: Vec<PathBuf>,
}

/// What the journal says is durable.
#[derive(Debug, Default)]
struct Durable {
    /// File path -> synced length.
    synced: BTreeMap<PathBuf, u64>,
    /// Directory -> the entries its last sync made durable.
    entries: BTreeMap<PathBuf, BTreeSet<String>>,
}

impl Durable {
    fn read(journal: &Path) -> io::Result<Durable> {
        let text = match std::fs::read_to_string(journal) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut d = Durable::default();
        for line in text.lines() {
            let Some((kind, rest)) = line.split_once(' ') else { continue };
            match kind {
                "S" => {
                    if let Some((len, path)) = rest.split_once(' ')
                        && let Ok(len) = len.parse()
                    {
                        d.synced.insert(PathBuf::from(path), len);
                    }
                }
                "D" => {
                    let mut parts = rest.split('\t');
                    let dir = PathBuf::from(parts.next().unwrap_or_default());
                    d.entries.insert(dir, parts.map(str::to_owned).collect());
                }
                "R" => {
                    if let Some((from, to)) = rest.split_once('\t') {
                        let (from, to) = (Path::new(from), Path::new(to));
                        let moved: Vec<(PathBuf, u64)> = d
                            .synced
                            .iter()
                            .filter(|(p, _)| p.starts_with(from))
                            .map(|(p, l)| (to.join(p.strip_prefix(from).unwrap_or(p)), *l))
                            .collect();
                        d.synced.retain(|p, _| !p.starts_with(from) && !p.starts_with(to));
                        d.synced.extend(moved);
                    }
                }
                "X" => {
                    let gone = Path::new(rest);
                    d.synced.retain(|p, _| !p.starts_with(gone));
                }
                _ => {}
            }
        }
        Ok(d)
    }

    /// Whether the entry `path` survives: its directory's last sync held it. `root` and the directories above it
    /// are always durable.
    fn entry_durable(&self, root: &Path, path: &Path) -> bool {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return true };
        if !dir.starts_with(root) || path == root {
            return true;
        }
        self.entries.get(dir).is_some_and(|names| names.contains(&name.to_string_lossy().into_owned()))
    }
}

/// The power cut: takes the tree under `root` back to what `journal` says was durable. Files and directories
/// whose entry was not made durable go; every other file is cut to its last synced length (0 when never synced).
/// Run it on a killed process's files, never a live one's.
pub fn drop_unsynced(journal: &Path, root: &Path) -> io::Result<Dropped> {
    let durable = Durable::read(journal)?;
    let mut out = Dropped::default();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<Vec<_>, _>>()?;
        names.sort_by_key(|e| e.file_name());
        for entry in names {
            let path = entry.path();
            let is_dir = entry.file_type()?.is_dir();
            if !durable.entry_durable(root, &path) {
                if is_dir {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
                out.removed.push(path);
                continue;
            }
            if is_dir {
                stack.push(path);
                continue;
            }
            let len = entry.metadata()?.len();
            let keep = durable.synced.get(&path).copied().unwrap_or(0).min(len);
            if keep < len {
                OpenOptions::new().write(true).open(&path)?.set_len(keep)?;
                out.truncated.push((path, len, keep));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_power_cut_keeps_what_was_synced_and_no_more() {
        let root = tempfile::tempdir().unwrap();
        let journal = root.path().join("journal");
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let fs = JournalFs::open(&journal).unwrap();
        let p = data.join("p");
        super::super::sync_new_dirs(&fs, &p).unwrap();
        // A synced file, then written past its sync.
        let a = fs.open(&p.join("a.log"), OpenMode::CreateNew).unwrap();
        fs.sync_dir(&p).unwrap();
        a.append(&[b"hello"]).unwrap();
        a.sync_data().unwrap();
        a.append(&[b" world"]).unwrap();
        // A file replaced atomically: the new content survives.
        super::super::write_atomic(&fs, &p.join("meta.json"), b"{\"v\":2}").unwrap();
        // A file whose entry was never synced: it goes, synced data and all.
        let b = fs.open(&p.join("b.log"), OpenMode::CreateNew).unwrap();
        b.append(&[b"lost"]).unwrap();
        b.sync_data().unwrap();
        // A new directory never synced into its parent: it goes whole.
        std::fs::create_dir(data.join("q")).unwrap();
        std::fs::write(data.join("q").join("c.log"), b"x").unwrap();
        drop((a, b));

        let dropped = drop_unsynced(&journal, &data).unwrap();
        assert_eq!(std::fs::read(p.join("a.log")).unwrap(), b"hello");
        assert!(!p.join("b.log").exists());
        assert_eq!(std::fs::read(p.join("meta.json")).unwrap(), b"{\"v\":2}");
        assert!(!data.join("q").exists());
        assert_eq!(dropped.truncated, vec![(p.join("a.log"), 11, 5)]);
        assert_eq!(dropped.removed.len(), 2, "{dropped:?}");
        // Nothing more to drop a second time.
        assert_eq!(drop_unsynced(&journal, &data).unwrap(), Dropped::default());
    }
}
