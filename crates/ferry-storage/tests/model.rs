//! Model test: random sequences of appends, offset appends (at the end, present, diverged, over a gap, zero-batch
//! jumps), reads, clean and unclean reopens, power losses, flushes, truncations and retention, checked after every
//! step against an in-memory model of what the log must hold: the same batches (offsets, epochs, records with
//! keys, values, headers and timestamps), log start and end, epoch (bumped exactly on unclean reopens), epoch
//! history, `EpochEnd` and gaps.
//!
//! The log runs on the real file system, and on [`SimFs`], whose power loss drops what was never fsynced (all of
//! it, a torn tail of each file, or random whole pages, and directory entries never synced). After a power loss:
//! - under the sync flush policy the log holds exactly what the model holds (every append was acknowledged, so
//!   none may be lost), with the epoch bumped;
//! - under the async policy it holds exactly the model's state as it was after some step since the last point
//!   where everything was durable (a flush, a close, a reopen, a truncation): an exact prefix, never a hole,
//!   never a changed batch.
//!
//! `PROPTEST_CASES` raises the case count (the default keeps a debug run to seconds).

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use ferry_batch::{self as batch, Record};
use ferry_storage::fs::{PowerLoss, SimFs};
use ferry_storage::{EpochEnd, FlushPolicy, Log, LogConfig, ManualClock, OffsetAppendOutcome};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Append { n: u64 },
    OffsetAtEnd { n: u64, epoch_step: u32 },
    OffsetPresent { pick: usize },
    OffsetDiverged { pick: usize, record: usize },
    OffsetGap { skip: u64, extra: u64, n: u64 },
    ZeroBatchJump { skip: u64 },
    Read { pick: u64, max_bytes: u64 },
    Reopen { clean: bool },
    PowerLoss { mode: PowerLoss, seed: u64 },
    Flush,
    Truncate { pick: u64 },
    Retention { bytes: Option<u64>, age: Option<u64> },
}

fn power_loss() -> impl Strategy<Value = PowerLoss> {
    prop_oneof![Just(PowerLoss::DropUnsynced), Just(PowerLoss::TornTail), Just(PowerLoss::TornPages)]
}

/// Operations with power losses and flushes (the simulated file layer only).
fn op_with_power_loss() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (power_loss(), any::<u64>()).prop_map(|(mode, seed)| Op::PowerLoss { mode, seed }),
        2 => Just(Op::Flush),
        20 => op(),
    ]
}

/// Operations on any file layer.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..5).prop_map(|n| Op::Append { n }),
        4 => (1u64..5, 0u32..2).prop_map(|(n, epoch_step)| Op::OffsetAtEnd { n, epoch_step }),
        2 => any::<usize>().prop_map(|pick| Op::OffsetPresent { pick }),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(pick, record)| Op::OffsetDiverged { pick, record }),
        1 => (1u64..60, 0u64..3, 1u64..4).prop_map(|(skip, extra, n)| Op::OffsetGap { skip, extra, n }),
        1 => (0u64..40).prop_map(|skip| Op::ZeroBatchJump { skip }),
        3 => (any::<u64>(), 1u64..2000).prop_map(|(pick, max_bytes)| Op::Read { pick, max_bytes }),
        2 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
        1 => any::<u64>().prop_map(|pick| Op::Truncate { pick }),
        1 => (proptest::option::of(0u64..3000), proptest::option::of(0u64..400))
            .prop_map(|(bytes, age)| Op::Retention { bytes, age }),
    ]
}

#[derive(Debug, Clone)]
struct MBatch {
    base: u64,
    last: u64,
    epoch: u32,
    records: Vec<Record>,
    bytes: Bytes,
}

#[derive(Debug, Default)]
struct Model {
    batches: Vec<MBatch>,
    log_start: u64,
    log_end: u64,
    current: u32,
    history: Vec<(u32, u64)>,
    /// States a power loss may leave, oldest first: (log end, base of the last batch held). The first is the last
    /// state known durable.
    since_durable: Vec<(u64, Option<u64>)>,
}

impl Model {
    /// The current state, as a power loss would find it.
    fn state(&self) -> (u64, Option<u64>) {
        (self.log_end, self.batches.last().map(|b| b.base))
    }

    /// Records that the current state may be what a power loss leaves.
    fn mark(&mut self) {
        let state = self.state();
        if self.since_durable.last() != Some(&state) {
            self.since_durable.push(state);
        }
    }

