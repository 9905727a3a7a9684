//! The controller: one broker at a time, elected through etcd. The controller key is created, only if absent,
//! under a lease the controller keeps alive; when it stops (killed, frozen, cut off), the lease runs out and any
//! other member takes over. Every write the controller makes also compares the controller key's create revision,
//! so a deposed controller's writes fail.
//!
//! Its duty: a partition whose leader left the cluster gets a new leader from its in-sync set only, the old
//! leader taken out of the ISR and the leader epoch bumped. A partition with no live in-sync replica stays
//! offline (no unclean election): an acknowledged record is on every ISR member. It also moves replicas, one
//! step a beat (see [`crate::cluster::core::moves`]): off brokers being drained, and off lost brokers of double_write partitions.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};

use std::collections::BTreeSet;

use crate::cluster::catalog::{self, PartitionState, Replication as Mode, Snapshot};
use crate::cluster::core::moves;
use crate::events::{Event, Events};

/// The controller's state on one broker.
#[derive(Default)]
pub struct Controller {
    held: Option<Held>,
}

struct Held {
    lease: i64,
    /// The controller key's create revision: the fence of every write.
    created: i64,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("held", &self.held.as_ref().map(|h| h.created)).finish()
    }
}

impl Controller {
    /// Whether this broker holds the controller key.
    pub fn is_controller(&self) -> bool {
        self.held.is_some()
    }

    /// One beat: keeps the lease alive, or campaigns when no one holds the key; as controller, and when
    /// `act_on_missing` (etcd was not just back from an outage), elects leaders for partitions whose leader left.
    pub async fn tick(
        &mut self,
        client: &mut Client,
        me: u32,
        ttl: Duration,
        snap: &Snapshot,
        act_on_missing: bool,
        events: &Events,
    ) -> Result<(), etcd_client::Error> {
        self.keep_alive(me).await;
        if self.held.is_none() && snap.controller == 0 {
            self.campaign(client, me, ttl).await?;
        }
        let Some(created) = self.held.as_ref().map(|h| h.created) else { return Ok(()) };
        if !act_on_missing {
            return Ok(());
        }
        let live: BTreeSet<u32> = snap.brokers.keys().copied().collect();
        // Replica counts as moves start this beat, so that several partitions do not all pick the same broker.
        let mut load = snap.replica_counts();
        for ((topic, p), v) in &snap.partitions {
            if let Some(next) = elect(&v.state, snap) {
                let old = v.state.leader;
                if catalog::swap_partition(client, topic, *p, v.revision, &next, Some(created)).await?.is_some() {
                    events.note(Event::LeaderElected);
                    tracing::info!(
                        event = "leader_elected",
                        topic,
                        partition = p,
                        leader = next.leader,
                        leader_epoch = next.leader_epoch,
                        previous = old,
                        isr = ?next.isr,
                        "elected a new leader from the in-sync set"
                    );
                }
                continue;
            }
            let mode = snap.topics.get(topic).map_or(Mode::Raft3, |t| t.replication);
            let pick = |taken: &[u32]| {
                let id = load.iter().filter(|(id, _)| !taken.contains(id)).min_by_key(|&(id, c)| (*c, *id))?.0;
                Some(*id)
            };
            let next = match moves::target_for(&v.state, mode, &live, &snap.draining, pick) {
                Some(target) => {
                    for id in target.iter().filter(|id| !v.state.replicas.contains(id)) {
                        *load.entry(*id).or_default() += 1;
                    }
                    tracing::info!(
                        event = "move_started",
                        topic,
                        partition = p,
                        replicas = ?v.state.replicas,
                        target = ?target,
                        "moving the partition's replicas"
                    );
                    PartitionState { target: Some(target), ..v.state.clone() }
                }
                None => match moves::step(&v.state, &live) {
                    Some(next) => next,
                    None => continue,
                },
            };
            match catalog::swap_partition(client, topic, *p, v.revision, &next, Some(created)).await? {
                Some(_) if next.target.is_none() && v.state.target.is_some() => {
                    events.note(Event::MoveDone);
                    tracing::info!(event = "move_done", topic, partition = p, replicas = ?next.replicas, "partition moved");
                }
                Some(_) => tracing::debug!(topic, partition = p, state = ?next, "move step"),
                None => tracing::debug!(topic, partition = p, "partition state changed meanwhile; next beat decides"),
            }
        }
        Ok(())
    }

