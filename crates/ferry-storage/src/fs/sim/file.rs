//! [`SimFile`]: an open file of a [`SimFs`], reading and writing the simulated machine's bytes.

use std::io;

use super::SimFs;
use super::machine::{Sim, err};
use crate::fs::FsFile;

#[derive(Debug)]
pub(super) struct SimFile {
    pub fs: SimFs,
    pub ino: u64,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut Sim, u64) -> io::Result<T>) -> io::Result<T> {
        let mut sim = self.fs.state()?;
        f(&mut sim, self.ino)
    }
}

impl FsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.with(|sim, ino| {
            let file = sim.file_mut(ino)?;
            let start = usize::try_from(pos).unwrap_or(usize::MAX).min(file.data.len());
            let n = buf.len().min(file.data.len() - start);
            buf[..n].copy_from_slice(&file.data[start..start + n]);
            Ok(n)
        })
    }

    fn append(&self, parts: &[&[u8]]) -> io::Result<()> {
        self.with(|sim, ino| {
            let mut room = sim.room();
            let file = sim.file_mut(ino)?;
            for part in parts {
                let n = part.len().min(usize::try_from(room).unwrap_or(usize::MAX));
                file.data.extend_from_slice(&part[..n]);
                room -= n as u64;
                if n < part.len() {
                    return Err(err(io::ErrorKind::StorageFull, "no space left on device (simulated)"));
                }
            }
            Ok(())
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(|sim, ino| {
            let room = sim.room();
            let file = sim.file_mut(ino)?;
            let len = usize::try_from(len).map_err(|_| err(io::ErrorKind::InvalidInput, "length"))?;
            if len > file.data.len() && (len - file.data.len()) as u64 > room {
                return Err(err(io::ErrorKind::StorageFull, "no space left on device (simulated)"));
            }
            file.data.resize(len, 0);
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(|sim, ino| {
            let file = sim.file_mut(ino)?;
            file.durable.clone_from(&file.data);
            Ok(())
        })
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        self.with(|sim, ino| Ok(sim.file_mut(ino)?.data.len() as u64))
    }

    fn created_ms(&self) -> Option<i64> {
        None
    }
}
