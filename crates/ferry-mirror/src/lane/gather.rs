//! The lanes' resume reads, gathered into few calls.
//!
//! A lane that resumes reads three facts of its partition, in this order: where the target stands, the source
//! group's committed offset, and the source's log start and end. Ten thousand lanes starting together made that
//! thirty thousand calls, and the fetch session reconciled its subscriptions as each lane's seat trickled in. Here
//! one task takes every resume read queued (after a short gathering window) and answers them all with one target
//! read per topic, one committed-offsets call and one ListOffsets per source leader, in that order.
//!
//! Invariant: a lane's reads keep their order. What a batched call leaves out (a Kafka source has no cheap call for
//! many partitions' offsets; a topic or a leader that did not answer; a failed call) is read by the lane alone, as
//! before, and so is everything after it: the answers a lane gets are always a prefix of the three.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_client::proto as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Probed, TargetCluster, TargetPartition};
use crate::egress::EgressHandle;
use crate::tp::{SourceTp, TargetTp};

/// Most resume reads answered by one round of batched calls.
const MAX_ASKS: usize = 20_000;
/// How long the task waits after the first read of a round for the lanes started with it.
const WINDOW: Duration = Duration::from_millis(5);
/// Bound of one round: past it, every lane of the round reads alone.
const ROUND_TIMEOUT: Duration = Duration::from_secs(30);

/// What the batched calls answered for one partition: a prefix of the three reads (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gathered {
    /// Where the target stands.
    pub target: Option<TargetPartition>,
    /// The source group's committed offset (`Some(None)`: nothing committed).
    pub committed: Option<Option<u64>>,
    /// The source's (log start, log end).
    pub offsets: Option<(u64, u64)>,
}

struct Ask {
    source: SourceTp,
    target: TargetTp,
    reply: oneshot::Sender<Gathered>,
}

/// Where lanes ask for their resume reads.
#[derive(Debug, Clone)]
pub struct Gather {
    tx: mpsc::UnboundedSender<Ask>,
}

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ask({})", self.source)
    }
}

impl Gather {
    /// The handle lanes ask through, and the task that answers them (run it with [`GatherTask::run`]).
    pub fn new(target: Arc<dyn TargetCluster>, egress: EgressHandle, group: String) -> (Gather, GatherTask) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Gather { tx }, GatherTask { rx, target, egress, group })
    }

    /// The batched resume reads of `source` (mirrored into `target`); nothing when the task is gone.
    pub async fn resume(&self, source: &SourceTp, target: &TargetTp) -> Gathered {
        let (reply, answer) = oneshot::channel();
        let ask = Ask { source: source.clone(), target: target.clone(), reply };
        if self.tx.send(ask).is_err() {
            return Gathered::default();
        }
        answer.await.unwrap_or_default()
    }
}

/// The task answering [`Gather::resume`].
pub struct GatherTask {
    rx: mpsc::UnboundedReceiver<Ask>,
    target: Arc<dyn TargetCluster>,
    egress: EgressHandle,
    group: String,
}

impl GatherTask {
    /// Answers rounds of resume reads until `stop`; reads still queued then are answered with nothing (their lanes
    /// read alone).
    pub async fn run(mut self, stop: CancellationToken) {
        let mut asks = Vec::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                n = self.rx.recv_many(&mut asks, MAX_ASKS) => if n == 0 { return },
            }
            // Lanes started together ask within moments of each other: take the rest of them into this round.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WINDOW) => {}
            }
            while asks.len() < MAX_ASKS
                && let Ok(ask) = self.rx.try_recv()
            {
                asks.push(ask);
            }
            let round = std::mem::take(&mut asks);
            let keys: Vec<(SourceTp, TargetTp)> = round.iter().map(|a| (a.source.clone(), a.target.clone())).collect();
            let answers = tokio::select! {
                _ = stop.cancelled() => return,
                r = tokio::time::timeout(ROUND_TIMEOUT, self.read(&keys)) => r.unwrap_or_default(),
            };
            let mut answers = answers.into_iter();
            for ask in round {
                let _ = ask.reply.send(answers.next().unwrap_or_default());
            }
        }
    }

    /// The three batched reads for `keys`, in order, and their answers by partition.
    async fn read(&self, keys: &[(SourceTp, TargetTp)]) -> Vec<Gathered> {
        let targets: Vec<TargetTp> = keys.iter().map(|(_, t)| t.clone()).collect();
        let sources: Vec<SourceTp> = keys.iter().map(|(s, _)| s.clone()).collect();
        let on_target = self.target.partitions_many(&targets).await.ok();
        let source = Arc::clone(&self.egress.active().cluster);
        let committed = match on_target {
            Some(_) => source.committed(&self.group, &sources).await.ok(),
            None => None,
        };
        let offsets = match committed {
            Some(_) => source.log_offsets_many(&sources, ROUND_TIMEOUT).await.ok(),
            None => None,
        };
        sort_answers(keys, on_target, committed, offsets)
    }
}

