//! The member-to-member questions: a leader's failsafe confirmations while its lease lapses, and the replicas'
//! reports an election is decided on. Both sides of each: asking (here, on the manager's beat) and answering (the
//! service's `ConfirmLeader` and `ReplicaState`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto as pb;
use tokio_util::sync::CancellationToken;

use super::Replication;
use crate::cluster::catalog::Snapshot;
use crate::cluster::controller::Reports;
use crate::cluster::core::controller::Action;
use crate::cluster::core::election::Report;
use crate::cluster::core::fencing::{self, Answer, Ask};
use crate::events::Event;

impl Replication {
    /// The failsafe beat, until `stop`: for every partition this member leads whose lease is lapsing, ask every
    /// other replica to confirm; a partition every replica confirmed keeps its leader for the grant. Also notes
    /// the moment a leader fences itself, and the moment it holds on under the failsafe.
    pub(super) async fn failsafe(self: Arc<Self>, stop: CancellationToken) {
        let mut fenced: HashSet<(String, u32)> = HashSet::new();
        let mut held: HashSet<(String, u32)> = HashSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.s.beat) => {}
            }
            let now = Instant::now();
            let lease = self.serving.lease().until();
            if fencing::should_ask(now, lease, self.s.ttl) {
                self.ask_confirmations().await;
            }
            let now = Instant::now();
            for topic in self.core.topics() {
                for part in topic.partitions() {
                    let Some(r) = part.replica() else { continue };
                    let Ok(authority) = r.with_leading(|l| self.serving.authority(l, now)) else { continue };
                    let key = (part.topic().to_owned(), part.index());
                    if authority.holds() {
                        if fenced.remove(&key) {
                            tracing::info!(topic = part.topic(), partition = part.index(), "acting as leader again");
                        }
                        let under_failsafe = authority == fencing::Authority::Failsafe;
                        if under_failsafe && held.insert(key.clone()) {
                            self.events.note(Event::FailsafeHeld);
                            tracing::warn!(
                                event = "failsafe_held",
                                topic = part.topic(),
                                partition = part.index(),
                                "etcd lease lapsing: leading on under the failsafe, every replica confirmed"
                            );
                        } else if !under_failsafe {
                            held.remove(&key);
                        }
                    } else if fenced.insert(key.clone()) {
                        held.remove(&key);
                        self.events.note(Event::SelfFenced);
                        tracing::warn!(
                            event = "self_fenced",
                            topic = part.topic(),
                            partition = part.index(),
                            "etcd lease could have expired and no failsafe confirmation covers it: no longer acting \
                             as leader (no acknowledgement, no read) until etcd answers"
                        );
                    }
                }
            }
            fenced.retain(|(t, p)| {
                self.core.partition(t, *p).is_ok_and(|p| p.replica().is_some_and(|r| r.leading().is_ok()))
            });
        }
    }

    /// Asks every replica of the partitions this member leads to confirm it, and takes the grants.
    async fn ask_confirmations(&self) {
        let snap = self.snapshot();
        let mut by_peer: BTreeMap<u32, Vec<pb::LeaderClaim>> = BTreeMap::new();
        let mut led: Vec<(Arc<crate::node::partition::Partition>, Vec<u32>)> = Vec::new();
        for topic in self.core.topics() {
            for part in topic.partitions() {
                let Some(r) = part.replica() else { continue };
                let Ok((epoch, replicas)) = r.with_leading(|l| (l.epoch, l.replicas.clone())) else { continue };
                for peer in replicas.iter().filter(|id| **id != self.s.me) {
                    by_peer.entry(*peer).or_default().push(pb::LeaderClaim {
                        topic: part.topic().to_owned(),
                        partition: part.index(),
                        leader_epoch: epoch,
                    });
                }
                led.push((part, replicas));
            }
        }
        if led.is_empty() {
            return;
        }
        let sent = Instant::now();
        let asks = by_peer.into_iter().filter_map(|(peer, partitions)| {
            let mut client = self.peer(peer, &snap)?;
            let request = pb::ConfirmLeaderRequest { leader_id: self.s.me, partitions };
            let wait = self.s.beat;
            Some(async move {
                let answer = tokio::time::timeout(wait, client.confirm_leader(request)).await;
                (peer, answer.ok().and_then(|a| a.ok()).map(|a| a.into_inner()))
            })
        });
        let answers = futures::future::join_all(asks).await;
        let mut confirmed: BTreeMap<(String, u32), Vec<u32>> = BTreeMap::new();
        for (peer, answer) in answers {
            for c in answer.map(|a| a.partitions).unwrap_or_default() {
                if c.confirmed {
                    confirmed.entry((c.topic, c.partition)).or_default().push(peer);
                }
            }
        }
        for (part, replicas) in led {
            let key = (part.topic().to_owned(), part.index());
            let yes = confirmed.get(&key).cloned().unwrap_or_default();
            if let Some(until) = fencing::grant(&replicas, self.s.me, &yes, sent, self.s.ttl)
                && let Some(r) = part.replica()
            {
                let _ = r.with_leading(|l| l.failsafe_until = l.failsafe_until.max(Some(until)));
            }
        }
    }

    /// A leader's question, answered for each partition it names (`caller` is the member its credential proved).
    pub fn answer_confirm(&self, caller: u32, req: &pb::ConfirmLeaderRequest) -> pb::ConfirmLeaderResponse {
        let partitions = req
            .partitions
            .iter()
            .map(|c| {
                let answer = match self.core.partition(&c.topic, c.partition) {
                    Ok(part) => self.serving.confirm(&part, Ask { leader: caller, epoch: c.leader_epoch }),
                    Err(_) => Answer::Refuse("this broker holds no replica of it".into()),
                };
                let (confirmed, reason) = match answer {
                    Answer::Confirm => (true, String::new()),
                    Answer::Refuse(why) => (false, why),
                };
                pb::LeaderConfirmation { topic: c.topic.clone(), partition: c.partition, confirmed, reason }
            })
            .collect();
        pb::ConfirmLeaderResponse { partitions }
    }

    /// This member's report of its replica of `topic`/`p`, when it holds one.
    fn local_report(&self, topic: &str, p: u32) -> Option<Report> {
        let part = self.core.partition(topic, p).ok()?;
        let r = part.replica()?;
        let now = Instant::now();
        let promised_to = r.known().promise.filter(|(_, until)| now < *until).map_or(0, |(leader, _)| leader);
        Some(Report {
            last_epoch: r.epochs().last().map_or(0, |e| e.epoch),
            log_end: part.log().log_end_offset(),
            promised_to,
        })
    }

    /// The service's `ReplicaState`: a report per partition asked; with `freeze_ms`, no failsafe confirmation for
    /// those partitions for that long first (an unclean election is being prepared).
    pub fn answer_replica_state(&self, req: &pb::ReplicaStateRequest) -> pb::ReplicaStateResponse {
        let freeze = (req.freeze_ms > 0).then(|| Instant::now() + Duration::from_millis(u64::from(req.freeze_ms)));
        let partitions = req
            .partitions
            .iter()
            .map(|tp| {
                if let Some(until) = freeze
                    && let Ok(part) = self.core.partition(&tp.topic, tp.partition)
                    && let Some(r) = part.replica()
                {
                    r.freeze(until);
                }
                match self.local_report(&tp.topic, tp.partition) {
                    Some(rep) => pb::ReplicaStateEntry {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        error: pb::ErrorCode::None as i32,
                        last_leader_epoch: rep.last_epoch,
                        log_end_offset: rep.log_end,
                        promised_to: rep.promised_to,
                    },
                    None => pb::ReplicaStateEntry {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        error: pb::ErrorCode::UnknownTopicOrPartition as i32,
                        ..Default::default()
                    },
                }
            })
            .collect();
        pb::ReplicaStateResponse { partitions }
    }

    /// The reports of the candidates `asks` name, asked over the peer links (this member answers for itself), each
    /// within a beat; with `freeze_ms`, the asked replicas withhold failsafe confirmations that long. A candidate
    /// that does not answer has no report.
    pub(super) async fn gather_reports(&self, asks: &[Action], snap: &Snapshot, freeze_ms: u32) -> Reports {
        let mut by_broker: BTreeMap<u32, BTreeSet<(String, u32)>> = BTreeMap::new();
        for a in asks {
            if let Action::Ask { key, candidates } = a {
                for c in candidates {
                    by_broker.entry(*c).or_default().insert(key.clone());
                }
            }
        }
        let mut reports = Reports::new();
        if let Some(mine) = by_broker.remove(&self.s.me) {
            for key in mine {
                if freeze_ms > 0
                    && let Ok(part) = self.core.partition(&key.0, key.1)
                    && let Some(r) = part.replica()
                {
                    r.freeze(Instant::now() + Duration::from_millis(u64::from(freeze_ms)));
                }
                if let Some(rep) = self.local_report(&key.0, key.1) {
                    reports.entry(key).or_default().insert(self.s.me, rep);
                }
            }
        }
        let wait = self.s.beat.max(Duration::from_millis(500));
        let calls = by_broker.into_iter().filter_map(|(broker, keys)| {
            let mut client = self.peer(broker, snap)?;
            let partitions =
                keys.into_iter().map(|(topic, partition)| pb::TopicPartition { topic, partition }).collect();
            let request = pb::ReplicaStateRequest { partitions, freeze_ms };
            Some(async move {
                let answer = tokio::time::timeout(wait, client.replica_state(request)).await;
                (broker, answer.ok().and_then(|a| a.ok()).map(|a| a.into_inner()))
            })
        });
        for (broker, answer) in futures::future::join_all(calls).await {
            let Some(answer) = answer else {
                tracing::info!(broker_id = broker, "a candidate did not report for an election; it is not elected now");
                continue;
            };
            for e in answer.partitions {
                if e.error == pb::ErrorCode::None as i32 {
                    let rep = Report {
                        last_epoch: e.last_leader_epoch,
                        log_end: e.log_end_offset,
                        promised_to: e.promised_to,
                    };
                    reports.entry((e.topic, e.partition)).or_default().insert(broker, rep);
                }
            }
        }
        reports
    }
}
