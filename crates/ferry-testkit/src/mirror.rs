//! [`MirrorProcess`]: the real `ferry-mirror` binary with a config the test supplies, its own temp dir and a
//! captured log.
//!
//! The mirror is started as `ferry-mirror --config {dir}/mirror.toml --addr-file {dir}/addr`. The test gives the
//! whole config text; the kit writes it verbatim, substituting nothing. The config should set
//! `[monitor] listen = "127.0.0.1:0"`: the mirror writes the monitor's bound HTTP address into the address file,
//! and the kit waits for that file and a TCP connect to it.
//!
//! The mirror's working directory is its temp dir ([`MirrorProcess::dir`]), so a test can put token files or
//! rules there and refer to them by relative path.
//!
//! Invariant: dropping a `MirrorProcess` kills the mirror with SIGKILL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::Signal;

use crate::bins::{MIRROR_BIN, binary_path};
use crate::error::Result;
use crate::process::{ChildProcess, ChildSpec};
use crate::server::{DEFAULT_START_TIMEOUT, Layout, Server, write_atomically};

/// Options for starting a mirror; create with [`MirrorProcess::builder`], finish with [`MirrorBuilder::start`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until start() is called"]
pub struct MirrorBuilder {
    config: String,
    envs: Vec<(String, String)>,
    program: Option<PathBuf>,
    start_timeout: Duration,
}

impl MirrorBuilder {
    /// Sets an environment variable for the mirror (e.g. `FERRY_MONITOR_TOKEN`, `FERRY_SMTP_PASSWORD`,
    /// `FERRY_MIRROR__SYNC__COMMIT_INTERVAL`, `RUST_LOG`). The test's own environment is inherited as well.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Runs this executable instead of the built `ferry-mirror` (e.g. a stand-in in the testkit's own tests).
    pub fn program(mut self, path: impl Into<PathBuf>) -> Self {
        self.program = Some(path.into());
        self
    }

    /// How long [`MirrorBuilder::start`] and [`MirrorProcess::restart`] wait for the address file and a TCP
    /// connect. Default: 30 s.
    pub fn start_timeout(mut self, deadline: Duration) -> Self {
        self.start_timeout = deadline;
        self
    }

    /// Starts the mirror and waits until its monitor accepts TCP connections. Fails with
    /// [`crate::Error::BinaryNotFound`] if the binary is not built, or [`crate::Error::EarlyExit`] /
    /// [`crate::Error::StartTimeout`] (with the last 50 log lines), e.g. when the config is rejected.
    pub async fn start(self) -> Result<MirrorProcess> {
        let program = match self.program {
            Some(p) => p,
            None => binary_path(MIRROR_BIN)?,
        };
        let layout = Layout::create("ferry-mirror-", "mirror.toml", &self.config)?;
        let config_path = layout.config_path.clone();
        let args = mirror_args(&config_path, &layout.addr_file);
        let mut spec = ChildSpec::new(MIRROR_BIN, program, &layout.log_path).args(args).current_dir(layout.dir.path());
        for (k, v) in self.envs {
            spec = spec.env(k, v);
        }
        let server = Server::start(layout, spec, self.start_timeout).await?;
        tracing::info!(monitor = %server.addr(), "mirror started");
        Ok(MirrorProcess { server, config_path })
    }
}

/// A running `ferry-mirror` (see the module docs). Dropping it kills the process with SIGKILL.
#[derive(Debug)]
pub struct MirrorProcess {
    server: Server,
    config_path: PathBuf,
}

impl MirrorProcess {
    /// A builder for a mirror running `config` (the complete TOML text of its config file).
    pub fn builder(config: impl Into<String>) -> MirrorBuilder {
        MirrorBuilder { config: config.into(), envs: Vec::new(), program: None, start_timeout: DEFAULT_START_TIMEOUT }
    }

