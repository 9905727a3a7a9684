//! The condition checker: every `sync.stall_check_interval` it samples each partition in [`Shared`] and raises
//! (and clears) the two conditions the mirror watches itself. Its events go out through the EventBus like every
//! other event.
//!
//! - `lag_above_threshold`: lag above `lag_threshold` records, or replication latency above `latency_threshold`
//!   while there is lag, holding at every sample for at least `for_duration`. Raised once when it starts (with
//!   lag, latency and the thresholds as details); the same kind with `cleared = true` when it ends.
//! - `partition_stalled`: a partition in state `mirroring` with lag whose cache offset has not moved for
//!   `stall_after`. The clock starts when the checker first sees lag at that cache offset, so a partition that
//!   sat idle without lag is not "stalled" the moment new data arrives. The flag is kept in
//!   [`PartitionStatus::set_stalled`] for the monitor; it clears when the offset moves, the lag is gone or the
//!   partition stops mirroring (paused, halted).
//!
//! A partition that leaves this process (topic removed, scale-out rebalance) gets a cleared event for each
//! condition it had raised, so no alarm repeats for a partition nobody here watches.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::rules::Thresholds;
use crate::events::{Details, Event, EventKind, LagFacts, StallFacts};
use crate::state::{PartitionState, PartitionStatus, Shared};

#[derive(Debug, Default)]
struct Track {
    /// Since when the lag condition has held at every sample.
    above_since: Option<Instant>,
    /// Whether lag_above_threshold is raised.
    lagging: bool,
    /// The cache offset last seen with lag, and since when.
    progress: Option<(u64, Instant)>,
    /// Whether partition_stalled is raised.
    stalled: bool,
}

/// Per-partition sampling state.
#[derive(Debug, Default)]
pub struct ConditionChecker {
    tracks: HashMap<(String, u32), Track>,
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

impl ConditionChecker {
    /// A checker that has seen nothing yet.
    pub fn new() -> ConditionChecker {
        ConditionChecker::default()
    }

