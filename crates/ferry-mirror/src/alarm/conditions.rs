//! The condition checker: every `sync.stall_check_interval` it samples each partition in [`Shared`] and raises
//! (and clears) the conditions the mirror watches itself. Its events go out through the EventBus like every other
//! event. The decisions are made on plain [`Sample`]s ([`ConditionChecker::step`]), so they are tested as tables.
//!
//! - `lag_above_threshold`: lag above `lag_threshold` records, or replication latency above `latency_threshold`
//!   while there is lag, holding at every sample for at least `for_duration`. Raised once when it starts (with
//!   lag, latency and the thresholds as details); the same kind with `cleared = true` when it ends.
//! - `rpo_above_threshold`: the partition's RPO (see [`crate::rpo`]) above `rpo_threshold` at every sample for at
//!   least `for_duration`; raised and cleared the same way. Paused and halted partitions count: their records
//!   wait all the same.
//! - `partition_stalled`: a partition in state `mirroring` with records waiting (its source log end, as the fetch
//!   stream or the independent ListOffsets probe saw it last, past its cache offset) whose cache offset has not
//!   moved for `stall_after`. The clock starts at the later of the last move of the cache offset and the moment the
//!   mirror first saw the oldest waiting record (the RPO clock's sighting, never a record timestamp), so a
//!   partition that sat idle is not "stalled" the moment new data arrives, and a stall shows at the first check
//!   after `stall_after`; the probe's log end counts whatever the stream's positions (and so the lag) say. The flag
//!   is kept in [`PartitionStatus::set_stalled`] for the monitor; it clears when the offset moves, nothing waits
//!   any more or the partition stops mirroring (paused, halted).
//!
//! A partition that leaves this process (topic removed, scale-out rebalance) gets a cleared event for each
//! condition it had raised, so no alarm repeats for a partition nobody here watches.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::rules::Thresholds;
use crate::events::{Details, Event, EventKind, LagFacts, RpoFacts, StallFacts};
use crate::state::{PartitionState, PartitionStatus, Shared};

/// A condition that must hold at every sample for a while before it is raised.
#[derive(Debug, Default)]
struct Held {
    /// Since when it has held at every sample.
    since: Option<Instant>,
    /// Whether it is raised.
    raised: bool,
}

/// What a sample does to a [`Held`] condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Raise,
    Clear,
}

impl Held {
    /// Takes one sample: `Raise` at the first sample at which it has held for `for_duration`, `Clear` at the first
    /// sample at which it no longer holds after a raise.
    fn step(&mut self, holds: bool, now: Instant, for_duration: Duration) -> Option<Change> {
        if !holds {
            self.since = None;
            return std::mem::take(&mut self.raised).then_some(Change::Clear);
        }
        let since = *self.since.get_or_insert(now);
        if self.raised || now.duration_since(since) < for_duration {
            return None;
        }
        self.raised = true;
        Some(Change::Raise)
    }
}

#[derive(Debug, Default)]
struct Track {
    lag: Held,
    rpo: Held,
    /// Whether partition_stalled is raised.
    stalled: bool,
}

/// What the checker reads of one partition at one sample.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample {
    /// Source topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The partition's state (without the stalled flag).
    pub state: PartitionState,
    /// The next offset to copy.
    pub cache: u64,
    /// The source log end as the fetch stream saw it last.
    pub source_offset: u64,
    /// The source log end as the independent probe read it last.
    pub probed_source_offset: u64,
    /// Replication latency of the last appended batch, ms.
    pub latency_ms: u64,
    /// The RPO.
    pub rpo: Duration,
    /// How long the oldest waiting record has waited since the mirror first saw it (`None`: none waits).
    pub waiting: Option<Duration>,
    /// How long since the cache offset last moved (or the state changed).
    pub since_progress: Duration,
}

impl Sample {
    /// Reads a partition's status.
    pub fn of(s: &PartitionStatus) -> Sample {
        Sample {
            topic: s.topic.clone(),
            partition: s.partition,
            state: s.state(),
            cache: s.cache_offset(),
            source_offset: s.source_offset(),
            probed_source_offset: s.probed_source_offset(),
            latency_ms: s.latency_ms(),
            rpo: s.rpo(),
            waiting: s.waiting(),
            since_progress: s.since_progress(),
        }
    }

