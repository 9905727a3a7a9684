//! What operators see and do across the cluster: the placement and status of every replicated partition, draining
//! a broker (a mark in etcd that the controller acts on, see [`crate::cluster::core::moves`]), and electing a leader by hand,
//! cleanly or, when no in-sync replica is live and the operator says so, uncleanly.

use std::time::Instant;

use ferry_proto as pb;

use super::Replication;
use crate::cluster::catalog::{self, PartitionState};
use crate::cluster::core::election;
use crate::error::{BrokerError, Result};
use crate::events::Event;

fn unreachable(e: etcd_client::Error) -> BrokerError {
    BrokerError::Cluster(format!("cannot reach etcd: {e}"))
}

impl Replication {
    /// A client of member `id` with this member's credential (for a feature's member-only calls, such as the
    /// delay timer's moves to a partition another member leads); `None` when its address is unknown.
    pub fn member_client(&self, id: u32) -> Option<crate::cluster::peers::PeerClient> {
        let snap = self.snap.read();
        self.peer(id, &snap)
    }

    /// Each live broker that registered named listener `listener`, with its address there (brokers without it are
    /// left out).
    pub fn listener_addresses(&self, listener: &str) -> std::collections::BTreeMap<u32, String> {
        let snap = self.snap.read();
        snap.brokers.keys().filter_map(|id| Some((*id, snap.listeners.get(id)?.get(listener)?.clone()))).collect()
    }

    /// The broker coordinating `group` as the catalog says (the leader of its offsets partition); `None` on a
    /// cluster without offsets partitions yet, or while that partition has no leader.
    pub fn group_coordinator(&self, group: &str) -> Option<u32> {
        let k = self.groups.cluster()?.partition_of(group);
        let snap = self.snap.read();
        let leader = snap.partitions.get(&(crate::groups::CLUSTER_OFFSETS_TOPIC.to_owned(), k))?.state.leader;
        (leader != 0).then_some(leader)
    }

    /// The placement of `topics`' partitions (every topic's when empty), with the leaders' addresses on
    /// `listener` (the registered ones for `None`).
    /// A partition this broker leads, as the catalog says, is answered as led here only while it may act as its
    /// leader (its lease, or the failsafe): a member cut off from etcd does not tell clients it leads (case 3 of the
    /// fault analysis); it answers leader 0, and clients ask another member.
    pub fn placements(&self, topics: &[String], listener: Option<&str>) -> Vec<pb::PartitionPlacement> {
        let snap = self.snap.read();
        let now = Instant::now();
        let acts_here = |t: &str, p: u32| {
            self.core
                .partition(t, p)
                .ok()
                .and_then(|part| part.replica().map(|r| r.with_leading(|l| self.serving.authority(l, now).holds())))
                .is_some_and(|a| a == Ok(true))
        };
        snap.partitions
            .iter()
            .filter(|((t, _), _)| topics.is_empty() || topics.contains(t))
            .map(|((t, p), v)| {
                let leader = if v.state.leader == self.s.me && !acts_here(t, *p) { 0 } else { v.state.leader };
                pb::PartitionPlacement {
                    topic: t.clone(),
                    partition: *p,
                    leader_id: leader,
                    leader_epoch: v.state.leader_epoch,
                    replicas: v.state.replicas.clone(),
                    isr: v.state.isr.clone(),
                    leader_address: snap.address(leader, listener).unwrap_or_default(),
                    target_replicas: v.state.target.clone().unwrap_or_default(),
                }
            })
            .collect()
    }

    /// Where a client should go for `topic`/`partition` when this broker cannot answer for it (it holds no replica,
    /// or its replica does not know who leads): the leader the catalog names, unless none leads or this one does.
    pub fn leader_hint(&self, topic: &str, partition: u32) -> Option<pb::LeaderHint> {
        let snap = self.snap.read();
        let state = &snap.partitions.get(&(topic.to_owned(), partition))?.state;
        if state.leader == 0 || state.leader == self.s.me {
            return None;
        }
        Some(pb::LeaderHint {
            leader_id: state.leader,
            leader_address: snap.address(state.leader, None)?,
            leader_epoch: state.leader_epoch,
        })
    }

    /// The live members, at their addresses on `listener` (the registered ones for `None`).
    pub fn brokers(&self, listener: Option<&str>) -> Vec<pb::BrokerNode> {
        let snap = self.snap.read();
        snap.brokers
            .keys()
            .map(|&broker_id| pb::BrokerNode {
                broker_id,
                address: snap.address(broker_id, listener).unwrap_or_default(),
            })
            .collect()
    }

