//! Real endpoints for the alarm tests: an SMTP server (aiosmtpd, through `smtp_sink.py`) and a webhook receiver
//! (axum), both on free loopback ports, recording exactly what they received; and in [`alarmer`], the Alarmer
//! under test and the configs that point it at them.

pub mod alarmer;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The Python interpreter that has aiosmtpd: Debian's `/usr/bin/python3` (python3-aiosmtpd), else the `python3`
/// on PATH (pip). Panics with what to install when neither has it.
fn python_with_aiosmtpd() -> &'static str {
    for python in ["/usr/bin/python3", "python3"] {
        let ok = std::process::Command::new(python)
            .args(["-c", "import aiosmtpd"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return python;
        }
    }
    panic!(
        "the alarm tests need the aiosmtpd SMTP server for Python 3: install it with \
         `apt-get install -y python3-aiosmtpd` or `pip install aiosmtpd` (scripts/test.sh does this)"
    );
}

/// One message as the SMTP server decoded it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Mail {
    /// The TLS version the message arrived under (`None`: plain text).
    pub tls_version: Option<String>,
    /// Envelope sender.
    pub mail_from: String,
    /// Envelope recipients.
    pub rcpt_tos: Vec<String>,
    /// The login that authenticated, if any.
    pub auth_login: Option<String>,
    /// `From:` header.
    pub from: String,
    /// `To:` header.
    pub to: String,
    /// Decoded `Subject:`.
    pub subject: String,
    /// MIME type of the body.
    pub content_type: String,
    /// Decoded body with `\n` line ends.
    pub body: String,
}

/// A running aiosmtpd server; it exits when this is dropped (its stdin closes and it is killed).
pub struct SmtpSink {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    _stdin: ChildStdin,
    _child: Child,
}

impl SmtpSink {
    /// Starts a server; with `auth`, AUTH with that user and password is required.
    pub async fn start(auth: Option<(&str, &str)>) -> SmtpSink {
        SmtpSink::start_with(auth, None).await
    }

    /// Starts a server speaking TLS: `(mode, cert PEM, key PEM)` with mode `starttls` (required before mail) or
    /// `implicit` (TLS from the first byte).
    pub async fn start_tls(mode: &str, cert: &Path, key: &Path) -> SmtpSink {
        SmtpSink::start_with(None, Some((mode, cert, key))).await
    }

    async fn start_with(auth: Option<(&str, &str)>, tls: Option<(&str, &Path, &Path)>) -> SmtpSink {
        let dir = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_sink.py");
        let mut cmd = Command::new(python_with_aiosmtpd());
        cmd.arg(script).arg(dir.path());
        if let Some((user, password)) = auth {
            cmd.args(["--user", user, "--password", password]);
        }
        if let Some((mode, cert, key)) = tls {
            cmd.args(["--tls", mode, "--cert"]).arg(cert).arg("--key").arg(key);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the SMTP sink");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the SMTP sink did not print its port within 30s")
            .expect("read the SMTP sink's stdout")
            .expect("the SMTP sink exited before printing its port");
        let port = first.trim().parse().unwrap_or_else(|_| panic!("the SMTP sink printed {first:?}, not a port"));
        SmtpSink { port, dir, _stdin: stdin, _child: child }
    }

    /// Every message received so far, in arrival order.
    pub fn messages(&self) -> Vec<Mail> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files.iter().map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()).collect()
    }
}

/// One request the webhook receiver accepted.
#[derive(Debug, Clone)]
pub struct Received {
    /// Request headers.
    pub headers: HeaderMap,
    /// The exact body bytes.
    pub body: Bytes,
}

impl Received {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_owned())
    }
}

#[derive(Default)]
struct HookState {
    fail_first: usize,
    attempts: AtomicUsize,
    received: Mutex<Vec<Received>>,
}

/// A webhook receiver on 127.0.0.1: answers 500 to the first `fail_first` requests, then 200, and records the
/// requests it accepted.
pub struct Hook {
    /// `http://127.0.0.1:PORT/hook`.
    pub url: String,
    state: Arc<HookState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(State(s): State<Arc<HookState>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    if s.attempts.fetch_add(1, Ordering::SeqCst) < s.fail_first {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    s.received.lock().push(Received { headers, body });
    StatusCode::OK
}

impl Hook {
    /// Starts a receiver.
    pub async fn start(fail_first: usize) -> Hook {
        let state = Arc::new(HookState { fail_first, ..HookState::default() });
        let app = Router::new().route("/hook", post(accept)).with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Hook { url, state, task }
    }

    /// Requests accepted so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().clone()
    }

    /// Requests seen so far, failed ones included.
    pub fn attempts(&self) -> usize {
        self.state.attempts.load(Ordering::SeqCst)
    }
}
