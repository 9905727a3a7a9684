//! Turning the raw file into a [`MirrorConfig`], collecting every problem (unknown keys, bad values, missing
//! required keys, cross-section rules) so `ferry-mirror validate` can list them all at once.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use regex::Regex;

use super::raw::*;
use super::*;

/// Loads and validates `path` (the `validate` subcommand and daemon start share this).
pub fn validate(path: &std::path::Path) -> Result<MirrorConfig, ConfigProblems> {
    MirrorConfig::load(path)
}

struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, key: &str, msg: impl std::fmt::Display) {
        self.0.push(format!("{key}: {msg}"));
    }

    fn duration(&mut self, key: &str, raw: &Option<String>, default: Duration, min: Duration) -> Duration {
        let Some(text) = raw else { return default };
        match humantime::parse_duration(text.trim()) {
            Ok(d) if d < min => {
                self.add(key, format!("{text:?} is below the minimum of {}", humantime::format_duration(min)));
                default
            }
            Ok(d) => d,
            Err(e) => {
                self.add(key, format!("{text:?} is not a duration like \"5s\" or \"250ms\" ({e})"));
                default
            }
        }
    }

    fn size(&mut self, key: &str, raw: &Option<String>, default: u64) -> u64 {
        let Some(text) = raw else { return default };
        let t = text.trim();
        if let Ok(n) = t.parse::<u64>() {
            return n;
        }
        match bytesize::ByteSize::from_str(t) {
            Ok(b) => b.as_u64(),
            Err(e) => {
                self.add(key, format!("{text:?} is not a size like \"64MiB\" ({e})"));
                default
            }
        }
    }

    fn regexes(&mut self, key: &str, raw: &Option<Vec<String>>) -> Vec<Regex> {
        let mut out = Vec::new();
        for (i, pattern) in raw.iter().flatten().enumerate() {
            match Regex::new(pattern) {
                Ok(r) => out.push(r),
                Err(e) => self.add(&format!("{key}[{i}]"), format!("bad regex {pattern:?}: {e}")),
            }
        }
        out
    }

    fn choice<T: Copy>(&mut self, key: &str, raw: &Option<String>, default: T, options: &[(&str, T)]) -> T {
        let Some(text) = raw else { return default };
        match options.iter().find(|(name, _)| name == text) {
            Some((_, v)) => *v,
            None => {
                let names: Vec<_> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                self.add(key, format!("{text:?} is not one of {}", names.join(", ")));
                default
            }
        }
    }

    fn secret_file(&mut self, key: &str, file: &Option<String>, env: Option<&str>) -> Option<Secret> {
        if let Some(var) = env
            && let Ok(v) = std::env::var(var)
            && !v.trim().is_empty()
        {
            return Some(Secret::new(v.trim()));
        }
        let path = file.as_ref()?;
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => {
                self.add(key, format!("{path} is empty"));
                None
            }
            Ok(text) => Some(Secret::new(text.trim())),
            Err(e) => {
                self.add(key, format!("cannot read {path}: {e}"));
                None
            }
        }
    }

    /// Resolves librdkafka property values written as `"env:VAR"` or `"file:/path"`, so that secrets such as
    /// `sasl.password` stay out of the config file.
    fn kafka_secrets(&mut self, section: &str, props: BTreeMap<String, String>) -> BTreeMap<String, String> {
        props
            .into_iter()
            .map(|(k, v)| {
                let key = format!("{section}.\"{k}\"");
                let resolved = if let Some(var) = v.strip_prefix("env:") {
                    match std::env::var(var) {
                        Ok(value) if !value.is_empty() => value,
                        _ => {
                            self.add(&key, format!("environment variable {var} is not set"));
                            String::new()
                        }
                    }
                } else if let Some(path) = v.strip_prefix("file:") {
                    match std::fs::read_to_string(path) {
                        Ok(text) => text.trim_end_matches(['\n', '\r']).to_owned(),
                        Err(e) => {
                            self.add(&key, format!("cannot read {path}: {e}"));
                            String::new()
                        }
                    }
                } else {
                    v
                };
                (k, resolved)
            })
            .collect()
    }

    fn name(&mut self, key: &str, name: &str) {
        if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            self.add(key, format!("{name:?} must be 1-100 characters of A-Z a-z 0-9 . _ -"));
        }
    }

    fn addresses(&mut self, key: &str, list: &[String]) {
        if list.is_empty() {
            self.add(key, "needs at least one \"host:port\" address");
        }
        for (i, a) in list.iter().enumerate() {
            let ok = a
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                self.add(&format!("{key}[{i}]"), format!("{a:?} is not a \"host:port\" address"));
            }
        }
    }

    fn tls(&mut self, key: &str, raw: &Option<RawTls>) -> Option<TlsFiles> {
        let t = raw.as_ref()?;
        let files = TlsFiles {
            ca_file: t.ca_file.as_ref().map(PathBuf::from),
            cert_file: t.cert_file.as_ref().map(PathBuf::from),
            key_file: t.key_file.as_ref().map(PathBuf::from),
            domain: t.domain.clone(),
        };
        if files.cert_file.is_some() != files.key_file.is_some() {
            self.add(key, "cert_file and key_file go together (mutual TLS)");
        }
        for (k, p) in [("ca_file", &files.ca_file), ("cert_file", &files.cert_file), ("key_file", &files.key_file)] {
            if let Some(p) = p
                && !p.is_file()
            {
                self.add(&format!("{key}.{k}"), format!("{} does not exist", p.display()));
            }
        }
        Some(files)
    }
}

