//! A real SMTP server: aiosmtpd, run through the mirror crate's `tests/support/smtp_sink.py` with a Python that has
//! it (Debian's `/usr/bin/python3` with python3-aiosmtpd, else the `python3` on PATH). It listens on a free
//! loopback port and writes each accepted message as JSON (envelope, decoded subject and body) into its directory.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The Python interpreter that has aiosmtpd.
fn python_with_aiosmtpd() -> anyhow::Result<&'static str> {
    for python in ["/usr/bin/python3", "python3"] {
        let ok = std::process::Command::new(python)
            .args(["-c", "import aiosmtpd"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(python);
        }
    }
    bail!(
        "these tests need the aiosmtpd SMTP server for Python 3: `apt-get install -y python3-aiosmtpd` or \
         `pip install aiosmtpd` (scripts/test.sh does this)"
    )
}

/// A running SMTP server; it exits when dropped (its stdin closes and it is killed).
pub struct SmtpSink {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    _stdin: ChildStdin,
    _child: Child,
}

impl SmtpSink {
    /// Starts a server without authentication.
    pub async fn start() -> anyhow::Result<SmtpSink> {
        let dir = tempfile::tempdir()?;
        let script = ferry_testkit::workspace_root().join("crates/ferry-mirror/tests/support/smtp_sink.py");
        let mut child = Command::new(python_with_aiosmtpd()?)
            .arg(&script)
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", script.display()))?;
        let stdin = child.stdin.take().context("the SMTP sink's stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("the SMTP sink's stdout")?).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the SMTP sink did not print its port within 30 s")??
            .context("the SMTP sink exited before printing its port")?;
        let port = first.trim().parse().with_context(|| format!("the SMTP sink printed {first:?}, not a port"))?;
        Ok(SmtpSink { port, dir, _stdin: stdin, _child: child })
    }

    /// Every message received so far, in arrival order (fields: mail_from, rcpt_tos, from, to, subject,
    /// content_type, body).
    pub fn messages(&self) -> Vec<Value> {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else { return Vec::new() };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files.iter().filter_map(|p| serde_json::from_slice(&std::fs::read(p).ok()?).ok()).collect()
    }

    /// Waits (up to `limit`) for a message with this exact subject, and returns it.
    pub async fn wait_subject(&self, subject: &str, limit: Duration) -> anyhow::Result<Value> {
        ferry_testkit::wait_for(&format!("a mail {subject:?}"), limit, async || {
            self.messages().into_iter().find(|m| m["subject"] == subject)
        })
        .await
        .with_context(|| {
            let subjects: Vec<Value> = self.messages().into_iter().map(|m| m["subject"].clone()).collect();
            format!("subjects so far: {subjects:?}")
        })
    }
}
