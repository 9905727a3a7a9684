//! Just enough of the Chrome DevTools Protocol to drive a headless Chromium from a test: start it with a remote
//! debugging port, open a page, and evaluate JavaScript in it over a WebSocket (RFC 6455 client frames, written
//! here because no WebSocket client is among the project's dependencies: text frames, masked, with continuation).

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A headless Chromium and one page of it.
pub struct Browser {
    _child: Child,
    _profile: tempfile::TempDir,
    ws: TcpStream,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium on `url` and connects to that page.
    pub async fn open(url: &str) -> anyhow::Result<Browser> {
        let profile = tempfile::tempdir()?;
        let mut child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-port=0",
                "--window-size=1280,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let port = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("DevTools listening on ws://127.0.0.1:") {
                    return anyhow::Ok(rest.split('/').next().unwrap_or_default().parse::<u16>()?);
                }
            }
            anyhow::bail!("chromium exited before listening")
        })
        .await??;
        // Keep draining its stderr so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let targets: Vec<Value> = reqwest::get(format!("http://127.0.0.1:{port}/json/list")).await?.json().await?;
        let page =
            targets.iter().find(|t| t["type"] == "page").ok_or_else(|| anyhow::anyhow!("no page: {targets:?}"))?;
        let ws_url = page["webSocketDebuggerUrl"].as_str().unwrap_or_default().to_owned();
        let path = ws_url.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap_or_default();
        let mut ws = TcpStream::connect(("127.0.0.1", port)).await?;
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        let hello = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        ws.write_all(hello.as_bytes()).await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(ws.read_u8().await?);
        }
        anyhow::ensure!(head.starts_with(b"HTTP/1.1 101"), "no WebSocket: {}", String::from_utf8_lossy(&head));
        Ok(Browser { _child: child, _profile: profile, ws, next_id: 0 })
    }

    async fn send(&mut self, text: &str) -> anyhow::Result<()> {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask: [u8; 4] = rand::random();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        Ok(self.ws.write_all(&frame).await?)
    }

    async fn receive(&mut self) -> anyhow::Result<String> {
        let mut message = Vec::new();
        loop {
            let b0 = self.ws.read_u8().await?;
            let b1 = self.ws.read_u8().await?;
            let len = match b1 & 0x7f {
                126 => u64::from(self.ws.read_u16().await?),
                127 => self.ws.read_u64().await?,
                n => u64::from(n),
            };
            let mut payload = vec![0; len as usize];
            self.ws.read_exact(&mut payload).await?;
            match b0 & 0x0f {
                0 | 1 => message.extend_from_slice(&payload),
                8 => anyhow::bail!("chromium closed the DevTools connection"),
                _ => continue,
            }
            if b0 & 0x80 != 0 {
                return Ok(String::from_utf8(message)?);
            }
        }
    }

    /// Calls `method` and returns its result (events in between are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"id": id, "method": method, "params": params}).to_string()).await?;
        loop {
            let v: Value = serde_json::from_str(&self.receive().await?)?;
            if v["id"] == id {
                anyhow::ensure!(v["error"].is_null(), "{method}: {}", v["error"]);
                return Ok(v["result"].clone());
            }
        }
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    pub async fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let r = self
            .call("Runtime.evaluate", json!({"expression": expression, "awaitPromise": true, "returnByValue": true}))
            .await?;
        anyhow::ensure!(r["exceptionDetails"].is_null(), "{expression}: {}", r["exceptionDetails"]);
        Ok(r["result"]["value"].clone())
    }

    /// A PNG screenshot of the page.
    pub async fn screenshot(&mut self, path: &std::path::Path) -> anyhow::Result<()> {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"})).await?;
        let png = base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().unwrap_or_default())?;
        std::fs::write(path, png)?;
        Ok(())
    }

    /// Loads `url` and waits until its document is complete; returns its HTML after its scripts ran.
    pub async fn visit(&mut self, url: &str) -> anyhow::Result<String> {
        self.eval("window.__ferryOld = true").await?;
        self.call("Page.navigate", json!({"url": url})).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let ready = self.eval("!window.__ferryOld && document.readyState === 'complete'").await;
            if matches!(ready, Ok(Value::Bool(true))) {
                break;
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "{url} did not load");
            tokio::task::yield_now().await;
        }
        Ok(self.eval("document.documentElement.outerHTML").await?.as_str().unwrap_or_default().to_owned())
    }
}
