//! The alarm state machine: turns events into notices under the rules — throttling, active conditions, repeats
//! and recovery notices. Pure state driven by the caller's clock readings (tokio time), so it is tested on a
//! paused clock.
//!
//! - An event of a condition kind ([`is_condition`]) makes its key active until a clearing event of the same key
//!   (`cleared = true`, or a kind whose [`EventKind::clears`] names it). A clearing event for one route also ends
//!   the same condition raised for route `"*"` (no route at all).
//! - A new event passes the throttle of its kind and key, or is suppressed.
//! - While a condition is active and its rule has `repeat`, it is sent again `repeat` after the last notice of it
//!   (repeats bypass the throttle; a condition whose first notice was suppressed is sent by its first repeat).
//! - When a condition that was notified clears and its rule has `recovery`, a recovery notice goes out (also
//!   outside the throttle: there is at most one per notified alarm). A clearing event that is not such a notice
//!   is handled by its own kind's rule when it is a kind of its own (source_net_recovered), else only logged.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::notice::{Notice, NoticeKind};
use super::throttle::Throttles;
use crate::config::rules::{Channels, Rules, is_condition};
use crate::events::{Event, EventKind};

/// What to do with an event or a due repeat.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Deliver `notice` to `channels`.
    Send {
        /// The notice.
        notice: Notice,
        /// Where to.
        channels: Channels,
    },
    /// Throttled: count it as suppressed on `channels`.
    Suppressed {
        /// The event.
        event: Arc<Event>,
        /// The channels it would have reached.
        channels: Channels,
    },
    /// Nothing to send (a log-only rule, or a clearing event without a notice).
    LogOnly,
}

#[derive(Debug)]
struct Active {
    kind: EventKind,
    event: Arc<Event>,
    last_sent: Instant,
    notified: bool,
}

/// Active conditions and throttles under one rule set.
#[derive(Debug)]
pub struct Tracker {
    rules: Arc<Rules>,
    throttles: Throttles,
    active: HashMap<String, Active>,
}

fn wildcard_key(event: &Event) -> Option<String> {
    let route = event.route.as_deref()?;
    (route != "*").then(|| Event { route: Some("*".to_owned()), ..event.clone() }.key())
}

impl Tracker {
    /// A tracker with no active condition.
    pub fn new(rules: Arc<Rules>) -> Tracker {
        Tracker { throttles: Throttles::new(&rules), rules, active: HashMap::new() }
    }

    /// The rules in force.
    pub fn rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    /// Replaces the rules (a reload): throttles start afresh, active conditions stay.
    pub fn set_rules(&mut self, rules: Arc<Rules>) {
        self.throttles = Throttles::new(&rules);
        self.rules = rules;
    }

    /// How many conditions are active.
    #[cfg(test)]
    pub fn active_count(&self) -> usize {
        self.active.len()
    }

    /// Decides what `event` leads to, at `now`.
    pub fn on_event(&mut self, event: Arc<Event>, now: Instant) -> Decision {
        let key = event.key();
        let own_kind = event.kind.clears().is_some();
        if event.cleared || own_kind {
            let condition = event.kind.clears().unwrap_or(event.kind);
            let mut notified = false;
            for k in std::iter::once(key.clone()).chain(wildcard_key(&event)) {
                if let Some(a) = self.active.remove(&k) {
                    notified |= a.notified;
                }
            }
            let rule = self.rules.rule(condition);
            if notified && rule.recovery {
                let notice = Notice { event, severity: rule.severity, kind: NoticeKind::Recovery };
                return Decision::Send { notice, channels: rule.channels.clone() };
            }
            if !own_kind {
                return Decision::LogOnly;
            }
        }
        let rule = self.rules.rule(event.kind);
        if is_condition(event.kind) && !event.cleared {
            self.active.entry(key.clone()).and_modify(|a| a.event = Arc::clone(&event)).or_insert_with(|| Active {
                kind: event.kind,
                event: Arc::clone(&event),
                last_sent: now,
                notified: false,
            });
        }
        if rule.channels == Channels::Named(Vec::new()) {
            return Decision::LogOnly;
        }
        if !self.throttles.allow(event.kind, &key) {
            return Decision::Suppressed { event, channels: rule.channels.clone() };
        }
        if let Some(a) = self.active.get_mut(&key) {
            a.notified = true;
            a.last_sent = now;
        }
        Decision::Send {
            notice: Notice { event, severity: rule.severity, kind: NoticeKind::Alarm },
            channels: rule.channels.clone(),
        }
    }

