//! The generic child-process layer under [`crate::BrokerProcess`] and [`crate::MirrorProcess`]: spawn a program
//! with stdout and stderr captured into one log file, send signals, wait with deadlines, wait for an address
//! file, and respawn with the same arguments.
//!
//! Invariants:
//! - A `ChildProcess` never leaves a process behind: `Drop` sends SIGKILL (and tokio's `kill_on_drop` is set as
//!   a second line of defence), so a panicking test does not leak brokers. The workspace denies `unsafe_code`, so
//!   `PR_SET_PDEATHSIG` (which needs `pre_exec`) is not used: a test process killed by SIGKILL itself can still
//!   leave children behind.
//! - The log file is appended to, never truncated: every (re)spawn first writes a `==== testkit: ... ====` marker
//!   line, so the log of a restarted process shows each run in order.
//! - A process id is signalled only while the kit still holds the unreaped child, so a recycled pid is never hit.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::time::Instant;

use crate::error::{Error, Result};

/// How many log lines the kit puts into start and stop errors.
pub const LOG_TAIL_LINES: usize = 50;

/// How often readiness and exit are polled.
const POLL: Duration = Duration::from_millis(20);

/// What to run: program, arguments, environment, working directory and the log file. Built with
/// [`ChildSpec::new`] and the chaining setters, then passed to [`ChildProcess::spawn`].
#[derive(Debug, Clone)]
pub struct ChildSpec {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    log_path: PathBuf,
}

impl ChildSpec {
    /// A spec running `program`, named `name` in errors, with stdout and stderr appended to `log_path`. The
    /// environment is inherited from the test process, plus `NO_COLOR=1` (the log is a file: no ANSI colour
    /// codes in it, so log assertions match plain text), plus whatever [`ChildSpec::env`] adds (which may
    /// override `NO_COLOR`).
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>, log_path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            envs: vec![("NO_COLOR".into(), "1".into())],
            cwd: None,
            log_path: log_path.into(),
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable for the child (on top of the inherited environment).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Runs the child in `dir` instead of the test's working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Replaces the argument list (used by restarts that pin a previously bound port).
    pub fn set_args<I, S>(&mut self, args: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args = args.into_iter().map(Into::into).collect();
    }

    /// The display name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The program path.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The arguments.
    pub fn get_args(&self) -> &[OsString] {
        &self.args
    }

    /// The log file path.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

/// A running (or exited) child process with captured logs. See the module docs for the guarantees.
#[derive(Debug)]
pub struct ChildProcess {
    spec: ChildSpec,
    child: tokio::process::Child,
    pid: u32,
    status: Option<ExitStatus>,
    spawns: u32,
}

impl ChildProcess {
    /// Starts the process described by `spec`. Must be called inside a tokio runtime.
    pub fn spawn(spec: ChildSpec) -> Result<Self> {
        let (child, pid) = launch(&spec, 1)?;
        Ok(Self { spec, child, pid, status: None, spawns: 1 })
    }

    /// Starts the same spec again (same program, arguments, environment and log file). The previous run must
    /// have exited: otherwise [`Error::StillRunning`].
    pub fn respawn(&mut self) -> Result<()> {
        if self.is_running() {
            return Err(Error::StillRunning { name: self.spec.name.clone(), pid: self.pid });
        }
        let (child, pid) = launch(&self.spec, self.spawns + 1)?;
        self.spawns += 1;
        self.child = child;
        self.pid = pid;
        self.status = None;
        Ok(())
    }

    /// The spec this process runs; mutable so a caller can change arguments before [`ChildProcess::respawn`].
    pub fn spec_mut(&mut self) -> &mut ChildSpec {
        &mut self.spec
    }

    /// The spec this process runs.
    pub fn spec(&self) -> &ChildSpec {
        &self.spec
    }

    /// The display name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The process id of the current (or last) run.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The captured stdout+stderr file.
    pub fn log_path(&self) -> &Path {
        &self.spec.log_path
    }

    /// Everything the process (all of its runs) wrote so far, lossily decoded as UTF-8. Empty if the file
    /// cannot be read.
    pub fn logs(&self) -> String {
        read_log(&self.spec.log_path)
    }

