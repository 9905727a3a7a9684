//! The alarm rules file (`alerts/rules.toml`, `[alarms] rules`): per event kind a severity, channels, a throttle,
//! a repeat interval and a recovery notice, plus the thresholds of the lag, RPO and stall conditions. Read like the
//! daemons' config files: typed serde tables with `deny_unknown_fields`, every problem collected
//! ([`ferry_config::deserialize`]), then each table's own checks.
//!
//! The shipped rules are `alerts/rules.toml`, compiled in, so the file in the repository and the daemon's
//! defaults are the same text. A user's file is laid over them key by key (see the top of that file):
//! a threshold or default comes from the user's file, else the shipped one; an event's key comes from the user's
//! `[events.NAME]`, else the shipped `[events.NAME]`, else the defaults. Problems name their key, so
//! `ferry-mirror validate` can list them all.
//!
//! Invariant: a [`Rules`] holds a complete rule for every [`EventKind`].

mod file;
mod rule;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ferry_config::Problems;

pub use self::rule::{Channels, Rule, Thresholds, Throttle, is_condition};

use self::file::{Layer, PartialRule, RulesFile};
use crate::events::EventKind;

/// The shipped rules file, `alerts/rules.toml`.
pub const SHIPPED_RULES: &str = include_str!("../../../../../alerts/rules.toml");

/// A complete rule set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Condition thresholds.
    pub thresholds: Thresholds,
    rules: BTreeMap<EventKind, Rule>,
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
        let mut problems = Problems::new();
        let shipped = RulesFile::parse(SHIPPED_RULES, channels, &mut problems);
        if !problems.is_empty() {
            return Err(problems.0.into_iter().map(|p| format!("(shipped rules) {p}")).collect());
        }
        let user = user.map(|text| RulesFile::parse(text, channels, &mut problems)).unwrap_or_default();
        if !problems.is_empty() {
            return Err(problems.0);
        }
        resolve(&user, &shipped).map_err(|p| p.0)
    }

    /// The rule of `kind`.
    pub fn rule(&self, kind: EventKind) -> &Rule {
        // Invariant: every kind is present (resolve fills all of them).
        &self.rules[&kind]
    }
}

/// Lays `user` over `shipped` and fills every event's rule (see the module docs for the order).
fn resolve(user: &Layer, shipped: &Layer) -> Result<Rules, Problems> {
    fn need<T>(problems: &mut Problems, v: Option<T>, key: &str) -> Option<T> {
        if v.is_none() {
            problems.push(key, "is not set in the rules nor in the shipped rules");
        }
        v
    }
    let mut problems = Problems::new();
    let (ut, st) = (&user.thresholds, &shipped.thresholds);
    let lag_threshold = need(&mut problems, ut.lag_threshold.or(st.lag_threshold), "thresholds.lag_threshold");
    let latency_threshold =
        need(&mut problems, ut.latency_threshold.or(st.latency_threshold), "thresholds.latency_threshold");
    let for_duration = need(&mut problems, ut.for_duration.or(st.for_duration), "thresholds.for_duration");
    let stall_after = need(&mut problems, ut.stall_after.or(st.stall_after), "thresholds.stall_after");
    let rpo_threshold = need(&mut problems, ut.rpo_threshold.or(st.rpo_threshold), "thresholds.rpo_threshold");
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
    match (lag_threshold, latency_threshold, for_duration, stall_after, rpo_threshold) {
        (Some(lag_threshold), Some(latency_threshold), Some(for_duration), Some(stall_after), Some(rpo_threshold))
            if problems.is_empty() =>
        {
            let thresholds = Thresholds { lag_threshold, latency_threshold, for_duration, stall_after, rpo_threshold };
            Ok(Rules { thresholds, rules })
        }
        _ => Err(problems),
    }
}
