//! The high watermark, the readable end and the acknowledgement of a write.
//!
//! - **The high watermark** is the smallest log end over the in-sync set the leader counts (its *maximal* ISR: the
//!   set etcd accepted plus the followers it has proposed to add, Kafka's rule), and never passes what at least
//!   `min_insync` replicas hold: the `min_insync`-th largest log end the leader knows, its own included. So a
//!   leader whose in-sync set shrank to itself does not make readable what only it holds (case 8 of the cluster
//!   analysis), and a follower being added counts from the moment it is proposed (case 6).
//! - **The readable end** is the high watermark, capped at the log end, on a leader that may act as one (see
//!   [`super::fencing`]) and whose high watermark has reached its epoch's first offset (the old leader's high
//!   watermark was no further, so a reader never sees the end move back).
//! - **An acknowledgement** needs the same leader epoch the write was made under, a committed in-sync set of at
//!   least `min_insync`, the leader's authority, and a high watermark past the write's last offset.

use std::collections::BTreeMap;

use super::fencing::Authority;

/// What the leader knows when it computes its high watermark.
#[derive(Debug, Clone, Copy)]
pub struct HwInput<'a> {
    /// The leader's broker id.
    pub me: u32,
    /// The leader's log end offset.
    pub leo: u64,
    /// The in-sync set it counts: etcd's, plus the followers it proposed to add.
    pub isr: &'a [u32],
    /// Each follower's log end, as its fetches said (replicas of the partition only).
    pub followers: &'a BTreeMap<u32, u64>,
    /// The fewest replicas an acknowledged (and readable) record must be on.
    pub min_insync: usize,
}

/// The high watermark `input` allows (the caller keeps the largest it has seen: it never moves back).
pub fn high_watermark(input: &HwInput<'_>) -> u64 {
    let end_of = |id: &u32| if *id == input.me { input.leo } else { input.followers.get(id).copied().unwrap_or(0) };
    let over_isr = input.isr.iter().map(end_of).min().unwrap_or(input.leo);
    let mut ends: Vec<u64> = std::iter::once(input.leo)
        .chain(input.followers.iter().filter(|(id, _)| **id != input.me).map(|(_, leo)| *leo))
        .collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    let held_by_enough = ends.get(input.min_insync.max(1) - 1).copied().unwrap_or(0);
    over_isr.min(held_by_enough)
}

/// How far a leader may serve reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadEnd {
    /// Up to this offset (exclusive).
    Serve(u64),
    /// Nothing past this offset yet: the high watermark has not reached the epoch's first offset.
    Behind(u64),
    /// Not at all: the leader is fenced.
    Fenced(String),
}

/// The readable end of a leader with high watermark `hw`, log end `leo`, whose epoch started at `epoch_start`.
pub fn readable_end(hw: u64, leo: u64, epoch_start: u64, authority: &Authority) -> ReadEnd {
    if let Authority::Fenced(why) = authority {
        return ReadEnd::Fenced(why.clone());
    }
    let hw = hw.min(leo);
    if hw >= epoch_start { ReadEnd::Serve(hw) } else { ReadEnd::Behind(hw) }
}

/// Where a write stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// Every in-sync replica (`min_insync` at least) holds it.
    Acked,
    /// Not yet.
    Waiting,
    /// It never will be by this leader: why.
    Refused(String),
}

/// What an acknowledgement is decided on.
#[derive(Debug, Clone, Copy)]
pub struct AckInput<'a> {
    /// The leader epoch the write was made under.
    pub write_epoch: u32,
    /// Its last offset.
    pub last: u64,
    /// The epoch this replica leads at now (`None`: it does not lead).
    pub leading: Option<u32>,
    /// The in-sync set etcd accepted.
    pub committed_isr: &'a [u32],
    /// The fewest replicas an acknowledged record must be on.
    pub min_insync: usize,
    /// The high watermark.
    pub hw: u64,
    /// Whether the leader may act as one.
    pub authority: &'a Authority,
}

/// Whether a write is acknowledged.
pub fn ack(input: &AckInput<'_>) -> Ack {
    match input.leading {
        None => return Ack::Refused("this broker lost the partition's leadership".into()),
        Some(e) if e != input.write_epoch => {
            return Ack::Refused(format!("leader epoch moved from {} to {e}", input.write_epoch));
        }
        Some(_) => {}
    }
    if let Authority::Fenced(why) = input.authority {
        return Ack::Refused(format!("the leader fenced itself: {why}"));
    }
    if input.committed_isr.len() < input.min_insync {
        return Ack::Refused(format!("the in-sync set shrank to {:?}", input.committed_isr));
    }
    if input.hw > input.last { Ack::Acked } else { Ack::Waiting }
}