    /// The last `lines` lines of [`ChildProcess::logs`].
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.logs(), lines)
    }

    /// Whether the current run is still alive (not exited). Reaps it if it has exited.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// The exit status of the current run, or `None` while it runs.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            // An error here means the child was already reaped elsewhere, which the kit never does.
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
            }
        }
        self.status
    }

    /// Sends `signal` (e.g. [`Signal::HUP`], [`Signal::TERM`]) to the running process.
    pub fn send_signal(&mut self, signal: Signal) -> Result<()> {
        if !self.is_running() {
            return Err(Error::NotRunning { name: self.spec.name.clone(), signal: signal.as_raw() });
        }
        let signal_error = |source: std::io::Error| Error::Signal {
            name: self.spec.name.clone(),
            pid: self.pid,
            signal: signal.as_raw(),
            source,
        };
        let raw = i32::try_from(self.pid).map_err(|_| signal_error(std::io::ErrorKind::InvalidInput.into()))?;
        let pid = Pid::from_raw(raw).ok_or_else(|| signal_error(std::io::ErrorKind::InvalidInput.into()))?;
        // The child is not reaped yet (checked above), so the pid still names it even if it just exited.
        rustix::process::kill_process(pid, signal).map_err(|e| signal_error(e.into()))
    }

    /// Freezes the process with SIGSTOP and waits up to `deadline` until the kernel reports it stopped (state `T`
    /// in `/proc/PID/stat`), so that on return it runs no more code: its timers, heartbeats and sockets stand still
    /// while it stays alive, as a process stuck in a long GC pause or on a frozen VM. [`ChildProcess::resume`]
    /// lets it continue. While suspended it does not act on SIGTERM (so [`ChildProcess::terminate`] would time
    /// out); SIGKILL, [`ChildProcess::kill9`] and `Drop` end it at once. Not seeing the stop in time is
    /// [`Error::SuspendTimeout`].
    pub async fn suspend(&mut self, deadline: Duration) -> Result<()> {
        self.send_signal(Signal::STOP)?;
        let until = Instant::now() + deadline;
        while !self.is_suspended() {
            if Instant::now() >= until {
                return Err(Error::SuspendTimeout {
                    name: self.spec.name.clone(),
                    pid: self.pid,
                    deadline,
                    state: proc_state(self.pid).map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
                });
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Lets a process frozen by [`ChildProcess::suspend`] continue (SIGCONT). Signals sent while it was frozen
    /// (e.g. SIGTERM) take effect now.
    pub fn resume(&mut self) -> Result<()> {
        self.send_signal(Signal::CONT)
    }

    /// Whether the current run is alive and stopped by a signal (after [`ChildProcess::suspend`]).
    pub fn is_suspended(&mut self) -> bool {
        // The child is not reaped while it runs, so its pid still names it.
        self.is_running() && proc_state(self.pid) == Some('T')
    }

    /// Kills the process with SIGKILL and reaps it. Returns its exit status (the earlier one if it had already
    /// exited).
    pub async fn kill9(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        // start_kill fails only if the child was reaped in between, which wait() below then reports.
        let _ = self.child.start_kill();
        let status = self.child.wait().await.map_err(|source| Error::Wait { name: self.spec.name.clone(), source })?;
        self.status = Some(status);
        Ok(status)
    }

    /// Sends SIGTERM and waits up to `deadline` for the process to exit. If it does not, kills it with SIGKILL
    /// and returns [`Error::TerminateTimeout`] with the log tail. Returns the earlier status if it had already
    /// exited.
    pub async fn terminate(&mut self, deadline: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        self.send_signal(Signal::TERM)?;
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.status = Some(status);
                Ok(status)
            }
            Ok(Err(source)) => Err(Error::Wait { name: self.spec.name.clone(), source }),
            Err(_elapsed) => {
                self.kill9().await?;
                Err(Error::TerminateTimeout {
                    name: self.spec.name.clone(),
                    deadline,
                    log: self.spec.log_path.clone(),
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                })
            }
        }
    }

    /// Waits up to `deadline` for the process to exit by itself (e.g. a one-shot command). On timeout the
    /// process is left running and [`Error::ExitTimeout`] is returned.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.status = Some(status);
                Ok(status)
            }
            Ok(Err(source)) => Err(Error::Wait { name: self.spec.name.clone(), source }),
            Err(_elapsed) => Err(Error::ExitTimeout {
                name: self.spec.name.clone(),
                deadline,
                log: self.spec.log_path.clone(),
                log_tail: self.log_tail(LOG_TAIL_LINES),
            }),
        }
    }

    /// Waits until `addr_file` holds a socket address (e.g. `127.0.0.1:40123`, surrounding whitespace allowed)
    /// and a TCP connect to it succeeds, for at most `deadline`. The process exiting first is
    /// [`Error::EarlyExit`]; running out of time is [`Error::StartTimeout`]; both carry the log tail. Delete a
    /// stale file before (re)spawning, or this returns the old address.
    pub async fn wait_for_addr_file(&mut self, addr_file: &Path, deadline: Duration) -> Result<SocketAddr> {
        let until = Instant::now() + deadline;
        let mut waiting_for = format!("address file {} not written yet", addr_file.display());
        loop {
            if let Some(status) = self.exit_status() {
                return Err(Error::EarlyExit {
                    name: self.spec.name.clone(),
                    status,
                    log: self.spec.log_path.clone(),
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                });
            }
            if let Ok(text) = std::fs::read_to_string(addr_file) {
                // The writer may not have finished the file: an unparsable text is retried, not an error.
                match text.trim().parse::<SocketAddr>() {
                    Ok(addr) => match tokio::time::timeout_at(until, tokio::net::TcpStream::connect(addr)).await {
                        Ok(Ok(_stream)) => return Ok(addr),
                        Ok(Err(e)) => waiting_for = format!("TCP connect to {addr} failed: {e}"),
                        Err(_elapsed) => waiting_for = format!("TCP connect to {addr} did not complete"),
                    },
                    Err(_) => {
                        waiting_for = format!("address file {} holds {:?}, not an address", addr_file.display(), text)
                    }
                }
            }
            if Instant::now() >= until {
                return Err(Error::StartTimeout {
                    name: self.spec.name.clone(),
                    deadline,
                    waiting_for,
                    log: self.spec.log_path.clone(),
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.status.is_none() {
            // SIGKILL. Errors mean it is already gone.
            let _ = self.child.start_kill();
            // Reap it briefly and synchronously, so the temp dir that owners remove next is no longer written
            // to. SIGKILL takes effect within milliseconds; if not, tokio reaps the orphan in the background.
            let until = std::time::Instant::now() + Duration::from_secs(2);
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Opens the log, writes the run marker and spawns the child with stdout and stderr appended to the log.
fn launch(spec: &ChildSpec, run: u32) -> Result<(tokio::process::Child, u32)> {
    let io_err = |action, source| Error::Io { action, path: spec.log_path.clone(), source };
    let mut log =
        OpenOptions::new().create(true).append(true).open(&spec.log_path).map_err(|e| io_err("open log file", e))?;
    let args: Vec<_> = spec.args.iter().map(|a| a.to_string_lossy()).collect();
    writeln!(log, "==== testkit: run {run} of {}: {} {} ====", spec.name, spec.program.display(), args.join(" "))
        .map_err(|e| io_err("write log file", e))?;
    let stderr = log.try_clone().map_err(|e| io_err("duplicate log file handle", e))?;

    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    // ETXTBSY: an executable a test just wrote can be held open for a moment by a child that another thread
    // forked meanwhile (the fd is close-on-exec, so only until that child execs). Retry briefly.
    let mut attempts = 0;
    let child = loop {
        match cmd.spawn() {
            Ok(child) => break child,
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(source) => {
                return Err(Error::Spawn { name: spec.name.clone(), program: spec.program.clone(), source });
            }
        }
    };
    // A freshly spawned child always has an id; 0 would only appear after it was reaped.
    let pid = child.id().unwrap_or(0);
    tracing::debug!(name = %spec.name, pid, run, log = %spec.log_path.display(), "spawned");
    Ok((child, pid))
}

/// Reads a log file lossily; a missing file reads as empty.
pub(crate) fn read_log(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The scheduler state of process `pid` (the field after the command name in `/proc/PID/stat`: `R`, `S`, `T`,
/// `Z`, ...), or `None` when it cannot be read (no such process, or not Linux).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself hold spaces and parentheses: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a\nb", 5), "a\nb");
        assert_eq!(tail("", 3), "");
    }
}
