//! [`BrokerProcess`]: the real `ferry-broker` binary on a loopback port, with its own temp dir, config file,
//! data dir and captured log.
//!
//! The broker is started as
//! `ferry-broker --config {dir}/broker.toml --listen 127.0.0.1:{port} --data-dir {data} --cluster-id {id}
//! --addr-file {dir}/addr`, with port 0 on the first start. It writes its bound address into the address file
//! once it listens; the kit waits for that file and a successful TCP connect. A restart passes the port the
//! previous run bound, so clients (and proxies) pointing at the broker keep working.
//!
//! Invariants: the data dir survives restarts (it is removed with the `BrokerProcess` only when the kit created
//! it); dropping a `BrokerProcess` kills the broker with SIGKILL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::process::Signal;

use crate::bins::{BROKER_BIN, binary_path};
use crate::error::{Error, Result};
use crate::process::{ChildProcess, ChildSpec};
use crate::server::{DEFAULT_START_TIMEOUT, Layout, Server};

/// The environment override of `metrics.listen`, which the testkit sets to port 0 for every broker it starts, so
/// that brokers sharing the host never fight over the default port. A test's own [`BrokerBuilder::env`] of it wins
/// (the environment also wins over the config file).
pub const METRICS_LISTEN_VAR: &str = "FERRY_BROKER__METRICS__LISTEN";

/// Options for starting a broker; create with [`BrokerProcess::builder`], finish with [`BrokerBuilder::start`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until start() is called"]
pub struct BrokerBuilder {
    cluster_id: Option<String>,
    config: String,
    envs: Vec<(String, String)>,
    data_dir: Option<PathBuf>,
    program: Option<PathBuf>,
    start_timeout: Duration,
    port: u16,
    journal: bool,
    full_switch: bool,
}

impl BrokerBuilder {
    /// Gives the broker a full-disk switch ([`BrokerProcess::set_disk_full`]).
    pub fn disk_full_switch(mut self) -> Self {
        self.full_switch = true;
        self
    }

    /// Listens on this loopback port (reserved by the caller, e.g. with [`crate::reserve_port`]) instead of a
    /// free one picked at start: other members' links (proxies) can then point at it before it starts.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Runs the broker on the journaled file layer (`FERRY_TEST_SYNC_JOURNAL`), so that
    /// [`BrokerProcess::power_loss`] can drop what it never synced.
    pub fn sync_journal(mut self) -> Self {
        self.journal = true;
        self
    }

