//! `conf/mirror.toml`, the reference for every key, against the compiled config: every documented default (see
//! [`ferry_config::documented`] for the convention) loads to the same config as leaving the key out, and every key
//! of every section is mentioned.

use std::collections::BTreeSet;
use std::path::Path;

use ferry_config::documented;

use super::super::*;

/// The reference file the documented defaults are checked in, and a base it is laid over: the required keys,
/// plus one entry of each array of tables so their entries' defaults can be checked too.
const REFERENCE_BASE: &str = r#"
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
[[alarms.webhook]]
name = "ops"
url = "http://127.0.0.1:9/hook"
[[alarms.email]]
name = "oncall"
smtp = "127.0.0.1:25"
from = "ferry@example.org"
to = ["oncall@example.org"]
"#;

/// The loaded config of `text`, as Debug text (secrets redacted), without `target.health_settings`: that is the
/// file as written, and only its resolution (`target.health`, which is compared) is a default.
fn resolved(text: &str) -> String {
    let mut c = MirrorConfig::from_toml(text, false).unwrap_or_else(|e| panic!("{e}\nin:\n{text}"));
    c.target.health_settings = TargetHealth::default();
    format!("{c:?}")
}

fn reference() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/mirror.toml");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn every_documented_default_in_conf_mirror_toml_is_the_compiled_default() {
    let text = reference();
    let documented = documented::defaults(&text).unwrap();
    let want = resolved(REFERENCE_BASE);
    for d in &documented {
        let doc = documented::with_default(REFERENCE_BASE, d).unwrap();
        assert_eq!(
            resolved(&doc),
            want,
            "conf/mirror.toml line {}: {} is not the compiled default",
            d.line,
            d.assignment
        );
    }
    // Every optional key with a default is documented so; these are all of them.
    let keys: BTreeSet<String> = documented.iter().map(|d| d.dotted()).collect();
    let want: BTreeSet<String> = [
        "mirror.on_divergence",
        "source.kind",
        "source.health.check_interval",
        "source.health.timeout",
        "source.health.failure_threshold",
        "source.health.switch_after",
        "source.health.switch_back",
        "source.health.min_switch_interval",
        "target.kind",
        "target.replication",
        "target.health.check_interval",
        "target.health.timeout",
        "target.health.failure_threshold",
        "topics.exclude",
        "topics.rename",
        "topics.discovery_interval",
        "topics.start_position",
        "groups.include",
        "groups.exclude",
        "groups.group_sync_interval",
        "sync.commit_interval",
        "sync.queue_bytes",
        "sync.max_memory",
        "sync.compression",
        "sync.max_bytes_per_sec",
        "sync.max_records_per_sec",
        "sync.shutdown_timeout",
        "sync.group_session_timeout",
        "sync.max_request_bytes",
        "sync.stall_check_interval",
        "sync.position_heartbeat",
        "verify.bytes_per_sec",
        "monitor.listen",
        "alarms.queue_size",
        "alarms.webhook.timeout",
        "alarms.webhook.retries",
        "alarms.email.tls",
        "alarms.email.timeout",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    assert_eq!(keys, want);
    assert_eq!(documented.len(), want.len(), "each default is documented once");
}

#[test]
fn a_drifted_documented_default_is_caught() {
    let text = reference().replace("# commit_interval = \"5s\"", "# commit_interval = \"6s\"");
    let d = documented::defaults(&text).unwrap().into_iter().find(|d| d.key == "commit_interval").unwrap();
    let doc = documented::with_default(REFERENCE_BASE, &d).unwrap();
    assert_ne!(resolved(&doc), resolved(REFERENCE_BASE));
    // The same for a key whose default is another section's value.
    let text = reference().replace("# failure_threshold = 3\n\n[topics]", "# failure_threshold = 4\n\n[topics]");
    let d = documented::defaults(&text)
        .unwrap()
        .into_iter()
        .find(|d| d.dotted() == "target.health.failure_threshold")
        .unwrap();
    assert_eq!(d.assignment, "failure_threshold = 4");
    assert_ne!(resolved(&documented::with_default(REFERENCE_BASE, &d).unwrap()), resolved(REFERENCE_BASE));
}

#[test]
fn conf_mirror_toml_mentions_every_key_of_every_section() {
    let mentioned = documented::mentioned(&reference()).unwrap();
    let sections: [(&str, &[&str]); 15] = [
        ("mirror", documented::fields::<MirrorSection>()),
        ("source", documented::fields::<SourceConfig>()),
        ("source.tls", documented::fields::<TlsFiles>()),
        ("source.routes", documented::fields::<Route>()),
        ("source.health", documented::fields::<HealthConfig>()),
        ("target", documented::fields::<TargetConfig>()),
        ("target.tls", documented::fields::<TlsFiles>()),
        ("target.health", documented::fields::<TargetHealth>()),
        ("topics", documented::fields::<TopicsConfig>()),
        ("groups", documented::fields::<GroupsConfig>()),
        ("sync", documented::fields::<SyncConfig>()),
        ("monitor", documented::fields::<MonitorConfig>()),
        ("alarms", documented::fields::<AlarmsConfig>()),
        ("alarms.webhook", documented::fields::<WebhookConfig>()),
        ("alarms.email", documented::fields::<EmailConfig>()),
    ];
    let mut missing = Vec::new();
    for (section, fields) in sections {
        assert!(!fields.is_empty(), "{section}");
        for f in fields {
            let key = format!("{section}.{f}");
            if !mentioned.contains(&key) {
                missing.push(key);
            }
        }
    }
    assert_eq!(missing, Vec::<String>::new(), "keys conf/mirror.toml does not mention");
}
