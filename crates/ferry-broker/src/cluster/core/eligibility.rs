//! Who may be elected: a replica that restarts after an unclean shutdown (no clean-shutdown marker, a recovery that
//! cut anything, or a log that is missing, as after a disk replacement) may have lost records it had acknowledged.
//! Before it fetches or registers, it takes itself out of the ISR in etcd (Kafka's KIP-966), so it can be elected
//! only after it caught up from a leader and re-entered the ISR.
//!
//! When it is the ISR's last member it cannot leave it (someone must be able to lead): it keeps its place, and the
//! partition moves to a new leader epoch, with it as the leader, so that the replicas that come back truncate to its
//! history by epoch (KIP-101) and no two replicas ever hold two histories under one epoch (case 12).

use crate::node::replica::PartitionState;

/// How a replica's log came back when its broker started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// A clean shutdown, and recovery cut nothing.
    Clean,
    /// No clean-shutdown marker, a cut, or no log at all.
    Unclean,
}

/// The partition's state after broker `me` restarted as `how`, when it must change.
pub fn on_restart(state: &PartitionState, me: u32, how: Restart) -> Option<PartitionState> {
    if how == Restart::Clean || !state.isr.contains(&me) {
        return None;
    }
    let mut next = state.clone();
    if state.isr.len() > 1 {
        next.isr.retain(|r| *r != me);
        if state.leader == me {
            // The controller elects among the others, at a new epoch.
            next.leader = 0;
            next.leader_epoch += 1;
        }
    } else {
        // The last in-sync replica: it leads on, at a new epoch that tells its history apart.
        next.leader = me;
        next.leader_epoch += 1;
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(leader: u32, epoch: u32, isr: &[u32]) -> PartitionState {
        PartitionState {
            replicas: vec![1, 2, 3],
            leader,
            leader_epoch: epoch,
            isr: isr.to_vec(),
            target: None,
            unclean_epoch: None,
        }
    }

    #[test]
    fn the_restart_rule() {
        let cases = [
            ("a clean restart changes nothing", state(1, 4, &[1, 2, 3]), 2, Restart::Clean, None),
            ("a replica out of the ISR changes nothing", state(1, 4, &[1, 3]), 2, Restart::Unclean, None),
            (
                "case 1: a follower back from a power loss leaves the ISR",
                state(1, 4, &[1, 2, 3]),
                2,
                Restart::Unclean,
                Some(state(1, 4, &[1, 3])),
            ),
            (
                "a leader back from a crash leaves it too, and the controller elects another at a new epoch",
                state(1, 4, &[1, 2, 3]),
                1,
                Restart::Unclean,
                Some(state(0, 5, &[2, 3])),
            ),
            (
                "case 12: the last in-sync replica leads at a new epoch",
                state(0, 4, &[3]),
                3,
                Restart::Unclean,
                Some(state(3, 5, &[3])),
            ),
        ];
        for (name, s, me, how, want) in cases {
            assert_eq!(on_restart(&s, me, how), want, "{name}");
        }
    }
}
