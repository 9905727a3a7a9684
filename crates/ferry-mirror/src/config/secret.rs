//! Secrets: tokens, the SMTP password, webhook keys and librdkafka secrets. They never live in the config tree:
//! each comes from its own file or environment variable, is held in a [`Secret`] (whose `Debug` is redacted), and
//! is never logged.

use std::collections::BTreeMap;
use std::path::Path;

use ferry_config::Problems;

/// Environment variable for the monitor's bearer token.
pub const MONITOR_TOKEN_ENV: &str = "FERRY_MONITOR_TOKEN";
/// Environment variable for the SMTP password of every email channel without a `password_file`.
pub const SMTP_PASSWORD_ENV: &str = "FERRY_SMTP_PASSWORD";
/// Environment variable for the source brokers' bearer token (alternative to `source.token_file`).
pub const SOURCE_TOKEN_ENV: &str = "FERRY_SOURCE_TOKEN";
/// Environment variable for the target brokers' bearer token (alternative to `target.token_file`).
pub const TARGET_TOKEN_ENV: &str = "FERRY_TARGET_TOKEN";

/// A secret value. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The secret in `env` (when set and not blank), else the content of `file` (trimmed; an empty or unreadable
/// file is a problem of `key`), else none.
pub(super) fn read(p: &mut Problems, key: &str, file: Option<&Path>, env: Option<&str>) -> Option<Secret> {
    if let Some(var) = env
        && let Ok(v) = std::env::var(var)
        && !v.trim().is_empty()
    {
        return Some(Secret::new(v.trim()));
    }
    let path = file?;
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => {
            p.push(key, format!("{} is empty", path.display()));
            None
        }
        Ok(text) => Some(Secret::new(text.trim())),
        Err(e) => {
            p.push(key, format!("cannot read {}: {e}", path.display()));
            None
        }
    }
}

/// Resolves librdkafka property values written as `"env:VAR"` or `"file:/path"`, so that secrets such as
/// `sasl.password` stay out of the config file. `section` is `source.kafka` or `target.kafka`.
pub(super) fn kafka(p: &mut Problems, section: &str, props: &mut BTreeMap<String, String>) {
    for (k, v) in props.iter_mut() {
        let key = format!("{section}.\"{k}\"");
        if let Some(var) = v.strip_prefix("env:") {
            *v = match std::env::var(var) {
                Ok(value) if !value.is_empty() => value,
                _ => {
                    p.push(&key, format!("environment variable {var} is not set"));
                    String::new()
                }
            };
        } else if let Some(path) = v.strip_prefix("file:") {
            *v = match std::fs::read_to_string(path) {
                Ok(text) => text.trim_end_matches(['\n', '\r']).to_owned(),
                Err(e) => {
                    p.push(&key, format!("cannot read {path}: {e}"));
                    String::new()
                }
            };
        }
    }
}
