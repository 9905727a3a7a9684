//! A rules file as written: typed serde tables (every key optional, unknown keys refused), their checks, and the
//! deserializers whose messages name what is expected.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;
use serde::de::{self as serde_de, Deserializer, SeqAccess, Visitor};

use super::rule::{Channels, Throttle, is_condition};
use crate::events::{EventKind, Severity};

/// `[thresholds]` as one file writes it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ThresholdsTable {
    #[serde(deserialize_with = "record_count")]
    pub(super) lag_threshold: Option<u64>,
    #[serde(deserialize_with = "de::opt_duration")]
    pub(super) latency_threshold: Option<Duration>,
    #[serde(deserialize_with = "de::opt_duration")]
    pub(super) for_duration: Option<Duration>,
    #[serde(deserialize_with = "de::opt_duration")]
    pub(super) stall_after: Option<Duration>,
    #[serde(deserialize_with = "de::opt_duration")]
    pub(super) rpo_threshold: Option<Duration>,
}

/// `throttle = { max = N, window = "10m" }` as one file writes it.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ThrottleTable {
    #[serde(deserialize_with = "count")]
    max: Option<NonZeroU32>,
    #[serde(deserialize_with = "de::opt_duration")]
    window: Option<Duration>,
}

/// `[defaults]` or one `[events.NAME]` as one file writes it: every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RuleTable {
    #[serde(deserialize_with = "severity")]
    severity: Option<Severity>,
    channels: Option<ChannelsValue>,
    throttle: Option<ThrottleTable>,
    #[serde(deserialize_with = "de::opt_duration")]
    repeat: Option<Duration>,
    #[serde(deserialize_with = "boolean")]
    recovery: Option<bool>,
}

/// One rules file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RulesFile {
    thresholds: ThresholdsTable,
    defaults: RuleTable,
    events: BTreeMap<String, RuleTable>,
}

/// A rule as one file writes it, checked.
#[derive(Debug, Clone, Default)]
pub(super) struct PartialRule {
    pub(super) severity: Option<Severity>,
    pub(super) channels: Option<Channels>,
    pub(super) throttle: Option<Throttle>,
    pub(super) repeat: Option<Option<Duration>>,
    pub(super) recovery: Option<bool>,
}

/// One rules file, checked.
#[derive(Debug, Clone, Default)]
pub(super) struct Layer {
    pub(super) thresholds: ThresholdsTable,
    pub(super) defaults: PartialRule,
    pub(super) events: BTreeMap<EventKind, PartialRule>,
}

impl RulesFile {
    /// Parses and checks one file; every problem goes to `problems`.
    pub(super) fn parse(text: &str, channels: &BTreeSet<String>, problems: &mut Problems) -> Layer {
        let tree = match ferry_config::toml_tree(text) {
            Ok(t) => t,
            Err(e) => {
                problems.push_text(e);
                return Layer::default();
            }
        };
        let file: RulesFile = ferry_config::deserialize(tree, problems, "");
        file.validate(channels, problems)
    }

    fn validate(self, channels: &BTreeSet<String>, p: &mut Problems) -> Layer {
        let t = &self.thresholds;
        if t.stall_after.is_some_and(|d| d.is_zero()) {
            p.push("thresholds.stall_after", "must be more than 0s");
        }
        if self.defaults.severity.is_some() {
            p.push("defaults.severity", "unknown key (a severity is set per event, in [events.NAME])");
        }
        let defaults = self.defaults.validate("defaults", None, channels, p);
        let mut events = BTreeMap::new();
        for (name, table) in &self.events {
            let key = format!("events.{name}");
            let Some(kind) = EventKind::from_name(name) else {
                let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
                p.push(&key, format!("unknown event (events are {})", names.join(", ")));
                continue;
            };
            events.insert(kind, table.validate(&key, Some(kind), channels, p));
        }
        Layer { thresholds: self.thresholds, defaults, events }
    }
}

impl RuleTable {
    fn validate(
        &self,
        prefix: &str,
        kind: Option<EventKind>,
        configured: &BTreeSet<String>,
        p: &mut Problems,
    ) -> PartialRule {
        let mut repeat = self.repeat.map(|d| (!d.is_zero()).then_some(d));
        if let (Some(kind), Some(Some(_))) = (kind, repeat)
            && !is_condition(kind)
        {
            p.push(
                format!("{prefix}.repeat"),
                format!("{kind} is a one-shot event with no clearing event, so it cannot repeat (use \"0s\")"),
            );
            repeat = None;
        }
        PartialRule {
            severity: self.severity,
            channels: self.channels.as_ref().map(|c| c.check(&format!("{prefix}.channels"), configured, p)),
            throttle: self.throttle.and_then(|t| t.check(&format!("{prefix}.throttle"), p)),
            repeat,
            recovery: self.recovery,
        }
    }
}

impl ThrottleTable {
    fn check(self, key: &str, p: &mut Problems) -> Option<Throttle> {
        if self.window.is_some_and(|w| w.is_zero()) {
            p.push(format!("{key}.window"), "must be more than 0s");
            return None;
        }
        match (self.max, self.window) {
            (Some(max), Some(window)) => Some(Throttle { max, window }),
            (Some(_), None) => {
                p.push(key, "needs window (a duration) as well as max");
                None
            }
            (None, Some(_)) => {
                p.push(key, "needs max (a count) as well as window");
                None
            }
            // Both missing, or both bad and reported already.
            (None, None) => None,
        }
    }
}