    /// The cluster's status as this broker sees it: the catalog, and its own leaders' progress.
    pub fn status(&self) -> pb::ClusterStatusResponse {
        let (controller_id, draining, modes) = {
            let snap = self.snap.read();
            let modes: std::collections::BTreeMap<String, (String, bool)> = snap
                .topics
                .iter()
                .map(|(name, t)| (name.clone(), (t.replication.as_str().to_owned(), t.risk_phase)))
                .collect();
            (snap.controller, snap.draining.iter().copied().collect(), modes)
        };
        let partitions = self
            .placements(&[], None)
            .into_iter()
            .map(|placement| {
                let (replication, risk_phase) = modes.get(&placement.topic).cloned().unwrap_or_default();
                let mut status = pb::PartitionStatus {
                    under_replicated: placement.isr.len() < placement.replicas.len(),
                    at_risk: risk_phase && placement.leader_id != 0 && placement.isr.len() < 2,
                    replication,
                    ..Default::default()
                };
                if let Ok(part) = self.core.partition(&placement.topic, placement.partition)
                    && let Some(r) = part.replica()
                    && let Ok(l) = r.leading()
                {
                    let leo = part.log().log_end_offset();
                    let now = Instant::now();
                    status.led_here = true;
                    status.high_watermark = r.hw();
                    status.log_end_offset = leo;
                    status.followers = l
                        .followers
                        .iter()
                        .map(|(&broker_id, p)| pb::ReplicaProgress {
                            broker_id,
                            log_end_offset: p.leo,
                            lag_records: leo.saturating_sub(p.leo),
                            caught_up_ms_ago: now.saturating_duration_since(p.caught_up).as_millis() as u64,
                        })
                        .collect();
                }
                status.placement = Some(placement);
                status
            })
            .collect();
        pb::ClusterStatusResponse {
            cluster_id: self.core.cluster_id().to_owned(),
            broker_id: self.s.me,
            brokers: self.brokers(None),
            controller_id,
            partitions,
            etcd_reachable: self.etcd_reachable(),
            draining,
        }
    }

    /// Marks broker `id` as being drained (or, with `cancel`, no longer): the controller moves its leaderships,
    /// then its replicas, to other brokers, and new topics place nothing on it. Returns every broker being drained.
    pub async fn drain(&self, id: u32, cancel: bool) -> Result<Vec<u32>> {
        let mut etcd = self.etcd.clone();
        let key = catalog::drain_key(id);
        if cancel {
            etcd.delete(key, None).await.map_err(unreachable)?;
            tracing::info!(event = "drain_cancelled", broker_id = id, "no longer draining the broker");
        } else {
            etcd.put(key, id.to_string(), None).await.map_err(unreachable)?;
            tracing::info!(event = "drain_started", broker_id = id, "draining the broker");
        }
        self.kick.notify_one();
        let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
        Ok(snap.draining.into_iter().collect())
    }

    /// Elects a leader of `topic`/`partition` by hand (`core::election::manual`): the preferred live in-sync
    /// replica; with `unclean`, when no in-sync replica is live, the live replica with the highest (last epoch, log
    /// end), which then starts a new partition epoch. An unclean election is refused while a live replica holds a
    /// failsafe promise to a member of the old in-sync set, unless `dead` names that member. Returns the new state
    /// (the current one when the preferred in-sync replica already leads) and whether it was unclean.
    pub async fn elect(
        &self,
        topic: &str,
        partition: u32,
        unclean: bool,
        dead: &[u32],
    ) -> Result<(PartitionState, bool)> {
        let mut etcd = self.etcd.clone();
        let snap = catalog::snapshot(&mut etcd).await.map_err(unreachable)?;
        let Some(v) = snap.partitions.get(&(topic.to_owned(), partition)) else {
            return Err(match snap.topics.get(topic) {
                Some(t) => BrokerError::UnknownPartition { topic: topic.to_owned(), partition, count: t.partitions },
                None => BrokerError::UnknownTopic { topic: topic.to_owned() },
            });
        };
        let live: std::collections::BTreeSet<u32> = snap.brokers.keys().copied().collect();
        let state = &v.state;
        let key = (topic.to_owned(), partition);
        let candidates = state.replicas.iter().copied().filter(|r| live.contains(r)).collect();
        let asks = [crate::cluster::core::controller::Action::Ask { key: key.clone(), candidates }];
        // Preparing an unclean election, the asked replicas give no failsafe confirmation for two lease TTLs.
        let freeze = if unclean { u32::try_from((2 * self.s.ttl).as_millis()).unwrap_or(u32::MAX) } else { 0 };
        let reports = self.gather_reports(&asks, &snap, freeze).await;
        let empty = std::collections::BTreeMap::new();
        let decided = election::manual(state, &live, reports.get(&key).unwrap_or(&empty), unclean, dead)
            .map_err(|why| BrokerError::ElectionRefused(format!("{topic}/{partition}: {why}")))?;
        let (next, was_unclean) = match decided {
            election::Manual::Unchanged => return Ok((state.clone(), false)),
            election::Manual::Clean(next) => (next, false),
            election::Manual::Unclean(next) => (next, true),
        };
        if catalog::swap_partition(&mut etcd, topic, partition, v.revision, &next, None)
            .await
            .map_err(unreachable)?
            .is_none()
        {
            return Err(BrokerError::Cluster(format!(
                "{topic}/{partition}: the partition's state changed while electing; look again and retry"
            )));
        }
        if was_unclean {
            self.events.note(Event::UncleanElection);
        }
        tracing::warn!(
            event = if was_unclean { "unclean_election" } else { "leader_elected" },
            topic,
            partition,
            leader = next.leader,
            leader_epoch = next.leader_epoch,
            previous = state.leader,
            "leader elected by an operator"
        );
        self.kick.notify_one();
        Ok((next, was_unclean))
    }
}
