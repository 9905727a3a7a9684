//! The resume rule, the tail check, appends, the target's answers and truncation.

use super::*;

#[test]
fn the_resume_rule() {
    struct Case {
        name: &'static str,
        target: TargetPartition,
        committed: Option<u64>,
        source: (u64, u64),
        first_run_latest: bool,
        want: Vec<Out>,
    }
    let cases = [
        Case {
            name: "a target with data is verified at its last offset",
            target: TargetPartition::at(0, 100, Some(2)),
            committed: Some(100),
            source: (0, 150),
            first_run_latest: true,
            want: vec![Out::CompareTail(99)],
        },
        Case {
            name: "a target with only a recorded start resumes there",
            target: TargetPartition::at(40, 40, None),
            committed: None,
            source: (40, 90),
            first_run_latest: false,
            want: vec![Out::Seat(Some(40))],
        },
        Case {
            name: "an empty target on the first run with latest starts at the source's log end",
            target: TargetPartition::at(0, 0, None),
            committed: None,
            source: (10, 500),
            first_run_latest: true,
            want: vec![Out::Jump(500)],
        },
        Case {
            name: "an empty target otherwise starts at the source's log start",
            target: TargetPartition::at(0, 0, None),
            committed: None,
            source: (10, 500),
            first_run_latest: false,
            want: vec![Out::Jump(10)],
        },
        Case {
            name: "an empty target at source offset 0 needs no positioning",
            target: TargetPartition::at(0, 0, None),
            committed: Some(0),
            source: (0, 500),
            first_run_latest: false,
            want: vec![Out::Seat(Some(0))],
        },
        Case {
            name: "an empty target although the group shows progress lost data: sync_error, copy from the start",
            target: TargetPartition::at(0, 0, None),
            committed: Some(300),
            source: (10, 500),
            first_run_latest: true,
            want: vec![Out::SyncError, Out::Jump(10)],
        },
    ];
    for c in cases {
        let (mut h, out) = H::new(config(OnDivergence::Halt, SourceKind::Ferry, c.first_run_latest));
        assert_eq!(out, vec![Out::ReadResume], "{}", c.name);
        let facts = ResumeFacts {
            target: c.target,
            committed: c.committed,
            source_earliest: c.source.0,
            source_latest: c.source.1,
        };
        assert_eq!(h.answer(Answer::Resume(facts)), c.want, "{}", c.name);
    }
}

#[test]
fn positioning_an_empty_target_then_mirroring_from_there() {
    let (mut h, _) = H::new(config(OnDivergence::Halt, SourceKind::Ferry, false));
    let facts = ResumeFacts {
        target: TargetPartition::at(0, 0, None),
        committed: None,
        source_earliest: 10,
        source_latest: 50,
    };
    assert_eq!(h.answer(Answer::Resume(facts)), vec![Out::Jump(10)]);
    assert_eq!(h.answer(appended(10)), vec![Out::Seat(Some(10))]);
    assert_eq!(h.data(vec![batch(10, 5, 0)], pos(10, 15, 0)), vec![Out::Append(10, 14, 1)]);
    assert_eq!(h.answer(appended(15)), vec![Out::Copied(5)]);
    assert_eq!(h.core.cache(), 15);
    assert_eq!(h.core.view().target_log_end, Some(15));
}

