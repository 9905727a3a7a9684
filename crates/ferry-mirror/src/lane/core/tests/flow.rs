//! Source positions, epochs, gaps, seats, pause, lost targets and source errors.

use super::*;

#[test]
fn source_positions() {
    struct Case {
        name: &'static str,
        on_divergence: OnDivergence,
        pos: SourcePos,
        want: Vec<Out>,
    }
    let cases = [
        Case { name: "ahead", on_divergence: OnDivergence::Halt, pos: pos(0, 150, 0), want: vec![] },
        Case {
            name: "a log end below the cache offset diverges there",
            on_divergence: OnDivergence::Halt,
            pos: pos(0, 80, 0),
            want: vec![Out::Diverged(80, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "the same under truncate",
            on_divergence: OnDivergence::Truncate,
            pos: pos(0, 80, 0),
            want: vec![Out::Diverged(80, OnDivergence::Truncate), Out::Seat(None), Out::Truncate(80)],
        },
        Case {
            name: "a re-created topic always halts",
            on_divergence: OnDivergence::Truncate,
            pos: SourcePos { topic_id: "id-2".into(), ..pos(0, 150, 0) },
            want: vec![Out::Diverged(100, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "a newer epoch is checked at once",
            on_divergence: OnDivergence::Halt,
            pos: pos(0, 150, 1),
            want: vec![Out::EpochEnd(0)],
        },
    ];
    for c in cases {
        let mut h = H::mirroring_at(config(c.on_divergence, SourceKind::Ferry, false), 100, 0);
        assert_eq!(h.step(Input::Position(c.pos)), c.want, "{}", c.name);
    }
}

#[test]
fn a_replicated_sources_new_leader_below_the_cache_offset_is_waited_for_unless_its_epoch_moved() {
    let cfg = CoreConfig { replicated_source: true, ..config(OnDivergence::Halt, SourceKind::Ferry, false) };
    let mut h = H::mirroring_at(cfg.clone(), 100, 0);
    // The new leader serves up to 80 for now: nothing happens, the lane says why it waits.
    assert_eq!(h.step(Input::Position(pos(0, 80, 0))), vec![]);
    let waiting = h.core.view().last_error;
    assert!(waiting.as_deref().is_some_and(|e| e.contains("waiting for the source's new leader")), "{waiting:?}");
    // Its high watermark caught up: mirroring goes on.
    assert_eq!(h.step(Input::Position(pos(0, 150, 0))), vec![]);
    // An unclean election started a new partition epoch: the end below the cache offset is divergence.
    let mut h = H::mirroring_at(cfg, 100, 0);
    assert_eq!(h.step(Input::Position(pos(0, 80, 1))), vec![Out::Diverged(80, OnDivergence::Halt), Out::Seat(None)]);
}

#[test]
fn epoch_checks() {
    struct Case {
        name: &'static str,
        kind: SourceKind,
        on_divergence: OnDivergence,
        answer: EpochAnswer,
        want: Vec<Out>,
    }
    let cases = [
        Case {
            name: "the old epoch ended at the cache offset: append",
            kind: SourceKind::Ferry,
            on_divergence: OnDivergence::Halt,
            answer: EpochAnswer::Found { epoch: 0, end: 100 },
            want: vec![Out::Append(100, 109, 1)],
        },
        Case {
            name: "the old epoch ended below the cache offset: the source reused offsets",
            kind: SourceKind::Ferry,
            on_divergence: OnDivergence::Halt,
            answer: EpochAnswer::Found { epoch: 0, end: 70 },
            want: vec![Out::Diverged(70, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "the same under truncate",
            kind: SourceKind::Ferry,
            on_divergence: OnDivergence::Truncate,
            answer: EpochAnswer::Found { epoch: 0, end: 70 },
            want: vec![Out::Diverged(70, OnDivergence::Truncate), Out::Seat(None), Out::Truncate(70)],
        },
        Case {
            name: "a Ferry source that no longer knows the epoch lost it",
            kind: SourceKind::Ferry,
            on_divergence: OnDivergence::Halt,
            answer: EpochAnswer::Before { first: 0 },
            want: vec![Out::Diverged(0, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "under truncate, to where its history starts",
            kind: SourceKind::Ferry,
            on_divergence: OnDivergence::Truncate,
            answer: EpochAnswer::Before { first: 0 },
            want: vec![Out::Diverged(0, OnDivergence::Truncate), Out::Seat(None), Out::Truncate(0)],
        },
        Case {
            name: "a Kafka source keeps no history the mirror can read",
            kind: SourceKind::Kafka,
            on_divergence: OnDivergence::Halt,
            answer: EpochAnswer::Before { first: 0 },
            want: vec![Out::Append(100, 109, 1)],
        },
    ];
    for c in cases {
        let mut h = H::mirroring_at(config(c.on_divergence, c.kind, false), 100, 0);
        // A batch of a newer epoch waits for the check.
        assert_eq!(h.data(vec![batch(100, 10, 1)], pos(0, 110, 1)), vec![Out::EpochEnd(0)], "{}", c.name);
        assert_eq!(h.answer(Answer::EpochEnd(c.answer)), c.want, "{}", c.name);
    }
}

#[test]
fn retention_that_passed_the_cache_offset_is_carried_over_as_a_gap() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    // A pending batch is appended first, then the jump.
    assert_eq!(h.data(vec![batch(100, 10, 0)], pos(0, 110, 0)), vec![Out::Append(100, 109, 1)]);
    // Reported at once, for what the partition does not hold; fetching stops.
    let gone = Input::SourceError { fault: SourceFault::OutOfRange, message: "below".into(), pos: pos(300, 400, 0) };
    assert_eq!(h.step(gone), vec![Out::Seat(None), Out::DataLost(110, 300)]);
    assert_eq!(h.answer(appended(110)), vec![Out::Copied(10), Out::Jump(300)]);
    assert_eq!(h.answer(appended(300)), vec![Out::Seat(Some(300))]);
    assert_eq!(h.core.cache(), 300);
}

#[test]
fn a_log_start_past_what_the_partition_holds_is_reported_once_per_range_from_any_sighting() {
    struct Case {
        name: &'static str,
        paused: bool,
        /// Log starts seen in turn, each with the outputs expected.
        sightings: Vec<(Input, Vec<Out>)>,
        /// After resuming (when paused) and the pending append's answer.
        then: Vec<Out>,
        jump_answer: Vec<Out>,
    }
    let probe = Input::SourceLogStart;
    let stream = |start: u64| Input::Position(pos(start, 500, 0));
    let cases = vec![
        Case {
            name: "the probe, retention moving on in two steps",
            paused: false,
            sightings: vec![
                (probe(105), vec![]),
                (probe(200), vec![Out::Seat(None), Out::DataLost(110, 200)]),
                (probe(200), vec![]),
                (probe(250), vec![Out::DataLost(200, 250)]),
            ],
            then: vec![Out::Copied(10), Out::Jump(250)],
            jump_answer: vec![Out::Seat(Some(250))],
        },
        Case {
            name: "a stream position, then a fetch error naming the same start",
            paused: false,
            sightings: vec![
                (stream(300), vec![Out::Seat(None), Out::DataLost(110, 300)]),
                (
                    Input::SourceError {
                        fault: SourceFault::OutOfRange,
                        message: "below".into(),
                        pos: pos(300, 500, 0),
                    },
                    vec![],
                ),
            ],
            then: vec![Out::Copied(10), Out::Jump(300)],
            jump_answer: vec![Out::Seat(Some(300))],
        },
        Case {
            name: "while paused: reported at once, recorded after the resume",
            paused: true,
            sightings: vec![(probe(300), vec![Out::Seat(None), Out::DataLost(110, 300)])],
            then: vec![Out::Copied(10), Out::Jump(300)],
            jump_answer: vec![Out::Seat(Some(300))],
        },
    ];
    for c in cases {
        let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
        if c.paused {
            assert_eq!(h.step(Input::Pause), vec![], "{}", c.name);
            assert_eq!(h.data(vec![batch(100, 10, 0)], pos(0, 110, 0)), vec![], "{}", c.name);
        } else {
            assert_eq!(h.data(vec![batch(100, 10, 0)], pos(0, 110, 0)), vec![Out::Append(100, 109, 1)], "{}", c.name);
        }
        let seat = h.core.seat();
        for (i, (input, want)) in c.sightings.into_iter().enumerate() {
            assert_eq!(h.step(input), want, "{} sighting {i}", c.name);
        }
        // Data of the lost range still in flight (fetched under the old seat) is dropped.
        let late = Input::Data { seat, batches: vec![batch(110, 10, 0)], held: Held::none(), pos: pos(0, 500, 0) };
        assert_eq!(h.step(late), vec![], "{}", c.name);
        if c.paused {
            assert_eq!(h.step(Input::Resume), vec![Out::Append(100, 109, 1)], "{}", c.name);
        }
        assert_eq!(h.answer(appended(110)), c.then, "{}", c.name);
        assert_eq!(
            h.answer(appended(
                c.then
                    .iter()
                    .find_map(|o| match o {
                        Out::Jump(to) => Some(*to),
                        _ => None,
                    })
                    .unwrap()
            )),
            c.jump_answer,
            "{}",
            c.name
        );
    }
}

#[test]
fn a_batch_above_the_cache_offset_is_a_gap_only_when_the_source_confirms_it() {
    // Confirmed: a gap inside the source log is carried over and the batch appended at its start.
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    assert_eq!(h.data(vec![batch(150, 10, 0)], pos(0, 160, 0)), vec![Out::ProbeGap(100)]);
    assert_eq!(h.answer(Answer::Gap(Some((150, TOPIC_ID.into())))), vec![Out::Jump(150)]);
    assert_eq!(h.answer(appended(150)), vec![Out::Append(150, 159, 1)]);
    // Not confirmed: stale data is dropped and the partition fetched again from the cache offset.
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    assert_eq!(h.data(vec![batch(150, 10, 0)], pos(0, 160, 0)), vec![Out::ProbeGap(100)]);
    assert_eq!(h.answer(Answer::Gap(Some((100, TOPIC_ID.into())))), vec![Out::Seat(Some(100))]);
    assert_eq!(h.core.view().pending_bytes, 0);
}

#[test]
fn data_of_an_older_seat_is_dropped() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    let stale = h.core.seat() - 1;
    let out =
        h.step(Input::Data { seat: stale, batches: vec![batch(100, 10, 0)], held: Held::none(), pos: pos(0, 110, 0) });
    assert_eq!(out, vec![]);
    assert_eq!(h.core.view().pending_bytes, 0);
}

#[test]
fn pause_holds_appends_and_resume_releases_them() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    assert_eq!(h.step(Input::Pause), vec![]);
    assert_eq!(h.data(vec![batch(100, 10, 0)], pos(0, 110, 0)), vec![]);
    assert!(h.core.view().paused);
    assert_eq!(h.step(Input::Resume), vec![Out::Append(100, 109, 1)]);
}

#[test]
fn what_a_lane_publishes_follows_its_state_and_prefers_its_own_error_to_the_retried_failure() {
    use crate::state::PartitionState;
    let cfg = CoreConfig { replicated_source: true, ..config(OnDivergence::Halt, SourceKind::Ferry, false) };
    let mut h = H::mirroring_at(cfg, 100, 0);
    let retrying = "the target did not answer".to_owned();
    let p = h.core.published(Some(&retrying));
    assert_eq!(
        (p.state, p.cache, p.last_error.as_deref()),
        (PartitionState::Mirroring, 100, Some("the target did not answer"))
    );
    h.step(Input::Position(pos(0, 80, 0)));
    let p = h.core.published(Some(&retrying));
    assert_eq!((p.source_log_start, p.source_log_end), (0, 80));
    assert!(p.last_error.as_deref().is_some_and(|e| e.contains("waiting for the source's new leader")), "{p:?}");
    assert_eq!(p.last_error, h.core.view().last_error, "the core's own error, as its view says");
    h.step(Input::Pause);
    assert_eq!(h.core.published(None).state, PartitionState::Paused);
    assert_eq!(h.core.published(None), h.core.published(None), "the same core publishes the same");
}

#[test]
fn resuming_a_halted_partition_checks_again_from_the_target() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    h.step(Input::Position(pos(0, 50, 0)));
    assert!(h.core.is_halted());
    assert_eq!(h.data(vec![batch(100, 10, 0)], pos(0, 110, 0)), vec![], "a halted partition appends nothing");
    assert_eq!(h.step(Input::Resume), vec![Out::Seat(None), Out::ReadResume]);
}

#[test]
fn a_lost_target_is_resynced_from_its_log_end() {
    struct Case {
        name: &'static str,
        log_end: u64,
        cache_before: u64,
        want: Vec<Out>,
    }
    let cases = [
        Case { name: "at the cache offset", log_end: 100, cache_before: 100, want: vec![] },
        Case {
            name: "below it: resync",
            log_end: 60,
            cache_before: 100,
            want: vec![Out::TargetLost(60), Out::Seat(None), Out::ReadResume],
        },
        Case {
            name: "a probe that started before the last acknowledgement says nothing about it",
            log_end: 90,
            cache_before: 90,
            want: vec![],
        },
    ];
    for c in cases {
        let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
        let out = h.step(Input::TargetLogEnd { log_end: c.log_end, cache_before: c.cache_before });
        assert_eq!(out, c.want, "{}", c.name);
    }
    // After the resync, the status shows the target's real log end, and the lag counts what is missing.
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    h.step(Input::TargetLogEnd { log_end: 60, cache_before: 100 });
    assert_eq!(h.core.view().target_log_end, Some(60));
    let facts = ResumeFacts {
        target: TargetPartition::at(0, 60, Some(0)),
        committed: Some(100),
        source_earliest: 0,
        source_latest: 100,
    };
    h.answer(Answer::Resume(facts));
    assert_eq!(h.core.cache(), 60);
}

#[test]
fn a_vanished_target_partition_resumes_once_it_exists_again() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    h.data(vec![batch(100, 10, 0)], pos(0, 110, 0));
    let out = h.answer(Answer::Appended(Err(Failure::NotFound("no topic orders".into()))));
    assert_eq!(out, vec![Out::Seat(None), Out::ReadResume]);
    assert!(h.core.view().last_error.is_some_and(|e| e.contains("no topic orders")));
}

#[test]
fn the_answer_of_a_request_given_up_on_is_ignored() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    h.data(vec![batch(100, 10, 0)], pos(0, 110, 0));
    let append_id = h.id.unwrap();
    // The target lost records meanwhile: the append is cancelled and the target re-read.
    assert_eq!(
        h.step(Input::TargetLogEnd { log_end: 50, cache_before: 100 }),
        vec![Out::TargetLost(50), Out::Cancel, Out::Seat(None), Out::ReadResume]
    );
    assert_eq!(h.step(Input::Answer { id: append_id, answer: appended(110) }), vec![]);
    assert_eq!(h.core.cache(), 100, "the stale acknowledgement moved nothing");
}

#[test]
fn source_errors_alarm_once_per_code_and_missing_topics_not_at_all() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    let err = |fault| Input::SourceError { fault, message: "x".into(), pos: SourcePos::default() };
    assert_eq!(h.step(err(SourceFault::Other("NOT_AUTHORIZED".into()))), vec![Out::SyncError]);
    assert_eq!(h.step(err(SourceFault::Other("NOT_AUTHORIZED".into()))), vec![]);
    assert_eq!(h.step(err(SourceFault::Missing)), vec![]);
    assert_eq!(h.step(err(SourceFault::Corrupt)), vec![Out::Halted, Out::Seat(None)]);
}

#[test]
fn a_tail_written_in_a_newer_source_epoch_is_located_through_the_epoch_history() {
    // The source lost its tail (offsets 60..100) in a power loss and wrote new records over them in epoch 1.
    let target_tail = tail_batch(90, 10, 0);
    let mut source_tail = tail_batch(90, 10, 1);
    source_tail.records[0].value = Some(Bytes::from_static(b"after-loss"));
    for policy in [OnDivergence::Halt, OnDivergence::Truncate] {
        let (mut h, _) = H::new(config(policy, SourceKind::Ferry, false));
        let facts = ResumeFacts {
            target: TargetPartition::at(0, 100, Some(0)),
            committed: Some(100),
            source_earliest: 0,
            source_latest: 140,
        };
        assert_eq!(h.answer(Answer::Resume(facts)), vec![Out::CompareTail(99)]);
        let tail = TailFacts { target: Some(target_tail.clone()), source: Some(source_tail.clone()) };
        assert_eq!(h.answer(Answer::Tail(tail)), vec![Out::EpochEnd(0)], "{policy:?}");
        let want = match policy {
            OnDivergence::Halt => vec![Out::Diverged(60, policy), Out::Seat(None)],
            OnDivergence::Truncate => vec![Out::Diverged(60, policy), Out::Seat(None), Out::Truncate(60)],
        };
        assert_eq!(h.answer(Answer::EpochEnd(EpochAnswer::Found { epoch: 0, end: 60 })), want, "{policy:?}");
    }
}
