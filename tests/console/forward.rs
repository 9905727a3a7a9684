//! `forward_user_token`: the broker's scopes for each console user's own token, end to end. One broker with scoped
//! tokens and one console showing it twice: cluster `fwd` forwards the caller's token, cluster `svc` uses the
//! console's own broker token. `alice` is a console admin whose broker token has only the consume scope; `root`
//! has produce, consume and admin on both.

use std::path::Path;

use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, OffsetSpec};
use ferry_testkit::{BrokerProcess, ConsoleProcess};
use serde_json::{Value, json};

use crate::common::IO_BUDGET;

const SVC: &str = "console-svc-secret-8c41d2e07b";
const ALICE: &str = "alice-secret-3f9a61c2d84e";
const ROOT: &str = "root-secret-b27e05d9c13a";

fn broker_tokens(dir: &Path) -> anyhow::Result<String> {
    let mut config = String::new();
    for (name, secret, scopes) in [
        ("console-svc", SVC, r#"["produce", "consume", "admin"]"#),
        ("alice", ALICE, r#"["consume"]"#),
        ("root", ROOT, r#"["produce", "consume", "admin"]"#),
    ] {
        let file = dir.join(format!("{name}.token"));
        std::fs::write(&file, format!("{secret}\n"))?;
        config.push_str(&format!(
            "[[auth.tokens]]\nname = \"{name}\"\ntoken_file = {:?}\nscopes = {scopes}\ntopics = [\".*\"]\ngroups = [\".*\"]\n\n",
            file.display().to_string()
        ));
    }
    Ok(config)
}

fn console_config(broker: &BrokerProcess) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
audit_log = "audit.jsonl"
[[clusters]]
name = "fwd"
brokers = ["{addr}"]
token_file = "svc.token"
forward_user_token = true
[[clusters]]
name = "svc"
brokers = ["{addr}"]
token_file = "svc.token"
[[tokens]]
name = "alice"
token_file = "alice.token"
scope = "admin"
[[tokens]]
name = "root"
token_file = "root.token"
scope = "admin"
"#,
        addr = broker.addr()
    )
}

struct Caller<'a> {
    http: &'a reqwest::Client,
    base: String,
    token: &'static str,
    csrf: String,
}

impl Caller<'_> {
    async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(self.token).send().await?;
        Ok((r.status().as_u16(), r.json().await?))
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.token)
            .header("x-ferry-csrf", &self.csrf)
            .json(&body)
            .send()
            .await?;
        Ok((r.status().as_u16(), r.json().await?))
    }
}

async fn caller<'a>(
    http: &'a reqwest::Client,
    console: &ConsoleProcess,
    token: &'static str,
) -> anyhow::Result<Caller<'a>> {
    let mut c = Caller { http, base: console.url(), token, csrf: String::new() };
    let (status, session) = c.get("/api/v1/session").await?;
    anyhow::ensure!(status == 200, "session: {status} {session}");
    assert_eq!(session["scope"], "admin");
    c.csrf = session["csrf"].as_str().unwrap_or_default().to_owned();
    Ok(c)
}

