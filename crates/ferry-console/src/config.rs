//! The console's configuration (`conf/console.toml` documents every key): where it listens, the clusters it shows,
//! the mirror monitors it links to, who may use it (tokens with a scope) and where the audit log goes.
//!
//! Invariants: unknown keys are refused; every problem is reported at once; secrets (console and broker tokens)
//! come from their own files and are never part of the config text, a log line or an error message.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9500";
/// Default byte budget of one filter scan or key search.
pub const DEFAULT_SCAN_BUDGET: u64 = 64 * 1024 * 1024;
/// The largest byte budget a request may ask for.
pub const MAX_SCAN_BUDGET: u64 = 4 * 1024 * 1024 * 1024;
/// Default period of the groups' backlog samples (60 of them: the last hour).
pub const DEFAULT_LAG_SAMPLE_INTERVAL: &str = "60s";
/// Backlog samples kept per group.
pub const LAG_SAMPLES: usize = 60;
/// The most records one browse page or scan answers.
pub const MAX_PAGE_RECORDS: usize = 500;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every page and GET call.
    Read,
    /// Read, plus the actions (produce, resend, redrive, offset reset, transaction resolution).
    Admin,
}

/// One cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Its name in URLs and pages (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// A file holding the broker token the console presents (none: no token).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Call this cluster's brokers with each caller's own console token instead of `token_file`, so the broker's
    /// scopes for that token decide what the caller may do (anonymous readers still use `token_file`).
    #[serde(default)]
    pub forward_user_token: bool,
}

/// One mirror monitor whose status the overview shows.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorLink {
    /// Display name.
    pub name: String,
    /// The monitor's base URL (`http://127.0.0.1:9300`).
    pub url: String,
}

/// One console token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who it is (written in audit records).
    pub name: String,
    /// The file holding the token.
    pub token_file: PathBuf,
    /// `read` or `admin`.
    pub scope: Scope,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default = "default_listen")]
    listen: String,
    #[serde(default)]
    audit_log: Option<PathBuf>,
    #[serde(default)]
    anonymous_read: bool,
    #[serde(default = "default_budget")]
    scan_budget_bytes: u64,
    #[serde(default = "default_lag_interval")]
    lag_sample_interval: String,
    #[serde(default)]
    clusters: Vec<ClusterConfig>,
    #[serde(default)]
    mirrors: Vec<MirrorLink>,
    #[serde(default)]
    tokens: Vec<TokenConfig>,
}

fn default_listen() -> String {
    DEFAULT_LISTEN.to_owned()
}

fn default_lag_interval() -> String {
    DEFAULT_LAG_SAMPLE_INTERVAL.to_owned()
}

const fn default_budget() -> u64 {
    DEFAULT_SCAN_BUDGET
}

/// A token read from its file (never printed).
#[derive(Clone)]
pub struct LoadedToken {
    /// Who.
    pub name: String,
    /// Scope.
    pub scope: Scope,
    /// The secret.
    pub secret: String,
}

impl std::fmt::Debug for LoadedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedToken").field("name", &self.name).field("scope", &self.scope).finish()
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// JSON-lines audit file (always also logged at target `audit`).
    pub audit_log: Option<PathBuf>,
    /// Pages and GET calls without a token (a read scope for everyone who can reach the port).
    pub anonymous_read: bool,
    /// Default byte budget of a scan.
    pub scan_budget_bytes: u64,
    /// How often each message-model group's backlog and counters are sampled.
    pub lag_sample_interval: std::time::Duration,
    /// Clusters, in display order.
    pub clusters: Vec<ClusterConfig>,
    /// Broker tokens per cluster (same order as `clusters`).
    pub broker_tokens: Vec<Option<String>>,
    /// Mirror monitors.
    pub mirrors: Vec<MirrorLink>,
    /// Console tokens.
    pub tokens: Vec<LoadedToken>,
}