    /// When the next repeat is due, if any condition repeats.
    pub fn next_repeat(&self) -> Option<Instant> {
        self.active.values().filter_map(|a| Some(a.last_sent + self.rules.rule(a.kind).repeat?)).min()
    }

    /// The repeats due at `now` (each condition's clock restarts at `now`).
    pub fn due_repeats(&mut self, now: Instant) -> Vec<Decision> {
        let mut out = Vec::new();
        for a in self.active.values_mut() {
            let rule = self.rules.rule(a.kind);
            let Some(repeat) = rule.repeat else { continue };
            if a.last_sent + repeat > now {
                continue;
            }
            a.last_sent = now;
            if rule.channels == Channels::Named(Vec::new()) {
                continue;
            }
            a.notified = true;
            let notice = Notice { event: Arc::clone(&a.event), severity: rule.severity, kind: NoticeKind::Repeat };
            out.push(Decision::Send { notice, channels: rule.channels.clone() });
        }
        out
    }

    /// Forgets throttle keys that are idle again.
    pub fn forget_idle(&self) {
        self.throttles.forget_idle();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::events::Severity;

    const RULES: &str = r#"
[defaults]
throttle = { max = 2, window = "1h" }
[events.lag_above_threshold]
repeat = "10m"
[events.source_net_not_available]
repeat = "5m"
[events.partition_stalled]
recovery = false
repeat = "0s"
"#;

    fn tracker() -> Tracker {
        Tracker::new(Arc::new(Rules::parse(Some(RULES), &Default::default()).unwrap()))
    }

    fn lag(p: u32) -> Arc<Event> {
        Arc::new(Event::new(EventKind::LagAboveThreshold, "lagging").partition("orders", p))
    }

    fn sent(d: &Decision) -> Option<(NoticeKind, EventKind, bool)> {
        match d {
            Decision::Send { notice, channels } => {
                assert_eq!(*channels, Channels::All);
                Some((notice.kind, notice.event.kind, notice.event.cleared))
            }
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_repeats_until_it_clears_then_recovers_once() {
        let mut t = tracker();
        let start = Instant::now();
        let d = t.on_event(lag(0), start);
        assert_eq!(sent(&d), Some((NoticeKind::Alarm, EventKind::LagAboveThreshold, false)));
        assert_eq!(t.next_repeat(), Some(start + Duration::from_secs(600)));
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(t.due_repeats(Instant::now()).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let r = t.due_repeats(Instant::now());
        assert_eq!(
            r.iter().map(sent).collect::<Vec<_>>(),
            [Some((NoticeKind::Repeat, EventKind::LagAboveThreshold, false))]
        );
        assert!(t.due_repeats(Instant::now()).is_empty(), "one repeat per interval");
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(t.due_repeats(Instant::now()).len(), 1);
        let clear = Arc::new((*lag(0)).clone().cleared());
        let d = t.on_event(clear, Instant::now());
        assert_eq!(sent(&d), Some((NoticeKind::Recovery, EventKind::LagAboveThreshold, true)));
        assert_eq!((t.active_count(), t.next_repeat()), (0, None));
        // A second clearing event has nothing to end.
        assert_eq!(t.on_event(Arc::new((*lag(0)).clone().cleared()), Instant::now()), Decision::LogOnly);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(t.due_repeats(Instant::now()).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_suppressed_condition_is_sent_by_its_first_repeat_and_then_recovers() {
        let mut t = tracker();
        let now = Instant::now();
        // Budget of 2 per hour per key: the third start of the same key is suppressed.
        for _ in 0..2 {
            assert!(sent(&t.on_event(lag(1), now)).is_some());
            assert!(sent(&t.on_event(Arc::new((*lag(1)).clone().cleared()), now)).is_some());
        }
        let d = t.on_event(lag(1), now);
        assert!(matches!(d, Decision::Suppressed { channels: Channels::All, .. }), "{d:?}");
        // Not notified: clearing now would send nothing.
        tokio::time::advance(Duration::from_secs(600)).await;
        let r = t.due_repeats(Instant::now());
        assert_eq!(
            r.iter().map(sent).collect::<Vec<_>>(),
            [Some((NoticeKind::Repeat, EventKind::LagAboveThreshold, false))]
        );
        let d = t.on_event(Arc::new((*lag(1)).clone().cleared()), Instant::now());
        assert_eq!(sent(&d), Some((NoticeKind::Recovery, EventKind::LagAboveThreshold, true)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clearing_kind_recovers_its_condition_and_the_no_route_alarm() {
        let mut t = tracker();
        let now = Instant::now();
        let down = |route: &str| Arc::new(Event::new(EventKind::SourceNetNotAvailable, "down").route(route));
        assert!(sent(&t.on_event(down("primary"), now)).is_some());
        assert!(sent(&t.on_event(down("*"), now)).is_some());
        assert_eq!(t.active_count(), 2);
        let up = Arc::new(Event::new(EventKind::SourceNetRecovered, "up").route("primary"));
        let d = t.on_event(Arc::clone(&up), now);
        match &d {
            Decision::Send { notice, .. } => {
                assert_eq!(
                    (notice.kind, notice.severity, notice.event.kind),
                    (NoticeKind::Recovery, Severity::Critical, EventKind::SourceNetRecovered)
                );
                assert!(notice.cleared());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.active_count(), 0);
        // With nothing active, source_net_recovered follows its own (log-only) rule.
        assert_eq!(t.on_event(up, now), Decision::LogOnly);
    }

    #[tokio::test(start_paused = true)]
    async fn one_shot_events_and_log_only_rules() {
        let mut t = tracker();
        let now = Instant::now();
        assert_eq!(t.on_event(Arc::new(Event::new(EventKind::AddTopic, "new")), now), Decision::LogOnly);
        let err = || Arc::new(Event::new(EventKind::SyncError, "promoted").partition("orders", 0));
        assert!(sent(&t.on_event(err(), now)).is_some());
        assert!(sent(&t.on_event(err(), now)).is_some());
        assert!(matches!(t.on_event(err(), now), Decision::Suppressed { .. }));
        assert_eq!(t.active_count(), 0, "one-shot events are never active");
        // A condition without recovery: its clearing is only logged, and without repeat nothing is due.
        let stall = Event::new(EventKind::PartitionStalled, "stalled").partition("orders", 0);
        assert!(sent(&t.on_event(Arc::new(stall.clone()), now)).is_some());
        assert_eq!(t.next_repeat(), None);
        assert_eq!(t.on_event(Arc::new(stall.cleared()), now), Decision::LogOnly);
        assert_eq!(t.active_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_keeps_active_conditions_under_the_new_rules() {
        let mut t = tracker();
        let now = Instant::now();
        assert!(sent(&t.on_event(lag(0), now)).is_some());
        let text = "[events.lag_above_threshold]\nseverity = \"critical\"\nrepeat = \"1m\"\n";
        t.set_rules(Arc::new(Rules::parse(Some(text), &Default::default()).unwrap()));
        assert_eq!(t.next_repeat(), Some(now + Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(60)).await;
        match &t.due_repeats(Instant::now())[..] {
            [Decision::Send { notice, .. }] => assert_eq!(notice.severity, Severity::Critical),
            other => panic!("{other:?}"),
        }
    }
}
