//! Table-driven tests of every rule of the decision core, as plain data: inputs in, requests, seats and events out.
//! This module holds the harness; `resume` tests the resume rule, the tail check, appends, target answers and
//! truncation, `flow` positions, epochs, gaps, seats, pause, lost targets and source errors.

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
        decode_limit: crate::reshape::decode_limit(16 << 20, MAX_BATCH),
        source_kind: kind,
        replicated_source: false,
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

mod flow;
mod resume;
