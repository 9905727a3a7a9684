//! When a member may act as a leader: self-fencing by lease, and the failsafe through a whole-etcd outage.
//!
//! - **Lease.** A member acts as leader (acknowledges, serves reads, answers as leader in Metadata, coordinates
//!   groups) only until its etcd lease could have run out: the *send* time of its last successful renewal plus the
//!   TTL, less a tenth for clock-rate drift, all on the monotonic clock. etcd cannot expire the lease before that,
//!   so a member cut off from etcd stops before anyone else may be elected in its place (Patroni's rule).
//! - **Failsafe** (Patroni's `failsafe_mode`). While its lease is lapsing, a leader keeps its role for a partition
//!   only while *every* replica of that partition confirmed over the peer links, within the grant interval, that it
//!   knows no newer leader epoch. A replica confirms only when it cannot reach etcd itself (a replica that reaches
//!   etcd knows the catalog decides, and the catalog will elect another leader once the lease runs out), and
//!   promises not to start leading a newer epoch until its promise ends, which is after the grant it gave. So
//!   through a whole-etcd outage the partitions keep serving; a partition one of whose replicas is unreachable, or
//!   reaches etcd, stops. The price is availability, never two histories.

use std::time::{Duration, Instant};

/// Whether a member may act as a partition's leader now, and on what ground.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// Its etcd lease is valid.
    Lease,
    /// Its lease lapsed, but every replica confirmed it within the grant interval.
    Failsafe,
    /// Neither: why.
    Fenced(String),
}

impl Authority {
    /// Whether the member may act.
    pub fn holds(&self) -> bool {
        !matches!(self, Authority::Fenced(_))
    }
}

/// The part of the TTL kept back for clock-rate drift between this member and etcd.
pub fn drift_margin(ttl: Duration) -> Duration {
    ttl / 10
}

/// Until when a lease renewed by a request sent at `sent` is certainly valid.
pub fn lease_until(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl - drift_margin(ttl)
}

/// How long a failsafe grant (and the promise a replica gives with its confirmation) lasts.
pub fn grant_length(ttl: Duration) -> Duration {
    ttl / 2
}

/// A member's authority at `now`, its lease valid until `lease_until` (`None`: it never held one) and its
/// failsafe grant for the partition until `failsafe_until`.
pub fn authority(now: Instant, lease_until: Option<Instant>, failsafe_until: Option<Instant>) -> Authority {
    if lease_until.is_some_and(|t| now < t) {
        return Authority::Lease;
    }
    if failsafe_until.is_some_and(|t| now < t) {
        return Authority::Failsafe;
    }
    Authority::Fenced(match lease_until {
        None => "this member holds no etcd lease".to_owned(),
        Some(_) => "its etcd lease could have expired and no failsafe confirmation covers it".to_owned(),
    })
}

/// Whether a leader should ask its replicas for failsafe confirmations: its lease has less than half a TTL left
/// (a healthy member renews every third of it, so it never gets there).
pub fn should_ask(now: Instant, lease_until: Option<Instant>, ttl: Duration) -> bool {
    lease_until.is_none_or(|t| now + ttl / 2 >= t)
}

/// A leader's question to a replica: "I lead at this epoch; do you know a newer one?"
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The asking leader.
    pub leader: u32,
    /// Its leader epoch.
    pub epoch: u32,
}

/// What the asked replica knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knows {
    /// The newest leader epoch it knows for the partition (from etcd or a leader), 0 when none.
    pub epoch: u32,
    /// The leader of that epoch, 0 when none.
    pub leader: u32,
    /// Whether it read etcd within the last few beats.
    pub etcd_fresh: bool,
    /// Whether an election of a new leader is being prepared on it (an operator's unclean election).
    pub frozen: bool,
}

/// A replica's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It knows no newer epoch and cannot reach etcd: it promises not to lead a newer epoch for the grant length.
    Confirm,
    /// It will not confirm: why.
    Refuse(String),
}

/// The replica's answer to `ask`, knowing `knows`.
pub fn answer(ask: Ask, knows: Knows) -> Answer {
    if knows.epoch > ask.epoch {
        return Answer::Refuse(format!("leader epoch {} (broker {}) is newer", knows.epoch, knows.leader));
    }
    if knows.epoch == ask.epoch && knows.leader != 0 && knows.leader != ask.leader {
        return Answer::Refuse(format!("broker {} leads epoch {}", knows.leader, knows.epoch));
    }
    if knows.frozen {
        return Answer::Refuse("an election of a new leader is being prepared here".into());
    }
    if knows.etcd_fresh {
        return Answer::Refuse("this replica reaches etcd: the catalog decides who leads".into());
    }
    Answer::Confirm
}