    fn lag(&self) -> u64 {
        self.source_offset.saturating_sub(self.cache)
    }

    /// Whether records wait to be copied, by the stream's or the probe's log end.
    fn behind(&self) -> bool {
        self.source_offset.max(self.probed_source_offset) > self.cache
    }
}

/// Per-partition sampling state.
#[derive(Debug, Default)]
pub struct ConditionChecker {
    tracks: HashMap<(String, u32), Track>,
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn seconds(d: Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

impl ConditionChecker {
    /// A checker that has seen nothing yet.
    pub fn new() -> ConditionChecker {
        ConditionChecker::default()
    }

    /// Samples every partition at `now`, sets their stalled flags and returns the events to emit, in partition
    /// order.
    pub fn check(&mut self, shared: &Shared, th: &Thresholds, now: Instant) -> Vec<Event> {
        let mut statuses: Vec<_> = shared.partitions.iter().map(|e| std::sync::Arc::clone(e.value())).collect();
        statuses.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let samples: Vec<Sample> = statuses.iter().map(|s| Sample::of(s)).collect();
        let (events, stalled) = self.step(&samples, th, now);
        for (s, stalled) in statuses.iter().zip(stalled) {
            s.set_stalled(stalled);
        }
        events
    }

    /// Takes one sample of every partition this process owns (in partition order) at `now`: the events to emit,
    /// and each partition's stalled flag.
    pub fn step(&mut self, samples: &[Sample], th: &Thresholds, now: Instant) -> (Vec<Event>, Vec<bool>) {
        let mut out = Vec::new();
        let mut flags = Vec::with_capacity(samples.len());
        for s in samples {
            let t = self.tracks.entry((s.topic.clone(), s.partition)).or_default();
            lag(s, t, th, now, &mut out);
            rpo(s, t, th, now, &mut out);
            flags.push(stall(s, t, th, &mut out));
        }
        // Partitions no longer here (a set of those here: with thousands of partitions, a scan of the samples for
        // each track would be most of what an idle mirror does).
        let here: std::collections::HashSet<(&str, u32)> =
            samples.iter().map(|s| (s.topic.as_str(), s.partition)).collect();
        self.tracks.retain(|(topic, partition), t| {
            if here.contains(&(topic.as_str(), *partition)) {
                return true;
            }
            let gone = "is no longer mirrored by this process";
            for (raised, kind) in [
                (t.lag.raised, EventKind::LagAboveThreshold),
                (t.rpo.raised, EventKind::RpoAboveThreshold),
                (t.stalled, EventKind::PartitionStalled),
            ] {
                if raised {
                    out.push(
                        Event::new(kind, format!("{topic}/{partition} {gone}")).partition(topic, *partition).cleared(),
                    );
                }
            }
            false
        });
        (out, flags)
    }
}

fn lag(s: &Sample, t: &mut Track, th: &Thresholds, now: Instant, out: &mut Vec<Event>) {
    let (lag, latency_ms) = (s.lag(), s.latency_ms);
    let latency = Duration::from_millis(latency_ms);
    let by_lag = lag > th.lag_threshold;
    let by_latency = !th.latency_threshold.is_zero() && lag > 0 && latency > th.latency_threshold;
    let (topic, p) = (&s.topic, s.partition);
    match t.lag.step(by_lag || by_latency, now, th.for_duration) {
        None => {}
        Some(Change::Clear) => out.push(
            Event::new(
                EventKind::LagAboveThreshold,
                format!(
                    "{topic}/{p} is back under the thresholds: lag {lag} records, replication latency {latency_ms} ms"
                ),
            )
            .partition(topic, p)
            .with(Details::Lag(LagFacts { lag, latency_ms, ..Default::default() }))
            .cleared(),
        ),
        Some(Change::Raise) => {
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
                    source_offset: Some(s.source_offset),
                    cache_offset: Some(s.cache),
                })),
            );
        }
    }
}