fn read_secret(path: &Path, what: &str, problems: &mut Vec<String>) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Ok(_) => {
            problems.push(format!("{what}: {} is empty", path.display()));
            None
        }
        Err(e) => {
            problems.push(format!("{what}: cannot read {}: {e}", path.display()));
            None
        }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl ConsoleConfig {
    /// Reads and validates `path`; every problem at once, one per line.
    pub fn load(path: &Path) -> Result<ConsoleConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        ConsoleConfig::parse(&text)
    }

    /// Parses and validates a config text (token files are read).
    pub fn parse(text: &str) -> Result<ConsoleConfig, String> {
        let raw: Raw = toml::from_str(text).map_err(|e| format!("invalid config: {e}"))?;
        let mut problems = Vec::new();
        let listen = raw.listen.parse::<SocketAddr>().unwrap_or_else(|e| {
            problems.push(format!("listen: {:?} is not an address (ip:port): {e}", raw.listen));
            SocketAddr::from(([127, 0, 0, 1], 0))
        });
        if raw.scan_budget_bytes == 0 || raw.scan_budget_bytes > MAX_SCAN_BUDGET {
            problems.push(format!("scan_budget_bytes: {} is outside 1..={MAX_SCAN_BUDGET}", raw.scan_budget_bytes));
        }
        let lag_sample_interval = match humantime::parse_duration(&raw.lag_sample_interval) {
            Ok(d) if d >= std::time::Duration::from_millis(100) && d <= std::time::Duration::from_secs(3600) => d,
            Ok(_) => {
                problems.push(format!("lag_sample_interval: {:?} is outside 100ms..=1h", raw.lag_sample_interval));
                std::time::Duration::from_secs(60)
            }
            Err(e) => {
                problems.push(format!("lag_sample_interval: {:?} is not a duration: {e}", raw.lag_sample_interval));
                std::time::Duration::from_secs(60)
            }
        };
        if raw.clusters.is_empty() {
            problems.push("clusters: at least one [[clusters]] entry is required".to_owned());
        }
        let mut broker_tokens = Vec::new();
        for (i, c) in raw.clusters.iter().enumerate() {
            if !valid_name(&c.name) {
                problems.push(format!("clusters[{i}].name: {:?} must be 1-64 of [A-Za-z0-9._-]", c.name));
            }
            if raw.clusters[..i].iter().any(|o| o.name == c.name) {
                problems.push(format!("clusters[{i}].name: {:?} is used twice", c.name));
            }
            if c.brokers.is_empty() {
                problems.push(format!("clusters[{i}].brokers: list at least one host:port"));
            }
            let what = format!("clusters[{i}].token_file");
            broker_tokens.push(c.token_file.as_deref().and_then(|p| read_secret(p, &what, &mut problems)));
        }
        for (i, m) in raw.mirrors.iter().enumerate() {
            if !(m.url.starts_with("http://") || m.url.starts_with("https://")) {
                problems.push(format!("mirrors[{i}].url: {:?} must start with http:// or https://", m.url));
            }
        }
        let mut tokens = Vec::new();
        for (i, t) in raw.tokens.iter().enumerate() {
            let what = format!("tokens[{i}].token_file");
            if let Some(secret) = read_secret(&t.token_file, &what, &mut problems) {
                if tokens.iter().any(|o: &LoadedToken| o.secret == secret) {
                    problems.push(format!("tokens[{i}]: the same token is configured twice"));
                }
                tokens.push(LoadedToken { name: t.name.clone(), scope: t.scope, secret });
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        Ok(ConsoleConfig {
            listen,
            audit_log: raw.audit_log,
            anonymous_read: raw.anonymous_read,
            scan_budget_bytes: raw.scan_budget_bytes,
            lag_sample_interval,
            clusters: raw.clusters,
            broker_tokens,
            mirrors: raw.mirrors,
            tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = r#"
listen = "nowhere"
scan_budget_bytes = 0
lag_sample_interval = "1ms"
[[clusters]]
name = "a b"
brokers = []
[[mirrors]]
name = "m"
url = "ftp://x"
"#;
        let e = ConsoleConfig::parse(text).unwrap_err();
        for needle in [
            "listen:",
            "scan_budget_bytes:",
            "lag_sample_interval:",
            "clusters[0].name",
            "clusters[0].brokers",
            "mirrors[0].url",
        ] {
            assert!(e.contains(needle), "{needle} missing from {e}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_and_defaults_apply() {
        assert!(
            ConsoleConfig::parse("bogus = 1\n[[clusters]]\nname='a'\nbrokers=['x:1']").unwrap_err().contains("bogus")
        );
        let c = ConsoleConfig::parse("[[clusters]]\nname='a'\nbrokers=['x:1']").unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert!(!c.anonymous_read);
        assert_eq!(c.scan_budget_bytes, DEFAULT_SCAN_BUDGET);
    }

    #[test]
    fn the_shipped_sample_is_valid_and_shows_the_compiled_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/console.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = ConsoleConfig::parse(&text).unwrap();
        assert_eq!(c.clusters.len(), 1);
        for shown in [
            format!("# listen = \"{DEFAULT_LISTEN}\""),
            "# anonymous_read = false".to_owned(),
            format!("# lag_sample_interval = \"{DEFAULT_LAG_SAMPLE_INTERVAL}\""),
            format!("# scan_budget_bytes = {DEFAULT_SCAN_BUDGET}"),
        ] {
            assert!(text.lines().any(|l| l == shown), "{shown} missing");
        }
    }
}
