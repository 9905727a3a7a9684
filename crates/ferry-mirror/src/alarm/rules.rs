//! Alarm rules: per event kind a severity, channels, a throttle, a repeat interval and a recovery notice, plus the
//! thresholds of the lag and stall conditions.
//!
//! The shipped rules are `alerts/rules.toml`, compiled in, so the file in the repository and the daemon's
//! defaults are the same text. A user's file is laid over them key by key (see the top of that file):
//! a threshold or default comes from the user's file, else the shipped one; an event's key comes from the user's
//! `[events.NAME]`, else the shipped `[events.NAME]`, else the defaults. Parsing collects every problem, each
//! naming its key, so `ferry-mirror validate` can list them all.
//!
//! Invariant: a [`Rules`] holds a complete rule for every [`EventKind`].

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use crate::events::{EventKind, Severity};

/// The shipped rules file, `alerts/rules.toml`.
pub const SHIPPED_RULES: &str = include_str!("../../../../alerts/rules.toml");

/// Where a rule's notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channels {
    /// Every configured channel.
    All,
    /// These channels, by name (empty: log only).
    Named(Vec<String>),
}

/// At most `max` notifications per `window` for one alarm key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    /// Burst size.
    pub max: NonZeroU32,
    /// Window length (one more notification is allowed per window after the burst).
    pub window: Duration,
}

/// The resolved rule of one event kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Severity shown in notifications and logs.
    pub severity: Severity,
    /// Target channels.
    pub channels: Channels,
    /// Rate limit per alarm key.
    pub throttle: Throttle,
    /// Re-send interval while the condition lasts; `None`: never.
    pub repeat: Option<Duration>,
    /// Whether a recovery notice is sent when the condition clears.
    pub recovery: bool,
}

/// Thresholds of the conditions the [`ConditionChecker`](super::conditions::ConditionChecker) evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Lag (records) above which a partition is lagging.
    pub lag_threshold: u64,
    /// Replication latency above which a partition with lag is lagging; zero disables the latency test.
    pub latency_threshold: Duration,
    /// How long either must hold before `lag_above_threshold` is raised.
    pub for_duration: Duration,
    /// How long a partition with lag may go without progress before `partition_stalled` is raised.
    pub stall_after: Duration,
}

/// A complete rule set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Condition thresholds.
    pub thresholds: Thresholds,
    rules: BTreeMap<EventKind, Rule>,
}

/// Whether `kind` is a condition: an alarm that lasts until a clearing event ends it. Only conditions repeat
/// and have recovery notices; every other kind is a one-shot notice.
pub fn is_condition(kind: EventKind) -> bool {
    matches!(kind, EventKind::LagAboveThreshold | EventKind::PartitionStalled)
        || EventKind::ALL.iter().any(|k| k.clears() == Some(kind))
}

impl Rules {
    /// The shipped rules.
    pub fn shipped() -> Rules {
        // The shipped file is checked by `shipped_rules_parse_and_match_the_contract`; no channel names in it.
        match Rules::parse(None, &BTreeSet::new()) {
            Ok(r) => r,
            Err(problems) => unreachable!("the shipped alarm rules are invalid: {problems:?}"),
        }
    }

    /// The rules in `path` laid over the shipped ones (or the shipped ones alone when `path` is `None`),
    /// checked against the configured channel names. Problems read `alarms.rules: {path}: {key}: {what}`.
    pub fn load(path: Option<&Path>, channels: &BTreeSet<String>) -> Result<Rules, Vec<String>> {
        match path {
            None => Rules::parse(None, channels),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| vec![format!("alarms.rules: cannot read {}: {e}", p.display())])?;
                Rules::parse(Some(&text), channels)
                    .map_err(|ps| ps.into_iter().map(|m| format!("alarms.rules: {}: {m}", p.display())).collect())
            }
        }
    }

    /// Parses a user's rules text laid over the shipped rules. Problems read `{key}: {what}`.
    pub fn parse(user: Option<&str>, channels: &BTreeSet<String>) -> Result<Rules, Vec<String>> {
        let mut problems = Vec::new();
        let shipped = Layer::parse(SHIPPED_RULES, channels, &mut problems);
        if !problems.is_empty() {
            return Err(problems.into_iter().map(|p| format!("(shipped rules) {p}")).collect());
        }
        let user = user.map(|text| Layer::parse(text, channels, &mut problems)).unwrap_or_default();
        if !problems.is_empty() {
            return Err(problems);
        }
        resolve(&user, &shipped)
    }

    /// The rule of `kind`.
    pub fn rule(&self, kind: EventKind) -> &Rule {
        // Invariant: every kind is present (resolve fills all of them).
        &self.rules[&kind]
    }
}