const KINDS: &[(&str, ClusterKind)] = &[("ferry", ClusterKind::Ferry), ("kafka", ClusterKind::Kafka)];

/// Converts the raw config, collecting every problem.
pub(super) fn validate_raw(
    raw: RawConfig,
    unknown: Vec<String>,
    (source_kafka, target_kafka): (BTreeMap<String, String>, BTreeMap<String, String>),
) -> Result<MirrorConfig, ConfigProblems> {
    let mut p = Problems(Vec::new());
    for key in unknown {
        if key != "source.kafka"
            && key != "target.kafka"
            && !key.starts_with("source.kafka.")
            && !key.starts_with("target.kafka.")
        {
            p.add(&key, "unknown key (see conf/mirror.toml for every key)");
        }
    }

    // [source]
    let s = &raw.source;
    let source_cluster = s.cluster.clone().unwrap_or_else(|| "source".into());
    p.name("source.cluster", &source_cluster);
    let source_kind = p.choice("source.kind", &s.kind, ClusterKind::Ferry, KINDS);
    let mut routes = Vec::new();
    match &s.routes {
        None => p.add("source.routes", "at least one [[source.routes]] is required (no default)"),
        Some(list) if list.is_empty() => p.add("source.routes", "at least one [[source.routes]] is required"),
        Some(list) => {
            let mut seen = BTreeSet::new();
            for (i, r) in list.iter().enumerate() {
                let key = format!("source.routes[{i}]");
                let name = r.name.clone().unwrap_or_default();
                if name.is_empty() {
                    p.add(&format!("{key}.name"), "every route needs a name");
                } else {
                    p.name(&format!("{key}.name"), &name);
                    if !seen.insert(name.clone()) {
                        p.add(&format!("{key}.name"), format!("duplicate route name {name:?}"));
                    }
                }
                let brokers = r.brokers.clone().unwrap_or_default();
                p.addresses(&format!("{key}.brokers"), &brokers);
                let bind = match &r.bind {
                    None => None,
                    Some(b) => match b.parse::<IpAddr>() {
                        Ok(ip) => Some(ip),
                        Err(_) => {
                            p.add(&format!("{key}.bind"), format!("{b:?} is not an IP address"));
                            None
                        }
                    },
                };
                if bind.is_some() && source_kind == ClusterKind::Kafka {
                    p.add(
                        &format!("{key}.bind"),
                        "a bind address is not supported for kind = \"kafka\": librdkafka cannot bind a local address",
                    );
                }
                routes.push(Route { name, brokers, bind });
            }
        }
    }
    let h = &s.health;
    let health = HealthConfig {
        check_interval: p.duration(
            "source.health.check_interval",
            &h.check_interval,
            Duration::from_secs(1),
            Duration::from_millis(50),
        ),
        timeout: p.duration("source.health.timeout", &h.timeout, Duration::from_secs(1), Duration::from_millis(10)),
        failure_threshold: h.failure_threshold.unwrap_or(3),
        switch_after: p.duration(
            "source.health.switch_after",
            &h.switch_after,
            Duration::from_secs(10),
            Duration::ZERO,
        ),
        switch_back: p.choice(
            "source.health.switch_back",
            &h.switch_back,
            SwitchBack::Manual,
            &[("manual", SwitchBack::Manual), ("auto", SwitchBack::Auto)],
        ),
        min_switch_interval: p.duration(
            "source.health.min_switch_interval",
            &h.min_switch_interval,
            Duration::from_secs(60),
            Duration::ZERO,
        ),
    };
    if health.failure_threshold == 0 {
        p.add("source.health.failure_threshold", "must be at least 1");
    }
    let source = SourceConfig {
        cluster: source_cluster,
        cluster_id: s.cluster_id.clone().filter(|c| !c.is_empty()),
        kind: source_kind,
        token: p.secret_file("source.token_file", &s.token_file, Some(SOURCE_TOKEN_ENV)),
        tls: p.tls("source.tls", &s.tls),
        routes,
        health,
        kafka: p.kafka_secrets("source.kafka", source_kafka),
    };
    if source.kind == ClusterKind::Ferry && !source.kafka.is_empty() {
        p.add("source.kafka", "librdkafka properties apply only with source.kind = \"kafka\"");
    }

    // [target]
    let t = &raw.target;
    let target_cluster = t.cluster.clone().unwrap_or_else(|| "target".into());
    p.name("target.cluster", &target_cluster);
    let brokers = match &t.brokers {
        None => {
            p.add("target.brokers", "is required (no default): the target cluster's broker addresses");
            Vec::new()
        }
        Some(b) => {
            p.addresses("target.brokers", b);
            b.clone()
        }
    };
    let target = TargetConfig {
        cluster: target_cluster,
        brokers,
        kind: p.choice("target.kind", &t.kind, ClusterKind::Ferry, KINDS),
        token: p.secret_file("target.token_file", &t.token_file, Some(TARGET_TOKEN_ENV)),
        tls: p.tls("target.tls", &t.tls),
        kafka: p.kafka_secrets("target.kafka", target_kafka),
    };
    if target.kind == ClusterKind::Ferry && !target.kafka.is_empty() {
        p.add("target.kafka", "librdkafka properties apply only with target.kind = \"kafka\"");
    }
    if source.cluster == target.cluster {
        p.add("target.cluster", format!("must differ from source.cluster ({:?})", source.cluster));
    }

    // [mirror]
    let name = raw.mirror.name.clone().unwrap_or_else(|| format!("{}_to_{}", source.cluster, target.cluster));
    p.name("mirror.name", &name);
    let on_divergence = p.choice(
        "mirror.on_divergence",
        &raw.mirror.on_divergence,
        OnDivergence::Halt,
        &[("halt", OnDivergence::Halt), ("truncate", OnDivergence::Truncate)],
    );

    // [topics]
    let tp = &raw.topics;
    let include = p.regexes("topics.include", &tp.include);
    if tp.include.as_ref().is_none_or(Vec::is_empty) {
        p.add("topics.include", "list at least one regex of topics to mirror (e.g. [\"^orders\\\\..*$\"])");
    }
    let topics = TopicsConfig {
        include,
        exclude: p.regexes("topics.exclude", &tp.exclude.clone().or_else(|| Some(vec!["^__".into()]))),
        rename: p.choice(
            "topics.rename",
            &tp.rename,
            Rename::Identity,
            &[("identity", Rename::Identity), ("prefix", Rename::Prefix)],
        ),
        discovery_interval: p.duration(
            "topics.discovery_interval",
            &tp.discovery_interval,
            Duration::from_secs(10),
            Duration::from_millis(100),
        ),
        start_position: p.choice(
            "topics.start_position",
            &tp.start_position,
            StartPosition::Earliest,
            &[("earliest", StartPosition::Earliest), ("latest", StartPosition::Latest)],
        ),
    };

    // [groups]
    let g = &raw.groups;
    let groups = GroupsConfig {
        include: p.regexes("groups.include", &g.include),
        exclude: p.regexes("groups.exclude", &g.exclude),
        group_sync_interval: p.duration(
            "groups.group_sync_interval",
            &g.group_sync_interval,
            Duration::from_secs(10),
            Duration::from_millis(100),
        ),
    };

    // [sync]
    let sy = &raw.sync;
    let sync = SyncConfig {
        commit_interval: p.duration(
            "sync.commit_interval",
            &sy.commit_interval,
            Duration::from_secs(5),
            Duration::from_millis(10),
        ),
        queue_bytes: p.size("sync.queue_bytes", &sy.queue_bytes, 16 << 20),
        max_memory: p.size("sync.max_memory", &sy.max_memory, 256 << 20),
        compression: p.choice("sync.compression", &sy.compression, true, &[("zstd", true), ("none", false)]),
        max_bytes_per_sec: p.size("sync.max_bytes_per_sec", &sy.max_bytes_per_sec, 0),
        max_records_per_sec: sy.max_records_per_sec.unwrap_or(0),
        shutdown_timeout: p.duration(
            "sync.shutdown_timeout",
            &sy.shutdown_timeout,
            Duration::from_secs(30),
            Duration::from_millis(100),
        ),
        group_session_timeout: p.duration(
            "sync.group_session_timeout",
            &sy.group_session_timeout,
            Duration::from_secs(10),
            Duration::from_secs(1),
        ),
        max_request_bytes: p.size("sync.max_request_bytes", &sy.max_request_bytes, 4 << 20),
        stall_check_interval: p.duration(
            "sync.stall_check_interval",
            &sy.stall_check_interval,
            Duration::from_secs(1),
            Duration::from_millis(50),
        ),
    };
    if sync.queue_bytes < 64 * 1024 {
        p.add("sync.queue_bytes", "must be at least 64KiB");
    }
    if sync.max_memory < sync.queue_bytes {
        p.add("sync.max_memory", format!("must be at least sync.queue_bytes ({})", sync.queue_bytes));
    }
    if sync.max_request_bytes < 64 * 1024 {
        p.add("sync.max_request_bytes", "must be at least 64KiB");
    }

    // [monitor]
    let m = &raw.monitor;
    let listen_text = m.listen.clone().unwrap_or_else(|| "127.0.0.1:9300".into());
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            p.add("monitor.listen", format!("{listen_text:?} is not an \"ip:port\" address"));
            SocketAddr::from(([127, 0, 0, 1], 9300))
        }
    };
    let monitor_tls = match &m.tls {
        None => None,
        Some(t) => match (&t.cert_file, &t.key_file) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            _ => {
                p.add("monitor.tls", "needs both cert_file and key_file");
                None
            }
        },
    };
    let monitor = MonitorConfig {
        listen,
        token: p.secret_file("monitor.token_file", &m.token_file, Some(MONITOR_TOKEN_ENV)),
        tls: monitor_tls,
        audit_log: m.audit_log.as_ref().map(PathBuf::from),
    };

    // [alarms]
    let a = &raw.alarms;
    let mut channel_names = BTreeSet::new();
    let mut webhooks = Vec::new();
    for (i, w) in a.webhook.iter().flatten().enumerate() {
        let key = format!("alarms.webhook[{i}]");
        let name = w.name.clone().unwrap_or_default();
        p.name(&format!("{key}.name"), &name);
        if !channel_names.insert(name.clone()) {
            p.add(&format!("{key}.name"), format!("duplicate channel name {name:?}"));
        }
        let url = w.url.clone().unwrap_or_default();
        if !(url.starts_with("http://") || url.starts_with("https://")) || reqwest::Url::parse(&url).is_err() {
            p.add(&format!("{key}.url"), format!("{url:?} is not an http(s) URL"));
        }
        webhooks.push(WebhookConfig {
            name,
            url,
            secret: p.secret_file(&format!("{key}.secret_file"), &w.secret_file, None),
            timeout: p.duration(
                &format!("{key}.timeout"),
                &w.timeout,
                Duration::from_secs(5),
                Duration::from_millis(10),
            ),
            retries: w.retries.unwrap_or(3),
        });
    }
    let mut emails = Vec::new();
    for (i, e) in a.email.iter().flatten().enumerate() {
        let key = format!("alarms.email[{i}]");
        let name = e.name.clone().unwrap_or_default();
        p.name(&format!("{key}.name"), &name);
        if !channel_names.insert(name.clone()) {
            p.add(&format!("{key}.name"), format!("duplicate channel name {name:?}"));
        }
        let smtp = e.smtp.clone().unwrap_or_default();
        let (host, port) =
            match smtp.rsplit_once(':').and_then(|(h, port)| Some((h.to_owned(), port.parse::<u16>().ok()?))) {
                Some((h, port)) if !h.is_empty() => (h, port),
                _ => {
                    p.add(&format!("{key}.smtp"), format!("{smtp:?} is not a \"host:port\" address"));
                    (String::new(), 0)
                }
            };
        let from = e.from.clone().unwrap_or_default();
        if !from.contains('@') {
            p.add(&format!("{key}.from"), format!("{from:?} is not an email address"));
        }
        let to = e.to.clone().unwrap_or_default();
        if to.is_empty() || to.iter().any(|t| !t.contains('@')) {
            p.add(&format!("{key}.to"), "needs one or more email addresses");
        }
        let password = p
            .secret_file(&format!("{key}.password_file"), &e.password_file, None)
            .or_else(|| std::env::var(SMTP_PASSWORD_ENV).ok().filter(|v| !v.is_empty()).map(Secret::new));
        let tls = p.choice(
            &format!("{key}.tls"),
            &e.tls,
            SmtpTls::StartTls,
            &[("starttls", SmtpTls::StartTls), ("tls", SmtpTls::Tls), ("none", SmtpTls::None)],
        );
        let ca_file = e.ca_file.as_ref().map(PathBuf::from);
        if let Some(ca) = &ca_file {
            if tls == SmtpTls::None {
                p.add(&format!("{key}.ca_file"), "is only used with tls = \"starttls\" or \"tls\"");
            } else if !ca.is_file() {
                p.add(&format!("{key}.ca_file"), format!("{} does not exist", ca.display()));
            }
        }
        emails.push(EmailConfig {
            name,
            host,
            port,
            tls,
            ca_file,
            username: e.username.clone(),
            password,
            from,
            to,
            timeout: p.duration(
                &format!("{key}.timeout"),
                &e.timeout,
                Duration::from_secs(10),
                Duration::from_millis(10),
            ),
        });
    }
    let rules = a.rules.as_ref().map(PathBuf::from);
    if let Some(r) = &rules
        && !r.is_file()
    {
        p.add("alarms.rules", format!("{} does not exist", r.display()));
    }
    let alarms = AlarmsConfig { rules, queue_size: a.queue_size.unwrap_or(1000).max(1) as usize, webhooks, emails };
    // The rules file, the email templates and the email addresses (crate::alarm owns their formats).
    p.0.extend(crate::alarm::check(&alarms));

    if !p.0.is_empty() {
        return Err(ConfigProblems(p.0));
    }
    Ok(MirrorConfig { name, on_divergence, source, target, topics, groups, sync, monitor, alarms, path: None })
}

#[cfg(test)]
mod tests {
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
        assert_eq!(c.sync.queue_bytes, 16 << 20);
        assert_eq!(c.sync.max_memory, 256 << 20);
        assert_eq!(c.monitor.listen, "127.0.0.1:9300".parse().unwrap());
        assert_eq!(c.topics.exclude.len(), 1);
        assert!(c.sync.compression);
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
        for needle in
            ["mirror.nmae", "duplicate route name", "source.health.check_interval", "target.brokers", "bad regex"]
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
        assert_eq!(c.sync.queue_bytes, 16 << 20);
    }
}