    async fn keep_alive(&mut self, me: u32) {
        let Some(h) = &mut self.held else { return };
        let alive = match h.keeper.keep_alive().await {
            Ok(()) => matches!(h.answers.message().await, Ok(Some(a)) if a.ttl() > 0),
            Err(_) => false,
        };
        if !alive {
            tracing::warn!(
                event = "controller_lost",
                broker_id = me,
                "lost the controller lease; no longer controller"
            );
            self.held = None;
        }
    }

    async fn campaign(&mut self, client: &mut Client, me: u32, ttl: Duration) -> Result<(), etcd_client::Error> {
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX).max(1);
        let lease = client.lease_grant(secs, None).await?.id();
        let key = catalog::controller_key();
        let txn = Txn::new().when([Compare::version(key.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key.as_str(),
            me.to_string(),
            Some(PutOptions::new().with_lease(lease)),
        )]);
        let response = client.txn(txn).await?;
        if !response.succeeded() {
            let _ = client.lease_revoke(lease).await;
            return Ok(());
        }
        let created = response.header().map_or(0, |h| h.revision());
        let (keeper, answers) = client.lease_keep_alive(lease).await?;
        tracing::info!(event = "controller_elected", broker_id = me, "this broker is the controller");
        self.held = Some(Held { lease, created, keeper, answers });
        Ok(())
    }

    /// Gives the controller key up (a graceful stop): another member takes over at once.
    pub async fn resign(&mut self, client: &mut Client) {
        if let Some(h) = self.held.take() {
            let _ = client.lease_revoke(h.lease).await;
        }
    }
}

/// The state after electing a new leader for `state`, when its leader is gone (or none is) and a live in-sync
/// replica exists: the first such in replica order.
fn elect(state: &PartitionState, snap: &Snapshot) -> Option<PartitionState> {
    if state.leader != 0 && snap.brokers.contains_key(&state.leader) {
        return None;
    }
    let candidate = state
        .replicas
        .iter()
        .copied()
        .find(|r| *r != state.leader && state.isr.contains(r) && snap.brokers.contains_key(r))?;
    let isr = state.isr.iter().copied().filter(|r| *r != state.leader).collect();
    Some(PartitionState { leader: candidate, leader_epoch: state.leader_epoch + 1, isr, ..state.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(live: &[u32]) -> Snapshot {
        Snapshot { brokers: live.iter().map(|&id| (id, format!("h:{id}"))).collect(), ..Snapshot::default() }
    }

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
    fn a_new_leader_comes_from_the_live_in_sync_replicas_only() {
        // The leader is alive: nothing to do.
        assert_eq!(elect(&state(1, 4, &[1, 2, 3]), &snap(&[1, 2, 3])), None);
        // It left: the first live ISR member in replica order leads, at the next epoch, and the old leader is out.
        assert_eq!(elect(&state(1, 4, &[1, 2, 3]), &snap(&[2, 3])), Some(state(2, 5, &[2, 3])));
        // Broker 2 is live but out of sync: 3 leads.
        assert_eq!(elect(&state(1, 4, &[1, 3]), &snap(&[2, 3])), Some(state(3, 5, &[3])));
        // No live ISR member: the partition stays offline rather than lose acknowledged records.
        assert_eq!(elect(&state(1, 4, &[1, 3]), &snap(&[2])), None);
        // An offline partition whose ISR member is back gets it as leader.
        assert_eq!(elect(&state(0, 5, &[3]), &snap(&[2, 3])), Some(state(3, 6, &[3])));
    }
}