/// A rule as one file writes it: every key optional.
#[derive(Debug, Clone, Default)]
struct PartialRule {
    severity: Option<Severity>,
    channels: Option<Channels>,
    throttle: Option<Throttle>,
    repeat: Option<Option<Duration>>,
    recovery: Option<bool>,
}

/// Thresholds as one file writes them.
#[derive(Debug, Clone, Default)]
struct PartialThresholds {
    lag_threshold: Option<u64>,
    latency_threshold: Option<Duration>,
    for_duration: Option<Duration>,
    stall_after: Option<Duration>,
}

/// One rules file.
#[derive(Debug, Clone, Default)]
struct Layer {
    thresholds: PartialThresholds,
    defaults: PartialRule,
    events: BTreeMap<EventKind, PartialRule>,
}

impl Layer {
    fn parse(text: &str, channels: &BTreeSet<String>, problems: &mut Vec<String>) -> Layer {
        let mut layer = Layer::default();
        let table: toml::Table = match text.parse() {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("invalid TOML: {}", e.to_string().trim()));
                return layer;
            }
        };
        for (key, value) in &table {
            match key.as_str() {
                "thresholds" => {
                    if let Some(t) = as_table(key, value, problems) {
                        layer.thresholds = parse_thresholds(t, problems);
                    }
                }
                "defaults" => {
                    if let Some(t) = as_table(key, value, problems) {
                        layer.defaults = parse_rule("defaults", None, t, channels, problems);
                    }
                }
                "events" => {
                    let Some(events) = as_table(key, value, problems) else { continue };
                    for (name, value) in events {
                        let key = format!("events.{name}");
                        let Some(kind) = EventKind::from_name(name) else {
                            let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
                            problems.push(format!("{key}: unknown event (events are {})", names.join(", ")));
                            continue;
                        };
                        if let Some(t) = as_table(&key, value, problems) {
                            layer.events.insert(kind, parse_rule(&key, Some(kind), t, channels, problems));
                        }
                    }
                }
                _ => problems
                    .push(format!("{key}: unknown key (the sections are [thresholds], [defaults], [events.NAME])")),
            }
        }
        layer
    }
}

fn as_table<'a>(key: &str, value: &'a toml::Value, problems: &mut Vec<String>) -> Option<&'a toml::Table> {
    match value.as_table() {
        Some(t) => Some(t),
        None => {
            problems.push(format!("{key}: must be a table"));
            None
        }
    }
}

fn duration(key: &str, value: &toml::Value, problems: &mut Vec<String>) -> Option<Duration> {
    let parsed = value.as_str().map(|s| humantime::parse_duration(s.trim()));
    match parsed {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            problems.push(format!("{key}: {value} is not a duration like \"30s\" or \"10m\" ({e})"));
            None
        }
        None => {
            problems.push(format!("{key}: {value} is not a duration string like \"30s\" or \"10m\""));
            None
        }
    }
}

fn parse_thresholds(t: &toml::Table, problems: &mut Vec<String>) -> PartialThresholds {
    let mut out = PartialThresholds::default();
    for (k, v) in t {
        let key = format!("thresholds.{k}");
        match k.as_str() {
            "lag_threshold" => match v.as_integer() {
                Some(n) if n >= 0 => out.lag_threshold = Some(n as u64),
                _ => problems.push(format!("{key}: {v} is not a record count (an integer, 0 or more)")),
            },
            "latency_threshold" => out.latency_threshold = duration(&key, v, problems),
            "for_duration" => out.for_duration = duration(&key, v, problems),
            "stall_after" => match duration(&key, v, problems) {
                Some(d) if d.is_zero() => problems.push(format!("{key}: must be more than 0s")),
                d => out.stall_after = d,
            },
            _ => problems.push(format!(
                "{key}: unknown key (thresholds are lag_threshold, latency_threshold, for_duration, stall_after)"
            )),
        }
    }
    out
}

