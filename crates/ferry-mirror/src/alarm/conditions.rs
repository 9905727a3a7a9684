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
use crate::tp::TpHasher;

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
    /// The last round that sampled it.
    seen: u64,
}

/// What the checker reads of one partition at one sample.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample<'a> {
    /// Source topic.
    pub topic: &'a str,
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

impl<'a> Sample<'a> {
    /// Reads a partition's status.
    pub fn of(s: &'a PartitionStatus) -> Sample<'a> {
        let clocks = s.clocks();
        Sample {
            topic: &s.topic,
            partition: s.partition,
            state: clocks.state,
            cache: s.cache_offset(),
            source_offset: s.source_offset(),
            probed_source_offset: s.probed_source_offset(),
            latency_ms: s.latency_ms(),
            rpo: clocks.rpo,
            waiting: clocks.waiting,
            since_progress: clocks.since_progress,
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

/// Per-partition sampling state. An idle mirror with thousands of partitions samples each every second, so a round
/// allocates nothing per partition and sorts nothing but its events: it reads each status where it is kept, and a
/// partition for which no condition holds and none was held or raised has no track at all (a track that comes back
/// to that is dropped), so a quiet partition costs its reading and nothing else. Tracks are found by the status's
/// own topic name, and those no longer sampled are told by the round that last saw them.
#[derive(Debug, Default)]
pub struct ConditionChecker {
    tracks: HashMap<String, HashMap<u32, Track, TpHasher>, TpHasher>,
    rounds: u64,
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn seconds(d: Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

impl Track {
    /// Whether it holds nothing: no condition held since a time or raised (what a partition without a track has).
    fn is_quiet(&self) -> bool {
        self.lag.since.is_none() && !self.lag.raised && self.rpo.since.is_none() && !self.rpo.raised && !self.stalled
    }
}

impl ConditionChecker {
    /// A checker that has seen nothing yet.
    pub fn new() -> ConditionChecker {
        ConditionChecker::default()
    }

    /// Samples every partition at `now`, sets their stalled flags and returns the events to emit, in partition
    /// order.
    pub fn check(&mut self, shared: &Shared, th: &Thresholds, now: Instant) -> Vec<Event> {
        self.rounds += 1;
        let mut out = Vec::new();
        for entry in shared.partitions.iter() {
            let status = entry.value();
            let stalled = self.sample(&Sample::of(status), th, now, &mut out);
            // Written only when it changes: a quiet round reads each status and writes none.
            if status.stalled() != stalled {
                status.set_stalled(stalled);
            }
        }
        self.finish(out)
    }

    /// Takes one sample of every partition this process owns at `now`: the events to emit (those of the sampled
    /// partitions in partition order, then the clearings of partitions no longer here), and each sample's stalled
    /// flag.
    pub fn step(&mut self, samples: &[Sample<'_>], th: &Thresholds, now: Instant) -> (Vec<Event>, Vec<bool>) {
        self.rounds += 1;
        let mut out = Vec::new();
        let flags = samples.iter().map(|s| self.sample(s, th, now, &mut out)).collect();
        (self.finish(out), flags)
    }

    /// One partition's sample in this round: its events go to `out`; returns its stalled flag.
    fn sample(&mut self, s: &Sample<'_>, th: &Thresholds, now: Instant, out: &mut Vec<Event>) -> bool {
        let (by_lag, by_latency) = lag_holds(s, th);
        let quiet = !by_lag && !by_latency && !rpo_holds(s, th) && !stall_holds(s, th).1;
        // A quiet partition without a track stays without one: every step on a quiet track is a no-op.
        let topic = match self.tracks.get_mut(s.topic) {
            Some(t) => t,
            None if quiet => return false,
            None => self.tracks.entry(s.topic.to_owned()).or_default(),
        };
        let t = match topic.get_mut(&s.partition) {
            Some(t) => t,
            None if quiet => return false,
            None => topic.entry(s.partition).or_default(),
        };
        t.seen = self.rounds;
        lag(s, t, th, now, out);
        rpo(s, t, th, now, out);
        let stalled = stall(s, t, th, out);
        if t.is_quiet() {
            topic.remove(&s.partition);
            if topic.is_empty() {
                self.tracks.remove(s.topic);
            }
        }
        stalled
    }

    /// The round's events in partition order, then the clearings of partitions no longer here.
    fn finish(&mut self, mut out: Vec<Event>) -> Vec<Event> {
        let round = self.rounds;
        // Stable: a partition's events keep their order (lag, RPO, stall).
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        // Partitions no longer here.
        self.tracks.retain(|topic, partitions| {
            partitions.retain(|partition, t| {
                if t.seen == round {
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
                            Event::new(kind, format!("{topic}/{partition} {gone}"))
                                .partition(topic, *partition)
                                .cleared(),
                        );
                    }
                }
                false
            });
            !partitions.is_empty()
        });
        out
    }
}

/// Whether the lag condition holds: (by the lag, by the replication latency).
fn lag_holds(s: &Sample<'_>, th: &Thresholds) -> (bool, bool) {
    let lag = s.lag();
    let by_lag = lag > th.lag_threshold;
    let by_latency =
        !th.latency_threshold.is_zero() && lag > 0 && Duration::from_millis(s.latency_ms) > th.latency_threshold;
    (by_lag, by_latency)
}

/// Whether the RPO condition holds.
fn rpo_holds(s: &Sample<'_>, th: &Thresholds) -> bool {
    !th.rpo_threshold.is_zero() && s.rpo > th.rpo_threshold
}

/// How long the partition has made no progress with records waiting (`None`: it is not mirroring, or nothing
/// waits), and whether that is a stall.
fn stall_holds(s: &Sample<'_>, th: &Thresholds) -> (Option<Duration>, bool) {
    let stalled_for = (s.state == PartitionState::Mirroring && s.behind())
        .then(|| s.waiting.map(|w| w.min(s.since_progress)))
        .flatten();
    (stalled_for, stalled_for.is_some_and(|d| d >= th.stall_after))
}

fn lag(s: &Sample<'_>, t: &mut Track, th: &Thresholds, now: Instant, out: &mut Vec<Event>) {
    let (lag, latency_ms) = (s.lag(), s.latency_ms);
    let (by_lag, by_latency) = lag_holds(s, th);
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

fn rpo(s: &Sample<'_>, t: &mut Track, th: &Thresholds, now: Instant, out: &mut Vec<Event>) {
    let above = rpo_holds(s, th);
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
fn stall(s: &Sample<'_>, t: &mut Track, th: &Thresholds, out: &mut Vec<Event>) -> bool {
    let (lag, cache, state) = (s.lag(), s.cache, s.state);
    let (topic, p) = (&s.topic, s.partition);
    let source = s.source_offset.max(s.probed_source_offset);
    let (stalled_for, stalled) = stall_holds(s, th);
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
mod tests;
