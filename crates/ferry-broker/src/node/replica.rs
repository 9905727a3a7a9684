//! A replicated partition's state on this broker, as data: its role (leader, follower or neither), the leader
//! epoch it acts under, its leader-epoch history, its high watermark (HW) and, as leader, each follower's progress,
//! the in-sync set (ISR) etcd last accepted, the additions it proposed, and its failsafe grant. Also what it knows
//! of newer leaders, and the failsafe promises it gave.
//!
//! Nothing here decides: the rules (how the HW moves, who is in sync, when a leader may act, who is elected) are
//! in `cluster::core`, and the cluster's drivers apply their answers here, under this state's lock. The one
//! invariant kept here is that the HW never moves back except by an explicit reset after a truncation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use ferry_storage::fs::FileSystem;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::Result;
use crate::node::leader_epochs::{EpochEntry, LeaderEpochs};

/// One replicated partition's placement and leadership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// The brokers holding a replica, in preference order.
    pub replicas: Vec<u32>,
    /// The leader's broker id; 0 while none is (every in-sync replica is gone).
    pub leader: u32,
    /// Bumped by every leader change.
    pub leader_epoch: u32,
    /// The in-sync set: the replicas that hold every acknowledged record. The leader is one of them.
    pub isr: Vec<u32>,
    /// While the partition moves to other brokers (a drain, or a lost double_write replica being replaced): the
    /// replicas it moves to. The controller adds them, waits until they are in sync, moves the leadership when the
    /// leader is not among them, then drops the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Vec<u32>>,
    /// The leader epoch of the last unclean election: its leader starts a new partition epoch before it writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unclean_epoch: Option<u32>,
}

/// What a follower has, as its leader learnt from its fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The follower's log end offset: the offset of its last fetch.
    pub leo: u64,
    /// When it was last known to hold everything the leader had (Kafka's last caught-up time).
    pub caught_up: Instant,
    /// When it last fetched, and the leader's log end offset then.
    pub last_fetch: Instant,
    /// The leader's log end offset at that fetch.
    pub leader_leo_then: u64,
    /// Whether its last fetch said it had CRC-checked what it held when it started.
    pub verified: bool,
    /// Set by an unverified fetch: the follower leaves the ISR, and comes back only once verified.
    pub unverified_seen: bool,
}

/// The leader's side.
#[derive(Debug, Clone)]
pub struct Leading {
    /// The leader epoch.
    pub epoch: u32,
    /// The ISR etcd last accepted, this broker included.
    pub isr: Vec<u32>,
    /// Followers proposed for the ISR and not yet accepted by etcd: they count for the HW already.
    pub proposed: Vec<u32>,
    /// Every replica's broker.
    pub replicas: Vec<u32>,
    /// The mod revision of the partition's state in etcd that this ISR was written at.
    pub revision: i64,
    /// The first offset of this epoch: the log end offset when this broker became leader.
    pub epoch_start: u64,
    /// Each follower's progress (replicas of the partition only).
    pub followers: BTreeMap<u32, Progress>,
    /// Until when every replica confirmed this leader under the failsafe (see `cluster::core::fencing`).
    pub failsafe_until: Option<Instant>,
    /// The partition's state as etcd last accepted it (the fields this leader does not change, such as a move's
    /// target, are written back as they are).
    pub state: PartitionState,
}

impl Leading {
    /// The partition's state with `isr` as its in-sync set, for a compare-and-swap.
    pub fn with_isr(&self, isr: Vec<u32>) -> PartitionState {
        PartitionState { isr, ..self.state.clone() }
    }

    /// Each follower's log end, as its fetches said.
    pub fn follower_ends(&self) -> BTreeMap<u32, u64> {
        self.followers.iter().map(|(id, p)| (*id, p.leo)).collect()
    }
}

/// A replica's role.
#[derive(Debug, Clone)]
pub enum Role {
    /// Neither leader nor follower yet (just opened, or deposed until etcd says who leads).
    Idle,
    /// This broker leads the partition.
    Leader(Leading),
    /// This broker follows `leader` at `epoch`.
    Follower {
        /// The leader's broker id.
        leader: u32,
        /// The leader epoch.
        epoch: u32,
        /// The leader's advertised address, for clients sent there.
        address: String,
    },
}