/// Whether a leader may take a new write: it must be able to acknowledge it (authority, and a committed in-sync
/// set of at least `min_insync`). `Err` says why not.
pub fn may_write(committed_isr: &[u32], min_insync: usize, authority: &Authority) -> Result<(), String> {
    if let Authority::Fenced(why) = authority {
        return Err(format!("the leader fenced itself: {why}"));
    }
    if committed_isr.len() < min_insync {
        return Err(format!("the in-sync set {committed_isr:?} is smaller than {min_insync}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(pairs: &[(u32, u64)]) -> BTreeMap<u32, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn the_high_watermark_rule() {
        struct Case {
            name: &'static str,
            leo: u64,
            isr: &'static [u32],
            followers: &'static [(u32, u64)],
            min_insync: usize,
            want: u64,
        }
        let cases = [
            Case {
                name: "the smallest end over the in-sync set",
                leo: 100,
                isr: &[1, 2, 3],
                followers: &[(2, 90), (3, 80)],
                min_insync: 2,
                want: 80,
            },
            Case {
                name: "a follower out of the set does not hold it back",
                leo: 100,
                isr: &[1, 2],
                followers: &[(2, 90), (3, 10)],
                min_insync: 2,
                want: 90,
            },
            Case {
                name: "case 8: the set shrank to the leader; readable only what a second replica holds",
                leo: 100,
                isr: &[1],
                followers: &[(2, 60), (3, 40)],
                min_insync: 2,
                want: 60,
            },
            Case {
                name: "case 8: the leader alone, no follower ever fetched: nothing is readable",
                leo: 100,
                isr: &[1],
                followers: &[],
                min_insync: 2,
                want: 0,
            },
            Case {
                name: "the risk phase (min_insync 1): the leader's own end",
                leo: 100,
                isr: &[1],
                followers: &[(2, 10)],
                min_insync: 1,
                want: 100,
            },
            Case {
                name: "case 6: a follower proposed for the set counts at once (maximal ISR)",
                leo: 100,
                isr: &[1, 2, 3],
                followers: &[(2, 100), (3, 70)],
                min_insync: 2,
                want: 70,
            },
            Case {
                name: "an in-sync follower that never fetched holds it at 0",
                leo: 100,
                isr: &[1, 2],
                followers: &[],
                min_insync: 2,
                want: 0,
            },
        ];
        for c in cases {
            let followers = ends(c.followers);
            let input = HwInput { me: 1, leo: c.leo, isr: c.isr, followers: &followers, min_insync: c.min_insync };
            assert_eq!(high_watermark(&input), c.want, "{}", c.name);
        }
    }

    #[test]
    fn the_readable_end_rule() {
        let fenced = Authority::Fenced("lease lapsed".into());
        let cases = [
            ("serves up to the high watermark", 80, 100, 50, Authority::Lease, ReadEnd::Serve(80)),
            ("never past the log end", 120, 100, 50, Authority::Lease, ReadEnd::Serve(100)),
            (
                "a new leader behind its epoch's start serves nothing new",
                40,
                100,
                50,
                Authority::Lease,
                ReadEnd::Behind(40),
            ),
            ("under the failsafe it serves", 80, 100, 50, Authority::Failsafe, ReadEnd::Serve(80)),
            ("case 3: a fenced leader serves nothing", 80, 100, 50, fenced, ReadEnd::Fenced("lease lapsed".into())),
        ];
        for (name, hw, leo, start, authority, want) in cases {
            assert_eq!(readable_end(hw, leo, start, &authority), want, "{name}");
        }
    }

    #[test]
    fn the_acknowledgement_rule() {
        let fenced = Authority::Fenced("lease lapsed".into());
        let isr3: &[u32] = &[1, 2, 3];
        let isr1: &[u32] = &[1];
        type Case<'a> = (&'a str, Option<u32>, &'a [u32], u64, &'a Authority, Ack);
        let cases: [Case<'_>; 6] = [
            ("past the high watermark", Some(4), isr3, 11, &Authority::Lease, Ack::Acked),
            ("not yet", Some(4), isr3, 10, &Authority::Lease, Ack::Waiting),
            (
                "epoch moved",
                Some(5),
                isr3,
                11,
                &Authority::Lease,
                Ack::Refused("leader epoch moved from 4 to 5".into()),
            ),
            (
                "not leading",
                None,
                isr3,
                11,
                &Authority::Lease,
                Ack::Refused("this broker lost the partition's leadership".into()),
            ),
            (
                "case 2: a fenced leader acknowledges nothing",
                Some(4),
                isr3,
                11,
                &fenced,
                Ack::Refused("the leader fenced itself: lease lapsed".into()),
            ),
            (
                "a set below two",
                Some(4),
                isr1,
                11,
                &Authority::Lease,
                Ack::Refused("the in-sync set shrank to [1]".into()),
            ),
        ];
        for (name, leading, isr, hw, authority, want) in cases {
            let input =
                AckInput { write_epoch: 4, last: 10, leading, committed_isr: isr, min_insync: 2, hw, authority };
            assert_eq!(ack(&input), want, "{name}");
        }
        assert!(may_write(isr3, 2, &Authority::Failsafe).is_ok());
        assert!(may_write(isr1, 2, &Authority::Lease).unwrap_err().contains("smaller than 2"));
        assert!(may_write(isr3, 2, &fenced).unwrap_err().contains("fenced"));
    }
}
