//! A real etcd server (Debian's `etcd-server` package) on loopback, its data in a temp dir: the cluster tests'
//! master. Client and peer ports are reserved free ports; the server is ready once a client can read its status.
//! The program is `$FERRY_ETCD_BIN`, else `etcd` on the PATH, else `/usr/bin/etcd`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::process::{ChildProcess, ChildSpec};
use crate::util::reserve_ports;
use crate::wait::POLL_INTERVAL;

/// How many times [`EtcdProcess::start`] starts etcd when its ports were taken meanwhile.
const BIND_ATTEMPTS: u32 = 3;
/// What etcd logs when a port it was given is taken.
const PORT_TAKEN: &str = "address already in use";

/// The variable naming the etcd binary to run.
pub const ETCD_BIN_VAR: &str = "FERRY_ETCD_BIN";

/// How long a start may take before it fails.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd; killed when dropped, its data dir removed after.
#[derive(Debug)]
pub struct EtcdProcess {
    proc: ChildProcess,
    url: String,
    // Declared last so the process (above) is killed before its directory is removed.
    _dir: TempDir,
}

/// The etcd binary: [`ETCD_BIN_VAR`], else `etcd` on the PATH, else `/usr/bin/etcd`.
pub fn etcd_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(ETCD_BIN_VAR).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file());
    let path = on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::BinaryNotFound {
            name: "etcd (Debian: apt-get install -y etcd-server; scripts/test.sh installs it)".into(),
            path,
        })
    }
}

impl EtcdProcess {
    /// Starts a one-member etcd cluster on loopback and waits until it answers. etcd must be told its ports, so
    /// they are reserved first ([`reserve_ports`]); another process can take one before etcd binds it. An etcd
    /// that exits at start because a port is taken is started again on new ports, up to `BIND_ATTEMPTS` times in
    /// all: a lost race for a port, not a fault of the code under test.
    pub async fn start() -> Result<EtcdProcess> {
        let mut attempt = 1;
        loop {
            match Self::start_once().await {
                Err(Error::EarlyExit { log_tail, .. }) if attempt < BIND_ATTEMPTS && log_tail.contains(PORT_TAKEN) => {
                    tracing::warn!(attempt, "etcd lost a race for its port; starting it again on new ports");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once() -> Result<EtcdProcess> {
        let dir = tempfile::Builder::new().prefix("ferry-etcd-").tempdir().map_err(|source| Error::Io {
            action: "create temp dir in",
            path: std::env::temp_dir(),
            source,
        })?;
        let [client, peer] = reserve_ports::<2>()?;
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let spec = ChildSpec::new("etcd", etcd_binary()?, dir.path().join("etcd.log")).args([
            "--name".to_owned(),
            "ferry-test".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--listen-client-urls".into(),
            url.clone(),
            "--advertise-client-urls".into(),
            url.clone(),
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url.clone(),
            "--initial-cluster".into(),
            format!("ferry-test={peer_url}"),
            "--logger".into(),
            "zap".into(),
        ]);
        let mut proc = ChildProcess::spawn(spec)?;
        let started = Instant::now();
        loop {
            if let Some(status) = proc.exit_status() {
                return Err(Error::EarlyExit {
                    name: "etcd".into(),
                    status,
                    log: proc.log_path().to_owned(),
                    log_tail: proc.log_tail(crate::LOG_TAIL_LINES),
                });
            }
            if answers(&url).await {
                return Ok(EtcdProcess { proc, url, _dir: dir });
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::StartTimeout {
                    name: "etcd".into(),
                    deadline: START_TIMEOUT,
                    waiting_for: format!("a status answer on {url}"),
                    log: proc.log_path().to_owned(),
                    log_tail: proc.log_tail(crate::LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client of this server.
    pub async fn client(&self) -> Result<etcd_client::Client> {
        etcd_client::Client::connect([self.url.as_str()], None)
            .await
            .map_err(|e| Error::Etcd { url: self.url.clone(), message: e.to_string() })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Sends `signal` (SIGSTOP and SIGCONT pause and resume the master under load).
    pub fn send_signal(&mut self, signal: Signal) -> Result<()> {
        self.proc.send_signal(signal)
    }

    /// The captured log.
    pub fn logs(&self) -> String {
        self.proc.logs()
    }
}

/// Whether an etcd at `url` answers a status request (each attempt bounded, so a start never hangs on one).
async fn answers(url: &str) -> bool {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(1));
    match etcd_client::Client::connect([url], Some(options)).await {
        Ok(mut client) => client.status().await.is_ok(),
        Err(_) => false,
    }
}