/// Why a leader-only step was refused: the role this replica has instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLeading {
    /// The leader this replica follows, 0 when it knows none.
    pub leader: u32,
    /// The epoch it knows.
    pub epoch: u32,
    /// The leader's address, empty when unknown.
    pub address: String,
}

impl NotLeading {
    fn of(role: &Role) -> NotLeading {
        match role {
            Role::Follower { leader, epoch, address } => {
                NotLeading { leader: *leader, epoch: *epoch, address: address.clone() }
            }
            _ => NotLeading { leader: 0, epoch: 0, address: String::new() },
        }
    }
}

/// What this replica knows of the partition's leadership beyond its role, for the failsafe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Known {
    /// The newest leader epoch it has heard of (from etcd or a leader), and that epoch's leader.
    pub epoch: u32,
    /// That epoch's leader, 0 when none.
    pub leader: u32,
    /// The leader it promised, under the failsafe, not to lead a newer epoch before, and until when.
    pub promise: Option<(u32, Instant)>,
    /// Until when it gives no failsafe confirmation (an unclean election is being prepared here).
    pub frozen_until: Option<Instant>,
}

/// The replication state of one partition.
#[derive(Debug)]
pub struct Replica {
    id: u32,
    inner: Mutex<Inner>,
    hw: AtomicU64,
    /// Bumped on every change of HW, role or (on a leader) log end: acknowledgements and follower long polls
    /// wait on it.
    changes: watch::Sender<u64>,
    /// The broker-wide arrivals signal: consumers' long polls wake when the HW moves.
    arrivals: watch::Sender<u64>,
    /// Whether what this replica held when it opened has been CRC-checked (see `follower::verify`).
    verified: AtomicBool,
    /// The smallest in-sync set a write is acknowledged with (the topic's replication mode says).
    min_insync: usize,
    /// When the HW last moved (see [`crate::node::end_clock::EndClock`]).
    hw_moved: crate::node::end_clock::EndClock,
}

#[derive(Debug)]
struct Inner {
    role: Role,
    epochs: LeaderEpochs,
    known: Known,
}

impl Replica {
    /// The state of a replica on broker `id` with history `epochs`, idle.
    pub fn new(id: u32, epochs: LeaderEpochs, arrivals: watch::Sender<u64>, min_insync: usize) -> Replica {
        let (changes, _) = watch::channel(0);
        Replica {
            id,
            inner: Mutex::new(Inner { role: Role::Idle, epochs, known: Known::default() }),
            hw: AtomicU64::new(0),
            changes,
            arrivals,
            verified: AtomicBool::new(false),
            min_insync,
            hw_moved: Default::default(),
        }
    }

    /// This broker's id.
    pub fn broker_id(&self) -> u32 {
        self.id
    }

    /// Whether what the replica held when it opened has been CRC-checked.
    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// Records that it has.
    pub fn set_verified(&self) {
        self.verified.store(true, Ordering::Release);
    }

