//! The controller's driver: one broker at a time holds the controller key, created only if absent under its
//! *membership* lease, so the role ends exactly when the membership does (no second lease that could outlive or
//! undercut it). It acts only while its lease clock says it may (see `core::fencing`); one that stops holding the
//! key, or whose lease lapsed, drops the role at once and, when it can, deletes its key so that another member
//! takes over within a beat. Every write it makes also compares the key's create revision, so a deposed
//! controller's writes fail.
//!
//! What it does each beat is decided by `core::controller::step`: elections (after asking the candidates for
//! their reports) and replica moves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::catalog::{self, Snapshot};
use super::core::controller::{Action, Key, Why};
use super::core::election::Report;
use crate::events::{Event, Events};

/// The controller's state on one broker.
#[derive(Debug)]
pub struct Controller {
    /// The controller key's create revision while this broker holds it: the fence of every write.
    held: Option<i64>,
    lease: Arc<AtomicI64>,
}

impl Controller {
    /// A controller that campaigns under the membership lease `lease` (its current id).
    pub fn new(lease: Arc<AtomicI64>) -> Controller {
        Controller { held: None, lease }
    }

    /// Whether this broker holds the controller key.
    pub fn is_controller(&self) -> bool {
        self.held.is_some()
    }

    /// Keeps the role in step with etcd and the lease clock: drops it when the key is another's or gone, or when
    /// this member may not act (`may_act` false); campaigns when no one holds the key. Returns whether it holds it.
    pub async fn keep(&mut self, client: &mut Client, me: u32, snap: &Snapshot, may_act: bool) -> bool {
        if let Some(created) = self.held {
            let still = snap.controller == me;
            if !still || !may_act {
                self.held = None;
                tracing::warn!(event = "controller_lost", broker_id = me, still_keyed = still, "no longer controller");
                if still {
                    // Give the key up, so that a successor takes over within a beat rather than a lease TTL.
                    let key = catalog::controller_key();
                    let txn = Txn::new()
                        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, created)])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    let _ = client.txn(txn).await;
                }
            }
        }
        if self.held.is_none() && snap.controller == 0 && may_act {
            match self.campaign(client, me).await {
                Ok(()) => {}
                Err(e) => tracing::debug!(error = %e, "campaigning for controller failed; next beat retries"),
            }
        }
        self.held.is_some()
    }

    async fn campaign(&mut self, client: &mut Client, me: u32) -> Result<(), etcd_client::Error> {
        let lease = self.lease.load(Ordering::Acquire);
        let key = catalog::controller_key();
        let txn = Txn::new().when([Compare::version(key.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key.as_str(),
            me.to_string(),
            Some(PutOptions::new().with_lease(lease)),
        )]);
        let response = client.txn(txn).await?;
        if response.succeeded() {
            self.held = Some(response.header().map_or(0, |h| h.revision()));
            tracing::info!(event = "controller_elected", broker_id = me, "this broker is the controller");
        }
        Ok(())
    }

    /// Writes the `Write` actions of a beat, each a compare-and-swap fenced by the controller key.
    pub async fn apply(
        &self,
        client: &mut Client,
        actions: &[Action],
        events: &Events,
    ) -> Result<(), etcd_client::Error> {
        let Some(created) = self.held else { return Ok(()) };
        for action in actions {
            let Action::Write { key: (topic, p), revision, next, why } = action else { continue };
            match catalog::swap_partition(client, topic, *p, *revision, next, Some(created)).await? {
                None => tracing::debug!(topic, partition = p, "partition state changed meanwhile; next beat decides"),
                Some(_) => match why {
                    Why::Elected => {
                        events.note(Event::LeaderElected);
                        tracing::info!(
                            event = "leader_elected",
                            topic,
                            partition = p,
                            leader = next.leader,
                            leader_epoch = next.leader_epoch,
                            isr = ?next.isr,
                            "elected a new leader: the live in-sync replica with the highest (last epoch, log end)"
                        );
                    }
                    Why::MoveStarted => tracing::info!(
                        event = "move_started",
                        topic,
                        partition = p,
                        replicas = ?next.replicas,
                        target = ?next.target,
                        "moving the partition's replicas"
                    ),
                    Why::MoveStep => tracing::debug!(topic, partition = p, state = ?next, "move step"),
                    Why::MoveDone => {
                        events.note(Event::MoveDone);
                        tracing::info!(event = "move_done", topic, partition = p, replicas = ?next.replicas, "partition moved");
                    }
                },
            }
        }
        Ok(())
    }

    /// Gives the controller key up (a graceful stop): another member takes over at once.
    pub async fn resign(&mut self, client: &mut Client) {
        if let Some(created) = self.held.take() {
            let key = catalog::controller_key();
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, created)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let _ = client.txn(txn).await;
        }
    }
}

/// The reports each partition's candidates gave, by partition (see `Replication::gather_reports`).
pub type Reports = BTreeMap<Key, BTreeMap<u32, Report>>;