/// The grant a leader holds after asking at `sent`: every replica of `replicas` but itself confirmed.
pub fn grant(replicas: &[u32], me: u32, confirmed: &[u32], sent: Instant, ttl: Duration) -> Option<Instant> {
    let all = replicas.iter().filter(|r| **r != me).all(|r| confirmed.contains(r));
    all.then(|| sent + grant_length(ttl))
}

/// Whether a replica that promised a leader of an older epoch `promised_until` may start leading now.
pub fn may_begin(now: Instant, promised_until: Option<Instant>) -> bool {
    promised_until.is_none_or(|t| now >= t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn the_lease_rule() {
        let t0 = Instant::now();
        let until = lease_until(t0, TTL);
        assert_eq!(until, t0 + Duration::from_secs(9), "the TTL from the send time, less a tenth");
        let s = Duration::from_secs;
        type Case = (&'static str, Instant, Option<Instant>, Option<Instant>, bool);
        let cases: [Case; 6] = [
            ("within the lease", t0 + s(8), Some(until), None, true),
            ("case 3: cut off from etcd, past the lease", t0 + s(9), Some(until), None, false),
            ("never held one", t0, None, None, false),
            ("past the lease, within a failsafe grant", t0 + s(10), Some(until), Some(t0 + s(11)), true),
            ("past both", t0 + s(12), Some(until), Some(t0 + s(11)), false),
            ("a grant without a lease counts", t0, None, Some(t0 + s(1)), true),
        ];
        for (name, now, lease, failsafe, holds) in cases {
            assert_eq!(authority(now, lease, failsafe).holds(), holds, "{name}");
        }
        assert_eq!(authority(t0 + s(10), Some(until), Some(t0 + s(11))), Authority::Failsafe);
        // A healthy member (renewed a third of a TTL ago) never asks; one whose renewals fail asks in time.
        assert!(!should_ask(t0 + s(3), Some(until), TTL));
        assert!(should_ask(t0 + s(4), Some(until), TTL));
        assert!(should_ask(t0, None, TTL));
    }

    #[test]
    fn the_failsafe_answer_rule() {
        let ask = Ask { leader: 1, epoch: 5 };
        let knows = |epoch, leader, etcd_fresh, frozen| Knows { epoch, leader, etcd_fresh, frozen };
        let cases = [
            ("a whole-etcd outage: confirmed", knows(5, 1, false, false), Answer::Confirm),
            ("a replica behind the leader confirms", knows(4, 2, false, false), Answer::Confirm),
            (
                "case 2: a newer epoch was elected",
                knows(6, 3, false, false),
                Answer::Refuse("leader epoch 6 (broker 3) is newer".into()),
            ),
            (
                "another leader of the same epoch",
                knows(5, 2, false, false),
                Answer::Refuse("broker 2 leads epoch 5".into()),
            ),
            (
                "case 3: the replica reaches etcd, the leader is cut off alone",
                knows(5, 1, true, false),
                Answer::Refuse("this replica reaches etcd: the catalog decides who leads".into()),
            ),
            (
                "an unclean election is being prepared here",
                knows(5, 1, false, true),
                Answer::Refuse("an election of a new leader is being prepared here".into()),
            ),
        ];
        for (name, k, want) in cases {
            assert_eq!(answer(ask, k), want, "{name}");
        }
    }

    #[test]
    fn the_failsafe_grant_and_promise_rule() {
        let t0 = Instant::now();
        let half = grant_length(TTL);
        assert_eq!(grant(&[1, 2, 3], 1, &[2, 3], t0, TTL), Some(t0 + half), "every other replica confirmed");
        assert_eq!(grant(&[1, 2, 3], 1, &[2], t0, TTL), None, "one replica is unreachable: no grant");
        assert_eq!(grant(&[1, 2], 1, &[2, 3], t0, TTL), Some(t0 + half));
        // The promise is dated from the answer, after the ask: the grant ends first, and the promising replica may
        // lead a newer epoch only after its promise.
        let answered = t0 + Duration::from_millis(30);
        let promised = answered + half;
        assert!(promised > t0 + half);
        assert!(!may_begin(t0 + half, Some(promised)));
        assert!(may_begin(promised, Some(promised)));
        assert!(may_begin(t0, None));
    }
}
