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
fn sample(p: u32, stream: u64, probed: u64, rpo: u64) -> Sample<'static> {
    Sample {
        topic: "orders",
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
fn waiting(p: u32, stream: u64, probed: u64, waiting: Option<u64>, progress: u64) -> Sample<'static> {
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

/// [`shared_with`] one mirroring partition of "orders" whose stream saw the source log end at `end` and whose cache
/// offset is `cache`.
fn lagging(p: u32, end: u64, cache: u64) -> (Shared, Arc<PartitionStatus>) {
    let (shared, s) = shared_with("orders", p);
    s.set_source(0, end);
    s.set_cache(cache);
    (shared, s)
}

/// Events as a table writes them: kind, and whether it is a clearing event.
type Kinds = &'static [(EventKind, bool)];

fn kinds(events: &[Event]) -> Vec<(EventKind, bool)> {
    events.iter().map(|e| (e.kind, e.cleared)).collect()
}

#[tokio::test(start_paused = true)]
async fn lag_above_for_the_duration_raises_once_and_clears_once() {
    let (shared, s) = lagging(0, 1000, 500);
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
    let (shared, s) = lagging(1, 50, 0);
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
    let (shared, s) = lagging(3, 1000, 10);
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

#[tokio::test(start_paused = true)]
async fn events_come_in_partition_order_whatever_order_the_partitions_are_sampled_in() {
    let mut c = ConditionChecker::new();
    let t0 = Instant::now();
    let lagging = |topic: &'static str, p: u32| Sample { topic, ..sample(p, 1000, 0, 0) };
    let order = [lagging("b", 1), lagging("a", 2), lagging("b", 0), lagging("a", 0)];
    assert!(c.step(&order, &th(), t0).0.is_empty());
    let (ev, _) = c.step(&order, &th(), t0 + 30 * SEC);
    let at: Vec<(Option<&str>, Option<u32>)> = ev.iter().map(|e| (e.topic.as_deref(), e.partition)).collect();
    assert_eq!(at, [(Some("a"), Some(0)), (Some("a"), Some(2)), (Some("b"), Some(0)), (Some("b"), Some(1))]);
    // b/1 leaves: it alone is cleared, after the others' events, and the others' tracks stay.
    let (ev, _) = c.step(&order[1..], &th(), t0 + 31 * SEC);
    let at: Vec<(Option<&str>, Option<u32>, bool)> =
        ev.iter().map(|e| (e.topic.as_deref(), e.partition, e.cleared)).collect();
    assert_eq!(at, [(Some("b"), Some(1), true)]);
    assert_eq!(c.tracks.values().map(HashMap::len).sum::<usize>(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_partition_has_no_track_and_one_that_comes_back_to_quiet_loses_its_own() {
    let mut c = ConditionChecker::new();
    let t0 = Instant::now();
    let tracked = |c: &ConditionChecker| -> Vec<(String, u32)> {
        let mut out: Vec<_> =
            c.tracks.iter().flat_map(|(topic, ps)| ps.keys().map(move |p| (topic.clone(), *p))).collect();
        out.sort();
        out
    };
    // Caught up (stream and probe at the cache offset, RPO 0): nothing holds, nothing is kept.
    let quiet = |p: u32| sample(p, 10, 10, 0);
    assert_eq!(c.step(&[quiet(0), quiet(1)], &th(), t0), (vec![], vec![false, false]));
    assert!(tracked(&c).is_empty());
    // Partition 1 lags: it alone is tracked while the condition holds, raised after 30 s.
    let lag = sample(1, 1000, 0, 0);
    assert!(c.step(&[quiet(0), lag.clone()], &th(), t0 + SEC).0.is_empty());
    assert_eq!(tracked(&c), [("orders".to_owned(), 1)]);
    let (ev, _) = c.step(&[quiet(0), lag], &th(), t0 + 31 * SEC);
    assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, false)]);
    // It catches up: the clearing goes out and the track with it; so a later departure clears nothing.
    let (ev, _) = c.step(&[quiet(0), quiet(1)], &th(), t0 + 32 * SEC);
    assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, true)]);
    assert!(tracked(&c).is_empty());
    assert_eq!(c.step(&[quiet(0)], &th(), t0 + 33 * SEC), (vec![], vec![false]));
    // A condition that held without being raised and stopped holding leaves nothing behind either.
    assert!(c.step(&[sample(0, 10, 10, 25)], &th(), t0 + 34 * SEC).0.is_empty());
    assert_eq!(tracked(&c), [("orders".to_owned(), 0)]);
    assert!(c.step(&[quiet(0)], &th(), t0 + 35 * SEC).0.is_empty());
    assert!(tracked(&c).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_check_reads_every_partition_in_place_and_puts_a_wrong_stalled_flag_right() {
    let (shared, s) = lagging(0, 1000, 10);
    let q = Arc::new(PartitionStatus::new("orders", "orders", 1));
    q.set_state(PartitionState::Mirroring);
    shared.partitions.insert(crate::tp::SourceTp::new("orders", 1), Arc::clone(&q));
    let mut c = ConditionChecker::new();
    let t0 = Instant::now();
    // Partition 1 is caught up but flagged stalled (as a stall that ended would have left it): the check clears
    // the flag; partition 0, lagging, is not stalled (it was sighted just now).
    q.set_stalled(true);
    assert!(c.check(&shared, &th(), t0).is_empty());
    assert!(!s.stalled() && !q.stalled());
    // Partition 0's lag is raised after 30 s, and only its own.
    let ev = c.check(&shared, &th(), t0 + 30 * SEC);
    assert_eq!(kinds(&ev), [(EventKind::LagAboveThreshold, false)]);
    assert_eq!((ev[0].topic.as_deref(), ev[0].partition), (Some("orders"), Some(0)));
    assert_eq!(c.tracks.values().map(HashMap::len).sum::<usize>(), 1, "the quiet partition has no track");
}