fn rpo(s: &Sample, t: &mut Track, th: &Thresholds, now: Instant, out: &mut Vec<Event>) {
    let above = !th.rpo_threshold.is_zero() && s.rpo > th.rpo_threshold;
    let (topic, p, rpo) = (&s.topic, s.partition, seconds(s.rpo));
    let event = match t.rpo.step(above, now, th.for_duration) {
        None => return,
        Some(Change::Clear) => Event::new(
            EventKind::RpoAboveThreshold,
            format!("{topic}/{p} is back under the RPO threshold: RPO {rpo:.3} s (cache offset {})", s.cache),
        )
        .with(Details::Rpo(RpoFacts { rpo_seconds: rpo, cache_offset: s.cache, ..Default::default() }))
        .cleared(),
        Some(Change::Raise) => Event::new(
            EventKind::RpoAboveThreshold,
            format!(
                "{topic}/{p}: the oldest record not yet on the target has waited {rpo:.3} s (threshold {}) for at least {} (cache offset {})",
                human(th.rpo_threshold),
                human(th.for_duration),
                s.cache
            ),
        )
        .with(Details::Rpo(RpoFacts {
            rpo_seconds: rpo,
            rpo_threshold_seconds: Some(seconds(th.rpo_threshold)),
            for_duration: Some(human(th.for_duration)),
            source_offset: Some(s.source_offset.max(s.probed_source_offset)),
            cache_offset: s.cache,
        })),
    };
    out.push(event.partition(topic, p));
}