    /// Records that everything up to now is durable.
    fn mark_durable(&mut self) {
        self.since_durable = vec![self.state()];
    }

    /// Adopts what a power loss left: `stored` batches and `log_end`, which must be one of the states since the
    /// last durable one, with exactly that state's batches. The unclean open bumps the epoch.
    fn adopt_power_loss(&mut self, stored: &[Bytes], log_end: u64) -> Result<(), TestCaseError> {
        let found = self.since_durable.iter().copied().find(|&(end, last_base)| {
            let kept: Vec<&Bytes> =
                self.batches.iter().filter(|b| last_base.is_some_and(|l| b.base <= l)).map(|b| &b.bytes).collect();
            end == log_end && kept.len() == stored.len() && kept.iter().zip(stored).all(|(a, b)| *a == b)
        });
        let Some((end, last_base)) = found else {
            return Err(TestCaseError::fail(format!(
                "after a power loss the log ends at {log_end} with {} batches, which is no state since the last \
                 durable one ({:?})",
                stored.len(),
                self.since_durable
            )));
        };
        self.batches.retain(|b| last_base.is_some_and(|l| b.base <= l));
        self.log_end = end;
        self.history.retain(|&(_, s)| s < end);
        self.current = self.latest() + 1;
        self.mark_durable();
        Ok(())
    }

    fn latest(&self) -> u32 {
        self.history.last().map_or(self.current, |&(e, _)| e.max(self.current))
    }

    fn push(&mut self, bytes: Bytes) {
        let h = batch::verify(&bytes).unwrap();
        if self.history.last().is_none_or(|&(e, _)| h.epoch > e) {
            self.history.push((h.epoch, h.base_offset));
        }
        let records = batch::decode_records(&bytes).unwrap();
        self.batches.push(MBatch { base: h.base_offset, last: h.last_offset(), epoch: h.epoch, records, bytes });
        self.log_end = h.next_offset();
    }

    /// Moves the log end up for a gap; an empty log moves its start along.
    fn jump(&mut self, target: u64) {
        if self.batches.is_empty() {
            self.log_start = target;
        }
        self.log_end = target;
    }

    fn gaps(&self) -> Vec<(u64, u64)> {
        let mut gaps: Vec<(u64, u64)> =
            self.batches.windows(2).filter(|w| w[1].base > w[0].last + 1).map(|w| (w[0].last + 1, w[1].base)).collect();
        if let Some(last) = self.batches.last()
            && self.log_end > last.last + 1
        {
            gaps.push((last.last + 1, self.log_end));
        }
        gaps
    }

    fn epoch_end(&self, epoch: u32) -> Option<EpochEnd> {
        let idx = self.history.iter().rposition(|&(e, _)| e <= epoch)?;
        let end_offset = self.history.get(idx + 1).map_or(self.log_end, |&(_, s)| s);
        Some(EpochEnd { epoch: self.history[idx].0, end_offset })
    }

    fn truncate(&mut self, offset: u64) -> u64 {
        if offset >= self.log_end {
            return self.log_end;
        }
        let new_end = if offset < self.log_start {
            self.log_start = offset;
            offset
        } else {
            let boundaries =
                std::iter::once(self.log_start).chain(self.batches.iter().flat_map(|b| [b.base, b.last + 1]));
            boundaries.filter(|&x| x <= offset).max().unwrap_or(self.log_start)
        };
        self.batches.retain(|b| b.base < new_end);
        self.log_end = new_end;
        self.history.retain(|&(_, s)| s < new_end);
        new_end
    }
}

fn config(sync: bool) -> LogConfig {
    let base = LogConfig { segment_bytes: 700, index_interval_bytes: 200, ..small_config() };
    if sync { LogConfig { flush: FlushPolicy::Sync, ..base } } else { base }
}

