//! The testkit's error type. Every variant names the process, path or address involved, and the process
//! variants carry the tail of the process log, so a failing test shows why the binary did not come up without
//! anyone having to find the log file.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// What went wrong in the testkit. Converts into `anyhow::Error` with `?`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `FERRY_TEST_SEED` is set to something that is not a seed.
    #[error("{var}={value:?} is not a seed: give a decimal u64 or 0x-prefixed hex, as a failed run printed it")]
    BadSeed {
        /// The variable's name.
        var: &'static str,
        /// What it holds.
        value: String,
    },

    /// The binary a test wants to start has not been built.
    #[error("{name} not found at {}: run `cargo build --workspace --bins` first", path.display())]
    BinaryNotFound {
        /// The binary name, e.g. `ferry-broker`.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
    },

    /// The operating system refused to start the process.
    #[error("cannot spawn {name} ({}): {source}", program.display())]
    Spawn {
        /// Display name of the process.
        name: String,
        /// The program that was executed.
        program: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The process exited before it announced its address.
    #[error("{name} exited with {status} before it was ready; last log lines ({}):\n{log_tail}", log.display())]
    EarlyExit {
        /// Display name of the process.
        name: String,
        /// How it exited.
        status: ExitStatus,
        /// The captured stdout+stderr file.
        log: PathBuf,
        /// The last lines of that file.
        log_tail: String,
    },

    /// An etcd client call failed.
    #[error("etcd at {url}: {message}")]
    Etcd {
        /// The server's client URL.
        url: String,
        /// What the client said.
        message: String,
    },

    /// The process did not become ready (address file written and a TCP connect to it succeeding) in time.
    #[error(
        "{name} was not ready within {deadline:?} ({waiting_for}); last log lines ({}):\n{log_tail}",
        log.display()
    )]
    StartTimeout {
        /// Display name of the process.
        name: String,
        /// How long the kit waited.
        deadline: Duration,
        /// The readiness step that did not complete.
        waiting_for: String,
        /// The captured stdout+stderr file.
        log: PathBuf,
        /// The last lines of that file.
        log_tail: String,
    },

    /// The process ignored SIGTERM for longer than the deadline; the kit killed it with SIGKILL.
    #[error(
        "{name} did not exit within {deadline:?} after SIGTERM and was killed with SIGKILL; last log lines ({}):\n{log_tail}",
        log.display()
    )]
    TerminateTimeout {
        /// Display name of the process.
        name: String,
        /// How long the kit waited after SIGTERM.
        deadline: Duration,
        /// The captured stdout+stderr file.
        log: PathBuf,
        /// The last lines of that file.
        log_tail: String,
    },

    /// The process did not exit by itself within the deadline (see `ChildProcess::wait_exit`).
    #[error("{name} did not exit within {deadline:?}; last log lines ({}):\n{log_tail}", log.display())]
    ExitTimeout {
        /// Display name of the process.
        name: String,
        /// How long the kit waited.
        deadline: Duration,
        /// The captured stdout+stderr file.
        log: PathBuf,
        /// The last lines of that file.
        log_tail: String,
    },

    /// `restart()` was called while the process is still running.
    #[error("{name} is still running (pid {pid}): stop it with kill9() or terminate() before restart()")]
    StillRunning {
        /// Display name of the process.
        name: String,
        /// Its process id.
        pid: u32,
    },

    /// The process was sent SIGSTOP but the kernel did not report it stopped within the deadline.
    #[error("{name} (pid {pid}) was not stopped within {deadline:?} after SIGSTOP (process state {state})")]
    SuspendTimeout {
        /// Display name of the process.
        name: String,
        /// Its process id.
        pid: u32,
        /// How long the kit waited.
        deadline: Duration,
        /// The last state read from `/proc/PID/stat`.
        state: String,
    },

    /// A signal was requested for a process that has already exited.
    #[error("{name} is not running: cannot send signal {signal}")]
    NotRunning {
        /// Display name of the process.
        name: String,
        /// The signal number that was requested.
        signal: i32,
    },

    /// `kill(2)` failed.
    #[error("cannot send signal {signal} to {name} (pid {pid}): {source}")]
    Signal {
        /// Display name of the process.
        name: String,
        /// Its process id.
        pid: u32,
        /// The signal number.
        signal: i32,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Waiting for the process failed at the OS level.
    #[error("cannot wait for {name}: {source}")]
    Wait {
        /// Display name of the process.
        name: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A file or directory operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What the kit was doing, e.g. "write config file".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A socket operation of the proxy or a port helper failed.
    #[error("cannot {action} {addr}: {source}")]
    Net {
        /// What the kit was doing, e.g. "bind proxy listener on".
        action: &'static str,
        /// The address involved.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The testkit's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
