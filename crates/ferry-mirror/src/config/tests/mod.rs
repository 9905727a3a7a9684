//! The mirror config's tests: defaults, every problem at once, secrets, librdkafka properties, `[target.health]`,
//! `[alarms]` with its rules and templates; `reference` checks `conf/mirror.toml` against the compiled defaults.

mod reference;

use std::time::Duration;

use super::*;

const MINIMAL: &str = r#"
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

#[test]
fn minimal_config_gets_the_documented_defaults() {
    let c = MirrorConfig::from_toml(MINIMAL, false).unwrap();
    assert_eq!(c.name, "dc-a_to_dc-b");
    assert_eq!(c.on_divergence, OnDivergence::Halt);
    assert_eq!(c.source.health.failure_threshold, 3);
    assert_eq!(c.source.health.switch_back, SwitchBack::Manual);
    assert_eq!(c.sync.queue_bytes, 64 << 20);
    assert_eq!(c.sync.max_memory, 512 << 20);
    assert_eq!(c.monitor.listen, "127.0.0.1:9300".parse().unwrap());
    assert_eq!(c.topics.exclude.len(), 1);
    assert!(c.sync.compression);
    assert_eq!(c.verify.bytes_per_sec, 512 << 10);
}

#[test]
fn verify_bytes_per_sec_is_off_or_at_least_4kib_and_unknown_keys_are_named() {
    let with = |section: &str| MirrorConfig::from_toml(&format!("{MINIMAL}\n[verify]\n{section}\n"), false);
    assert_eq!(with("bytes_per_sec = \"0\"").unwrap().verify.bytes_per_sec, 0);
    assert_eq!(with("bytes_per_sec = \"64MiB\"").unwrap().verify.bytes_per_sec, 64 << 20);
    let err = with("bytes_per_sec = \"1KiB\"").unwrap_err();
    assert_eq!(err.0, ["verify.bytes_per_sec: must be 0 (off) or at least 4KiB"]);
    let err = with("rate = \"1MiB\"").unwrap_err();
    assert!(err.0.len() == 1 && err.0[0].contains("verify.rate"), "{:?}", err.0);
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"
[mirror]
nmae = "typo"
[source]
cluster = "dc-a"
[[source.routes]]
name = "a"
brokers = ["127.0.0.1:1"]
[[source.routes]]
name = "a"
brokers = ["127.0.0.1:2"]
[source.health]
check_interval = "fast"
[target]
cluster = "dc-b"
[topics]
include = ["(unclosed"]
"#;
    let err = MirrorConfig::from_toml(text, false).unwrap_err();
    let all = err.0.join("\n");
    for needle in ["mirror.nmae", "duplicate route name", "source.health.check_interval", "target.brokers", "bad regex"]
    {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
    assert_eq!(err.0.len(), 5, "{all}");
}

#[test]
fn email_ca_file_must_exist_hold_certificates_and_go_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "just text").unwrap();
    let email = |name: &str, tls: &str, ca: &std::path::Path| {
        format!(
            "[[alarms.email]]\nname = \"{name}\"\nsmtp = \"127.0.0.1:25\"\ntls = \"{tls}\"\nca_file = \"{}\"\nfrom = \"f@example.org\"\nto = [\"t@example.org\"]\n",
            ca.display()
        )
    };
    let text = format!(
        "{MINIMAL}{}{}{}",
        email("missing", "starttls", &dir.path().join("nope.pem")),
        email("plain", "none", &not_pem),
        email("garbage", "tls", &not_pem)
    );
    let err = MirrorConfig::from_toml(&text, false).unwrap_err();
    let all = err.0.join("\n");
    let expected = [
        format!("alarms.email[0].ca_file: {} does not exist", dir.path().join("nope.pem").display()),
        "alarms.email[1].ca_file: is only used with tls = \"starttls\" or \"tls\"".to_owned(),
        format!("alarm channel \"garbage\": ca_file {} holds no PEM certificate", not_pem.display()),
    ];
    for needle in &expected {
        assert!(all.contains(needle.as_str()), "missing {needle:?} in:\n{all}");
    }
    assert_eq!(err.0.len(), 3, "{all}");
}

#[test]
fn no_routes_is_a_problem() {
    let text = "[target]\nbrokers = [\"127.0.0.1:1\"]\n[topics]\ninclude = [\".*\"]\n";
    let err = MirrorConfig::from_toml(text, false).unwrap_err();
    assert!(err.0.iter().any(|e| e.starts_with("source.routes")), "{err}");
}

