//! A group's state as its records rebuild it, and the records (`Change`) that change it: JSON values keyed by the
//! group's name in `__ferry_queues`. The members and locks are kept in memory only ([`Runtime`]).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use ferry_batch::Record;
use serde::{Deserialize, Serialize};

use super::core::{Part, Rec, Settings};
use crate::state::{Entry, Replayed};

/// A topic partition.
pub type Tp = (String, u32);

/// One change to a group's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Change {
    /// The group's settings (its first join).
    Config(Settings),
    /// A queue or serial group's start in a partition (first join, a reset, a gap).
    Start { t: String, p: u32, offset: u64 },
    /// Records delivered to a member (their counts raised).
    Delivered { t: String, p: u32, offsets: Vec<u64>, member: String, at: i64, lock_until: i64 },
    /// A transition that changes no progress but belongs in the history (success, retry, release, expiry).
    Settled { t: String, p: u32, offset: u64, ev: Event, member: String, at: i64, error: String, not_before: i64 },
    /// A record about to be dead-lettered under sequence `seq` of the group's dead-letter producer.
    DlqIntent { t: String, p: u32, offset: u64, seq: i32, member: String, at: i64, error: String },
    /// A dead-lettered record, with where it went.
    DeadLettered { t: String, p: u32, offset: u64, member: String, at: i64, dlq_offset: u64 },
    /// A broadcast member's position in a partition.
    Position { member: String, t: String, p: u32, offset: u64 },
    /// The group's redrive job.
    Redrive(Job),
    /// The whole state (a snapshot): replaces what came before.
    Snapshot(Box<Snapshot>),
}

/// What a transition was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    /// Succeeded.
    Success,
    /// Failed, to be retried.
    Retry,
    /// Given back unprocessed.
    Released,
    /// Its lock ended without an answer.
    LockExpired,
    /// Its member left or died.
    MemberGone,
}

impl Event {
    /// The name operators see.
    pub fn name(self) -> &'static str {
        match self {
            Event::Success => "SUCCESS",
            Event::Retry => "RETRY",
            Event::Released => "RELEASED",
            Event::LockExpired => "LOCK_EXPIRED",
            Event::MemberGone => "MEMBER_GONE",
        }
    }
}

/// A redrive job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: String,
    /// Target topic; empty: each record's origin topic.
    pub to: String,
    /// Records per second; 0 unlimited.
    pub rate: u32,
    /// Reports what it would do only.
    pub dry_run: bool,
    /// The dead-letter range: [from, end).
    pub from: u64,
    /// The dead-letter topic's end when the job started.
    pub end: u64,
    /// Next offset to copy.
    pub next: u64,
    /// Records copied.
    pub copied: u64,
    /// Per target topic.
    pub per_topic: BTreeMap<String, u64>,
    /// RUNNING, DONE or FAILED.
    pub state: String,
    /// The error of a failed job.
    pub error: String,
    /// Start and end times, ms.
    pub started_ms: i64,
    /// End time, ms (0 while running).
    pub finished_ms: i64,
    /// Next sequence of the redrive producer, per target partition ("topic/partition").
    pub seqs: BTreeMap<String, i32>,
}

/// A dead letter being written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// Its sequence under the group's dead-letter producer.
    pub seq: i32,
    /// Who failed it last.
    pub member: String,
    /// When it was decided.
    pub at: i64,
    /// The last error.
    pub error: String,
}

/// A partition's progress in a snapshot: topic, partition, start, and the records with a state.
pub type PartSnapshot = (String, u32, u64, Vec<(u64, Rec)>);

/// A group's persisted state, whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its settings.
    pub settings: Option<Settings>,
    /// Queue and serial progress: (topic, partition, start, records with a state).
    pub parts: Vec<PartSnapshot>,
    /// Broadcast positions: (member, topic, partition, offset).
    pub positions: Vec<(String, String, u32, u64)>,
    /// The next dead-letter sequence.
    pub dlq_seq: i32,
    /// Dead letters decided but not known written: (topic, partition, offset, intent).
    pub intents: Vec<(String, u32, u64, Intent)>,
    /// The redrive job.
    pub redrive: Option<Job>,
    /// Dead letters below this offset were redriven by a finished job.
    pub redriven_below: u64,
}