    /// Wakes whoever waits on this replica's changes, and the broker's long polls.
    pub fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wakes whoever waits on this replica's changes (followers' long polls, acknowledgements) only.
    pub fn nudge(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver of the change signal.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The role now.
    pub fn role(&self) -> Role {
        self.inner.lock().role.clone()
    }

    /// The high watermark.
    pub fn hw(&self) -> u64 {
        self.hw.load(Ordering::Acquire)
    }

    /// Moves the HW up to `target` (never down). Returns whether it moved.
    pub fn raise_hw(&self, target: u64) -> bool {
        let before = self.hw.fetch_max(target, Ordering::AcqRel);
        let moved = target > before;
        if moved {
            self.hw_moved.moved();
            self.notify();
        }
        moved
    }

    /// How long ago the HW last moved, when it has since the replica opened.
    pub fn hw_age(&self) -> Option<std::time::Duration> {
        self.hw_moved.age()
    }

    /// Sets the HW to `hw` exactly (after a truncation below it).
    pub fn reset_hw(&self, hw: u64) {
        self.hw.store(hw, Ordering::Release);
        self.notify();
    }

    /// The leader epoch this replica knows: its role's, else its history's latest.
    pub fn leader_epoch(&self) -> u32 {
        let inner = self.inner.lock();
        match &inner.role {
            Role::Leader(l) => l.epoch,
            Role::Follower { epoch, .. } => *epoch,
            Role::Idle => inner.epochs.latest().map_or(0, |e| e.epoch),
        }
    }

    /// The leader-epoch history.
    pub fn epochs(&self) -> Vec<EpochEntry> {
        self.inner.lock().epochs.entries().to_vec()
    }

    /// The leader's answer to a follower's `LeaderEpochEnd` (see [`LeaderEpochs::end_of`]).
    pub fn epoch_end(&self, epoch: u32, leo: u64) -> Option<(u32, u64)> {
        self.inner.lock().epochs.end_of(epoch, leo)
    }

    /// The history entries that matter to data in `[from, to]`.
    pub fn epochs_in_range(&self, from: u64, to: u64) -> Vec<EpochEntry> {
        self.inner.lock().epochs.in_range(from, to)
    }

    /// Records epoch boundaries learnt from the leader, durably, before the data they describe is written.
    pub fn learn_epochs(&self, fs: &dyn FileSystem, entries: &[EpochEntry]) -> Result<()> {
        let mut inner = self.inner.lock();
        for e in entries {
            inner.epochs.assign(fs, e.epoch, e.start)?;
        }
        Ok(())
    }

    /// Drops the history past a truncation to `leo`.
    pub fn truncate_epochs(&self, fs: &dyn FileSystem, leo: u64) -> Result<()> {
        self.inner.lock().epochs.truncate(fs, leo)
    }

    /// The smallest in-sync set a write is acknowledged with.
    pub fn min_insync(&self) -> usize {
        self.min_insync
    }

    /// What this replica knows of the partition's leadership.
    pub fn known(&self) -> Known {
        self.inner.lock().known
    }

    /// Notes that `leader` leads at `epoch` (from etcd or from a leader's answer), when newer than what it knew.
    pub fn learn_leader(&self, epoch: u32, leader: u32) {
        let mut inner = self.inner.lock();
        if epoch > inner.known.epoch || (epoch == inner.known.epoch && inner.known.leader == 0) {
            inner.known.epoch = epoch;
            inner.known.leader = leader;
        }
    }

    /// Records a failsafe promise to `leader` until `until`.
    pub fn promise(&self, leader: u32, until: Instant) {
        let mut inner = self.inner.lock();
        let later = inner.known.promise.is_none_or(|(l, t)| l != leader || t < until);
        if later {
            inner.known.promise = Some((leader, until));
        }
    }

    /// Gives no failsafe confirmation until `until`.
    pub fn freeze(&self, until: Instant) {
        self.inner.lock().known.frozen_until = Some(until);
    }

    /// Becomes leader at `state`'s epoch, its log ending at `leo`: the epoch's first offset is written to the
    /// history durably first. A leader of this epoch already keeps its state but takes a newer revision's ISR and
    /// replicas (a move adds and drops replicas at the same epoch).
    pub fn become_leader(&self, fs: &dyn FileSystem, state: &PartitionState, revision: i64, leo: u64) -> Result<()> {
        let epoch = state.leader_epoch;
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if epoch > inner.known.epoch {
            inner.known.epoch = epoch;
            inner.known.leader = self.id;
        }
        if let Role::Leader(l) = &mut inner.role
            && l.epoch == epoch
        {
            // etcd's state may be older than an ISR change this leader made since: only a newer one counts.
            if revision > l.revision {
                l.isr = state.isr.clone();
                l.proposed.retain(|r| !state.isr.contains(r) && state.replicas.contains(r));
                l.replicas = state.replicas.clone();
                l.state = state.clone();
                l.revision = revision;
                // A replica added by a move gets its progress from its first fetch; a dropped one's goes.
                l.followers.retain(|r, _| state.replicas.contains(r));
            }
            return Ok(());
        }
        inner.epochs.assign(fs, epoch, leo)?;
        let hw = self.hw();
        // An in-sync follower holds at least the HW; one out of sync gets its progress from its first fetch, never
        // from here: a made-up progress would look caught up and let a dead replica back into the ISR.
        let fresh = Progress {
            leo: hw,
            caught_up: now,
            last_fetch: now,
            leader_leo_then: leo,
            verified: true,
            unverified_seen: false,
        };
        let followers = state.isr.iter().filter(|&&r| r != self.id).map(|&r| (r, fresh)).collect();
        inner.role = Role::Leader(Leading {
            epoch,
            isr: state.isr.clone(),
            proposed: Vec::new(),
            replicas: state.replicas.clone(),
            revision,
            epoch_start: leo,
            followers,
            failsafe_until: None,
            state: state.clone(),
        });
        drop(inner);
        self.notify();
        Ok(())
    }

    /// Becomes a follower of `leader` (at `address`) at `epoch`.
    pub fn become_follower(&self, leader: u32, epoch: u32, address: String) {
        {
            let mut inner = self.inner.lock();
            inner.role = Role::Follower { leader, epoch, address };
            if epoch > inner.known.epoch {
                inner.known.epoch = epoch;
                inner.known.leader = leader;
            }
        }
        self.notify();
    }

    /// Stops leading or following (deposed, until etcd says who leads).
    pub fn step_down(&self) {
        self.inner.lock().role = Role::Idle;
        self.notify();
    }

    /// The leader state, or who this replica thinks leads.
    pub fn leading(&self) -> std::result::Result<Leading, NotLeading> {
        match &self.inner.lock().role {
            Role::Leader(l) => Ok(l.clone()),
            other => Err(NotLeading::of(other)),
        }
    }

    /// Runs `f` on the leader state under the lock, or says who this replica thinks leads.
    pub fn with_leading<R>(&self, f: impl FnOnce(&mut Leading) -> R) -> std::result::Result<R, NotLeading> {
        match &mut self.inner.lock().role {
            Role::Leader(l) => Ok(f(l)),
            other => Err(NotLeading::of(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(epoch: u32, isr: &[u32], replicas: &[u32]) -> PartitionState {
        PartitionState {
            replicas: replicas.to_vec(),
            leader: 1,
            leader_epoch: epoch,
            isr: isr.to_vec(),
            target: None,
            unclean_epoch: None,
        }
    }

    #[test]
    fn a_new_leader_records_its_epoch_start_and_seeds_only_in_sync_followers() {
        let fs = ferry_storage::fs::os();
        let dir = tempfile::tempdir().unwrap();
        let r = Replica::new(1, LeaderEpochs::load(&*fs, dir.path()).unwrap(), watch::channel(0).0, 2);
        assert!(r.leading().is_err());
        r.reset_hw(100);
        r.become_leader(&*fs, &state(5, &[1, 2], &[1, 2, 3]), 9, 120).unwrap();
        assert_eq!(r.epochs(), [EpochEntry { epoch: 5, start: 120 }]);
        let l = r.leading().unwrap();
        assert_eq!((l.epoch, l.epoch_start, l.revision), (5, 120, 9));
        assert_eq!(l.followers.keys().copied().collect::<Vec<_>>(), vec![2], "3 is out of sync: no made-up progress");
        assert_eq!(l.followers[&2].leo, 100, "an in-sync follower holds the HW");
        assert_eq!((r.known().epoch, r.known().leader), (5, 1));
        // The same epoch again at a newer revision takes the new ISR; an older one is ignored.
        r.become_leader(&*fs, &state(5, &[1, 2, 3], &[1, 2, 3]), 8, 130).unwrap();
        assert_eq!(r.leading().unwrap().isr, vec![1, 2]);
        r.become_leader(&*fs, &state(5, &[1, 2, 3], &[1, 2, 3]), 10, 130).unwrap();
        assert_eq!(r.leading().unwrap().isr, vec![1, 2, 3]);
        // The HW only moves up, except by a reset.
        assert!(!r.raise_hw(90));
        assert!(r.raise_hw(110));
        r.reset_hw(50);
        assert_eq!(r.hw(), 50);
        r.become_follower(2, 6, "h:2".into());
        assert_eq!(r.leading().unwrap_err(), NotLeading { leader: 2, epoch: 6, address: "h:2".into() });
        assert_eq!((r.known().epoch, r.known().leader), (6, 2));
        r.learn_leader(4, 3);
        assert_eq!((r.known().epoch, r.known().leader), (6, 2), "an older epoch is not learnt");
    }
}