fn parse_rule(
    prefix: &str,
    kind: Option<EventKind>,
    t: &toml::Table,
    channels: &BTreeSet<String>,
    problems: &mut Vec<String>,
) -> PartialRule {
    let mut out = PartialRule::default();
    for (k, v) in t {
        let key = format!("{prefix}.{k}");
        match k.as_str() {
            "severity" if kind.is_some() => match v.as_str().and_then(Severity::from_name) {
                Some(s) => out.severity = Some(s),
                None => problems.push(format!("{key}: {v} is not one of \"info\", \"warning\", \"critical\"")),
            },
            "channels" => out.channels = parse_channels(&key, v, channels, problems),
            "throttle" => out.throttle = parse_throttle(&key, v, problems),
            "repeat" => {
                let Some(d) = duration(&key, v, problems) else { continue };
                if let Some(kind) = kind
                    && !d.is_zero()
                    && !is_condition(kind)
                {
                    problems.push(format!(
                        "{key}: {kind} is a one-shot event with no clearing event, so it cannot repeat (use \"0s\")"
                    ));
                    continue;
                }
                out.repeat = Some((!d.is_zero()).then_some(d));
            }
            "recovery" => match v.as_bool() {
                Some(b) => out.recovery = Some(b),
                None => problems.push(format!("{key}: {v} is not true or false")),
            },
            _ => {
                let keys = if kind.is_some() {
                    "severity, channels, throttle, repeat, recovery"
                } else {
                    "channels, throttle, repeat, recovery"
                };
                problems.push(format!("{key}: unknown key (the keys are {keys})"));
            }
        }
    }
    out
}

fn parse_channels(
    key: &str,
    v: &toml::Value,
    configured: &BTreeSet<String>,
    problems: &mut Vec<String>,
) -> Option<Channels> {
    if v.as_str() == Some("all") {
        return Some(Channels::All);
    }
    let Some(list) = v.as_array() else {
        problems.push(format!("{key}: {v} is neither \"all\" nor a list of channel names"));
        return None;
    };
    let mut names = Vec::new();
    for (i, item) in list.iter().enumerate() {
        match item.as_str() {
            Some(name) if configured.contains(name) => {
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            }
            Some(name) => {
                let known: Vec<String> = configured.iter().map(|c| format!("{c:?}")).collect();
                let known = if known.is_empty() { "none is configured".to_owned() } else { known.join(", ") };
                problems.push(format!(
                    "{key}[{i}]: unknown channel {name:?} (the channels are the names of [[alarms.webhook]] and [[alarms.email]]: {known})"
                ));
            }
            None => problems.push(format!("{key}[{i}]: {item} is not a channel name")),
        }
    }
    Some(Channels::Named(names))
}

fn parse_throttle(key: &str, v: &toml::Value, problems: &mut Vec<String>) -> Option<Throttle> {
    let Some(t) = v.as_table() else {
        problems.push(format!("{key}: must be a table like {{ max = 5, window = \"10m\" }}"));
        return None;
    };
    let mut max = None;
    let mut window = None;
    for (k, v) in t {
        let sub = format!("{key}.{k}");
        match k.as_str() {
            "max" => match v.as_integer().and_then(|n| u32::try_from(n).ok()).and_then(NonZeroU32::new) {
                Some(n) => max = Some(n),
                None => problems.push(format!("{sub}: {v} is not a count of 1 or more")),
            },
            "window" => match duration(&sub, v, problems) {
                Some(d) if d.is_zero() => problems.push(format!("{sub}: must be more than 0s")),
                d => window = d,
            },
            _ => problems.push(format!("{sub}: unknown key (a throttle has max and window)")),
        }
    }
    match (max, window) {
        (Some(max), Some(window)) => Some(Throttle { max, window }),
        (None, _) if !t.contains_key("max") => {
            problems.push(format!("{key}: needs max (a count) as well as window"));
            None
        }
        (_, None) if !t.contains_key("window") => {
            problems.push(format!("{key}: needs window (a duration) as well as max"));
            None
        }
        _ => None,
    }
}