/// A member, as the owner knows it (memory only).
#[derive(Debug, Clone)]
pub struct MemberRt {
    /// Its client id.
    pub client_id: String,
    /// Its topics.
    pub topics: Vec<String>,
    /// Its session timeout, ms.
    pub session_ms: u64,
    /// Its last call, ms.
    pub last_seen_ms: i64,
    /// When it joined, ms, or (serial) when it was put last in line by an unpin: the active member is the one
    /// with the smallest.
    pub since: u64,
    /// Broadcast: where its next read starts, per partition (memory; the persisted position is the acked one).
    pub cursor: HashMap<Tp, u64>,
}

/// Counters since this owner loaded the group.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Deliveries after the first.
    pub redeliveries: u64,
    /// Locks that ended without an answer.
    pub lock_expiries: u64,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// Records succeeded.
    pub settled: u64,
}

/// What is kept in memory only.
#[derive(Debug, Clone, Default)]
pub struct Runtime {
    /// The live members.
    pub members: BTreeMap<String, MemberRt>,
    /// Counters.
    pub counters: Counters,
    /// A joining order for `since` ties.
    pub joins: u64,
}

/// One group's state.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Its settings, once it was joined.
    pub settings: Option<Settings>,
    /// Queue and serial progress.
    pub parts: BTreeMap<Tp, Part>,
    /// Broadcast acknowledged positions: member -> partition -> offset.
    pub positions: BTreeMap<String, BTreeMap<Tp, u64>>,
    /// The next dead-letter sequence.
    pub dlq_seq: i32,
    /// Dead letters decided and not known written.
    pub intents: BTreeMap<(Tp, u64), Intent>,
    /// The redrive job.
    pub redrive: Option<Job>,
    /// Dead letters below this offset were redriven.
    pub redriven_below: u64,
    /// Changes applied since the last snapshot.
    pub since_snapshot: u64,
    /// Memory only.
    pub rt: Runtime,
}

impl Group {
    /// The group's state as one record's worth.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            settings: self.settings.clone(),
            parts: self
                .parts
                .iter()
                .map(|((t, p), part)| {
                    (t.clone(), *p, part.start, part.recs.iter().map(|(o, r)| (*o, r.clone())).collect())
                })
                .collect(),
            positions: self
                .positions
                .iter()
                .flat_map(|(m, ps)| ps.iter().map(move |((t, p), o)| (m.clone(), t.clone(), *p, *o)))
                .collect(),
            dlq_seq: self.dlq_seq,
            intents: self.intents.iter().map(|(((t, p), o), i)| (t.clone(), *p, *o, i.clone())).collect(),
            redrive: self.redrive.clone(),
            redriven_below: self.redriven_below,
        }
    }

    fn restore(&mut self, s: Snapshot) {
        let rt = std::mem::take(&mut self.rt);
        *self = Group {
            settings: s.settings,
            parts: s
                .parts
                .into_iter()
                .map(|(t, p, start, recs)| {
                    ((t, p), Part { start, recs: recs.into_iter().collect(), ..Part::default() })
                })
                .collect(),
            positions: BTreeMap::new(),
            dlq_seq: s.dlq_seq,
            intents: s.intents.into_iter().map(|(t, p, o, i)| (((t, p), o), i)).collect(),
            redrive: s.redrive,
            redriven_below: s.redriven_below,
            since_snapshot: 0,
            rt,
        };
        for (m, t, p, o) in s.positions {
            self.positions.entry(m).or_default().insert((t, p), o);
        }
    }

    /// Applies one change.
    pub fn apply(&mut self, c: Change) {
        self.since_snapshot += 1;
        match c {
            Change::Config(s) => self.settings = Some(s),
            Change::Start { t, p, offset } => {
                let part = self.parts.entry((t, p)).or_insert_with(|| Part::at(offset));
                if offset > part.start {
                    part.skip_to(offset);
                } else if offset < part.start {
                    // A reset back: what was known above the old start is forgotten with it.
                    *part = Part::at(offset);
                }
            }
            Change::Delivered { t, p, offsets, .. } => {
                if let Some(part) = self.parts.get_mut(&(t, p)) {
                    part.delivered(&offsets);
                }
            }
            Change::Settled { t, p, offset, ev, at, error, not_before, .. } => {
                if let Some(part) = self.parts.get_mut(&(t, p)) {
                    match ev {
                        Event::Success => part.settle(offset, false),
                        Event::Retry => part.failed(offset, at, not_before, &error),
                        Event::Released | Event::LockExpired | Event::MemberGone => {}
                    }
                }
            }
            Change::DlqIntent { t, p, offset, seq, member, at, error } => {
                self.dlq_seq = seq.wrapping_add(1);
                self.intents.insert(((t, p), offset), Intent { seq, member, at, error });
            }
            Change::DeadLettered { t, p, offset, .. } => {
                let tp = (t, p);
                self.intents.remove(&(tp.clone(), offset));
                if let Some(part) = self.parts.get_mut(&tp) {
                    part.settle(offset, true);
                }
            }
            Change::Position { member, t, p, offset } => {
                self.positions.entry(member).or_default().insert((t, p), offset);
            }
            Change::Redrive(job) => {
                if job.state == "DONE" && !job.dry_run {
                    self.redriven_below = self.redriven_below.max(job.end);
                }
                self.redrive = Some(job);
            }
            Change::Snapshot(s) => self.restore(*s),
        }
    }
}