fn check(log: &Log, m: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(log.log_start_offset(), m.log_start);
    prop_assert_eq!(log.log_end_offset(), m.log_end);
    prop_assert_eq!(log.epoch(), m.latest());
    prop_assert_eq!(log.epoch_history(), m.history.clone());
    prop_assert_eq!(log.stats().gaps, m.gaps());
    for e in 0..=m.latest() + 1 {
        prop_assert_eq!(log.epoch_end(e), m.epoch_end(e), "EpochEnd({})", e);
    }
    let stored = read_all_batches(log, 1500);
    prop_assert_eq!(stored.len(), m.batches.len());
    for ((h, bytes), want) in stored.iter().zip(&m.batches) {
        prop_assert_eq!((h.base_offset, h.last_offset(), h.epoch), (want.base, want.last, want.epoch));
        prop_assert_eq!(batch::decode_records(bytes).unwrap(), want.records.clone());
        prop_assert_eq!(bytes, &want.bytes);
    }
    Ok(())
}

/// Where the log under test lives.
enum Disk {
    Real,
    Sim(SimFs),
}

fn run(dir: &Path, mut disk: Disk, sync: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let open = |disk: &Disk| match disk {
        Disk::Real => Log::open_with_clock(dir, config(sync), clock.clone()).unwrap(),
        Disk::Sim(fs) => Log::open_on(Arc::new(fs.clone()), dir, config(sync), clock.clone()).unwrap(),
    };
    let mut log = open(&disk);
    let mut m = Model::default();
    m.mark_durable();
    let mut counter = 0u64;
    let next_records = |base: u64, n: u64, counter: &mut u64| {
        *counter += 1;
        records(base, n, 10 * *counter as i64, &format!("c{counter}"))
    };
    for op in ops {
        match op {
            Op::Append { n } => {
                let recs = next_records(0, n, &mut counter);
                let info = log.append(&batch_of(&recs, 0)).unwrap();
                let (base, epoch) = (m.log_end, m.latest());
                prop_assert_eq!((info.base_offset, info.epoch, info.log_end_offset), (base, epoch, base + n));
                m.push(batch_of(&rebased(&recs, base), epoch));
            }
            Op::OffsetAtEnd { n, epoch_step } => {
                let epoch = m.history.last().map_or(0, |&(e, _)| e) + epoch_step;
                let b = batch_of(&next_records(m.log_end, n, &mut counter), epoch);
                let outcome = log.append_with_offsets(&b, 0).unwrap();
                prop_assert_eq!(
                    outcome,
                    OffsetAppendOutcome::Appended { written: 1, present: 0, log_end_offset: m.log_end + n }
                );
                m.push(b);
            }
            Op::OffsetPresent { pick } if !m.batches.is_empty() => {
                let b = m.batches[pick % m.batches.len()].bytes.clone();
                let outcome = log.append_with_offsets(&b, 0).unwrap();
                prop_assert_eq!(
                    outcome,
                    OffsetAppendOutcome::Appended { written: 0, present: 1, log_end_offset: m.log_end }
                );
            }
            Op::OffsetDiverged { pick, record } if !m.batches.is_empty() => {
                let target = &m.batches[pick % m.batches.len()];
                let mut recs = target.records.clone();
                let i = record % recs.len();
                recs[i].value = Some(Bytes::from(format!("changed-{i}")));
                let b = batch_of(&recs, target.epoch);
                let outcome = log.append_with_offsets(&b, 0).unwrap();
                let want = OffsetAppendOutcome::Diverged {
                    at: recs[i].offset,
                    written: 0,
                    present: 0,
                    log_end_offset: m.log_end,
                };
                prop_assert_eq!(outcome, want);
            }
            Op::OffsetGap { skip, extra, n } => {
                let source_start = m.log_end + skip;
                let base = source_start + extra;
                let epoch = m.history.last().map_or(0, |&(e, _)| e);
                let b = batch_of(&next_records(base, n, &mut counter), epoch);
                if extra > 0 {
                    // Starting above the source's log start would skip [source_start, base): refused.
                    let refused = log.append_with_offsets(&b, source_start);
                    prop_assert!(
                        matches!(refused, Err(ferry_storage::StorageError::OffsetAppendRefused { .. })),
                        "{:?}",
                        refused
                    );
                } else {
                    let outcome = log.append_with_offsets(&b, source_start).unwrap();
                    prop_assert_eq!(
                        outcome,
                        OffsetAppendOutcome::Appended { written: 1, present: 0, log_end_offset: base + n }
                    );
                    m.jump(base);
                    m.mark();
                    m.push(b);
                }
            }
            Op::ZeroBatchJump { skip } => {
                let target = m.log_end + skip;
                let outcome = log.append_with_offsets(&[], target).unwrap();
                prop_assert_eq!(
                    outcome,
                    OffsetAppendOutcome::Appended { written: 0, present: 0, log_end_offset: target }
                );
                if skip > 0 {
                    m.jump(target);
                }
            }
            Op::Read { pick, max_bytes } => {
                let offset = m.log_start + pick % (m.log_end - m.log_start + 1);
                let r = log.read(offset, max_bytes).unwrap();
                let expected: Vec<&MBatch> = m.batches.iter().filter(|b| b.last >= offset).collect();
                let got = batch::split_verified(&r.batches).unwrap();
                prop_assert_eq!(got.is_empty(), expected.is_empty());
                prop_assert!(got.len() == 1 || r.batches.len() as u64 <= max_bytes);
                for ((_, bytes), want) in got.iter().zip(&expected) {
                    prop_assert_eq!(bytes, &want.bytes);
                }
                prop_assert_eq!(r.next_offset, got.last().map_or(offset, |(h, _)| h.next_offset()));
            }
            Op::Reopen { clean } => {
                if clean {
                    log.close().unwrap();
                } else {
                    m.current = m.latest() + 1;
                }
                drop(log);
                log = open(&disk);
                // A clean close flushed everything; an unclean open fsynced what it checked.
                m.mark_durable();
            }
            Op::PowerLoss { mode, seed } => {
                let Disk::Sim(fs) = &disk else { unreachable!("power losses run on the simulated disk only") };
                let rebooted = fs.power_loss(mode, seed);
                drop(log);
                disk = Disk::Sim(rebooted);
                log = open(&disk);
                let stored: Vec<Bytes> = read_all_batches(&log, 1500).into_iter().map(|(_, b)| b).collect();
                m.adopt_power_loss(&stored, log.log_end_offset())?;
            }
            Op::Flush => {
                log.flush().unwrap();
                m.mark_durable();
            }
            Op::Truncate { pick } => {
                let offset = pick % (m.log_end + 10);
                let cuts = offset < m.log_end;
                let want = m.truncate(offset);
                prop_assert_eq!(log.truncate_to(offset).unwrap(), want);
                if cuts {
                    // A truncation that cuts flushes first and leaves its cut durable.
                    m.mark_durable();
                }
            }
            Op::Retention { bytes, age } => {
                let bases = log.segment_base_offsets();
                let now = 10 * counter as i64;
                // Expected: whole sealed segments from the front, by the same rules, on the model's batches.
                let seg_of = |b: &MBatch| bases.iter().rposition(|&s| s <= b.base).unwrap_or(0);
                let mut sizes = vec![0u64; bases.len()];
                let mut newest = vec![i64::MIN; bases.len()];
                for b in &m.batches {
                    sizes[seg_of(b)] += b.bytes.len() as u64;
                    newest[seg_of(b)] = newest[seg_of(b)].max(b.records.iter().map(|r| r.timestamp).max().unwrap());
                }
                let mut total: u64 = sizes.iter().sum();
                let mut deleted = 0;
                while deleted + 1 < bases.len()
                    && (bytes.is_some_and(|l| total > l) || age.is_some_and(|a| newest[deleted] < now - a as i64))
                {
                    total -= sizes[deleted];
                    deleted += 1;
                }
                log.set_config(LogConfig { retention_bytes: bytes, retention_ms: age, ..config(sync) });
                prop_assert_eq!(log.apply_retention(now).unwrap(), deleted);
                log.set_config(config(sync));
                if deleted > 0 {
                    m.log_start = bases[deleted];
                    m.batches.retain(|b| b.base >= bases[deleted]);
                }
            }
            _ => {}
        }
        if sync {
            // Every append returned after its fsync: all of it is durable.
            m.mark_durable();
        } else {
            m.mark();
        }
        check(&log, &m)?;
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn log_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        run(dir.path(), Disk::Real, false, ops)?;
    }

    #[test]
    fn power_loss_under_sync_flush_loses_nothing(ops in proptest::collection::vec(op_with_power_loss(), 1..60)) {
        run(Path::new("/data/t/0"), Disk::Sim(SimFs::new()), true, ops)?;
    }

    #[test]
    fn power_loss_under_async_flush_leaves_an_exact_earlier_state(
        ops in proptest::collection::vec(op_with_power_loss(), 1..60)
    ) {
        run(Path::new("/data/t/0"), Disk::Sim(SimFs::new()), false, ops)?;
    }
}
