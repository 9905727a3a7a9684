//! NATS JetStream as a benchmark yardstick: finding `nats-server`, running one on loopback (optionally from a config
//! file, e.g. a JetStream domain and a leafnode link), and publishing with a bounded window of acknowledgements.
//!
//! A [`NatsServer`] owns its temp dir (config, store, log) and its process; dropping it kills the process and removes
//! the dir.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use bytes::Bytes;
use ferry_testkit::{deadline, reserve_port, wait_until};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

/// Publishes JetStream may have waiting for their acknowledgement: enough to keep the server busy, bounded so a
/// large backlog does not hold every message in the client at once.
pub const ACK_WINDOW: usize = 8192;

/// The `nats-server` binary: on the PATH, else where Debian's package puts it (`/usr/sbin`, which a user's PATH may
/// lack) or `/usr/bin`.
pub fn server_binary() -> Option<PathBuf> {
    super::which("nats-server").or_else(|| {
        ["/usr/sbin/nats-server", "/usr/bin/nats-server"].into_iter().map(PathBuf::from).find(|p| p.is_file())
    })
}

/// A `nats-server -js` on a free loopback port, with its store, config and log in a temp dir; killed on drop.
pub struct NatsServer {
    /// `127.0.0.1:<port>`, for `async_nats::connect`.
    pub url: String,
    pid: u32,
    dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl NatsServer {
    /// A standalone server with JetStream's defaults.
    pub async fn start(program: &Path) -> anyhow::Result<NatsServer> {
        NatsServer::start_with_config(program, "").await
    }

    /// A server whose config file holds `config` (e.g. `jetstream { domain: hub }` and a `leafnodes` block). The
    /// listen address, JetStream itself and the store dir come from the command line, which nats-server lays over
    /// the file: `config` must not set them.
    pub async fn start_with_config(program: &Path, config: &str) -> anyhow::Result<NatsServer> {
        let dir = tempfile::Builder::new().prefix("nats-").tempdir()?;
        let port = reserve_port()?;
        let mut command = tokio::process::Command::new(program);
        command.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"]).arg(dir.path().join("store"));
        command.arg("-l").arg(dir.path().join("server.log"));
        if !config.is_empty() {
            let file = dir.path().join("server.conf");
            std::fs::write(&file, config).with_context(|| format!("cannot write {}", file.display()))?;
            command.arg("-c").arg(file);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let pid = child.id().context("nats-server exited at once")?;
        let url = format!("127.0.0.1:{port}");
        let server = NatsServer { url, pid, dir, _child: child };
        wait_until("nats-server to accept connections", deadline(&[Duration::from_secs(2)]), async || {
            tokio::net::TcpStream::connect(&server.url).await.map(|_| true)
        })
        .await
        .with_context(|| format!("nats-server log:\n{}", server.logs()))?;
        Ok(server)
    }

    /// The server's process id (for its CPU time in `/proc`).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's log so far, for an error message.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

/// Publishes `count` copies of `payload` round `subjects` with up to [`ACK_WINDOW`] acknowledgements outstanding;
/// returns the time until the last acknowledgement.
pub async fn publish_acked(
    js: &jetstream::Context,
    subjects: &[String],
    count: usize,
    payload: &Bytes,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut acks = FuturesUnordered::new();
    for i in 0..count {
        if acks.len() >= ACK_WINDOW
            && let Some(ack) = acks.next().await
        {
            ack?;
        }
        let ack = js.publish(subjects[i % subjects.len()].clone(), payload.clone()).await?;
        acks.push(ack.into_future());
    }
    while let Some(ack) = acks.next().await {
        ack?;
    }
    Ok(start.elapsed())
}
