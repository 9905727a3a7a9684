//! A broker and a console over it, with an admin token (`ops`), a read-only token (`viewer`) and an audit log.

use std::time::Duration;

use ferry_client::{Admin, BrokerClient, ClientConfig};
use ferry_testkit::{BrokerProcess, ConsoleProcess};
use serde_json::Value;

/// The admin token.
pub const OPS: &str = "ops-token-1f0c";
/// The read-only token.
pub const VIEWER: &str = "viewer-token-77aa";
/// How long one call may take on a loaded machine.
pub const IO_BUDGET: Duration = Duration::from_secs(20);

pub struct Env {
    /// The broker the console shows.
    pub broker: BrokerProcess,
    pub console: ConsoleProcess,
    pub client: BrokerClient,
    pub admin: Admin,
    pub http: reqwest::Client,
    pub csrf: String,
}

/// The console config over `broker`.
pub fn config(broker: &BrokerProcess, anonymous_read: bool) -> String {
    config_with(broker, anonymous_read, "", "")
}

/// [`config`] with `top` keys at its start and `extra` TOML at its end (e.g. `[[mirrors]]` entries).
pub fn config_with(broker: &BrokerProcess, anonymous_read: bool, top: &str, extra: &str) -> String {
    format!(
        r#"{top}
listen = "127.0.0.1:0"
audit_log = "audit.jsonl"
anonymous_read = {anonymous_read}
[[clusters]]
name = "dc1"
brokers = ["{}"]
[[tokens]]
name = "ops"
token_file = "ops.token"
scope = "admin"
[[tokens]]
name = "viewer"
token_file = "viewer.token"
scope = "read"
{extra}"#,
        broker.addr()
    )
}

pub async fn start_console(broker: &BrokerProcess, anonymous_read: bool) -> anyhow::Result<ConsoleProcess> {
    Ok(ConsoleProcess::start(&config(broker, anonymous_read), &[("ops.token", OPS), ("viewer.token", VIEWER)]).await?)
}

impl Env {
    pub async fn start() -> anyhow::Result<Env> {
        Env::start_with("", "").await
    }

    /// A broker and a console whose config starts with `top` and ends with `extra`.
    pub async fn start_with(top: &str, extra: &str) -> anyhow::Result<Env> {
        ferry_testkit::init_tracing();
        let broker = BrokerProcess::start().await?;
        let config = config_with(&broker, false, top, extra);
        let console = ConsoleProcess::start(&config, &[("ops.token", OPS), ("viewer.token", VIEWER)]).await?;
        let client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]))?;
        let http = reqwest::Client::builder().timeout(IO_BUDGET).build()?;
        let mut env = Env { admin: Admin::new(client.clone()), broker, console, client, http, csrf: String::new() };
        let (status, session) = env.get("/api/v1/session", Some(OPS)).await?;
        assert_eq!(status, 200, "{session}");
        env.csrf = session["csrf"].as_str().unwrap_or_default().to_owned();
        assert_eq!(session["scope"], "admin");
        assert!(!env.csrf.is_empty());
        Ok(env)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.console.url())
    }

    /// GET a JSON answer.
    pub async fn get(&self, path: &str, token: Option<&str>) -> anyhow::Result<(u16, Value)> {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await?))
    }

    /// GET as `ops`, expecting 200.
    pub async fn read(&self, path: &str) -> anyhow::Result<Value> {
        let (status, v) = self.get(path, Some(OPS)).await?;
        anyhow::ensure!(status == 200, "GET {path}: {status} {v}");
        Ok(v)
    }

    /// POST a JSON body.
    pub async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        csrf: Option<&str>,
        body: Value,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self.http.post(self.url(path)).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(c) = csrf {
            req = req.header("x-ferry-csrf", c);
        }
        let r = req.send().await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await?))
    }

    /// POST as `ops` with its CSRF token, expecting 200.
    pub async fn act(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let (status, v) = self.post(path, Some(OPS), Some(&self.csrf), body).await?;
        anyhow::ensure!(status == 200, "POST {path}: {status} {v}");
        Ok(v)
    }

    /// A streamed scan's lines.
    pub async fn scan(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let r = self.http.get(self.url(path)).bearer_auth(OPS).send().await?;
        anyhow::ensure!(r.status() == 200, "GET {path}: {}", r.status());
        assert_eq!(r.headers()["content-type"], "application/x-ndjson");
        let text = r.text().await?;
        Ok(text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?)
    }

    /// The audit log's records.
    pub fn audit(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.console.dir().join("audit.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).expect("an audit line is JSON")).collect()
    }
}

/// The records of a scan's answer: (partition, offset, key, value).
pub fn found(lines: &[Value]) -> Vec<(u64, u64, String, String)> {
    lines
        .iter()
        .filter(|l| l["type"] == "record")
        .map(|l| {
            let r = &l["record"];
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (r["partition"].as_u64().unwrap(), r["offset"].as_u64().unwrap(), s(&r["key"]), s(&r["value"]))
        })
        .collect()
}

/// The last line of a scan, which says why it ended.
pub fn done(lines: &[Value]) -> &Value {
    let last = lines.last().expect("a scan answers at least its done line");
    assert_eq!(last["type"], "done", "{last}");
    last
}