    /// The cluster id passed as `--cluster-id`. Default: a fresh `test-cluster-{pid}-{n}`, distinct for every
    /// broker the test process starts (so two brokers are two clusters unless a test says otherwise).
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.cluster_id = Some(id.into());
        self
    }

    /// Extra TOML written to the config file given as `--config`, e.g. `"[storage]\nflush = \"sync\"\n"`. The
    /// command-line flags (listen, data dir, cluster id) override the same keys in this text. Default: empty.
    pub fn config(mut self, toml: impl Into<String>) -> Self {
        self.config = toml.into();
        self
    }

    /// Sets an environment variable for the broker (e.g. `FERRY_BROKER__STORAGE__FLUSH`, `FERRY_BROKER_TOKEN`,
    /// `RUST_LOG`). The test's own environment is inherited as well.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Reuses an existing data dir instead of a fresh one inside the broker's temp dir. The kit never deletes a
    /// directory given here; the caller keeps it alive (e.g. a `tempfile::TempDir` held by the test).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Runs this executable instead of the built `ferry-broker` (e.g. a release build, or a stand-in in the
    /// testkit's own tests). It gets the same arguments.
    pub fn program(mut self, path: impl Into<PathBuf>) -> Self {
        self.program = Some(path.into());
        self
    }

    /// How long [`BrokerBuilder::start`] and [`BrokerProcess::restart`] wait for the address file and a TCP
    /// connect. Default: 30 s.
    pub fn start_timeout(mut self, deadline: Duration) -> Self {
        self.start_timeout = deadline;
        self
    }

    /// Starts the broker and waits until it accepts TCP connections. Fails with [`Error::BinaryNotFound`] if
    /// the binary is not built, or [`Error::EarlyExit`] / [`Error::StartTimeout`] (with the last 50 log lines).
    pub async fn start(self) -> Result<BrokerProcess> {
        let program = match self.program {
            Some(p) => p,
            None => binary_path(BROKER_BIN)?,
        };
        let cluster_id = self.cluster_id.unwrap_or_else(default_cluster_id);
        let layout = Layout::create("ferry-broker-", "broker.toml", &self.config)?;
        let data_dir = match self.data_dir {
            Some(dir) => dir,
            None => {
                let dir = layout.dir.path().join("data");
                std::fs::create_dir(&dir).map_err(|source| Error::Io {
                    action: "create data dir",
                    path: dir.clone(),
                    source,
                })?;
                dir
            }
        };
        let config_path = layout.config_path.clone();
        let args = broker_args(&config_path, self.port, &data_dir, &cluster_id, &layout.addr_file);
        let journal = self.journal.then(|| layout.dir.path().join("sync.journal"));
        let full_flag = self.full_switch.then(|| layout.dir.path().join("disk-full"));
        let mut spec = ChildSpec::new(BROKER_BIN, program, &layout.log_path).args(args).current_dir(layout.dir.path());
        // Many brokers share the host in tests: each serves its metrics on a port of its own unless told otherwise.
        // (Set first: a test's own setting, pushed after it, wins.)
        spec = spec.env(METRICS_LISTEN_VAR, "127.0.0.1:0");
        if let Some(j) = &journal {
            spec = spec.env(ferry_storage::fs::SYNC_JOURNAL_VAR, j.display().to_string());
        }
        if let Some(f) = &full_flag {
            spec = spec.env(ferry_storage::fs::DISK_FULL_FLAG_VAR, f.display().to_string());
        }
        for (k, v) in self.envs {
            spec = spec.env(k, v);
        }
        let server = Server::start(layout, spec, self.start_timeout).await?;
        tracing::info!(addr = %server.addr(), %cluster_id, data_dir = %data_dir.display(), "broker started");
        Ok(BrokerProcess { server, data_dir, cluster_id, config_path, journal, full_flag })
    }
}

/// A running `ferry-broker` (see the module docs). Dropping it kills the process with SIGKILL.
#[derive(Debug)]
pub struct BrokerProcess {
    server: Server,
    data_dir: PathBuf,
    cluster_id: String,
    config_path: PathBuf,
    journal: Option<PathBuf>,
    full_flag: Option<PathBuf>,
}