/// `channels` as written: `"all"` or a list of names.
#[derive(Debug, Clone)]
enum ChannelsValue {
    All,
    Named(Vec<String>),
}

impl ChannelsValue {
    fn check(&self, key: &str, configured: &BTreeSet<String>, p: &mut Problems) -> Channels {
        let ChannelsValue::Named(list) = self else { return Channels::All };
        let mut names: Vec<String> = Vec::new();
        for (i, name) in list.iter().enumerate() {
            if !configured.contains(name) {
                let known: Vec<String> = configured.iter().map(|c| format!("{c:?}")).collect();
                let known = if known.is_empty() { "none is configured".to_owned() } else { known.join(", ") };
                p.push(
                    format!("{key}[{i}]"),
                    format!(
                        "unknown channel {name:?} (the channels are the names of [[alarms.webhook]] and [[alarms.email]]: {known})"
                    ),
                );
            } else if !names.contains(name) {
                names.push(name.clone());
            }
        }
        Channels::Named(names)
    }
}

impl<'de> Deserialize<'de> for ChannelsValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ChannelsValue, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChannelsValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"all\" or a list of channel names")
            }
            fn visit_str<E: serde_de::Error>(self, v: &str) -> Result<ChannelsValue, E> {
                match v {
                    "all" => Ok(ChannelsValue::All),
                    _ => Err(E::custom(format!("{v:?} is neither \"all\" nor a list of channel names"))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ChannelsValue, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<ChannelName>()? {
                    names.push(name.0);
                }
                Ok(ChannelsValue::Named(names))
            }
        }
        d.deserialize_any(V)
    }
}

/// One channel name in a list.
struct ChannelName(String);

impl<'de> Deserialize<'de> for ChannelName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ChannelName, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ChannelName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a channel name")
            }
            fn visit_str<E: serde_de::Error>(self, v: &str) -> Result<ChannelName, E> {
                Ok(ChannelName(v.to_owned()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A value the visitor below did not expect, as TOML writes it.
fn written(v: impl fmt::Display, quote: bool) -> String {
    if quote { format!("\"{v}\"") } else { v.to_string() }
}

/// A visitor whose every unexpected value reads `{value} {what}`.
macro_rules! one_kind {
    ($name:ident, $ty:ty, $what:expr, { $($body:tt)* }) => {
        struct $name;
        impl Visitor<'_> for $name {
            type Value = $ty;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($what)
            }
            $($body)*
            fn visit_str<E: serde_de::Error>(self, v: &str) -> Result<$ty, E> {
                Err(E::custom(format!("{} {}", written(v, true), $what)))
            }
            fn visit_i64<E: serde_de::Error>(self, v: i64) -> Result<$ty, E> {
                Err(E::custom(format!("{} {}", written(v, false), $what)))
            }
            fn visit_f64<E: serde_de::Error>(self, v: f64) -> Result<$ty, E> {
                Err(E::custom(format!("{} {}", written(v, false), $what)))
            }
            fn visit_bool<E: serde_de::Error>(self, v: bool) -> Result<$ty, E> {
                Err(E::custom(format!("{} {}", written(v, false), $what)))
            }
        }
    };
}

one_kind!(RecordCount, u64, "is not a record count (an integer, 0 or more)", {
    fn visit_u64<E: serde_de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
});

fn record_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(RecordCount).map(Some)
}

one_kind!(Count, NonZeroU32, "is not a count of 1 or more", {
    fn visit_u64<E: serde_de::Error>(self, v: u64) -> Result<NonZeroU32, E> {
        u32::try_from(v)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| E::custom(format!("{v} is not a count of 1 or more")))
    }
});

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<NonZeroU32>, D::Error> {
    d.deserialize_any(Count).map(Some)
}

struct Boolean;

impl Visitor<'_> for Boolean {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("true or false")
    }
    fn visit_bool<E: serde_de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }
    fn visit_str<E: serde_de::Error>(self, v: &str) -> Result<bool, E> {
        Err(E::custom(format!("{v:?} is not true or false")))
    }
    fn visit_i64<E: serde_de::Error>(self, v: i64) -> Result<bool, E> {
        Err(E::custom(format!("{v} is not true or false")))
    }
    fn visit_u64<E: serde_de::Error>(self, v: u64) -> Result<bool, E> {
        Err(E::custom(format!("{v} is not true or false")))
    }
}

fn boolean<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    d.deserialize_any(Boolean).map(Some)
}

fn severity<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Severity>, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Severity;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("one of \"info\", \"warning\", \"critical\"")
        }
        fn visit_str<E: serde_de::Error>(self, v: &str) -> Result<Severity, E> {
            Severity::from_name(v)
                .ok_or_else(|| E::custom(format!("{v:?} is not one of \"info\", \"warning\", \"critical\"")))
        }
    }
    d.deserialize_str(V).map(Some)
}
