//! `[topics]` (which source topics are mirrored and how they are named on the target) and `[groups]` (whose
//! committed offsets are copied to the target for failover). SIGHUP reloads both.

use std::time::Duration;

use ferry_config::{Problems, de};
use regex::Regex;
use serde::Deserialize;

use super::checks;

/// How target topic names are derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rename {
    /// Same name (the default).
    #[default]
    Identity,
    /// `{source.cluster}.{topic}`.
    Prefix,
}

/// Where a partition new to the mirror starts on the very first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// The source's log start (the default).
    #[default]
    Earliest,
    /// The source's log end.
    Latest,
}

/// Smallest discovery and group sync interval.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// `[topics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// Topics to mirror (any match). Required: no default.
    #[serde(deserialize_with = "checks::regexes")]
    pub include: Vec<Regex>,
    /// Topics never mirrored (any match wins over include).
    #[serde(deserialize_with = "checks::regexes")]
    pub exclude: Vec<Regex>,
    /// Target naming.
    pub rename: Rename,
    /// Discovery period.
    #[serde(deserialize_with = "de::duration")]
    pub discovery_interval: Duration,
    /// First-run start position.
    pub start_position: StartPosition,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            include: Vec::new(),
            exclude: vec![Regex::new("^__").expect("a valid constant pattern")],
            rename: Rename::Identity,
            discovery_interval: Duration::from_secs(10),
            start_position: StartPosition::Earliest,
        }
    }
}

impl TopicsConfig {
    /// Whether `other` selects and names topics exactly as this does (the same patterns in the same order, the
    /// same rename and start position): a discovery round under either decides the same.
    pub fn decides_as(&self, other: &TopicsConfig) -> bool {
        fn same(a: &[Regex], b: &[Regex]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.as_str() == b.as_str())
        }
        same(&self.include, &other.include)
            && same(&self.exclude, &other.exclude)
            && self.rename == other.rename
            && self.start_position == other.start_position
    }

    /// Every problem of `[topics]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        if self.include.is_empty() && !p.has("topics.include") {
            p.push("topics.include", "list at least one regex of topics to mirror (e.g. [\"^orders\\\\..*$\"])");
        }
        p.at_least("topics.discovery_interval", self.discovery_interval, MIN_INTERVAL);
    }
}

/// `[groups]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupsConfig {
    /// Groups whose offsets are synced.
    #[serde(deserialize_with = "checks::regexes")]
    pub include: Vec<Regex>,
    /// Groups never synced.
    #[serde(deserialize_with = "checks::regexes")]
    pub exclude: Vec<Regex>,
    /// Sync period.
    #[serde(deserialize_with = "de::duration")]
    pub group_sync_interval: Duration,
}

impl Default for GroupsConfig {
    fn default() -> Self {
        GroupsConfig { include: Vec::new(), exclude: Vec::new(), group_sync_interval: Duration::from_secs(10) }
    }
}

impl GroupsConfig {
    /// Every problem of `[groups]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        p.at_least("groups.group_sync_interval", self.group_sync_interval, MIN_INTERVAL);
    }
}
