//! Scenario 12: `ferry-mirror validate --config F` lists every problem of a bad config at once and exits with 2;
//! a good config validates with 0.

use std::process::Output;

use ferry_testkit::{MIRROR_BIN, binary_path};

async fn validate(text: &str) -> anyhow::Result<(Output, String)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("mirror.toml");
    std::fs::write(&path, text)?;
    let output = tokio::process::Command::new(binary_path(MIRROR_BIN)?)
        .arg("validate")
        .arg("--config")
        .arg(&path)
        .env_remove("FERRY_MIRROR__SYNC__COMMIT_INTERVAL")
        .output()
        .await?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    Ok((output, text))
}

const GOOD: &str = r#"
[mirror]
name = "a_to_b"
[source]
cluster = "dc-a"
[[source.routes]]
name = "primary"
brokers = ["127.0.0.1:7411"]
[target]
cluster = "dc-b"
brokers = ["127.0.0.1:7412"]
[topics]
include = ["^orders$"]
"#;

#[tokio::test]
async fn validate_lists_every_problem_and_exits_2() -> anyhow::Result<()> {
    let (out, text) = validate(GOOD).await?;
    assert_eq!(out.status.code(), Some(0), "a good config validates: {text}");

    // An unknown key, a bad regex, duplicate route names and a bad duration, all in one file.
    let bad = r#"
[mirror]
name = "a_to_b"
colour = "blue"
[source]
cluster = "dc-a"
[[source.routes]]
name = "primary"
brokers = ["127.0.0.1:7411"]
[[source.routes]]
name = "primary"
brokers = ["127.0.0.1:7413"]
[target]
cluster = "dc-b"
brokers = ["127.0.0.1:7412"]
[topics]
include = ["^orders($"]
[sync]
commit_interval = "five seconds"
"#;
    let (out, text) = validate(bad).await?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    for needle in [
        "mirror.colour",
        "unknown key",
        "topics.include[0]",
        "bad regex",
        "duplicate route name",
        "sync.commit_interval",
    ] {
        assert!(text.contains(needle), "the report names {needle:?}:\n{text}");
    }
    assert!(text.contains("4 config problem(s)"), "exactly the four problems are listed:\n{text}");

    // No routes at all, and a bad duration elsewhere: both listed.
    let no_routes = r#"
[source]
cluster = "dc-a"
[source.health]
timeout = "soon"
[target]
brokers = ["127.0.0.1:7412"]
[topics]
include = ["^orders$"]
"#;
    let (out, text) = validate(no_routes).await?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    for needle in ["source.routes", "at least one [[source.routes]]", "source.health.timeout"] {
        assert!(text.contains(needle), "the report names {needle:?}:\n{text}");
    }
    assert!(text.contains("2 config problem(s)"), "exactly the two problems are listed:\n{text}");
    Ok(())
}
