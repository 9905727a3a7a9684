//! The in-sync set (ISR): who is caught up, who leaves, who comes back.
//!
//! - A follower's fetch at offset `o` says it holds everything below `o`. It is *caught up* when it holds all the
//!   leader has, or all the leader had at its previous fetch (Kafka's last-caught-up time).
//! - An ISR member that has not caught up within `replica_lag_max`, that never fetched since this leader took over,
//!   or that said it has not CRC-checked its log since it restarted, leaves. Only replicas of the partition count.
//! - A follower outside the ISR comes back once it holds everything up to the high watermark and the epoch's first
//!   offset, has verified its log, and fetched within `replica_lag_max`.
//! - Changes go through etcd (a compare-and-swap at the leader's epoch). A shrink counts only once etcd accepted
//!   it; an expansion counts for the high watermark from the moment it is proposed (Kafka's *maximal ISR*), so
//!   nothing is acknowledged without a member etcd may already call in sync (case 6).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use crate::node::replica::Progress;

/// The follower's state after a fetch from `offset` while the leader's log ends at `leo`, at `now`.
pub fn on_fetch(prev: Option<Progress>, offset: u64, leo: u64, verified: bool, now: Instant) -> Progress {
    let mut f = prev.unwrap_or(Progress {
        leo: offset,
        caught_up: now,
        last_fetch: now,
        leader_leo_then: leo,
        verified,
        unverified_seen: false,
    });
    f.verified = verified;
    f.unverified_seen |= !verified;
    if offset >= leo {
        f.caught_up = now;
    } else if offset >= f.leader_leo_then {
        f.caught_up = f.last_fetch;
    }
    f.leo = offset;
    f.last_fetch = now;
    f.leader_leo_then = leo;
    f
}

/// What an ISR decision is taken on.
#[derive(Debug, Clone, Copy)]
pub struct IsrInput<'a> {
    /// The leader's broker id.
    pub me: u32,
    /// The ISR etcd accepted.
    pub isr: &'a [u32],
    /// The partition's replicas.
    pub replicas: &'a [u32],
    /// What the leader knows of each follower that fetched since it took over.
    pub followers: &'a BTreeMap<u32, Progress>,
    /// The high watermark.
    pub hw: u64,
    /// The first offset of the leader's epoch.
    pub epoch_start: u64,
    /// `cluster.replica_lag_max`.
    pub lag: Duration,
    /// Now.
    pub now: Instant,
}

/// An ISR change to propose to etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The new ISR, in replica order.
    pub isr: Vec<u32>,
    /// Who leaves.
    pub removed: Vec<u32>,
    /// Who comes back.
    pub added: Vec<u32>,
}

/// The ISR change `input` calls for, if any.
pub fn change(input: &IsrInput<'_>) -> Option<Proposal> {
    let removed: Vec<u32> = input
        .isr
        .iter()
        .copied()
        .filter(|id| *id != input.me)
        .filter(|id| {
            input
                .followers
                .get(id)
                .is_none_or(|f| f.unverified_seen || input.now.saturating_duration_since(f.caught_up) > input.lag)
        })
        .collect();
    let added: Vec<u32> = input
        .followers
        .iter()
        .filter(|(id, f)| {
            **id != input.me
                && input.replicas.contains(id)
                && !input.isr.contains(id)
                && f.verified
                && f.leo >= input.hw
                && f.leo >= input.epoch_start
                && input.now.saturating_duration_since(f.last_fetch) <= input.lag
        })
        .map(|(id, _)| *id)
        .collect();
    if removed.is_empty() && added.is_empty() {
        return None;
    }
    let isr = input
        .replicas
        .iter()
        .copied()
        .filter(|r| (input.isr.contains(r) && !removed.contains(r)) || added.contains(r))
        .collect();
    Some(Proposal { isr, removed, added })
}