#[test]
fn the_tail_check() {
    struct Case {
        name: &'static str,
        target: Option<TailBatch>,
        source: Option<TailBatch>,
        want: Vec<Out>,
    }
    let same = tail_batch(90, 10, 1);
    let mut other_value = same.clone();
    other_value.records[4].value = Some(Bytes::from_static(b"changed"));
    other_value.crc ^= 1;
    // The mirror split a source batch of 20 records into pieces: the target's last piece has other boundaries.
    let source_whole = tail_batch(80, 20, 1);
    let mut piece = tail_batch(90, 10, 1);
    piece.crc ^= 0x55;
    let mut other_epoch = same.clone();
    other_epoch.epoch = 2;
    other_epoch.crc ^= 3;
    let cases = [
        Case {
            name: "identical",
            target: Some(same.clone()),
            source: Some(same.clone()),
            want: vec![Out::Seat(Some(100))],
        },
        Case {
            name: "a split piece whose records match",
            target: Some(piece),
            source: Some(source_whole),
            want: vec![Out::Seat(Some(100))],
        },
        Case {
            name: "a different record",
            target: Some(other_value),
            source: Some(same.clone()),
            want: vec![Out::Diverged(94, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "the same records in another epoch",
            target: Some(other_epoch),
            source: Some(same.clone()),
            want: vec![Out::Diverged(90, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "the source no longer has it",
            target: Some(same.clone()),
            source: None,
            want: vec![Out::Seat(Some(100))],
        },
        Case { name: "the target cannot say", target: None, source: Some(same), want: vec![Out::Seat(Some(100))] },
    ];
    for c in cases {
        let (mut h, _) = H::new(config(OnDivergence::Halt, SourceKind::Ferry, false));
        let facts = ResumeFacts {
            target: TargetPartition::at(0, 100, Some(1)),
            committed: None,
            source_earliest: 0,
            source_latest: 100,
        };
        assert_eq!(h.answer(Answer::Resume(facts)), vec![Out::CompareTail(99)], "{}", c.name);
        assert_eq!(h.answer(Answer::Tail(TailFacts { target: c.target, source: c.source })), c.want, "{}", c.name);
    }
}

#[test]
fn batches_go_in_order_and_what_the_target_holds_is_dropped() {
    let mut h = H::mirroring_at(config(OnDivergence::Halt, SourceKind::Ferry, false), 100, 0);
    // A re-delivered batch below the cache offset is dropped; the next is appended.
    assert_eq!(h.data(vec![batch(90, 10, 0), batch(100, 10, 0)], pos(0, 110, 0)), vec![Out::Append(100, 109, 1)]);
    // More data while the append is outstanding waits for the answer.
    assert_eq!(h.data(vec![batch(110, 10, 0), batch(120, 5, 0)], pos(0, 125, 0)), vec![]);
    assert_eq!(h.answer(appended(110)), vec![Out::Copied(10), Out::Append(110, 124, 2)]);
    assert_eq!(h.answer(appended(125)), vec![Out::Copied(15)]);
    assert_eq!((h.core.cache(), h.core.view().pending_bytes), (125, 0));
}

#[test]
fn a_batch_partly_on_the_target_is_cut_at_the_cache_offset_and_an_oversized_one_is_split() {
    let cfg = CoreConfig { target_max_batch: 512, ..config(OnDivergence::Halt, SourceKind::Ferry, false) };
    let mut h = H::mirroring_at(cfg, 105, 0);
    let out = h.data(vec![batch(100, 30, 0)], pos(0, 130, 0));
    let [Out::Append(first, last, pieces)] = out[..] else { panic!("{out:?}") };
    assert_eq!((first, last), (105, 129), "the records below the cache offset are dropped, every other one kept");
    assert!(pieces > 1, "split to fit 512 bytes: {pieces} pieces");
    assert_eq!(h.answer(appended(130)), vec![Out::Copied(25)]);
}

#[test]
fn a_single_record_over_the_target_limit_halts_the_partition() {
    let cfg = CoreConfig { target_max_batch: 64, ..config(OnDivergence::Truncate, SourceKind::Ferry, false) };
    let mut h = H::mirroring_at(cfg, 0, 0);
    assert_eq!(h.data(vec![batch(0, 3, 0)], pos(0, 3, 0)), vec![Out::Halted, Out::Seat(None)]);
    assert!(h.core.is_halted());
}

#[test]
fn target_answers() {
    struct Case {
        name: &'static str,
        on_divergence: OnDivergence,
        answer: AppendOutcome,
        want: Vec<Out>,
    }
    let cases = [
        Case {
            name: "DIVERGED halts at its offset",
            on_divergence: OnDivergence::Halt,
            answer: AppendOutcome::Diverged { at: 103, message: "differs".into() },
            want: vec![Out::Diverged(103, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "DIVERGED under truncate truncates there",
            on_divergence: OnDivergence::Truncate,
            answer: AppendOutcome::Diverged { at: 103, message: "differs".into() },
            want: vec![Out::Diverged(103, OnDivergence::Truncate), Out::Seat(None), Out::Truncate(103)],
        },
        Case {
            name: "a changed topic id halts even under truncate",
            on_divergence: OnDivergence::Truncate,
            answer: AppendOutcome::TopicIdMismatch("other topic".into()),
            want: vec![Out::Diverged(100, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "an epoch below the target's history diverges",
            on_divergence: OnDivergence::Halt,
            answer: AppendOutcome::EpochRegressed("epoch 1 below 2".into()),
            want: vec![Out::Diverged(100, OnDivergence::Halt), Out::Seat(None)],
        },
        Case {
            name: "a promoted target halts",
            on_divergence: OnDivergence::Truncate,
            answer: AppendOutcome::NotAMirrorTopic("promoted".into()),
            want: vec![Out::Halted, Out::Seat(None)],
        },
        Case {
            name: "a straddle re-reads the target",
            on_divergence: OnDivergence::Halt,
            answer: AppendOutcome::StraddlesEnd("straddles".into()),
            want: vec![Out::Seat(None), Out::ReadResume],
        },
        Case {
            name: "a refused gap re-reads the target",
            on_divergence: OnDivergence::Halt,
            answer: AppendOutcome::GapRefused("gap".into()),
            want: vec![Out::Seat(None), Out::ReadResume],
        },
        Case {
            name: "anything else halts",
            on_divergence: OnDivergence::Truncate,
            answer: AppendOutcome::Refused { code: "STORAGE_ERROR".into(), message: "disk".into() },
            want: vec![Out::Halted, Out::Seat(None)],
        },
    ];
    for c in cases {
        let mut h = H::mirroring_at(config(c.on_divergence, SourceKind::Ferry, false), 100, 0);
        assert_eq!(h.data(vec![batch(100, 10, 0)], pos(0, 110, 0)), vec![Out::Append(100, 109, 1)], "{}", c.name);
        assert_eq!(h.answer(Answer::Appended(Ok(c.answer))), c.want, "{}", c.name);
        assert_eq!(h.core.cache(), 100, "{}: the cache offset moves only on an acknowledgement", c.name);
    }
}

#[test]
fn a_truncation_resumes_from_the_target() {
    let mut h = H::mirroring_at(config(OnDivergence::Truncate, SourceKind::Ferry, false), 100, 0);
    h.data(vec![batch(100, 10, 0)], pos(0, 110, 0));
    h.answer(Answer::Appended(Ok(AppendOutcome::Diverged { at: 60, message: "x".into() })));
    assert_eq!(h.answer(Answer::Truncated(Ok(60))), vec![Out::Seat(None), Out::ReadResume]);
    let facts = ResumeFacts {
        target: TargetPartition::at(0, 60, Some(0)),
        committed: None,
        source_earliest: 0,
        source_latest: 110,
    };
    assert_eq!(h.answer(Answer::Resume(facts)), vec![Out::CompareTail(59)]);
    let tail = tail_batch(59, 1, 0);
    assert_eq!(
        h.answer(Answer::Tail(TailFacts { target: Some(tail.clone()), source: Some(tail) })),
        vec![Out::Seat(Some(60))]
    );
}

#[test]
fn a_truncation_to_an_empty_target_forgets_the_epoch_it_removed() {
    // The source lost its whole epoch 0; the target held only epoch-0 batches and is truncated to nothing.
    let mut h = H::mirroring_at(config(OnDivergence::Truncate, SourceKind::Ferry, false), 300, 0);
    assert_eq!(h.data(vec![batch(300, 10, 1)], pos(0, 400, 1)), vec![Out::EpochEnd(0)]);
    let out = h.answer(Answer::EpochEnd(EpochAnswer::Before { first: 0 }));
    assert_eq!(out, vec![Out::Diverged(0, OnDivergence::Truncate), Out::Seat(None), Out::Truncate(0)]);
    assert_eq!(h.answer(Answer::Truncated(Ok(0))), vec![Out::Seat(None), Out::ReadResume]);
    let facts = ResumeFacts {
        target: TargetPartition::at(0, 0, None),
        committed: None,
        source_earliest: 0,
        source_latest: 400,
    };
    assert_eq!(h.answer(Answer::Resume(facts)), vec![Out::Seat(Some(0))]);
    // Epoch 1 from offset 0 is appended as it is: no check of the epoch the truncation removed.
    assert_eq!(h.data(vec![batch(0, 10, 1)], pos(0, 400, 1)), vec![Out::Append(0, 9, 1)]);
    assert_eq!(h.answer(appended(10)), vec![Out::Copied(10)]);
}
