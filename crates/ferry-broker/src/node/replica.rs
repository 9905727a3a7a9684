//! A replicated partition's state on this broker: its role (leader, follower or neither), the leader epoch it acts
//! under, its leader-epoch history and its high watermark (HW); as leader, each follower's progress and the
//! in-sync set (ISR) as etcd last accepted it.
//!
//! The rules (docs/cluster.md, "What raft3 promises"):
//! - The HW is the smallest log end offset over the ISR, the leader's own included, and never moves back. Clients
//!   read only below it; a write is acknowledged once the HW has passed it.
//! - The leader's ISR changes only after etcd accepted the change (a compare-and-swap on the partition's state at
//!   the leader's epoch), so nothing is acknowledged without a follower before etcd knows that follower is out.
//! - A new leader serves reads once its HW has reached the first offset of its epoch: the HW of the old leader
//!   was at most that, so a consumer never sees the readable end move back past what it was shown.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferry_storage::fs::FileSystem;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::Result;
use crate::node::leader_epochs::{EpochEntry, LeaderEpochs};
use serde::{Deserialize, Serialize};

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
    /// Every replica's broker.
    pub replicas: Vec<u32>,
    /// The mod revision of the partition's state in etcd that this ISR was written at.
    pub revision: i64,
    /// The first offset of this epoch: the log end offset when this broker became leader.
    pub epoch_start: u64,
    /// Each follower's progress.
    pub followers: BTreeMap<u32, Progress>,
    /// The partition's state as etcd last accepted it (the fields this leader does not change, such as a move's
    /// target, are written back as they are).
    pub state: PartitionState,
}