    /// Starts a mirror with `config` and the defaults; the same as `MirrorProcess::builder(config).start()`.
    pub async fn start(config: impl Into<String>) -> Result<Self> {
        Self::builder(config).start().await
    }

    /// The monitor's bound HTTP address. A restart may change it when the config says port 0.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The monitor's base URL, `http://127.0.0.1:{port}` (append `/healthz`, `/api/v1/partitions`, ...).
    pub fn monitor_url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// The mirror's temp dir and working directory, holding `mirror.toml`, the address file and
    /// `process.log`. Put extra files (token files, rules) here.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// The config file given as `--config`.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Replaces the config file with `config` (atomically: a SIGHUP never reads half a file). The running mirror
    /// sees it after [`MirrorProcess::send_signal`] with [`Signal::HUP`] (topics, groups, alarm rules) or after a
    /// restart (everything).
    pub fn rewrite_config(&self, config: &str) -> Result<()> {
        write_atomically(&self.config_path, config)
    }

    /// The captured stdout+stderr of all runs.
    pub fn log_path(&self) -> &Path {
        self.server.proc_ref().log_path()
    }

    /// Everything the mirror wrote to stdout and stderr so far, over all runs (each run starts with a
    /// `==== testkit: run N ... ====` line).
    pub fn logs(&self) -> String {
        self.server.proc_ref().logs()
    }

    /// The process id of the current (or last) run.
    pub fn pid(&self) -> u32 {
        self.server.proc_ref().pid()
    }

    /// Whether the mirror process is alive.
    pub fn is_running(&mut self) -> bool {
        self.server.proc().is_running()
    }

    /// Sends a signal, e.g. [`Signal::HUP`] to reload rules or [`Signal::TERM`] to stop gracefully.
    pub fn send_signal(&mut self, signal: Signal) -> Result<()> {
        self.server.send_signal(signal)
    }

    /// Freezes the mirror with SIGSTOP and waits up to `deadline` until it is stopped; it stays alive, holding
    /// its connections and state, until [`MirrorProcess::resume`]. See [`ChildProcess::suspend`].
    pub async fn suspend(&mut self, deadline: Duration) -> Result<()> {
        self.server.proc().suspend(deadline).await
    }

    /// Lets a mirror frozen by [`MirrorProcess::suspend`] continue (SIGCONT).
    pub fn resume(&mut self) -> Result<()> {
        self.server.proc().resume()
    }

    /// Kills the mirror with SIGKILL (no graceful commit) and reaps it.
    pub async fn kill9(&mut self) -> Result<ExitStatus> {
        self.server.kill9().await
    }

    /// Sends SIGTERM and waits up to `deadline` for the graceful exit (offsets committed); past it, kills with
    /// SIGKILL and returns [`crate::Error::TerminateTimeout`] with the log tail.
    pub async fn terminate(&mut self, deadline: Duration) -> Result<ExitStatus> {
        self.server.terminate(deadline).await
    }

    /// Starts the mirror again after [`MirrorProcess::kill9`] or [`MirrorProcess::terminate`], with the current
    /// config file (as last rewritten) and the same environment, then waits for the monitor address. With
    /// `listen = "127.0.0.1:0"` the monitor gets a new port: read [`MirrorProcess::addr`] again afterwards.
    /// Fails with [`crate::Error::StillRunning`] if it has not been stopped.
    pub async fn restart(&mut self) -> Result<()> {
        let args = mirror_args(&self.config_path, self.server.addr_file());
        self.server.restart_with_args(args).await?;
        tracing::info!(monitor = %self.addr(), "mirror restarted");
        Ok(())
    }

    /// The underlying process, for anything not wrapped here (e.g. [`ChildProcess::wait_exit`]).
    pub fn process(&mut self) -> &mut ChildProcess {
        self.server.proc()
    }
}

fn mirror_args(config: &Path, addr_file: &Path) -> Vec<String> {
    vec!["--config".into(), config.display().to_string(), "--addr-file".into(), addr_file.display().to_string()]
}
