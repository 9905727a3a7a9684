//! The mirror's configuration: compiled-in defaults, then the TOML file, then `FERRY_MIRROR__SECTION__KEY`
//! environment variables, read the way every Ferry config is read ([`ferry_config`]): one typed serde section per
//! table, with `deny_unknown_fields` and a `Default` that is the single source of its defaults; every unknown key
//! and bad value collected at once; then each section's own `validate`, and the few rules that span sections in
//! [`cross_section`]. `ferry-mirror validate` lists every problem. `conf/mirror.toml` documents every key.
//!
//! The sections live in their own modules: [`source`] (`[source]`, routes, `[source.health]`, TLS, librdkafka
//! properties), [`target`] (with `[target.health]`, which defaults to `[source.health]`), [`topics`] (`[topics]`,
//! `[groups]`), [`sync`], [`monitor`], [`alarms`], [`verify`], and the alarm rules file and email templates ([`rules`],
//! [`templates`]), which are config files too. The alarm component reads these types; nothing here depends on it.
//!
//! Secrets never live in the config tree: tokens, the SMTP password and webhook secrets come from their own files
//! or environment variables, are held in [`Secret`] (whose `Debug` is redacted) and are never logged.

mod alarms;
mod checks;
mod monitor;
pub mod rules;
mod secret;
mod source;
mod sync;
mod target;
pub mod templates;
#[cfg(test)]
mod tests;
mod topics;
mod verify;

use std::path::{Path, PathBuf};

use ferry_config::Problems;
use serde::Deserialize;

pub use alarms::{AlarmsConfig, EmailConfig, SmtpServer, SmtpTls, WebhookConfig};
pub use monitor::MonitorConfig;
pub use secret::{MONITOR_TOKEN_ENV, SMTP_PASSWORD_ENV, SOURCE_TOKEN_ENV, Secret, TARGET_TOKEN_ENV};
pub use source::{ClusterKind, HealthCheck, HealthConfig, Route, SourceConfig, SwitchBack, TlsFiles};
pub use sync::SyncConfig;
pub use target::{TargetConfig, TargetHealth};
pub use topics::{GroupsConfig, Rename, StartPosition, TopicsConfig};
pub use verify::VerifyConfig;

/// Every problem found in a configuration; `.0` lists them, each naming its key.
pub type ConfigProblems = Problems;

/// What to do when a partition diverges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDivergence {
    /// Stop the partition and alarm (the default).
    #[default]
    Halt,
    /// Truncate the target to the divergence point and copy again from there.
    Truncate,
}

/// `[mirror]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MirrorSection {
    /// Pipeline identity; unset: `{source.cluster}_to_{target.cluster}`.
    pub name: Option<String>,
    /// Divergence policy.
    pub on_divergence: OnDivergence,
}

/// The file as written: one typed section per table, defaults applied, nothing resolved or checked yet.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct MirrorFile {
    /// `[mirror]`.
    pub mirror: MirrorSection,
    /// `[source]`.
    pub source: SourceConfig,
    /// `[target]`.
    pub target: TargetConfig,
    /// `[topics]`.
    pub topics: TopicsConfig,
    /// `[groups]`.
    pub groups: GroupsConfig,
    /// `[sync]`.
    pub sync: SyncConfig,
    /// `[monitor]`.
    pub monitor: MonitorConfig,
    /// `[alarms]`.
    pub alarms: AlarmsConfig,
    /// `[verify]`.
    pub verify: VerifyConfig,
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// Pipeline identity.
    pub name: String,
    /// Divergence policy.
    pub on_divergence: OnDivergence,
    /// Source side.
    pub source: SourceConfig,
    /// Target side.
    pub target: TargetConfig,
    /// Topic selection.
    pub topics: TopicsConfig,
    /// Group offset sync.
    pub groups: GroupsConfig,
    /// Pipeline tuning.
    pub sync: SyncConfig,
    /// REST and metrics.
    pub monitor: MonitorConfig,
    /// Alarm channels.
    pub alarms: AlarmsConfig,
    /// Continuous verification.
    pub verify: VerifyConfig,
    /// The file this was loaded from (for reloads).
    pub path: Option<PathBuf>,
}

/// The environment overrides: `FERRY_MIRROR__SECTION__KEY`, lists comma-separated.
const ENV: ferry_config::Env<'static> = ferry_config::Env {
    prefix: "FERRY_MIRROR",
    list_keys: &["topics.include", "topics.exclude", "groups.include", "groups.exclude", "target.brokers"],
};

/// The end of an unknown key's message.
const SEE: &str = "see conf/mirror.toml for every key";

/// Loads and validates `path` (the `validate` subcommand and daemon start share this).
pub fn validate(path: &Path) -> Result<MirrorConfig, ConfigProblems> {
    MirrorConfig::load(path)
}

impl MirrorConfig {
    /// Loads and validates the configuration in `path`, with environment overrides.
    pub fn load(path: &Path) -> Result<MirrorConfig, ConfigProblems> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Problems(vec![format!("cannot read {}: {e}", path.display())]))?;
        let mut cfg = Self::from_toml(&text, true)?;
        cfg.path = Some(path.to_owned());
        Ok(cfg)
    }

    /// Parses and validates TOML text (with environment overrides when `env` is set).
    pub fn from_toml(text: &str, env: bool) -> Result<MirrorConfig, ConfigProblems> {
        let tree = ferry_config::tree(text, env.then_some(ENV))?;
        let mut p = Problems::new();
        let file: MirrorFile = ferry_config::deserialize(tree, &mut p, SEE);
        let config = file.into_config(&mut p);
        p.into_result(config)
    }
}

impl MirrorFile {
    /// Resolves the secrets and the defaults that depend on other sections, and checks every section.
    fn into_config(self, p: &mut Problems) -> MirrorConfig {
        let MirrorFile { mirror, mut source, mut target, topics, groups, sync, mut monitor, mut alarms, verify } = self;
        source.resolve(p);
        target.resolve(&source.health, p);
        monitor.resolve(p);
        alarms.resolve(p);
        source.validate(p);
        target.validate(p);
        topics.validate(p);
        groups.validate(p);
        sync.validate(p);
        alarms.validate(p);
        verify.validate(p);
        let name = mirror.name.unwrap_or_else(|| format!("{}_to_{}", source.cluster, target.cluster));
        cross_section(&name, &source, &target, p);
        MirrorConfig {
            name,
            on_divergence: mirror.on_divergence,
            source,
            target,
            topics,
            groups,
            sync,
            monitor,
            alarms,
            verify,
            path: None,
        }
    }
}

/// The rules that span sections.
fn cross_section(name: &str, source: &SourceConfig, target: &TargetConfig, p: &mut Problems) {
    if source.cluster == target.cluster {
        p.push("target.cluster", format!("must differ from source.cluster ({:?})", source.cluster));
    }
    checks::name(p, "mirror.name", name);
}