/// Each partition's share of the batched answers (`None`: that call failed), cut to a prefix of the three reads.
fn sort_answers(
    keys: &[(SourceTp, TargetTp)],
    on_target: Option<Vec<(TargetTp, TargetPartition)>>,
    committed: Option<Vec<pb::CommittedOffset>>,
    offsets: Option<Vec<Probed>>,
) -> Vec<Gathered> {
    let on_target: HashMap<TargetTp, TargetPartition> = on_target.unwrap_or_default().into_iter().collect();
    let committed: Option<HashMap<(&str, u32), u64>> =
        committed.as_ref().map(|c| c.iter().map(|o| ((o.topic.as_str(), o.partition), o.offset)).collect());
    let offsets: HashMap<SourceTp, (u64, u64)> =
        offsets.unwrap_or_default().into_iter().map(|p| (p.tp, (p.log_start, p.log_end))).collect();
    keys.iter()
        .map(|(source, target)| {
            let mut g = Gathered { target: on_target.get(target).copied(), ..Gathered::default() };
            if g.target.is_none() {
                return g;
            }
            let Some(committed) = &committed else { return g };
            g.committed = Some(committed.get(&(source.topic(), source.partition)).copied());
            g.offsets = offsets.get(source).copied();
            g
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(log_end: u64) -> TargetPartition {
        TargetPartition { log_start: 0, log_end, last_epoch: None }
    }

    fn keys() -> Vec<(SourceTp, TargetTp)> {
        (0..3).map(|p| (SourceTp::new("orders", p), TargetTp::new("a.orders", p))).collect()
    }

    fn committed(partition: u32, offset: u64) -> pb::CommittedOffset {
        pb::CommittedOffset { topic: "orders".into(), partition, offset, metadata: String::new() }
    }

    fn probed(partition: u32, log_start: u64, log_end: u64) -> Probed {
        Probed { tp: SourceTp::new("orders", partition), log_start, log_end, end_age: None }
    }

    #[test]
    fn each_partition_gets_its_own_answers_and_nothing_committed_is_an_answer() {
        let got = sort_answers(
            &keys(),
            Some(vec![(TargetTp::new("a.orders", 2), part(7)), (TargetTp::new("a.orders", 0), part(5))]),
            Some(vec![committed(0, 4), committed(2, 6)]),
            Some(vec![probed(0, 1, 9), probed(2, 0, 7)]),
        );
        assert_eq!(
            got,
            vec![
                Gathered { target: Some(part(5)), committed: Some(Some(4)), offsets: Some((1, 9)) },
                // The target left partition 1 out: the lane reads all three alone.
                Gathered::default(),
                Gathered { target: Some(part(7)), committed: Some(Some(6)), offsets: Some((0, 7)) },
            ]
        );
        let none_committed = sort_answers(
            &keys()[..1],
            Some(vec![(TargetTp::new("a.orders", 0), part(0))]),
            Some(vec![committed(1, 3)]),
            Some(vec![]),
        );
        assert_eq!(
            none_committed,
            vec![Gathered { target: Some(part(0)), committed: Some(None), offsets: None }],
            "no commit for the partition is an answer; offsets left out are read alone"
        );
    }

    #[test]
    fn answers_are_a_prefix_of_the_three_reads() {
        let target = Some(vec![(TargetTp::new("a.orders", 0), part(5))]);
        // The committed-offsets call failed: the offsets read after it are not taken either.
        let got = sort_answers(&keys()[..1], target.clone(), None, Some(vec![probed(0, 1, 9)]));
        assert_eq!(got, vec![Gathered { target: Some(part(5)), committed: None, offsets: None }]);
        // The target read failed: nothing is taken.
        let got = sort_answers(&keys()[..1], None, Some(vec![committed(0, 4)]), Some(vec![probed(0, 1, 9)]));
        assert_eq!(got, vec![Gathered::default()]);
        // A source without a call for many partitions' offsets (Kafka) answers none.
        let got = sort_answers(&keys()[..1], target, Some(vec![]), Some(vec![]));
        assert_eq!(got, vec![Gathered { target: Some(part(5)), committed: Some(None), offsets: None }]);
    }
}