/// Lays `user` over `shipped` and fills every event's rule (see the module docs for the order).
fn resolve(user: &Layer, shipped: &Layer) -> Result<Rules, Vec<String>> {
    fn need<T>(problems: &mut Vec<String>, v: Option<T>, key: &str) -> Option<T> {
        if v.is_none() {
            problems.push(format!("{key}: is not set in the rules nor in the shipped rules"));
        }
        v
    }
    let mut problems = Vec::new();
    let (ut, st) = (&user.thresholds, &shipped.thresholds);
    let lag_threshold = need(&mut problems, ut.lag_threshold.or(st.lag_threshold), "thresholds.lag_threshold");
    let latency_threshold =
        need(&mut problems, ut.latency_threshold.or(st.latency_threshold), "thresholds.latency_threshold");
    let for_duration = need(&mut problems, ut.for_duration.or(st.for_duration), "thresholds.for_duration");
    let stall_after = need(&mut problems, ut.stall_after.or(st.stall_after), "thresholds.stall_after");
    let none = PartialRule::default();
    let mut rules = BTreeMap::new();
    for kind in EventKind::ALL {
        let u = user.events.get(&kind).unwrap_or(&none);
        let s = shipped.events.get(&kind).unwrap_or(&none);
        let (ud, sd) = (&user.defaults, &shipped.defaults);
        let key = |k: &str| format!("events.{kind}.{k}");
        let channels = u.channels.clone().or(s.channels.clone()).or(ud.channels.clone()).or(sd.channels.clone());
        let throttle = u.throttle.or(s.throttle).or(ud.throttle).or(sd.throttle);
        let recovery = u.recovery.or(s.recovery).or(ud.recovery).or(sd.recovery);
        // Defaults never make a one-shot event repeat.
        let repeat = u.repeat.or(s.repeat).or(if is_condition(kind) { ud.repeat.or(sd.repeat) } else { Some(None) });
        let (Some(channels), Some(throttle), Some(recovery), Some(repeat)) = (
            need(&mut problems, channels, &key("channels")),
            need(&mut problems, throttle, &key("throttle")),
            need(&mut problems, recovery, &key("recovery")),
            need(&mut problems, repeat, &key("repeat")),
        ) else {
            continue;
        };
        let severity = u.severity.or(s.severity).unwrap_or(kind.default_severity());
        rules.insert(kind, Rule { severity, channels, throttle, repeat, recovery });
    }
    match (lag_threshold, latency_threshold, for_duration, stall_after) {
        (Some(lag_threshold), Some(latency_threshold), Some(for_duration), Some(stall_after))
            if problems.is_empty() =>
        {
            Ok(Rules { thresholds: Thresholds { lag_threshold, latency_threshold, for_duration, stall_after }, rules })
        }
        _ => Err(problems),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn shipped_rules_parse_and_match_the_contract() {
        let r = Rules::shipped();
        assert_eq!(
            r.thresholds,
            Thresholds {
                lag_threshold: 10_000,
                latency_threshold: Duration::from_secs(60),
                for_duration: Duration::from_secs(30),
                stall_after: Duration::from_secs(60),
            }
        );
        for kind in EventKind::ALL {
            let rule = r.rule(kind);
            assert_eq!(rule.severity, kind.default_severity(), "{kind}");
            // Every warning and critical event goes to every channel; info events are logged only.
            let want = if rule.severity == Severity::Info { Channels::Named(vec![]) } else { Channels::All };
            assert_eq!(rule.channels, want, "{kind}");
            assert_eq!(rule.throttle, Throttle { max: NonZeroU32::new(5).unwrap(), window: Duration::from_secs(600) });
            assert!(rule.recovery);
            assert_eq!(rule.repeat.is_some(), is_condition(kind) && rule.severity != Severity::Info, "{kind}");
        }
        assert_eq!(r.rule(EventKind::LagAboveThreshold).repeat, Some(Duration::from_secs(3600)));
        assert_eq!(r.rule(EventKind::SourceNetNotAvailable).repeat, Some(Duration::from_secs(1800)));
    }

    #[test]
    fn a_user_file_is_laid_over_the_shipped_rules_key_by_key() {
        let text = r#"
[thresholds]
lag_threshold = 50
[defaults]
channels = ["ops"]
throttle = { max = 2, window = "1m" }
[events.lag_above_threshold]
severity = "critical"
repeat = "0s"
[events.add_topic]
recovery = false
"#;
        let r = Rules::parse(Some(text), &channels(&["ops", "oncall"])).unwrap();
        assert_eq!(r.thresholds.lag_threshold, 50);
        assert_eq!(r.thresholds.stall_after, Duration::from_secs(60));
        let lag = r.rule(EventKind::LagAboveThreshold);
        assert_eq!(lag.severity, Severity::Critical);
        assert_eq!(lag.repeat, None);
        // Neither file sets lag's channels or throttle: the user's defaults apply.
        assert_eq!(lag.channels, Channels::Named(vec!["ops".into()]));
        assert_eq!(lag.throttle, Throttle { max: NonZeroU32::new(2).unwrap(), window: Duration::from_secs(60) });
        // add_topic keeps the shipped channels (log only) under the user's own key.
        let add = r.rule(EventKind::AddTopic);
        assert_eq!(
            (add.severity, add.channels.clone(), add.recovery),
            (Severity::Info, Channels::Named(vec![]), false)
        );
        // An event the user did not mention keeps its shipped keys.
        assert_eq!(r.rule(EventKind::PartitionStalled).repeat, Some(Duration::from_secs(1800)));
        assert_eq!(r.rule(EventKind::SyncError).channels, Channels::Named(vec!["ops".into()]));
    }

    #[test]
    fn every_problem_names_its_key() {
        let text = r#"
colour = "red"
[thresholds]
lag_threshold = -1
stall_after = "0s"
latency = "1s"
[defaults]
throttle = { max = 0, window = "soon" }
[events.lag_above_threshold]
severity = "urgent"
channels = ["ops", "pager"]
repeat = 5
recovery = "yes"
[events.partition_exploded]
severity = "info"
[events.sync_error]
repeat = "10m"
throttle = { max = 3 }
"#;
        let err = Rules::parse(Some(text), &channels(&["ops"])).unwrap_err();
        let want = [
            "colour: unknown key",
            "thresholds.lag_threshold: -1 is not a record count",
            "thresholds.stall_after: must be more than 0s",
            "thresholds.latency: unknown key",
            "defaults.throttle.max: 0 is not a count of 1 or more",
            "defaults.throttle.window: \"soon\" is not a duration",
            "events.lag_above_threshold.severity: \"urgent\" is not one of",
            "events.lag_above_threshold.channels[1]: unknown channel \"pager\"",
            "events.lag_above_threshold.repeat: 5 is not a duration string",
            "events.lag_above_threshold.recovery: \"yes\" is not true or false",
            "events.partition_exploded: unknown event",
            "events.sync_error.repeat: sync_error is a one-shot event",
            "events.sync_error.throttle: needs window",
        ];
        for w in want {
            assert!(err.iter().any(|e| e.starts_with(w)), "missing {w:?} in {err:#?}");
        }
        assert_eq!(err.len(), want.len(), "{err:#?}");
    }

    #[test]
    fn bad_toml_and_unreadable_files_are_clear_errors() {
        let err = Rules::parse(Some("[events\n"), &BTreeSet::new()).unwrap_err();
        assert!(err[0].starts_with("invalid TOML:"), "{err:?}");
        let err = Rules::load(Some(Path::new("/nonexistent/rules.toml")), &BTreeSet::new()).unwrap_err();
        assert!(err[0].starts_with("alarms.rules: cannot read /nonexistent/rules.toml"), "{err:?}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.toml");
        std::fs::write(&path, "[events.lag_above_threshold]\nchannels = [\"nope\"]\n").unwrap();
        let err = Rules::load(Some(&path), &BTreeSet::new()).unwrap_err();
        assert_eq!(err.len(), 1);
        assert!(
            err[0].starts_with(&format!(
                "alarms.rules: {}: events.lag_above_threshold.channels[0]: unknown channel \"nope\"",
                path.display()
            )),
            "{err:?}"
        );
        assert!(err[0].ends_with("none is configured)"), "{err:?}");
    }

    #[test]
    fn conditions_are_the_kinds_with_a_clearing_event() {
        let conditions: Vec<EventKind> = EventKind::ALL.into_iter().filter(|k| is_condition(*k)).collect();
        assert_eq!(
            conditions,
            [
                EventKind::SourceNetNotAvailable,
                EventKind::TargetNetNotAvailable,
                EventKind::LagAboveThreshold,
                EventKind::PartitionStalled
            ]
        );
    }
}
