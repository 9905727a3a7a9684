//! What the broker and mirror wrappers share: a temp dir holding the config file, the address file and the log;
//! a [`ChildProcess`]; the address read from the address file; start and restart with a deadline.
//!
//! Invariant: the address file is deleted before every (re)spawn, so a start never reads the previous run's
//! address.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::Signal;
use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::process::{ChildProcess, ChildSpec};

/// Default time a start or restart may take before it fails.
pub(crate) const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);

/// A long-running server binary that announces its bound address in an address file.
#[derive(Debug)]
pub(crate) struct Server {
    proc: ChildProcess,
    addr: SocketAddr,
    addr_file: PathBuf,
    start_timeout: Duration,
    // Declared last so the process (above) is killed before its directory is removed.
    dir: TempDir,
}

/// The files a server keeps in its temp dir.
pub(crate) struct Layout {
    pub(crate) dir: TempDir,
    pub(crate) config_path: PathBuf,
    pub(crate) addr_file: PathBuf,
    pub(crate) log_path: PathBuf,
}

impl Layout {
    /// Creates the temp dir (`prefix` names it) and writes `config` into `{dir}/{config_name}`.
    pub(crate) fn create(prefix: &str, config_name: &str, config: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().map_err(|source| Error::Io {
            action: "create temp dir in",
            path: std::env::temp_dir(),
            source,
        })?;
        let config_path = dir.path().join(config_name);
        write_atomically(&config_path, config)?;
        Ok(Self { addr_file: dir.path().join("addr"), log_path: dir.path().join("process.log"), config_path, dir })
    }
}

impl Server {
    /// Spawns `spec` (whose log must be `layout.log_path`) and waits for its address.
    pub(crate) async fn start(layout: Layout, spec: ChildSpec, start_timeout: Duration) -> Result<Self> {
        remove_if_exists(&layout.addr_file)?;
        let mut proc = ChildProcess::spawn(spec)?;
        let addr = proc.wait_for_addr_file(&layout.addr_file, start_timeout).await?;
        Ok(Self { proc, addr, addr_file: layout.addr_file, start_timeout, dir: layout.dir })
    }

    /// Spawns the process again with `args` (same program, env, log) and waits for its address.
    pub(crate) async fn restart_with_args(&mut self, args: Vec<String>) -> Result<()> {
        if self.proc.is_running() {
            return Err(Error::StillRunning { name: self.proc.name().to_owned(), pid: self.proc.pid() });
        }
        remove_if_exists(&self.addr_file)?;
        self.proc.spec_mut().set_args(args);
        self.proc.respawn()?;
        self.addr = self.proc.wait_for_addr_file(&self.addr_file, self.start_timeout).await?;
        Ok(())
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn addr_file(&self) -> &Path {
        &self.addr_file
    }

    pub(crate) fn proc(&mut self) -> &mut ChildProcess {
        &mut self.proc
    }

    pub(crate) fn proc_ref(&self) -> &ChildProcess {
        &self.proc
    }

    pub(crate) async fn kill9(&mut self) -> Result<ExitStatus> {
        self.proc.kill9().await
    }

    pub(crate) async fn terminate(&mut self, deadline: Duration) -> Result<ExitStatus> {
        self.proc.terminate(deadline).await
    }

    pub(crate) fn send_signal(&mut self, signal: Signal) -> Result<()> {
        self.proc.send_signal(signal)
    }
}

/// Writes `text` to `path` through a temporary sibling and a rename, so a process reading the file (e.g. on
/// SIGHUP) never sees half of it.
pub(crate) fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, text).map_err(|source| Error::Io { action: "write", path: tmp.clone(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io { action: "rename into place", path: path.into(), source })
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io { action: "remove stale address file", path: path.into(), source }),
    }
}