#[test]
fn route_listeners_and_target_replication_are_checked() {
    let with = |route: &str, target: &str| {
        let text = MINIMAL
            .replace("brokers = [\"127.0.0.1:7411\"]\n", &format!("brokers = [\"127.0.0.1:7411\"]\n{route}\n"))
            .replace("brokers = [\"127.0.0.1:7412\"]\n", &format!("brokers = [\"127.0.0.1:7412\"]\n{target}\n"));
        MirrorConfig::from_toml(&text, false)
    };
    let c = with("listener = \"backup-1\"", "replication = \"raft3\"").unwrap();
    assert_eq!((c.source.routes[0].listener.as_deref(), c.target.replication.as_str()), (Some("backup-1"), "raft3"));
    assert_eq!(MirrorConfig::from_toml(MINIMAL, false).unwrap().target.replication, "source");
    let err = with("listener = \"back up\"", "replication = \"raft5\"").unwrap_err();
    assert_eq!(
        err.0,
        [
            "source.routes[0].listener: \"back up\" must be a listener name: A-Z a-z 0-9 - _",
            "target.replication: \"raft5\" is not one of \"source\", \"single\", \"double_write\", \"raft3\"",
        ]
    );
}

#[test]
fn kafka_properties_keep_their_dots_and_bind_is_refused_for_kafka() {
    let text = r#"
[source]
cluster = "dc-a"
kind = "kafka"
[[source.routes]]
name = "primary"
brokers = ["127.0.0.1:9092"]
bind = "127.0.0.1"
[source.kafka]
"session.timeout.ms" = "6000"
fetch.min.bytes = 1
[target]
cluster = "dc-b"
brokers = ["127.0.0.1:7412"]
[topics]
include = [".*"]
"#;
    let err = MirrorConfig::from_toml(text, false).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert!(err.0[0].contains("librdkafka cannot bind"), "{err}");
    let ok = text.replace("bind = \"127.0.0.1\"\n", "");
    let c = MirrorConfig::from_toml(&ok, false).unwrap();
    assert_eq!(c.source.kafka.get("session.timeout.ms").map(String::as_str), Some("6000"));
    assert_eq!(c.source.kafka.get("fetch.min.bytes").map(String::as_str), Some("1"));
}

#[test]
fn kafka_property_values_may_come_from_env_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("sasl.pass");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let text = format!(
        r#"
[source]
cluster = "dc-a"
kind = "kafka"
[[source.routes]]
name = "primary"
brokers = ["127.0.0.1:9092"]
[source.kafka]
"sasl.password" = "file:{}"
"sasl.username" = "env:FERRY_TEST_SURELY_UNSET_VAR"
[target]
cluster = "dc-b"
brokers = ["127.0.0.1:7412"]
[topics]
include = [".*"]
"#,
        secret.display()
    );
    let err = MirrorConfig::from_toml(&text, false).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert!(err.0[0].contains("FERRY_TEST_SURELY_UNSET_VAR"), "{err}");
    let ok = text.replace("\"sasl.username\" = \"env:FERRY_TEST_SURELY_UNSET_VAR\"\n", "");
    let c = MirrorConfig::from_toml(&ok, false).unwrap();
    assert_eq!(c.source.kafka.get("sasl.password").map(String::as_str), Some("s3cret"));
}

#[test]
fn secrets_are_redacted_in_debug() {
    let s = Secret::new("hunter2");
    assert_eq!(format!("{s:?}"), "Secret(***)");
}

#[test]
fn the_shipped_reference_config_validates() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/mirror.toml");
    let c = MirrorConfig::from_toml(&std::fs::read_to_string(path).unwrap(), false).unwrap();
    assert_eq!(c.name, "dc-a_to_dc-b");
    assert_eq!(c.source.routes.len(), 1);
    assert_eq!(c.sync.queue_bytes, 64 << 20);
}

#[test]
fn target_health_defaults_to_the_source_health_key_by_key() {
    let c = MirrorConfig::from_toml(MINIMAL, false).unwrap();
    assert_eq!(
        c.target.health,
        HealthCheck { check_interval: Duration::from_secs(1), timeout: Duration::from_secs(1), failure_threshold: 3 }
    );
    let text = format!(
        "{MINIMAL}[source.health]\ncheck_interval = \"2s\"\ntimeout = \"3s\"\nfailure_threshold = 5\n\
         [target.health]\ntimeout = \"500ms\"\n"
    );
    let c = MirrorConfig::from_toml(&text, false).unwrap();
    assert_eq!(
        c.target.health,
        HealthCheck {
            check_interval: Duration::from_secs(2),
            timeout: Duration::from_millis(500),
            failure_threshold: 5
        }
    );
    assert_eq!(
        c.source.health.check(),
        HealthCheck { check_interval: Duration::from_secs(2), timeout: Duration::from_secs(3), failure_threshold: 5 }
    );
}

