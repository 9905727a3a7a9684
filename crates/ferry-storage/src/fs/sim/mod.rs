//! [`SimFs`]: an in-memory file system for tests that knows what a power loss would keep.
//!
//! Every file keeps two versions of its bytes: what has been written (what reads see, the page cache) and what
//! was there at its last `sync_data`/`sync_all` (the disk). Every directory keeps two versions of its entries:
//! the live ones and those at its last [`FileSystem::sync_dir`]. The root directory itself is always durable.
//!
//! [`SimFs::power_loss`] is the power cut. Every directory falls back to its synced entries (so a file created or
//! renamed into place without a directory sync vanishes or reverts, and a removed one comes back), and every file
//! keeps its synced bytes plus, depending on [`PowerLoss`], none, an arbitrary prefix, or arbitrary whole pages of
//! what was written since. Handles of the old incarnation fail from then on, as if the process had died with the
//! machine; the returned handle is the rebooted machine.
//!
//! [`SimFs::set_space_limit`] makes the file system full: a write that does not fit writes the prefix that does and
//! fails with `StorageFull`, as a real disk does.

mod file;
mod machine;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{FileRef, FileSystem, LockGuard, OpenMode};
use file::SimFile;
use machine::{DirNode, FileNode, Node, ROOT, Sim, components, err};

/// What a power loss keeps of the bytes written since a file's last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerLoss {
    /// Nothing: every file is what it was at its last sync.
    DropUnsynced,
    /// A random prefix of what was written since the last sync (a torn tail, cut at any byte).
    TornTail,
    /// Each 4 KiB page that differs from the synced version is, at random, the new page or the old one (zeros
    /// where the chosen version has no bytes), and the size is anything between the two sizes: writeback that
    /// reached the disk out of order.
    TornPages,
}

/// The in-memory file system. Cloning gives another handle to the same machine and incarnation.
#[derive(Debug, Clone)]
pub struct SimFs {
    sim: Arc<Mutex<Sim>>,
    boot: u64,
}

impl Default for SimFs {
    fn default() -> Self {
        SimFs::new()
    }
}

impl SimFs {
    /// An empty file system (just the root directory).
    pub fn new() -> SimFs {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::Dir(DirNode::default()));
        let sim = Sim { boot: 0, nodes, next_ino: ROOT + 1, space_limit: None, rng: 0x5EED, locks: HashSet::new() };
        SimFs { sim: Arc::new(Mutex::new(sim)), boot: 0 }
    }

    fn state(&self) -> io::Result<parking_lot::MutexGuard<'_, Sim>> {
        let sim = self.sim.lock();
        if sim.boot != self.boot {
            return Err(err(io::ErrorKind::Other, "simulated power loss: this process is gone"));
        }
        Ok(sim)
    }

    /// Cuts the power. Directories revert to their synced entries, files keep what `mode` allows of their unsynced
    /// bytes (drawn from `seed`), and every handle of this incarnation (this one, its clones, open files) fails
    /// from now on. Returns the handle of the rebooted machine.
    pub fn power_loss(&self, mode: PowerLoss, seed: u64) -> SimFs {
        let mut sim = self.sim.lock();
        sim.rng = seed;
        let inos: Vec<u64> = sim.nodes.keys().copied().collect();
        for ino in inos {
            let crashed = match sim.nodes.get(&ino) {
                Some(Node::Dir(_)) => None,
                Some(Node::File(f)) => Some((f.data.clone(), f.durable.clone())),
                None => None,
            };
            match crashed {
                None => {
                    if let Some(Node::Dir(d)) = sim.nodes.get_mut(&ino) {
                        d.live = d.durable.clone();
                    }
                }
                Some((data, durable)) => {
                    let kept = sim.crash_bytes(&data, &durable, mode);
                    if let Some(Node::File(f)) = sim.nodes.get_mut(&ino) {
                        f.durable = kept.clone();
                        f.data = kept;
                    }
                }
            }
        }
        // Only what the synced entries reach survives.
        let mut reachable = HashSet::from([ROOT]);
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if let Some(Node::Dir(d)) = sim.nodes.get(&ino) {
                for &child in d.live.values() {
                    if reachable.insert(child) {
                        stack.push(child);
                    }
                }
            }
        }
        sim.nodes.retain(|ino, _| reachable.contains(ino));
        sim.locks.clear();
        sim.boot += 1;
        SimFs { sim: self.sim.clone(), boot: sim.boot }
    }

    /// Limits the bytes all files together may hold (`None`: unlimited). Writes past it fail with `StorageFull`
    /// after writing what fits.
    pub fn set_space_limit(&self, limit: Option<u64>) {
        self.sim.lock().space_limit = limit;
    }

    /// Bytes all files hold now (including removed files still open).
    pub fn used_bytes(&self) -> u64 {
        self.sim.lock().used_bytes()
    }

    /// Bytes written but not yet synced, over all files (a file counts from its first byte that differs from
    /// the synced version, to the end of the longer of the two).
    pub fn unsynced_bytes(&self) -> u64 {
        let sim = self.sim.lock();
        sim.nodes
            .values()
            .map(|n| match n {
                Node::File(f) => {
                    let common = f.data.iter().zip(&f.durable).take_while(|(a, b)| a == b).count();
                    (f.data.len().max(f.durable.len()) - common) as u64
                }
                Node::Dir(_) => 0,
            })
            .sum()
    }

    /// Flips the bits of `mask` in the byte at `pos` of the file at `path`, on the disk and in the cache alike:
    /// what a failing disk does.
    pub fn corrupt(&self, path: &Path, pos: u64, mask: u8) -> io::Result<()> {
        let mut sim = self.state()?;
        let ino = sim.lookup(&components(path))?.ok_or_else(|| err(io::ErrorKind::NotFound, path.display()))?;
        let file = sim.file_mut(ino)?;
        let at = usize::try_from(pos).map_err(|_| err(io::ErrorKind::InvalidInput, "position"))?;
        for version in [&mut file.data, &mut file.durable] {
            if let Some(b) = version.get_mut(at) {
                *b ^= mask;
            }
        }
        Ok(())
    }
}

