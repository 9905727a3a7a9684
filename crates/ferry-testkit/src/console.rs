//! [`ConsoleProcess`]: the real `ferry-console` binary with a config the test supplies, its own temp dir and a
//! captured log. Started as `ferry-console --config {dir}/console.toml --addr-file {dir}/addr`; the config should
//! set `listen = "127.0.0.1:0"`. Its working directory is its temp dir ([`ConsoleProcess::dir`]), so token files
//! written there can be named by relative path.
//!
//! Invariant: dropping a `ConsoleProcess` kills the console with SIGKILL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bins::{CONSOLE_BIN, binary_path};
use crate::error::Result;
use crate::process::{ChildProcess, ChildSpec};
use crate::server::{DEFAULT_START_TIMEOUT, Layout, Server, write_atomically};

/// A running `ferry-console`.
#[derive(Debug)]
pub struct ConsoleProcess {
    server: Server,
}

impl ConsoleProcess {
    /// Starts a console after writing `files` (name, content) into its directory, and waits until it accepts
    /// TCP connections.
    pub async fn start(config: &str, files: &[(&str, &str)]) -> Result<ConsoleProcess> {
        ConsoleProcess::start_program(binary_path(CONSOLE_BIN)?, config, files).await
    }

    /// [`ConsoleProcess::start`] with this executable (e.g. a release build for a benchmark).
    pub async fn start_program(program: PathBuf, config: &str, files: &[(&str, &str)]) -> Result<ConsoleProcess> {
        let layout = Layout::create("ferry-console-", "console.toml", config)?;
        for (name, content) in files {
            write_atomically(&layout.dir.path().join(name), content)?;
        }
        let args = vec![
            "--config".to_owned(),
            layout.config_path.display().to_string(),
            "--addr-file".to_owned(),
            layout.addr_file.display().to_string(),
        ];
        let spec = ChildSpec::new(CONSOLE_BIN, program, &layout.log_path).args(args).current_dir(layout.dir.path());
        let server = Server::start(layout, spec, DEFAULT_START_TIMEOUT).await?;
        Ok(ConsoleProcess { server })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// Its directory (config, token files, log).
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        self.server.proc_ref().logs()
    }

    /// The process.
    pub fn process(&mut self) -> &mut ChildProcess {
        self.server.proc()
    }

    /// Stops it with SIGTERM, waiting at most `deadline`.
    pub async fn terminate(&mut self, deadline: Duration) -> Result<std::process::ExitStatus> {
        self.server.terminate(deadline).await
    }
}