impl Leading {
    /// The partition's state with `isr` as its in-sync set, for a compare-and-swap.
    pub fn with_isr(&self, isr: Vec<u32>) -> PartitionState {
        PartitionState { isr, ..self.state.clone() }
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

/// Where a write stands (see [`Replica::ack_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckState {
    /// Every in-sync replica (two at least) holds it.
    Acked,
    /// Not yet.
    Waiting,
    /// It never will be by this leader: why.
    Refused(String),
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
    verified: std::sync::atomic::AtomicBool,
    /// The smallest in-sync set a write is acknowledged with (the topic's replication mode says).
    min_insync: usize,
}

#[derive(Debug)]
struct Inner {
    role: Role,
    epochs: LeaderEpochs,
}

impl Replica {
    /// The state of a replica on broker `id` with history `epochs`, idle.
    pub fn new(id: u32, epochs: LeaderEpochs, arrivals: watch::Sender<u64>, min_insync: usize) -> Replica {
        let (changes, _) = watch::channel(0);
        Replica {
            id,
            inner: Mutex::new(Inner { role: Role::Idle, epochs }),
            hw: AtomicU64::new(0),
            changes,
            arrivals,
            verified: std::sync::atomic::AtomicBool::new(false),
            min_insync,
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

    fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
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

    /// The end below which clients may read: the HW, capped at `leo`. `Ok(None)` on a leader whose HW has not
    /// reached its epoch's start yet (it serves no reads until it has); `Err` on a replica that does not lead.
    pub fn readable_end(&self, leo: u64) -> std::result::Result<Option<u64>, NotLeading> {
        let inner = self.inner.lock();
        let hw = self.hw().min(leo);
        match &inner.role {
            Role::Leader(l) => Ok((hw >= l.epoch_start).then_some(hw)),
            other => Err(NotLeading::of(other)),
        }
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

    /// Becomes leader at `state`'s epoch, its log ending at `leo`: the epoch's first offset is written to the
    /// history durably first. A leader of this epoch already keeps its state but takes a newer revision's ISR and
    /// replicas (a move adds and drops replicas at the same epoch).
    pub fn become_leader(&self, fs: &dyn FileSystem, state: &PartitionState, revision: i64, leo: u64) -> Result<()> {
        let epoch = state.leader_epoch;
        let now = Instant::now();
        let fresh = |leo: u64, leader_leo: u64| Progress {
            leo,
            caught_up: now,
            last_fetch: now,
            leader_leo_then: leader_leo,
            verified: true,
            unverified_seen: false,
        };
        let mut inner = self.inner.lock();
        if let Role::Leader(l) = &mut inner.role
            && l.epoch == epoch
        {
            // etcd's state may be older than an ISR change this leader made since: only a newer one counts.
            if revision > l.revision {
                l.isr = state.isr.clone();
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
        let followers = state.isr.iter().filter(|&&r| r != self.id).map(|&r| (r, fresh(hw, leo))).collect();
        inner.role = Role::Leader(Leading {
            epoch,
            isr: state.isr.clone(),
            replicas: state.replicas.clone(),
            revision,
            epoch_start: leo,
            followers,
            state: state.clone(),
        });
        drop(inner);
        self.advance_hw(leo);
        self.notify();
        Ok(())
    }

    /// Becomes a follower of `leader` (at `address`) at `epoch`.
    pub fn become_follower(&self, leader: u32, epoch: u32, address: String) {
        self.inner.lock().role = Role::Follower { leader, epoch, address };
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

    /// The leader's log grew to `leo` (or its ISR changed): the HW moves to the smallest log end over the ISR.
    pub fn advance_hw(&self, leo: u64) {
        let target = {
            let inner = self.inner.lock();
            let Role::Leader(l) = &inner.role else { return };
            l.isr
                .iter()
                .map(|id| if *id == self.id { leo } else { l.followers.get(id).map_or(0, |p| p.leo) })
                .min()
                .unwrap_or(leo)
        };
        let before = self.hw.fetch_max(target, Ordering::AcqRel);
        self.notify_if(target > before);
    }

    /// The leader appended up to `leo`: the HW may move, and followers waiting for data wake.
    pub fn appended(&self, leo: u64) {
        self.advance_hw(leo);
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether a write ending at `last` made under `epoch` is acknowledged: decided under one lock, so an ISR that
    /// shrank below two (which lets the HW run to the leader's log end) is never taken for an acknowledgement.
    pub fn ack_state(&self, epoch: u32, last: u64) -> AckState {
        let inner = self.inner.lock();
        match &inner.role {
            Role::Leader(l) if l.epoch == epoch => {
                if l.isr.len() < self.min_insync {
                    AckState::Refused(format!("the in-sync set shrank to {:?}", l.isr))
                } else if self.hw() > last {
                    AckState::Acked
                } else {
                    AckState::Waiting
                }
            }
            Role::Leader(l) => AckState::Refused(format!("leader epoch moved from {epoch} to {}", l.epoch)),
            _ => AckState::Refused("this broker lost the partition's leadership".into()),
        }
    }

    fn notify_if(&self, changed: bool) {
        if changed {
            self.notify();
        }
    }

    /// A follower fetched from `offset` at `epoch` while the leader's log ended at `leo`, saying whether it has
    /// verified what it held at its start. `Err` when this replica does not lead at that epoch.
    pub fn follower_fetched(
        &self,
        follower: u32,
        epoch: u32,
        offset: u64,
        leo: u64,
        verified: bool,
    ) -> std::result::Result<(), NotLeading> {
        {
            let mut inner = self.inner.lock();
            let Role::Leader(l) = &mut inner.role else { return Err(NotLeading::of(&inner.role)) };
            if l.epoch != epoch {
                return Err(NotLeading { leader: self.id, epoch: l.epoch, address: String::new() });
            }
            let now = Instant::now();
            let p = l.followers.entry(follower).or_insert(Progress {
                leo: offset,
                caught_up: now,
                last_fetch: now,
                leader_leo_then: leo,
                verified,
                unverified_seen: false,
            });
            p.verified = verified;
            p.unverified_seen |= !verified;
            // Caught up: it holds all the leader has, or all the leader had at its previous fetch (Kafka's rule).
            if offset >= leo {
                p.caught_up = now;
            } else if offset >= p.leader_leo_then {
                p.caught_up = p.last_fetch;
            }
            p.leo = offset;
            p.last_fetch = now;
            p.leader_leo_then = leo;
        }
        self.advance_hw(leo);
        Ok(())
    }

    /// On a follower: the leader's HW, capped at what this replica holds.
    pub fn follow_hw(&self, leader_hw: u64, leo: u64) {
        let target = leader_hw.min(leo);
        let before = self.hw.fetch_max(target, Ordering::AcqRel);
        self.notify_if(target > before);
    }

    /// Sets the HW to `hw` exactly (after a follower's truncation below it).
    pub fn reset_hw(&self, hw: u64) {
        self.hw.store(hw, Ordering::Release);
        self.notify();
    }

    /// ISR members that have not caught up within `lag` before `now` (the leader never is one).
    pub fn lagging(&self, lag: Duration, now: Instant) -> Vec<u32> {
        let inner = self.inner.lock();
        let Role::Leader(l) = &inner.role else { return Vec::new() };
        l.isr
            .iter()
            .filter(|&&id| id != self.id)
            .filter(|id| {
                l.followers
                    .get(id)
                    .is_none_or(|p| p.unverified_seen || now.saturating_duration_since(p.caught_up) > lag)
            })
            .copied()
            .collect()
    }

    /// Followers outside the ISR that hold everything up to the HW and the epoch's start, and fetched within
    /// `lag` before `now`: they may join the ISR.
    pub fn caught_up_outside(&self, lag: Duration, now: Instant) -> Vec<u32> {
        let inner = self.inner.lock();
        let Role::Leader(l) = &inner.role else { return Vec::new() };
        let hw = self.hw();
        l.followers
            .iter()
            .filter(|(id, p)| {
                !l.isr.contains(id)
                    && p.verified
                    && p.leo >= hw
                    && p.leo >= l.epoch_start
                    && now.saturating_duration_since(p.last_fetch) <= lag
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Takes the ISR etcd accepted at `revision`, if this replica still leads at `epoch`. Returns whether it did.
    pub fn set_isr(&self, epoch: u32, isr: Vec<u32>, revision: i64, leo: u64) -> bool {
        {
            let mut inner = self.inner.lock();
            let Role::Leader(l) = &mut inner.role else { return false };
            if l.epoch != epoch {
                return false;
            }
            for id in &isr {
                if let Some(p) = l.followers.get_mut(id).filter(|p| p.verified) {
                    p.unverified_seen = false;
                }
            }
            l.state.isr = isr.clone();
            l.isr = isr;
            l.revision = revision;
        }
        self.advance_hw(leo);
        self.notify();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(dir: &std::path::Path) -> Replica {
        let fs = ferry_storage::fs::os();
        Replica::new(1, LeaderEpochs::load(&*fs, dir).unwrap(), watch::channel(0).0, 2)
    }

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
    fn the_hw_is_the_smallest_end_over_the_isr_and_a_new_leader_reads_from_its_epoch_start() {
        let fs = ferry_storage::fs::os();
        let dir = tempfile::tempdir().unwrap();
        let r = replica(dir.path());
        assert!(r.readable_end(10).is_err());
        r.become_leader(&*fs, &state(3, &[1, 2, 3], &[1, 2, 3]), 7, 10).unwrap();
        assert_eq!(r.epochs(), [EpochEntry { epoch: 3, start: 10 }]);
        // Followers' progress is unknown: the HW stays at 0 and the new leader serves no reads yet.
        assert_eq!((r.hw(), r.readable_end(10)), (0, Ok(None)));
        r.follower_fetched(2, 3, 10, 10, true).unwrap();
        assert_eq!(r.hw(), 0);
        r.follower_fetched(3, 3, 8, 10, true).unwrap();
        assert_eq!((r.hw(), r.readable_end(10)), (8, Ok(None)));
        r.follower_fetched(3, 3, 10, 12, true).unwrap();
        r.advance_hw(12);
        assert_eq!((r.hw(), r.readable_end(12)), (10, Ok(Some(10))));
        // A fetch at another epoch is refused, and names the leader's.
        assert_eq!(
            r.follower_fetched(2, 2, 12, 12, true),
            Err(NotLeading { leader: 1, epoch: 3, address: String::new() })
        );
        // Dropping 3 from the ISR lets the HW pass it.
        r.follower_fetched(2, 3, 12, 12, true).unwrap();
        assert_eq!(r.hw(), 10);
        assert!(r.set_isr(3, vec![1, 2], 8, 12));
        assert_eq!(r.hw(), 12);
        assert!(!r.set_isr(4, vec![1], 9, 12), "an ISR of another epoch is not taken");
        // Stepping down: no reads, and leader-only steps name no leader.
        r.step_down();
        r.become_follower(2, 4, "h:2".into());
        let following = NotLeading { leader: 2, epoch: 4, address: "h:2".into() };
        assert_eq!(r.readable_end(12), Err(following.clone()));
        assert_eq!(r.leading().unwrap_err(), following);
    }

    #[test]
    fn a_new_leader_lets_no_replica_back_into_the_isr_before_it_fetched() {
        let fs = ferry_storage::fs::os();
        let dir = tempfile::tempdir().unwrap();
        let r = replica(dir.path());
        // Elected with 3 out of sync (dead, say), its log and HW both at 100: 3 has not fetched, so it stays out.
        r.reset_hw(100);
        r.become_leader(&*fs, &state(5, &[1, 2], &[1, 2, 3]), 9, 100).unwrap();
        let (now, lag) = (Instant::now(), Duration::from_secs(5));
        assert_eq!(r.caught_up_outside(lag, now), Vec::<u32>::new());
        assert_eq!(r.lagging(lag, now), Vec::<u32>::new(), "2 was in sync: it gets the usual grace");
        // Once it fetched up to the leader's end, it may come back.
        r.follower_fetched(3, 5, 100, 100, true).unwrap();
        assert_eq!(r.caught_up_outside(lag, now), vec![3]);
    }

    #[test]
    fn lagging_and_caught_up_followers_are_found_by_their_fetches() {
        let fs = ferry_storage::fs::os();
        let dir = tempfile::tempdir().unwrap();
        let r = replica(dir.path());
        r.become_leader(&*fs, &state(1, &[1, 2], &[1, 2, 3]), 1, 0).unwrap();
        r.follower_fetched(2, 1, 0, 0, true).unwrap();
        r.follower_fetched(3, 1, 0, 0, true).unwrap();
        let now = Instant::now();
        let lag = Duration::from_secs(5);
        assert_eq!(r.lagging(lag, now), Vec::<u32>::new());
        assert_eq!(r.lagging(lag, now + 2 * lag), vec![2]);
        assert_eq!(r.caught_up_outside(lag, now), vec![3]);
        assert_eq!(r.caught_up_outside(lag, now + 2 * lag), Vec::<u32>::new());

        // An unverified fetch (a restarted follower still CRC-checking its log) takes an ISR member out at once,
        // and keeps it out until it fetches verified; joining the ISR again clears the mark.
        r.follower_fetched(2, 1, 0, 0, false).unwrap();
        let now = Instant::now();
        assert_eq!(r.lagging(lag, now), vec![2]);
        assert!(r.set_isr(1, vec![1], 2, 0));
        assert_eq!(r.caught_up_outside(lag, now), vec![3]);
        r.follower_fetched(2, 1, 0, 0, true).unwrap();
        assert_eq!(r.caught_up_outside(lag, now), vec![2, 3]);
        assert!(r.set_isr(1, vec![1, 2], 3, 0));
        assert_eq!(r.lagging(lag, now), Vec::<u32>::new());
    }
}