/// The ISR the high watermark counts while the followers `proposed` are being added: the accepted one plus them
/// (members being removed still count until etcd accepted their removal).
pub fn counted(accepted: &[u32], proposed: &[u32]) -> Vec<u32> {
    let mut isr = accepted.to_vec();
    isr.extend(proposed.iter().filter(|id| !accepted.contains(id)));
    isr
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: Duration = Duration::from_secs(5);

    fn follower(leo: u64, at: Instant, verified: bool) -> Progress {
        Progress { leo, caught_up: at, last_fetch: at, leader_leo_then: leo, verified, unverified_seen: !verified }
    }

    #[test]
    fn the_caught_up_rule_follows_kafka() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        let f = on_fetch(None, 10, 10, true, t0);
        assert_eq!((f.caught_up, f.leo), (t0, 10));
        // Behind the leader's end now, but past its end at the previous fetch: caught up as of that fetch.
        let f = on_fetch(Some(f), 10, 20, true, t1);
        assert_eq!(f.caught_up, t0);
        let f = on_fetch(Some(f), 20, 30, true, t2);
        assert_eq!(f.caught_up, t1);
        // An unverified fetch is remembered.
        assert!(on_fetch(Some(f), 30, 30, false, t2).unverified_seen);
    }

    #[test]
    fn the_isr_change_rule() {
        let t0 = Instant::now();
        let later = t0 + 2 * LAG;
        struct Case {
            name: &'static str,
            isr: &'static [u32],
            followers: Vec<(u32, Progress)>,
            hw: u64,
            epoch_start: u64,
            now: Instant,
            want: Option<(Vec<u32>, Vec<u32>, Vec<u32>)>,
        }
        let cases = [
            Case {
                name: "everyone caught up: no change",
                isr: &[1, 2, 3],
                followers: vec![(2, follower(10, t0, true)), (3, follower(10, t0, true))],
                hw: 10,
                epoch_start: 0,
                now: t0,
                want: None,
            },
            Case {
                name: "a follower silent past the lag leaves",
                isr: &[1, 2, 3],
                followers: vec![(2, follower(10, later, true)), (3, follower(10, t0, true))],
                hw: 10,
                epoch_start: 0,
                now: later,
                want: Some((vec![1, 2], vec![3], vec![])),
            },
            Case {
                name: "an in-sync follower that never fetched from this leader leaves",
                isr: &[1, 2, 3],
                followers: vec![(2, follower(10, t0, true))],
                hw: 10,
                epoch_start: 0,
                now: t0,
                want: Some((vec![1, 2], vec![3], vec![])),
            },
            Case {
                name: "an unverified follower leaves at once",
                isr: &[1, 2, 3],
                followers: vec![(2, follower(10, t0, true)), (3, follower(10, t0, false))],
                hw: 10,
                epoch_start: 0,
                now: t0,
                want: Some((vec![1, 2], vec![3], vec![])),
            },
            Case {
                name: "a caught-up, verified follower comes back",
                isr: &[1, 2],
                followers: vec![(2, follower(10, t0, true)), (3, follower(10, t0, true))],
                hw: 10,
                epoch_start: 0,
                now: t0,
                want: Some((vec![1, 2, 3], vec![], vec![3])),
            },
            Case {
                name: "but not before it reached the epoch's start",
                isr: &[1, 2],
                followers: vec![(2, follower(12, t0, true)), (3, follower(10, t0, true))],
                hw: 10,
                epoch_start: 12,
                now: t0,
                want: None,
            },
            Case {
                name: "nor unverified",
                isr: &[1, 2],
                followers: vec![(2, follower(10, t0, true)), (3, follower(10, t0, false))],
                hw: 10,
                epoch_start: 0,
                now: t0,
                want: None,
            },
            Case {
                name: "case 10: a fetch claiming a broker that holds no replica is never let in",
                isr: &[1, 2],
                followers: vec![(2, follower(10, t0, true)), (9, follower(10, t0, true))],
                hw: 10,
                epoch_start: 0,
                now: t0,
                want: None,
            },
        ];
        for c in cases {
            let followers: BTreeMap<u32, Progress> = c.followers.into_iter().collect();
            let input = IsrInput {
                me: 1,
                isr: c.isr,
                replicas: &[1, 2, 3],
                followers: &followers,
                hw: c.hw,
                epoch_start: c.epoch_start,
                lag: LAG,
                now: c.now,
            };
            let got = change(&input).map(|p| (p.isr, p.removed, p.added));
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn case_6_a_proposed_member_counts_at_once_and_a_removed_one_until_etcd_accepted() {
        assert_eq!(counted(&[1, 2], &[3]), vec![1, 2, 3]);
        // A shrink being proposed: its member still counts, as it is still in the accepted set.
        assert_eq!(counted(&[1, 2, 3], &[]), vec![1, 2, 3]);
        assert_eq!(counted(&[1, 2], &[2]), vec![1, 2]);
    }
}