/// The stall watchdog; returns the partition's stalled flag.
fn stall(s: &Sample, t: &mut Track, th: &Thresholds, out: &mut Vec<Event>) -> bool {
    let (lag, cache, state) = (s.lag(), s.cache, s.state);
    let (topic, p) = (&s.topic, s.partition);
    let source = s.source_offset.max(s.probed_source_offset);
    let stalled_for = (state == PartitionState::Mirroring && s.behind())
        .then(|| s.waiting.map(|w| w.min(s.since_progress)))
        .flatten();
    let stalled = stalled_for.is_some_and(|d| d >= th.stall_after);
    if stalled == t.stalled {
        return stalled;
    }
    t.stalled = stalled;
    let event = if stalled {
        Event::new(
            EventKind::PartitionStalled,
            format!(
                "{topic}/{p} made no progress for {} with {} records to copy (cache offset {cache}, source offset {source})",
                human(th.stall_after),
                source - cache
            ),
        )
        .with(Details::Stall(StallFacts {
            stall_after: Some(human(th.stall_after)),
            source_offset: Some(s.source_offset),
            probed_source_offset: Some(s.probed_source_offset),
            stalled_for_ms: stalled_for.map(|d| d.as_millis() as u64),
            lag: Some(lag),
            cache_offset: Some(cache),
            ..Default::default()
        }))
    } else {
        let why = match state {
            PartitionState::Mirroring if !s.behind() => "caught up".to_owned(),
            PartitionState::Mirroring => "is making progress again".to_owned(),
            other => format!("is no longer mirroring (state {})", other.name()),
        };
        Event::new(EventKind::PartitionStalled, format!("{topic}/{p} {why} (cache offset {cache}, lag {lag})"))
            .cleared()
            .with(Details::Stall(StallFacts { lag: Some(lag), cache_offset: Some(cache), ..Default::default() }))
    };
    out.push(event.partition(topic, p));
    stalled
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
            rpo_threshold: Duration::from_secs(20),
        }
    }

    /// A mirroring partition at cache offset 10 whose source end the stream saw at `stream` and the probe at
    /// `probed`, with RPO `rpo` seconds.
    fn sample(p: u32, stream: u64, probed: u64, rpo: u64) -> Sample {
        Sample {
            topic: "orders".into(),
            partition: p,
            state: PartitionState::Mirroring,
            cache: 10,
            source_offset: stream,
            probed_source_offset: probed,
            latency_ms: 0,
            rpo: Duration::from_secs(rpo),
            waiting: None,
            since_progress: Duration::ZERO,
        }
    }

    /// [`sample`] whose records have waited `waiting` seconds and whose cache offset last moved `progress` ago.
    fn waiting(p: u32, stream: u64, probed: u64, waiting: Option<u64>, progress: u64) -> Sample {
        Sample {
            waiting: waiting.map(Duration::from_secs),
            since_progress: Duration::from_secs(progress),
            ..sample(p, stream, probed, 0)
        }
    }

    fn shared_with(topic: &str, p: u32) -> (Shared, Arc<PartitionStatus>) {
        let shared = Shared::default();
        let s = Arc::new(PartitionStatus::new(topic, topic, p));
        s.set_state(PartitionState::Mirroring);
        shared.partitions.insert(crate::tp::SourceTp::new(topic, p), Arc::clone(&s));
        (shared, s)
    }

    /// Events as a table writes them: kind, and whether it is a clearing event.
    type Kinds = &'static [(EventKind, bool)];

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
    async fn a_stall_starts_at_the_later_of_the_last_move_and_the_first_sighting() {
        let t0 = Instant::now();
        // (stream end, probed end, waiting s, since progress s, state, stalled flag, events). Cache offset 10,
        // stall_after 60 s; every row is one sample.
        type Row = (u64, u64, Option<u64>, u64, PartitionState, bool, Kinds);
        let m = PartitionState::Mirroring;
        let table: &[Row] = &[
            // Idle for ten minutes, then a record appears: waiting 0 s, not a stall.
            (10, 10, None, 600, m, false, &[]),
            (11, 11, Some(0), 600, m, false, &[]),
            (11, 11, Some(59), 659, m, false, &[]),
            (11, 11, Some(60), 660, m, true, &[(EventKind::PartitionStalled, false)]),
            (11, 11, Some(90), 690, m, true, &[]),
            // The cache offset moved 5 s ago and records still wait (older than that): the clock is the move.
            (20, 20, Some(95), 5, m, false, &[(EventKind::PartitionStalled, true)]),
            (20, 20, Some(150), 60, m, true, &[(EventKind::PartitionStalled, false)]),
            // Paused: no stall, whatever waits; the flag clears.
            (20, 20, Some(200), 100, PartitionState::Paused, false, &[(EventKind::PartitionStalled, true)]),
            (20, 20, Some(900), 800, PartitionState::Paused, false, &[]),
            // Resumed (a state change is progress) and stuck again; then caught up.
            (20, 20, Some(960), 60, m, true, &[(EventKind::PartitionStalled, false)]),
            (10, 10, None, 61, m, false, &[(EventKind::PartitionStalled, true)]),
        ];
        let mut c = ConditionChecker::new();
        for (i, (stream, probed, wait, progress, state, flag, want)) in table.iter().enumerate() {
            let s = Sample { state: *state, ..waiting(2, *stream, *probed, *wait, *progress) };
            let (events, flags) = c.step(&[s], &th(), t0 + Duration::from_secs(i as u64));
            let stalls: Vec<Event> = events.into_iter().filter(|e| e.kind == EventKind::PartitionStalled).collect();
            assert_eq!((kinds(&stalls), flags), (want.to_vec(), vec![*flag]), "row {i}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_partition_shows_stalled_and_a_removed_one_clears_its_conditions() {
        let (shared, s) = shared_with("orders", 3);
        s.set_source(0, 1000);
        s.set_cache(10);
        let mut c = ConditionChecker::new();
        let t0 = Instant::now();
        // Lag 990 for the duration: lag_above_threshold; the status's own clocks are seconds short of a stall.
        assert!(c.check(&shared, &th(), t0).is_empty());
        let ev = c.check(&shared, &th(), t0 + 30 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, false)]);
        assert!(!s.stalled());
        // A stall as the checker decides it sets the monitor's flag.
        let mut stuck = Sample::of(&s);
        (stuck.waiting, stuck.since_progress) = (Some(61 * SEC), 61 * SEC);
        let (ev, flags) = c.step(std::slice::from_ref(&stuck), &th(), t0 + 31 * SEC);
        assert_eq!((kinds(&ev), flags), (vec![(EventKind::PartitionStalled, false)], vec![true]));
        s.set_stalled(true);
        assert_eq!(s.view().state, PartitionState::Stalled);
        // The partition leaves this process: each raised condition gets its cleared event.
        shared.partitions.clear();
        let ev = c.check(&shared, &th(), t0 + 32 * SEC);
        assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, true), (EventKind::PartitionStalled, true)]);
        assert!(c.tracks.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn rpo_above_the_threshold_for_the_duration_raises_once_and_clears_once() {
        let mut c = ConditionChecker::new();
        let t0 = Instant::now();
        // (second, RPO, expected events): above 20 s from 5 s on; a dip at 40 s restarts the 30 s.
        let table: &[(u64, u64, Kinds)] = &[
            (0, 0, &[]),
            (5, 21, &[]),
            (34, 50, &[]),
            (40, 19, &[]),
            (41, 21, &[]),
            (70, 50, &[]),
            (71, 51, &[(EventKind::RpoAboveThreshold, false)]),
            (80, 60, &[]),
            (81, 0, &[(EventKind::RpoAboveThreshold, true)]),
            (90, 0, &[]),
        ];
        for (at, rpo, want) in table {
            // Paused: its records wait all the same (and a paused partition never stalls).
            let s = Sample { state: PartitionState::Paused, ..sample(0, 10 + rpo, 0, *rpo) };
            let (events, _) = c.step(&[s], &th(), t0 + Duration::from_secs(*at));
            assert_eq!(kinds(&events), *want, "at {at}s");
            if let [e] = &events[..]
                && !e.cleared
            {
                assert_eq!(e.details.value("rpo_seconds"), 51.0);
                assert_eq!(e.details.value("rpo_threshold_seconds"), 20.0);
                assert_eq!(e.details.value("for_duration"), "30s");
                assert_eq!(e.details.value("cache_offset"), 10);
            }
        }
        // A threshold of 0 turns the condition off.
        let off = Thresholds { rpo_threshold: Duration::ZERO, ..th() };
        let mut c = ConditionChecker::new();
        for at in [0, 100, 200] {
            let s = Sample { state: PartitionState::Paused, ..sample(0, 20, 0, 1000) };
            assert!(c.step(&[s], &off, t0 + Duration::from_secs(at)).0.is_empty());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_probe_reveals_a_stall_that_the_stream_positions_hide() {
        let mut c = ConditionChecker::new();
        let t0 = Instant::now();
        // (second, stream end, probed end, stalled flag, events): the stream's last word says caught up (lag 0),
        // the probe sees 5 records past the cache offset from 3 s on (the cache offset last moved long before).
        let table: &[(u64, u64, u64, bool, Kinds)] = &[
            (0, 10, 10, false, &[]),
            (3, 10, 15, false, &[]),
            (62, 10, 15, false, &[]),
            (63, 10, 15, true, &[(EventKind::PartitionStalled, false)]),
            (64, 10, 18, true, &[]),
            // The probe reads the cache offset's end again (nothing waits): the stall clears.
            (65, 10, 10, false, &[(EventKind::PartitionStalled, true)]),
        ];
        for (at, stream, probed, flag, want) in table {
            let wait = (*probed > 10).then(|| at - 3);
            let s = waiting(1, *stream, *probed, wait, 1000);
            let (events, flags) = c.step(&[s], &th(), t0 + Duration::from_secs(*at));
            assert_eq!((kinds(&events), flags), (want.to_vec(), vec![*flag]), "at {at}s");
            if let [e] = &events[..]
                && !e.cleared
            {
                assert_eq!(e.details.value("lag"), 0, "the lag metric says nothing");
                assert_eq!(e.details.value("probed_source_offset"), 15);
                assert_eq!(e.details.value("stalled_for_ms"), 60_000);
            }
        }
        // Paused and halted partitions never stall, whatever the probe says.
        for state in [PartitionState::Paused, PartitionState::Halted] {
            let mut c = ConditionChecker::new();
            for at in [0, 100, 200] {
                let s = Sample { state, ..waiting(2, 10, 99, Some(at), at) };
                assert_eq!(c.step(&[s], &th(), t0 + Duration::from_secs(at)), (vec![], vec![false]), "{state:?}");
            }
        }
    }
}