impl BrokerProcess {
    /// A builder with the defaults: fresh cluster id, empty config, fresh data dir, 30 s start timeout.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            cluster_id: None,
            config: String::new(),
            envs: Vec::new(),
            data_dir: None,
            program: None,
            start_timeout: DEFAULT_START_TIMEOUT,
            port: 0,
            journal: false,
            full_switch: false,
        }
    }

    /// Starts a broker with all defaults; the same as `BrokerProcess::builder().start()`.
    pub async fn start() -> Result<Self> {
        Self::builder().start().await
    }

    /// The address the broker listens on, e.g. `127.0.0.1:40123`. Stays the same across restarts.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The gRPC endpoint URL, `http://127.0.0.1:{port}`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// The data dir (kept across restarts).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The cluster id passed as `--cluster-id`.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The broker's temp dir, holding `broker.toml`, the address file, `process.log` and (by default) `data/`.
    /// Also the broker's working directory.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// The config file given as `--config`.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The captured stdout+stderr of all runs.
    pub fn log_path(&self) -> &Path {
        self.server.proc_ref().log_path()
    }

    /// Everything the broker wrote to stdout and stderr so far, over all runs (each run starts with a
    /// `==== testkit: run N ... ====` line).
    pub fn logs(&self) -> String {
        self.server.proc_ref().logs()
    }

    /// The process id of the current (or last) run.
    pub fn pid(&self) -> u32 {
        self.server.proc_ref().pid()
    }

    /// The address the current (or last) run serves its Prometheus metrics on, as its log names it (`None` with
    /// metrics off, or before the endpoint is up).
    pub fn metrics_addr(&self) -> Option<String> {
        let logs = self.logs();
        let line = logs.lines().rev().find(|l| l.contains("metrics listening"))?;
        line.split("addr=").nth(1).and_then(|r| r.split_whitespace().next()).map(str::to_owned)
    }

    /// Whether the broker process is alive.
    pub fn is_running(&mut self) -> bool {
        self.server.proc().is_running()
    }

    /// Freezes the broker with SIGSTOP and waits up to `deadline` until it is stopped; it stays alive, holding
    /// its connections and state, until [`BrokerProcess::resume`]. See [`ChildProcess::suspend`].
    pub async fn suspend(&mut self, deadline: Duration) -> Result<()> {
        self.server.proc().suspend(deadline).await
    }

    /// Lets a broker frozen by [`BrokerProcess::suspend`] continue (SIGCONT).
    pub fn resume(&mut self) -> Result<()> {
        self.server.proc().resume()
    }

    /// Kills the broker with SIGKILL (a crash: no clean-shutdown marker) and reaps it.
    pub async fn kill9(&mut self) -> Result<ExitStatus> {
        self.server.kill9().await
    }

    /// Makes the broker's disk full (every append fails with "no space left") or gives it room again. Needs
    /// [`BrokerBuilder::disk_full_switch`].
    pub fn set_disk_full(&self, full: bool) -> Result<()> {
        let Some(flag) = &self.full_flag else {
            return Err(Error::Io {
                action: "switch the disk (start the broker with disk_full_switch()) of",
                path: self.data_dir.clone(),
                source: std::io::Error::other("no full-disk switch"),
            });
        };
        let io = |source| Error::Io { action: "switch the full disk flag", path: flag.clone(), source };
        if full {
            std::fs::write(flag, b"full").map_err(io)
        } else {
            match std::fs::remove_file(flag) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            }
        }
    }

    /// Cuts the power under the broker: kills it with SIGKILL, then drops every byte and directory entry it never
    /// made durable (see `ferry_storage::fs::drop_unsynced`). Needs [`BrokerBuilder::sync_journal`]. Returns
    /// what was dropped; [`BrokerProcess::restart`] then starts it on what a rebooted machine would find.
    pub async fn power_loss(&mut self) -> Result<ferry_storage::fs::Dropped> {
        let Some(journal) = self.journal.clone() else {
            return Err(Error::Io {
                action: "cut the power (start the broker with sync_journal()) for",
                path: self.data_dir.clone(),
                source: std::io::Error::other("no sync journal"),
            });
        };
        self.kill9().await?;
        let data = self.data_dir.clone();
        ferry_storage::fs::drop_unsynced(&journal, &data).map_err(|source| Error::Io {
            action: "drop the unsynced data of",
            path: data,
            source,
        })
    }

    /// Sends SIGTERM and waits up to `deadline` for a graceful exit; past it, kills with SIGKILL and returns
    /// [`Error::TerminateTimeout`] with the log tail.
    pub async fn terminate(&mut self, deadline: Duration) -> Result<ExitStatus> {
        self.server.terminate(deadline).await
    }

    /// Sends any signal to the broker.
    pub fn send_signal(&mut self, signal: Signal) -> Result<()> {
        self.server.send_signal(signal)
    }

    /// Starts the broker again after [`BrokerProcess::kill9`] or [`BrokerProcess::terminate`]: same data dir,
    /// config, cluster id, environment and port (`--listen 127.0.0.1:{previous port}`), then waits for it as
    /// `start` does. Fails with [`Error::StillRunning`] if it has not been stopped.
    pub async fn restart(&mut self) -> Result<()> {
        let port = self.addr().port();
        let args = broker_args(&self.config_path, port, &self.data_dir, &self.cluster_id, self.server.addr_file());
        self.server.restart_with_args(args).await?;
        tracing::info!(addr = %self.addr(), cluster_id = %self.cluster_id, "broker restarted");
        Ok(())
    }

    /// The underlying process, for anything not wrapped here (e.g. [`ChildProcess::wait_exit`]).
    pub fn process(&mut self) -> &mut ChildProcess {
        self.server.proc()
    }
}

fn broker_args(config: &Path, port: u16, data_dir: &Path, cluster_id: &str, addr_file: &Path) -> Vec<String> {
    vec![
        "--config".into(),
        config.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--cluster-id".into(),
        cluster_id.into(),
        "--addr-file".into(),
        addr_file.display().to_string(),
    ]
}

fn default_cluster_id() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!("test-cluster-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}