#[test]
fn target_health_is_checked_like_source_health() {
    let text = format!(
        "{MINIMAL}[target.health]\ncheck_interval = \"10ms\"\ntimeout = \"soon\"\nfailure_threshold = 0\ncolour = 1\n"
    );
    let err = MirrorConfig::from_toml(&text, false).unwrap_err();
    let mut got = err.0.clone();
    got.sort();
    assert_eq!(got.len(), 4, "{err}");
    assert_eq!(got[0], "target.health.check_interval: \"10ms\" is below the minimum of 50ms");
    assert!(
        got[1].starts_with(
            "target.health.colour: unknown key (the keys here are check_interval, timeout, failure_threshold;"
        ),
        "{err}"
    );
    assert_eq!(got[2], "target.health.failure_threshold: must be at least 1");
    assert!(got[3].starts_with("target.health.timeout: \"soon\" is not a duration like"), "{err}");
    // The same values in [source.health] are reported there, once, and not again for the target that inherits them.
    let text = format!("{MINIMAL}[source.health]\ncheck_interval = \"10ms\"\nfailure_threshold = 0\n");
    let err = MirrorConfig::from_toml(&text, false).unwrap_err();
    assert_eq!(
        err.0,
        [
            "source.health.check_interval: \"10ms\" is below the minimum of 50ms",
            "source.health.failure_threshold: must be at least 1"
        ]
    );
}

#[test]
fn a_list_whose_entries_are_all_bad_is_not_also_missing() {
    let text = MINIMAL.replace("include = [\"^orders$\"]", "include = [\"(a\", \"^ok$\", \"(b\"]");
    let err = MirrorConfig::from_toml(&text, false).unwrap_err();
    assert_eq!(err.0.len(), 2, "{err}");
    assert!(err.0[0].starts_with("topics.include[0]: bad regex \"(a\""), "{err}");
    assert!(err.0[1].starts_with("topics.include[2]: bad regex \"(b\""), "{err}");
    let text = MINIMAL.replace("include = [\"^orders$\"]", "include = [\"(a\"]");
    let err = MirrorConfig::from_toml(&text, false).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
}

fn alarms_config(rules: Option<std::path::PathBuf>) -> AlarmsConfig {
    AlarmsConfig {
        rules,
        queue_size: 10,
        webhooks: vec![WebhookConfig {
            name: "ops".into(),
            url: "http://127.0.0.1:9/hook".into(),
            secret_file: None,
            secret: None,
            timeout: Duration::from_secs(1),
            retries: 0,
        }],
        emails: vec![EmailConfig {
            name: "oncall".into(),
            smtp: SmtpServer { host: "127.0.0.1".into(), port: 9 },
            tls: SmtpTls::None,
            ca_file: None,
            username: None,
            password_file: None,
            password_env: None,
            password: None,
            from: "ferry@example.org".into(),
            to: vec!["oncall@example.org".into()],
            timeout: Duration::from_secs(1),
        }],
    }
}

#[test]
fn alarms_validation_reports_rules_templates_and_credentials() {
    let check = |c: &AlarmsConfig| {
        let mut p = Problems::new();
        c.validate(&mut p);
        p.0
    };
    assert_eq!(check(&alarms_config(None)), Vec::<String>::new());
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, "[events.sync_error]\nchannels = [\"ops\", \"pager\"]\n").unwrap();
    std::fs::create_dir(dir.path().join("templates")).unwrap();
    std::fs::write(dir.path().join("templates/email_subject.txt"), "{nope}").unwrap();
    let mut c = alarms_config(Some(rules.clone()));
    c.emails[0].username = Some("ferry".into());
    let problems = check(&c);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("events.sync_error.channels[1]: unknown channel \"pager\""), "{problems:#?}");
    assert!(problems[1].contains("templates/email_subject.txt: unknown placeholder {nope}"), "{problems:#?}");
    assert!(
        problems[2].starts_with("alarm channel \"oncall\": username is set but there is no password"),
        "{problems:#?}"
    );
    // A missing rules file is reported once, as missing.
    let missing = dir.path().join("elsewhere/missing.toml");
    assert_eq!(
        check(&alarms_config(Some(missing.clone()))),
        [format!("alarms.rules: {} does not exist", missing.display())]
    );
}