/// The groups of one `__ferry_queues` partition.
#[derive(Debug, Default)]
pub struct Groups {
    /// By name.
    pub groups: HashMap<String, Group>,
}

impl Replayed for Groups {
    fn apply(&mut self, _offset: u64, record: &Record) {
        let (Some(key), Some(value)) = (&record.key, &record.value) else { return };
        let Ok(name) = std::str::from_utf8(key) else { return };
        match serde_json::from_slice::<Change>(value) {
            Ok(c) => self.groups.entry(name.to_owned()).or_default().apply(c),
            Err(e) => tracing::warn!(group = name, error = %e, "a message-model state record does not decode; skipped"),
        }
    }
}

/// The record of `change` to `group`.
pub fn entry(group: &str, change: &Change) -> Entry {
    Entry {
        key: Bytes::copy_from_slice(group.as_bytes()),
        value: Bytes::from(serde_json::to_vec(change).unwrap_or_default()),
    }
}

/// The change a record holds, if it is one of `group`'s.
pub fn change_of(group: &str, record: &Record) -> Option<Change> {
    if record.key.as_deref() != Some(group.as_bytes()) {
        return None;
    }
    serde_json::from_slice(record.value.as_deref()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::core::Mode;

    fn replay(changes: &[Change]) -> Group {
        let mut g = Group::default();
        for c in changes {
            let e = entry("g", c);
            let back: Change = serde_json::from_slice(&e.value).unwrap();
            assert_eq!(&back, c);
            g.apply(back);
        }
        g
    }

    #[test]
    fn a_replay_rebuilds_progress_and_a_snapshot_rebuilds_the_same() {
        let s = Settings { mode: Mode::Queue, lock_ms: 100, window: 10, backoff_ms: vec![5], retries: 1 };
        let d = |offsets: Vec<u64>| Change::Delivered {
            t: "t".into(),
            p: 0,
            offsets,
            member: "m".into(),
            at: 1,
            lock_until: 101,
        };
        let settled = |offset, ev| Change::Settled {
            t: "t".into(),
            p: 0,
            offset,
            ev,
            member: "m".into(),
            at: 2,
            error: "e".into(),
            not_before: 7,
        };
        let g = replay(&[
            Change::Config(s.clone()),
            Change::Start { t: "t".into(), p: 0, offset: 3 },
            d(vec![3, 4, 5]),
            settled(4, Event::Success),
            settled(3, Event::Retry),
            Change::DlqIntent { t: "t".into(), p: 0, offset: 5, seq: 0, member: "m".into(), at: 3, error: "x".into() },
            Change::DeadLettered { t: "t".into(), p: 0, offset: 5, member: "m".into(), at: 4, dlq_offset: 0 },
            Change::Position { member: "b".into(), t: "t".into(), p: 1, offset: 9 },
        ]);
        let part = &g.parts[&("t".to_owned(), 0)];
        assert_eq!(part.start, 3);
        assert_eq!(part.recs[&3].failures, 1);
        assert_eq!(part.recs[&3].not_before_ms, 7);
        assert!(part.recs[&4].done && part.recs[&5].dead);
        assert_eq!((g.dlq_seq, g.intents.len()), (1, 0));
        let again = replay(&[Change::Snapshot(Box::new(g.snapshot()))]);
        assert_eq!(again.snapshot(), g.snapshot());
        assert_eq!(again.settings, Some(s));
    }
}