/// A file handle of one incarnation of a [`SimFs`].
impl FileSystem for SimFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        let mut sim = self.state()?;
        let (parent, name) = sim.parent_of(path)?;
        let existing = sim.dir(parent)?.live.get(&name).copied();
        let ino = match (existing, mode) {
            (Some(_), OpenMode::CreateNew) => {
                return Err(err(io::ErrorKind::AlreadyExists, format!("{} exists", path.display())));
            }
            (Some(ino), _) => {
                let file = sim.file_mut(ino)?;
                if mode == OpenMode::CreateTruncate {
                    file.data.clear();
                }
                ino
            }
            (None, OpenMode::Existing) => {
                return Err(err(io::ErrorKind::NotFound, format!("{}: no such file", path.display())));
            }
            (None, _) => {
                let ino = sim.add(Node::File(FileNode::default()));
                sim.dir_mut(parent)?.live.insert(name, ino);
                ino
            }
        };
        Ok(Arc::new(SimFile { fs: self.clone(), ino }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.state()?;
        let mut ino = ROOT;
        for name in components(path) {
            ino = match sim.dir(ino)?.live.get(&name) {
                Some(&child) => {
                    sim.dir(child)?;
                    child
                }
                None => {
                    let child = sim.add(Node::Dir(DirNode::default()));
                    sim.dir_mut(ino)?.live.insert(name, child);
                    child
                }
            };
        }
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let sim = self.state()?;
        let ino = sim
            .lookup(&components(path))?
            .ok_or_else(|| err(io::ErrorKind::NotFound, format!("{}: no such directory", path.display())))?;
        Ok(sim.dir(ino)?.live.keys().cloned().collect())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let sim = self.state()?;
        match sim.lookup(&components(path)) {
            Ok(found) => Ok(found.is_some()),
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        let sim = self.state()?;
        Ok(matches!(sim.lookup(&components(path)), Ok(Some(ino)) if sim.dir(ino).is_ok()))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.state()?;
        let (parent, name) = sim.parent_of(path)?;
        let ino = sim.dir(parent)?.live.get(&name).copied();
        match ino {
            None => Err(err(io::ErrorKind::NotFound, format!("{}: no such file", path.display()))),
            Some(ino) => {
                sim.file_mut(ino)?;
                sim.dir_mut(parent)?.live.remove(&name);
                Ok(())
            }
        }
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.state()?;
        let (parent, name) = sim.parent_of(path)?;
        let ino = sim.dir(parent)?.live.get(&name).copied();
        match ino {
            None => Err(err(io::ErrorKind::NotFound, format!("{}: no such directory", path.display()))),
            Some(ino) => {
                // The entries inside are removed too, each pending its own directory's sync.
                let mut stack = vec![ino];
                while let Some(dir) = stack.pop() {
                    if let Some(Node::Dir(d)) = sim.nodes.get_mut(&dir) {
                        let children: Vec<u64> = std::mem::take(&mut d.live).into_values().collect();
                        stack.extend(children);
                    }
                }
                sim.dir_mut(parent)?.live.remove(&name);
                Ok(())
            }
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut sim = self.state()?;
        let (from_dir, from_name) = sim.parent_of(from)?;
        let (to_dir, to_name) = sim.parent_of(to)?;
        let ino = sim
            .dir(from_dir)?
            .live
            .get(&from_name)
            .copied()
            .ok_or_else(|| err(io::ErrorKind::NotFound, format!("{}: no such file", from.display())))?;
        if let Some(&replaced) = sim.dir(to_dir)?.live.get(&to_name)
            && let Ok(d) = sim.dir(replaced)
            && !d.live.is_empty()
        {
            return Err(err(io::ErrorKind::DirectoryNotEmpty, format!("{} is not empty", to.display())));
        }
        sim.dir_mut(from_dir)?.live.remove(&from_name);
        sim.dir_mut(to_dir)?.live.insert(to_name, ino);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.state()?;
        let ino = sim
            .lookup(&components(path))?
            .ok_or_else(|| err(io::ErrorKind::NotFound, format!("{}: no such directory", path.display())))?;
        let dir = sim.dir_mut(ino)?;
        dir.durable = dir.live.clone();
        Ok(())
    }

    fn lock_exclusive(&self, path: &Path) -> io::Result<LockGuard> {
        drop(self.open(path, OpenMode::Create)?);
        let key = components(path);
        if !self.state()?.locks.insert(key.clone()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(LockGuard::new(SimLock { fs: self.clone(), key }))
    }
}

/// Releases a [`SimFs`] lock when dropped (a power loss already released it).
#[derive(Debug)]
struct SimLock {
    fs: SimFs,
    key: Vec<String>,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        if let Ok(mut sim) = self.fs.state() {
            sim.locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{sync_new_dirs, write_atomic};
    use machine::PAGE;
    use std::path::PathBuf;

    /// Writes a new file whose name is made durable at once (its data is not).
    fn write(fs: &SimFs, path: &str, bytes: &[u8]) -> FileRef {
        let f = fs.open(Path::new(path), OpenMode::Create).unwrap();
        f.append(&[bytes]).unwrap();
        fs.sync_dir(Path::new(path).parent().unwrap()).unwrap();
        f
    }

    #[test]
    fn unsynced_data_and_entries_are_lost_and_synced_ones_kept() {
        let fs = SimFs::new();
        sync_new_dirs(&fs, Path::new("/d")).unwrap();
        let a = write(&fs, "/d/a", b"synced");
        a.sync_data().unwrap();
        fs.sync_dir(Path::new("/d")).unwrap();
        a.append(&[b"-unsynced"]).unwrap();
        let b = fs.open(Path::new("/d/b"), OpenMode::Create).unwrap();
        b.append(&[b"never synced entry"]).unwrap();
        b.sync_data().unwrap();
        fs.create_dir_all(Path::new("/e")).unwrap();
        let old = fs.clone();
        let fs = fs.power_loss(PowerLoss::DropUnsynced, 1);
        assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"synced");
        assert!(!fs.exists(Path::new("/d/b")).unwrap());
        assert!(!fs.exists(Path::new("/e")).unwrap());
        // The old incarnation is dead, and so are its files.
        assert!(old.read(Path::new("/d/a")).is_err());
        assert!(a.len().is_err());
    }

    #[test]
    fn a_torn_tail_keeps_a_prefix_of_the_unsynced_bytes() {
        let mut lengths = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let fs = SimFs::new();
            let f = write(&fs, "/a", b"0123");
            f.sync_data().unwrap();
            f.append(&[b"456789"]).unwrap();
            let fs = fs.power_loss(PowerLoss::TornTail, seed);
            let got = fs.read(Path::new("/a")).unwrap();
            assert!(b"0123456789".starts_with(&got) && got.len() >= 4, "{got:?}");
            lengths.insert(got.len());
        }
        assert!(lengths.len() > 3, "the cut falls at different bytes: {lengths:?}");
    }

    #[test]
    fn torn_pages_keep_synced_pages_and_mix_the_rest() {
        let fs = SimFs::new();
        let f = write(&fs, "/a", &[1u8; PAGE]);
        f.sync_data().unwrap();
        f.append(&[&[2u8; 3 * PAGE]]).unwrap();
        let mut saw_hole = false;
        for seed in 0..64 {
            let fs = fs.clone().power_loss_copy(PowerLoss::TornPages, seed);
            let got = fs.read(Path::new("/a")).unwrap();
            assert!(got.len() >= PAGE && got[..PAGE].iter().all(|&b| b == 1));
            let pages: Vec<u8> = got[PAGE..].chunks(PAGE).map(|p| p[0]).collect();
            saw_hole |= pages.windows(2).any(|w| w[0] == 0 && w[1] == 2);
        }
        assert!(saw_hole, "some loss keeps a later page while dropping an earlier one");
    }

    #[test]
    fn rename_is_durable_only_after_the_directory_sync() {
        let fs = SimFs::new();
        write_atomic(&fs, Path::new("/c"), b"v1").unwrap();
        let tmp = fs.open(Path::new("/c.tmp"), OpenMode::CreateTruncate).unwrap();
        tmp.append(&[b"v2"]).unwrap();
        tmp.sync_all().unwrap();
        fs.rename(Path::new("/c.tmp"), Path::new("/c")).unwrap();
        assert_eq!(fs.read(Path::new("/c")).unwrap(), b"v2");
        let fs = fs.power_loss(PowerLoss::DropUnsynced, 0);
        assert_eq!(fs.read(Path::new("/c")).unwrap(), b"v1");
        assert!(!fs.exists(Path::new("/c.tmp")).unwrap(), "the second temp file's name was never synced");
    }

    #[test]
    fn a_full_disk_writes_what_fits_and_fails() {
        let fs = SimFs::new();
        fs.set_space_limit(Some(10));
        let f = fs.open(Path::new("/a"), OpenMode::Create).unwrap();
        f.append(&[b"12345678"]).unwrap();
        let e = f.append(&[b"abcd"]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert_eq!(fs.read(Path::new("/a")).unwrap(), b"12345678ab");
        fs.set_space_limit(None);
        f.append(&[b"cd"]).unwrap();
        assert_eq!(fs.used_bytes(), 12);
    }

    #[test]
    fn removed_files_come_back_until_the_directory_is_synced() {
        let fs = SimFs::new();
        sync_new_dirs(&fs, &PathBuf::from("/x/y")).unwrap();
        write(&fs, "/x/y/f", b"data").sync_all().unwrap();
        fs.sync_dir(Path::new("/x/y")).unwrap();
        fs.remove_dir_all(Path::new("/x/y")).unwrap();
        assert!(!fs.exists(Path::new("/x/y")).unwrap());
        let fs = fs.power_loss(PowerLoss::DropUnsynced, 0);
        assert_eq!(fs.read(Path::new("/x/y/f")).unwrap(), b"data");
        assert_eq!(fs.unsynced_bytes(), 0);
    }

    impl SimFs {
        /// A power loss on a deep copy, leaving `self` usable (lets one test try many seeds on one state).
        fn power_loss_copy(self, mode: PowerLoss, seed: u64) -> SimFs {
            let copy = {
                let sim = self.sim.lock();
                let nodes = sim
                    .nodes
                    .iter()
                    .map(|(&ino, n)| {
                        let n = match n {
                            Node::File(f) => Node::File(FileNode { data: f.data.clone(), durable: f.durable.clone() }),
                            Node::Dir(d) => Node::Dir(DirNode { live: d.live.clone(), durable: d.durable.clone() }),
                        };
                        (ino, n)
                    })
                    .collect();
                Sim {
                    boot: sim.boot,
                    nodes,
                    next_ino: sim.next_ino,
                    space_limit: sim.space_limit,
                    rng: sim.rng,
                    locks: HashSet::new(),
                }
            };
            let fs = SimFs { sim: Arc::new(Mutex::new(copy)), boot: self.boot };
            fs.power_loss(mode, seed)
        }
    }
}