fn produce(value: &str) -> Value {
    json!({"topic": "orders", "partition": 0, "key": "k", "value": value, "confirm": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_read_only_broker_token_is_refused_a_mutation_the_console_scope_allows() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let secrets = tempfile::tempdir()?;
    let broker = BrokerProcess::builder().config(broker_tokens(secrets.path())?).start().await?;
    let root_client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]).with_token(ROOT))?;
    let admin = Admin::new(root_client);
    admin.create_topic("orders", 1, TopicConfig::default(), None).await?;
    let console = ConsoleProcess::start(
        &console_config(&broker),
        &[("svc.token", SVC), ("alice.token", ALICE), ("root.token", ROOT)],
    )
    .await?;
    let http = reqwest::Client::builder().timeout(IO_BUDGET).build()?;
    let alice = caller(&http, &console, ALICE).await?;
    let root = caller(&http, &console, ROOT).await?;
    let end = async || -> anyhow::Result<u64> {
        Ok(admin.list_offset("orders", 0, OffsetSpec::Latest).await?.log_end_offset)
    };

    // Forwarded: alice's own broker token has no produce scope, so the broker refuses and the console says why.
    let (s, e) = alice.post("/api/v1/clusters/fwd/produce", produce("from-alice-fwd")).await?;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    for part in ["the broker refused", "token \"alice\"", "Produce", "produce scope"] {
        assert!(reason.contains(part), "{part:?} missing from {reason:?}");
    }
    assert_eq!(end().await?, 0, "the refused produce wrote nothing");
    // Her reads pass (consume scope), and so does root's produce through the same forwarding cluster.
    let (s, page) = alice.get("/api/v1/clusters/fwd/topics/orders/partitions/0/records?offset=0").await?;
    assert_eq!((s, page["records"].as_array().map(Vec::len)), (200, Some(0)), "{page}");
    let (s, w) = root.post("/api/v1/clusters/fwd/produce", produce("from-root-fwd")).await?;
    assert_eq!((s, &w["written"]), (200, &json!({"topic": "orders", "partition": 0, "offset": 0})), "{w}");
    // Without forwarding the console's own broker token writes for her: the difference is the forwarding alone.
    let (s, w) = alice.post("/api/v1/clusters/svc/produce", produce("from-alice-svc")).await?;
    assert_eq!((s, &w["written"]), (200, &json!({"topic": "orders", "partition": 0, "offset": 1})), "{w}");
    assert_eq!(end().await?, 2);
    let (s, page) = alice.get("/api/v1/clusters/fwd/topics/orders/partitions/0/records?offset=0").await?;
    assert_eq!(s, 200, "{page}");
    let got: Vec<(u64, &str)> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["offset"].as_u64().unwrap(), r["value"].as_str().unwrap()))
        .collect();
    assert_eq!(got, vec![(0, "from-root-fwd"), (1, "from-alice-svc")]);

    // A browser session forwards the token it logged in with.
    let login = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(IO_BUDGET).build()?;
    let r = login.post(format!("{}/login", console.url())).form(&[("token", ALICE)]).send().await?;
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers()["set-cookie"].to_str()?.split(';').next().unwrap_or_default().to_owned();
    let session: Value =
        login.get(format!("{}/api/v1/session", console.url())).header("cookie", &cookie).send().await?.json().await?;
    let r = login
        .post(format!("{}/api/v1/clusters/fwd/produce", console.url()))
        .header("cookie", &cookie)
        .header("x-ferry-csrf", session["csrf"].as_str().unwrap_or_default())
        .json(&produce("from-alice-session"))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 403);
    let e: Value = r.json().await?;
    assert!(e["reason"].as_str().unwrap_or_default().contains("token \"alice\""), "{e}");
    assert_eq!(end().await?, 2);

    // The audit log names who and the outcome; no secret anywhere in it or in the console's log.
    let text = std::fs::read_to_string(console.dir().join("audit.jsonl"))?;
    let lines: Vec<Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let acts: Vec<(&str, &str, &str, &str)> = lines
        .iter()
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap_or_default();
            (s("action"), s("who"), s("path"), s("outcome"))
        })
        .collect();
    assert_eq!(
        acts,
        vec![
            ("produce", "alice", "/api/v1/clusters/fwd/produce", "forbidden"),
            ("produce", "root", "/api/v1/clusters/fwd/produce", "ok"),
            ("produce", "alice", "/api/v1/clusters/svc/produce", "ok"),
            ("login", "alice", "/login", "ok"),
            ("produce", "alice", "/api/v1/clusters/fwd/produce", "forbidden"),
        ]
    );
    for secret in [SVC, ALICE, ROOT] {
        assert!(!text.contains(secret), "a secret is in the audit log");
        assert!(!console.logs().contains(secret), "a secret is in the console's log");
    }
    // The broker saw alice's token, not the console's, on the refused calls.
    assert!(broker.logs().contains("alice"), "the broker's log names no denial of alice");
    Ok(())
}
