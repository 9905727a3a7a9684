//! Table-driven tests of every rule of the decision core, as plain data: inputs in, requests, seats and events out.

use bytes::Bytes;
use ferry_client::batch::{Batch, Compression, Header, ProducerInfo, Record, encode_records};

use super::*;
use crate::tp::{SourceTp, TargetTp};

const TOPIC_ID: &str = "id-1";
const MAX_BATCH: u64 = 1 << 20;

fn config(on_divergence: OnDivergence, kind: SourceKind, first_run_latest: bool) -> CoreConfig {
    CoreConfig {
        tp: SourceTp::new("orders", 0),
        target: TargetTp::new("orders", 0),
        topic_id: TOPIC_ID.into(),
        on_divergence,
        first_run_latest,
        target_max_batch: MAX_BATCH,
        source_kind: kind,
    }
}

fn records(base: u64, n: u64, tag: &str) -> Vec<Record> {
    (base..base + n)
        .map(|o| Record {
            offset: o,
            timestamp: 1_700_000_000_000 + o as i64,
            key: Some(Bytes::from(format!("k{o}"))),
            value: Some(Bytes::from(format!("{tag}-{o}"))),
            headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"1")) }],
        })
        .collect()
}

/// A batch of `n` records at `base`, epoch `epoch`.
fn batch(base: u64, n: u64, epoch: u32) -> Batch {
    Batch::parse(encode_records(&records(base, n, "v"), epoch, Compression::None, ProducerInfo::NONE)).unwrap()
}

fn pos(log_start: u64, log_end: u64, epoch: u32) -> SourcePos {
    SourcePos { log_start, log_end, epoch, topic_id: TOPIC_ID.into() }
}

fn appended(log_end: u64) -> Answer {
    Answer::Appended(Ok(AppendOutcome::Appended { log_end, written: 1, present: 0 }))
}

/// What an action looks like in a table: requests by kind and key numbers, seats, events by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    ReadResume,
    CompareTail(u64),
    Jump(u64),
    EpochEnd(u32),
    ProbeGap(u64),
    /// First and last offset, and the number of batches.
    Append(u64, u64, usize),
    Truncate(u64),
    Cancel,
    Seat(Option<u64>),
    Diverged(u64, OnDivergence),
    Halted,
    SyncError,
    TargetLost(u64),
    DataLost(u64, u64),
    Copied(u64),
}

struct H {
    core: PartitionCore,
    id: Option<u64>,
}

impl H {
    fn new(cfg: CoreConfig) -> (H, Vec<Out>) {
        let mut h = H { core: PartitionCore::new(cfg, false, 4 << 20), id: None };
        let out = h.drain();
        (h, out)
    }

    fn drain(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        for a in self.core.take_actions() {
            out.push(match a {
                Action::Send { id, request } => {
                    self.id = Some(id);
                    match request {
                        Request::ReadResume => Out::ReadResume,
                        Request::CompareTail { at } => Out::CompareTail(at),
                        Request::Jump { to } => Out::Jump(to),
                        Request::EpochEnd { epoch } => Out::EpochEnd(epoch),
                        Request::ProbeGap { at } => Out::ProbeGap(at),
                        Request::Append(p) => Out::Append(p.batches[0].base_offset(), p.last_offset, p.batches.len()),
                        Request::Truncate { at } => Out::Truncate(at),
                    }
                }
                Action::Cancel => Out::Cancel,
                Action::Seat(s) => Out::Seat(s.map(|(_, from)| from)),
                Action::Emit(CoreEvent::Diverged { at, policy, .. }) => Out::Diverged(at, policy),
                Action::Emit(CoreEvent::Halted { .. }) => Out::Halted,
                Action::Emit(CoreEvent::SyncError { .. }) => Out::SyncError,
                Action::Emit(CoreEvent::TargetLost { log_end, .. }) => Out::TargetLost(log_end),
                Action::Emit(CoreEvent::DataLost { start, end }) => Out::DataLost(start, end),
                Action::Copied { records, .. } => Out::Copied(records),
            });
        }
        out
    }

    fn step(&mut self, input: Input) -> Vec<Out> {
        self.core.step(input);
        self.drain()
    }

    fn answer(&mut self, answer: Answer) -> Vec<Out> {
        let id = self.id.expect("a request is outstanding");
        self.step(Input::Answer { id, answer })
    }

    fn data(&mut self, batches: Vec<Batch>, p: SourcePos) -> Vec<Out> {
        let seat = self.core.seat();
        self.step(Input::Data { seat, batches, held: Held::none(), pos: p })
    }

    /// Resumes at `cache` on a target whose last batch the source holds identically.
    fn mirroring_at(cfg: CoreConfig, cache: u64, epoch: u32) -> H {
        let (mut h, _) = H::new(cfg);
        let target = TargetPartition::at(0, cache, (cache > 0).then_some(epoch));
        let facts = ResumeFacts { target, committed: Some(cache), source_earliest: 0, source_latest: cache };
        let out = h.answer(Answer::Resume(facts));
        if cache > 0 {
            assert_eq!(out, vec![Out::CompareTail(cache - 1)]);
            let tail = tail_batch(cache - 1, 1, epoch);
            let out = h.answer(Answer::Tail(TailFacts { target: Some(tail.clone()), source: Some(tail) }));
            assert_eq!(out, vec![Out::Seat(Some(cache))]);
        }
        h
    }
}

fn tail_batch(base: u64, n: u64, epoch: u32) -> TailBatch {
    let b = batch(base, n, epoch);
    TailBatch {
        base,
        last: b.last_offset(),
        epoch,
        crc: b.header().crc,
        records: ferry_client::batch::decode_records(b.bytes()).unwrap(),
    }
}

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
    let gone = Input::SourceError { fault: SourceFault::OutOfRange, message: "below".into(), pos: pos(300, 400, 0) };
    assert_eq!(h.step(gone), vec![]);
    assert_eq!(h.answer(appended(110)), vec![Out::Copied(10), Out::Jump(300)]);
    assert_eq!(h.answer(appended(300)), vec![Out::DataLost(110, 300), Out::Seat(Some(300))]);
    assert_eq!(h.core.cache(), 300);
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
