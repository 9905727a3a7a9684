//! The simulated machine behind every [`SimFs`](super::SimFs) handle: inodes, each file's written and synced
//! bytes, each directory's live and synced entries, the space limit, and what a power loss keeps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Component, Path};

use super::PowerLoss;

/// Page size of the page-granular power loss.
pub(super) const PAGE: usize = 4096;

#[derive(Debug)]
pub(super) struct Sim {
    /// The incarnation: bumped by every power loss, so handles of an older one fail.
    pub boot: u64,
    pub nodes: HashMap<u64, Node>,
    pub next_ino: u64,
    pub space_limit: Option<u64>,
    pub rng: u64,
    /// Paths locked by this incarnation's processes.
    pub locks: HashSet<Vec<String>>,
}

#[derive(Debug)]
pub(super) enum Node {
    File(FileNode),
    Dir(DirNode),
}

#[derive(Debug, Default)]
pub(super) struct FileNode {
    /// What was written (what reads see).
    pub data: Vec<u8>,
    /// What was there at the last sync.
    pub durable: Vec<u8>,
}

#[derive(Debug, Default)]
pub(super) struct DirNode {
    /// The entries now.
    pub live: BTreeMap<String, u64>,
    /// The entries at the last directory sync.
    pub durable: BTreeMap<String, u64>,
}

/// Inode of the root directory, which is always durable.
pub(super) const ROOT: u64 = 0;

pub(super) fn err(kind: io::ErrorKind, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(kind, what.to_string())
}

/// The path's names from the root ("." and leading "/" dropped, ".." resolved).
pub(super) fn components(path: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(name) => out.push(name.to_string_lossy().into_owned()),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

impl Sim {
    fn next_random(&mut self) -> u64 {
        // splitmix64: deterministic for a given seed, which is all a test needs.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_random() % n }
    }

    pub(super) fn dir(&self, ino: u64) -> io::Result<&DirNode> {
        match self.nodes.get(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            _ => Err(err(io::ErrorKind::NotADirectory, "not a directory")),
        }
    }

    pub(super) fn dir_mut(&mut self, ino: u64) -> io::Result<&mut DirNode> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            _ => Err(err(io::ErrorKind::NotADirectory, "not a directory")),
        }
    }

    pub(super) fn file_mut(&mut self, ino: u64) -> io::Result<&mut FileNode> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(err(io::ErrorKind::IsADirectory, "is a directory")),
            None => Err(err(io::ErrorKind::NotFound, "file is gone")),
        }
    }

    /// The inode at `names` (live entries), if any.
    pub(super) fn lookup(&self, names: &[String]) -> io::Result<Option<u64>> {
        let mut ino = ROOT;
        for name in names {
            match self.dir(ino)?.live.get(name) {
                Some(&child) => ino = child,
                None => return Ok(None),
            }
        }
        Ok(Some(ino))
    }

    /// The directory holding the last name of `path`, and that name.
    pub(super) fn parent_of(&self, path: &Path) -> io::Result<(u64, String)> {
        let mut names = components(path);
        let name = names.pop().ok_or_else(|| err(io::ErrorKind::InvalidInput, "the root has no parent"))?;
        let parent = self
            .lookup(&names)?
            .ok_or_else(|| err(io::ErrorKind::NotFound, format!("{}: no such directory", path.display())))?;
        self.dir(parent)?;
        Ok((parent, name))
    }

    pub(super) fn add(&mut self, node: Node) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, node);
        ino
    }

    pub(super) fn used_bytes(&self) -> u64 {
        self.nodes.values().map(|n| if let Node::File(f) = n { f.data.len() as u64 } else { 0 }).sum()
    }

    /// How many more bytes fit.
    pub(super) fn room(&self) -> u64 {
        self.space_limit.map_or(u64::MAX, |limit| limit.saturating_sub(self.used_bytes()))
    }

    pub(super) fn crash_bytes(&mut self, data: &[u8], durable: &[u8], mode: PowerLoss) -> Vec<u8> {
        if data == durable {
            return data.to_vec();
        }
        match mode {
            PowerLoss::DropUnsynced => durable.to_vec(),
            PowerLoss::TornTail => {
                // Either the change since the sync never reached the disk, or the common prefix plus some of
                // what was written after it did.
                if self.below(4) == 0 {
                    return durable.to_vec();
                }
                let common = data.iter().zip(durable).take_while(|(a, b)| a == b).count();
                let keep = self.below((data.len() - common) as u64 + 1) as usize;
                data[..common + keep].to_vec()
            }
            PowerLoss::TornPages => {
                let (lo, hi) = (data.len().min(durable.len()), data.len().max(durable.len()));
                let len = lo + self.below((hi - lo) as u64 + 1) as usize;
                let mut out = vec![0u8; len];
                for start in (0..len).step_by(PAGE) {
                    let end = (start + PAGE).min(len);
                    let page = |v: &[u8]| -> Vec<u8> {
                        let mut p = vec![0u8; end - start];
                        if start < v.len() {
                            let n = v.len().min(end) - start;
                            p[..n].copy_from_slice(&v[start..start + n]);
                        }
                        p
                    };
                    let (new, old) = (page(data), page(durable));
                    let chosen = if new == old || self.below(2) == 0 { new } else { old };
                    out[start..end].copy_from_slice(&chosen);
                }
                out
            }
        }
    }
}