    /// Samples every partition at `now` and returns the events to emit, in partition order.
    pub fn check(&mut self, shared: &Shared, th: &Thresholds, now: Instant) -> Vec<Event> {
        let mut statuses: Vec<_> = shared.partitions.iter().map(|e| std::sync::Arc::clone(e.value())).collect();
        statuses.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let mut out = Vec::new();
        for s in &statuses {
            let t = self.tracks.entry((s.topic.clone(), s.partition)).or_default();
            lag(s, t, th, now, &mut out);
            stall(s, t, th, now, &mut out);
        }
        // Partitions no longer here.
        self.tracks.retain(|(topic, partition), t| {
            if shared.partitions.contains_key(&crate::tp::SourceTp::new(topic.as_str(), *partition)) {
                return true;
            }
            let gone = "is no longer mirrored by this process";
            if t.lagging {
                out.push(
                    Event::new(EventKind::LagAboveThreshold, format!("{topic}/{partition} {gone}"))
                        .partition(topic, *partition)
                        .cleared(),
                );
            }
            if t.stalled {
                out.push(
                    Event::new(EventKind::PartitionStalled, format!("{topic}/{partition} {gone}"))
                        .partition(topic, *partition)
                        .cleared(),
                );
            }
            false
        });
        out
    }
}

fn lag(s: &PartitionStatus, t: &mut Track, th: &Thresholds, now: Instant, out: &mut Vec<Event>) {
    let (lag, latency_ms) = (s.lag(), s.latency_ms());
    let latency = Duration::from_millis(latency_ms);
    let by_lag = lag > th.lag_threshold;
    let by_latency = !th.latency_threshold.is_zero() && lag > 0 && latency > th.latency_threshold;
    let (topic, p) = (&s.topic, s.partition);
    if !(by_lag || by_latency) {
        t.above_since = None;
        if std::mem::take(&mut t.lagging) {
            out.push(
                Event::new(
                    EventKind::LagAboveThreshold,
                    format!("{topic}/{p} is back under the thresholds: lag {lag} records, replication latency {latency_ms} ms"),
                )
                .partition(topic, p)
                .with(Details::Lag(LagFacts { lag, latency_ms, ..Default::default() }))
                .cleared(),
            );
        }
        return;
    }
    let since = *t.above_since.get_or_insert(now);
    if t.lagging || now.duration_since(since) < th.for_duration {
        return;
    }
    t.lagging = true;
    let reason = match (by_lag, by_latency) {
        (true, true) => "lag and latency",
        (true, false) => "lag",
        _ => "latency",
    };
    out.push(
        Event::new(
            EventKind::LagAboveThreshold,
            format!(
                "{topic}/{p} lags {lag} records (threshold {}) with replication latency {latency_ms} ms (threshold {}) for at least {}",
                th.lag_threshold,
                human(th.latency_threshold),
                human(th.for_duration)
            ),
        )
        .partition(topic, p)
        .with(Details::Lag(LagFacts {
            reason: Some(reason.to_owned()),
            lag,
            latency_ms,
            lag_threshold: Some(th.lag_threshold),
            latency_threshold_ms: Some(th.latency_threshold.as_millis() as u64),
            for_duration: Some(human(th.for_duration)),
            source_offset: Some(s.source_offset()),
            cache_offset: Some(s.cache_offset()),
        })),
    );
}

fn stall(s: &PartitionStatus, t: &mut Track, th: &Thresholds, now: Instant, out: &mut Vec<Event>) {
    let (lag, cache, state) = (s.lag(), s.cache_offset(), s.state());
    let (topic, p) = (&s.topic, s.partition);
    let stalled_for = if state == PartitionState::Mirroring && lag > 0 {
        if t.progress.is_none_or(|(c, _)| c != cache) {
            t.progress = Some((cache, now));
        }
        t.progress.map(|(_, since)| now.duration_since(since))
    } else {
        t.progress = None;
        None
    };
    let stalled = stalled_for.is_some_and(|d| d >= th.stall_after);
    s.set_stalled(stalled);
    if stalled == t.stalled {
        return;
    }
    t.stalled = stalled;
    let event = if stalled {
        Event::new(
            EventKind::PartitionStalled,
            format!(
                "{topic}/{p} made no progress for {} with {lag} records to copy (cache offset {cache}, source offset {})",
                human(th.stall_after),
                s.source_offset()
            ),
        )
        .with(Details::Stall(StallFacts {
            stall_after: Some(human(th.stall_after)),
            source_offset: Some(s.source_offset()),
            ..Default::default()
        }))
    } else {
        let why = match state {
            PartitionState::Mirroring if lag == 0 => "caught up".to_owned(),
            PartitionState::Mirroring => "is making progress again".to_owned(),
            other => format!("is no longer mirroring (state {})", other.name()),
        };
        Event::new(EventKind::PartitionStalled, format!("{topic}/{p} {why} (cache offset {cache}, lag {lag})"))
            .cleared()
    };
    let facts = StallFacts { lag: Some(lag), cache_offset: Some(cache), ..Default::default() };
    out.push(event.partition(topic, p).with(Details::Stall(facts)));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn th() -> Thresholds {
        Thresholds {
            lag_threshold: 100,
            latency_threshold: Duration::from_secs(10),
            for_duration: Duration::from_secs(30),
            stall_after: Duration::from_secs(60),
        }
    }

    fn shared_with(topic: &str, p: u32) -> (Shared, Arc<PartitionStatus>) {
        let shared = Shared::default();
        let s = Arc::new(PartitionStatus::new(topic, topic, p));
        s.set_state(PartitionState::Mirroring);
        shared.partitions.insert(crate::tp::SourceTp::new(topic, p), Arc::clone(&s));
        (shared, s)
    }

    fn kinds(events: &[Event]) -> Vec<(EventKind, bool)> {
        events.iter().map(|e| (e.kind, e.cleared)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn lag_above_for_the_duration_raises_once_and_clears_once() {
        let (shared, s) = shared_with("orders", 0);
        s.set_source(0, 1000);
        s.set_cache(500);
        let mut c = ConditionChecker::new();
        let start = Instant::now();
        // Above the threshold, but not yet for_duration.
        for secs in [0, 10, 29] {
            assert!(c.check(&shared, &th(), start + secs * SEC).iter().all(|e| e.kind != EventKind::LagAboveThreshold));
        }
        let ev = c.check(&shared, &th(), start + 30 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, false)]);
        let e = &ev[0];
        assert_eq!((e.topic.as_deref(), e.partition), (Some("orders"), Some(0)));
        assert_eq!(e.details.value("lag"), 500);
        assert_eq!(e.details.value("lag_threshold"), 100);
        assert_eq!(e.details.value("latency_threshold_ms"), 10_000);
        assert_eq!(e.details.value("reason"), "lag");
        assert_eq!(e.details.value("for_duration"), "30s");
        // Still above: nothing new.
        s.set_cache(501);
        assert!(c.check(&shared, &th(), start + 45 * SEC).is_empty());
        // Back under: one cleared event, then silence.
        s.set_cache(950);
        let ev = c.check(&shared, &th(), start + 46 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, true)]);
        assert_eq!(ev[0].details.value("lag"), 50);
        assert!(c.check(&shared, &th(), start + 47 * SEC).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dip_below_restarts_the_duration_and_latency_counts_only_with_lag() {
        let (shared, s) = shared_with("orders", 1);
        s.set_source(0, 50);
        s.set_cache(0);
        s.set_latency_ms(20_000);
        let mut c = ConditionChecker::new();
        let t0 = Instant::now();
        assert!(c.check(&shared, &th(), t0).is_empty());
        // Latency falls under the threshold for one sample: the 30 s start again.
        s.set_latency_ms(5);
        s.set_cache(1);
        assert!(c.check(&shared, &th(), t0 + 20 * SEC).is_empty());
        s.set_latency_ms(20_000);
        s.set_cache(2);
        assert!(c.check(&shared, &th(), t0 + 21 * SEC).is_empty());
        s.set_cache(3);
        assert!(c.check(&shared, &th(), t0 + 40 * SEC).is_empty());
        s.set_cache(4);
        let ev = c.check(&shared, &th(), t0 + 51 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, false)]);
        assert_eq!(ev[0].details.value("reason"), "latency");
        // High latency without lag is no condition.
        s.set_cache(50);
        assert_eq!(kinds(&c.check(&shared, &th(), t0 + 52 * SEC)), [(EventKind::LagAboveThreshold, true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partition_without_progress_stalls_and_clears_when_it_moves() {
        let (shared, s) = shared_with("orders", 2);
        s.set_source(0, 10);
        s.set_cache(5);
        let mut c = ConditionChecker::new();
        let t0 = Instant::now();
        assert!(c.check(&shared, &th(), t0).is_empty());
        assert!(c.check(&shared, &th(), t0 + 59 * SEC).is_empty());
        assert!(!s.stalled());
        let ev = c.check(&shared, &th(), t0 + 60 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::PartitionStalled, false)]);
        assert_eq!((ev[0].details.value("lag"), ev[0].details.value("cache_offset")), (5.into(), 5.into()));
        assert!(s.stalled());
        assert_eq!(s.view().state, crate::state::PartitionState::Stalled);
        assert!(c.check(&shared, &th(), t0 + 90 * SEC).is_empty(), "raised once");
        s.set_cache(6);
        let ev = c.check(&shared, &th(), t0 + 91 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::PartitionStalled, true)]);
        assert!(ev[0].message.contains("making progress again"), "{}", ev[0].message);
        assert!(!s.stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_paused_and_removed_partitions_do_not_stall() {
        let (shared, s) = shared_with("orders", 3);
        s.set_source(0, 10);
        s.set_cache(10);
        let mut c = ConditionChecker::new();
        let t0 = Instant::now();
        // Idle without lag for a long time ...
        assert!(c.check(&shared, &th(), t0).is_empty());
        assert!(c.check(&shared, &th(), t0 + 600 * SEC).is_empty());
        // ... then new data: the stall clock starts now, not at the last progress.
        s.set_source(0, 20);
        assert!(c.check(&shared, &th(), t0 + 601 * SEC).is_empty());
        assert_eq!(kinds(&c.check(&shared, &th(), t0 + 661 * SEC)), [(EventKind::PartitionStalled, false)]);
        // Paused: the stall ends.
        s.set_state(PartitionState::Paused);
        let ev = c.check(&shared, &th(), t0 + 662 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::PartitionStalled, true)]);
        assert!(ev[0].message.contains("no longer mirroring (state paused)"), "{}", ev[0].message);
        assert!(c.check(&shared, &th(), t0 + 900 * SEC).is_empty(), "a paused partition never stalls");
        // Resumed, lagging and stalled again, then removed: cleared events for both conditions.
        s.set_state(PartitionState::Mirroring);
        s.set_source(0, 1000);
        assert!(c.check(&shared, &th(), t0 + 901 * SEC).is_empty());
        let ev = c.check(&shared, &th(), t0 + 961 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, false), (EventKind::PartitionStalled, false)]);
        shared.partitions.clear();
        let ev = c.check(&shared, &th(), t0 + 962 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, true), (EventKind::PartitionStalled, true)]);
        assert!(c.tracks.is_empty());
    }
}
