//! The rules file's tests: the shipped rules, laying a user's file over them, and every problem by its key.

use std::num::NonZeroU32;
use std::time::Duration;

use super::*;
use crate::events::Severity;

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
            rpo_threshold: Duration::from_secs(60),
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
    assert_eq!(r.rule(EventKind::RpoAboveThreshold).repeat, Some(Duration::from_secs(3600)));
    assert_eq!(r.rule(EventKind::SourceNetNotAvailable).repeat, Some(Duration::from_secs(1800)));
}

#[test]
fn a_user_file_is_laid_over_the_shipped_rules_key_by_key() {
    let text = r#"
[thresholds]
lag_threshold = 50
rpo_threshold = "5m"
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
    assert_eq!(r.thresholds.rpo_threshold, Duration::from_secs(300));
    let lag = r.rule(EventKind::LagAboveThreshold);
    assert_eq!(lag.severity, Severity::Critical);
    assert_eq!(lag.repeat, None);
    // Neither file sets lag's channels or throttle: the user's defaults apply.
    assert_eq!(lag.channels, Channels::Named(vec!["ops".into()]));
    assert_eq!(lag.throttle, Throttle { max: NonZeroU32::new(2).unwrap(), window: Duration::from_secs(60) });
    // add_topic keeps the shipped channels (log only) under the user's own key.
    let add = r.rule(EventKind::AddTopic);
    assert_eq!((add.severity, add.channels.clone(), add.recovery), (Severity::Info, Channels::Named(vec![]), false));
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
            EventKind::PartitionStalled,
            EventKind::RpoAboveThreshold
        ]
    );
}

#[test]
fn alerts_rules_toml_loads_with_the_real_loader_and_is_the_compiled_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../alerts/rules.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, SHIPPED_RULES, "the compiled-in rules are this file");
    assert_eq!(Rules::load(Some(&path), &BTreeSet::new()).unwrap(), Rules::shipped());
    // A default documented as a commented-out line (conf/*.toml's convention) must be what the file resolves to.
    for d in ferry_config::documented::defaults(&text).unwrap() {
        let doc = ferry_config::documented::with_default("", &d).unwrap();
        let got = Rules::parse(Some(&doc), &BTreeSet::new()).unwrap();
        assert_eq!(got, Rules::shipped(), "alerts/rules.toml line {}: {}", d.line, d.assignment);
    }
}
