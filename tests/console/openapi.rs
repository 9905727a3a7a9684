//! A property test against docs/openapi-console.yaml: every operation it lists, called with random and hostile
//! path, query and body values, never answers 5xx; every error answer is `{"code", "reason"}`; an action without
//! credentials is 401, and one without its CSRF token is 403, whatever its input.

use ferry_client::admin::TopicConfig;
use ferry_client::{Producer, ProducerConfig, ProducerRecord};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use crate::common::{Env, OPS};

/// Calls per operation and credential mode.
const CASES: usize = 12;

fn text(rng: &mut StdRng) -> String {
    let pool = [
        "dc1",
        "t",
        "g",
        "0",
        "1",
        "-1",
        "",
        "a b",
        "ü/ß",
        "..%2F..",
        "(",
        "[a-",
        "99999999999999999999",
        "true",
        "null",
        "%00",
        "x.dlq",
    ];
    if rng.random_bool(0.1) { "z".repeat(rng.random_range(100..400)) } else { (*pool.choose(rng).unwrap()).to_owned() }
}

fn value_for(schema: &Value, rng: &mut StdRng) -> Value {
    if rng.random_bool(0.3) {
        return json!(text(rng));
    }
    match schema["type"].as_str() {
        Some("integer") => json!([0i64, 1, 3, -5, i64::MAX, 1 << 40].choose(rng).copied().unwrap()),
        Some("boolean") => json!(rng.random_bool(0.5)),
        Some("array") => json!([value_for(&schema["items"], rng)]),
        Some("object") => json!({"key": text(rng), "value": text(rng)}),
        _ => match schema["enum"].as_array() {
            Some(e) if rng.random_bool(0.7) => e.choose(rng).cloned().unwrap(),
            _ => json!(text(rng)),
        },
    }
}

fn resolve<'a>(spec: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str() {
        Some(r) => r.trim_start_matches("#/").split('/').fold(spec, |node, part| &node[part]),
        None => v,
    }
}

fn query_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A random request for an operation: its path and query, and a body.
fn request(spec: &Value, path: &str, op: &Value, rng: &mut StdRng) -> (String, Value) {
    let mut url = path.to_owned();
    let mut query = Vec::new();
    for p in op["parameters"].as_array().into_iter().flatten() {
        let p = resolve(spec, p);
        let name = p["name"].as_str().unwrap();
        let v = value_for(&p["schema"], rng);
        match p["in"].as_str() {
            Some("path") => {
                let good = match name {
                    "cluster" => "dc1",
                    "topic" => "t",
                    "group" => "g",
                    _ => "0",
                };
                let v = if rng.random_bool(0.5) { good.to_owned() } else { query_text(&v) };
                url = url.replace(&format!("{{{name}}}"), &encode(&v));
            }
            Some("query") if rng.random_bool(0.5) => query.push(format!("{name}={}", encode(&query_text(&v)))),
            _ => {}
        }
    }
    if !query.is_empty() {
        url = format!("{url}?{}", query.join("&"));
    }
    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
    let mut body = serde_json::Map::new();
    for (k, s) in schema["properties"].as_object().into_iter().flatten() {
        if rng.random_bool(0.7) {
            body.insert(k.clone(), value_for(s, rng));
        }
    }
    if rng.random_bool(0.1) {
        body.insert("unexpected".into(), json!(1));
    }
    (url, Value::Object(body))
}

async fn call(
    env: &Env,
    method: &str,
    url: &str,
    body: &Value,
    token: Option<&str>,
    csrf: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let mut req = if method == "post" { env.http.post(env.url(url)).json(body) } else { env.http.get(env.url(url)) };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(c) = csrf {
        req = req.header("x-ferry-csrf", c);
    }
    let r = req.send().await?;
    let status = r.status().as_u16();
    let ndjson = r.headers().get("content-type").is_some_and(|c| c == "application/x-ndjson");
    let text = r.text().await?;
    let v = if ndjson { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
    Ok((status, v))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_calls_of_every_documented_operation_never_5xx_and_actions_need_credentials_and_csrf()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("t", 2, TopicConfig::default(), None).await?;
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    for i in 0..20 {
        producer.send(ProducerRecord::new("t", format!("v{i}")).with_key(format!("k{i}"))).await?.await?;
    }
    producer.close().await;
    let text = std::fs::read_to_string(ferry_testkit::workspace_root().join("docs/openapi-console.yaml"))?;
    let spec: Value = serde_norway::from_str(&text)?;
    let (_seed, mut rng) = ferry_testkit::seeded_rng("console OpenAPI calls")?;
    let mut calls = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        if !path.starts_with("/api/") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            for _ in 0..CASES {
                let (url, body) = request(&spec, path, op, &mut rng);
                let modes: &[(Option<&str>, Option<&str>)] = if method == "post" {
                    &[(None, None), (Some(OPS), None), (Some(OPS), Some(env.csrf.as_str()))]
                } else {
                    &[(None, None), (Some(OPS), None)]
                };
                for (token, csrf) in modes {
                    let (status, answer) = call(&env, method, &url, &body, *token, *csrf).await?;
                    calls += 1;
                    let what = format!(
                        "{method} {url} {body} token={} csrf={}: {status} {answer}",
                        token.is_some(),
                        csrf.is_some()
                    );
                    assert!(status < 500, "{what}");
                    if status >= 400 {
                        assert!(answer["code"].is_string() && answer["reason"].is_string(), "{what}");
                    }
                    let path_only = url.split('?').next().unwrap_or_default();
                    if (path_only.contains("//") || path_only.ends_with('/')) && status == 404 {
                        // An empty path segment may name no route.
                        continue;
                    }
                    match (method.as_str(), token, csrf) {
                        (_, None, _) => assert_eq!(status, 401, "{what}"),
                        ("post", Some(_), None) => {
                            assert_eq!((status, answer["code"].as_str()), (403, Some("csrf_required")), "{what}")
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(calls > 300, "{calls} calls");
    Ok(())
}
