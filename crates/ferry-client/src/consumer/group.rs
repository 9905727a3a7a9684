//! Group membership: JoinGroup, the heartbeat task, rejoining after expiry, and leaving.
//!
//! The heartbeat task only records what the broker says (new generation and assignment); the consumer applies
//! it on its next `poll`, where it can commit first. This keeps every offset decision on the consumer's side.

use std::sync::Arc;
use std::time::Duration;

use ferry_proto as pb;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::connection::BrokerClient;
use crate::error::Result;

/// What the broker last told this member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GroupView {
    pub(crate) member_id: String,
    pub(crate) generation: u64,
    pub(crate) assignment: Vec<(String, u32)>,
}

#[derive(Debug, Default)]
struct SharedState {
    view: GroupView,
    /// Set when `view` changed and the consumer has not applied it yet.
    changed: bool,
}

/// A live membership with its heartbeat task. Dropping it stops the heartbeats (without leaving).
#[derive(Debug)]
pub(crate) struct Membership {
    pub(crate) group: String,
    state: Arc<parking_lot::Mutex<SharedState>>,
    pub(crate) changed: Arc<Notify>,
    cancel: CancellationToken,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Join parameters.
#[derive(Debug, Clone)]
pub(crate) struct JoinSpec {
    pub(crate) group: String,
    pub(crate) topics: Vec<String>,
    pub(crate) session_timeout: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) client_id: String,
}

fn assignment(list: Vec<pb::TopicPartition>) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = list.into_iter().map(|tp| (tp.topic, tp.partition)).collect();
    out.sort();
    out.dedup();
    out
}

async fn join(client: &BrokerClient, spec: &JoinSpec, member_id: String) -> Result<GroupView> {
    let response = client
        .join_group(pb::JoinGroupRequest {
            group: spec.group.clone(),
            member_id,
            topics: spec.topics.clone(),
            session_timeout_ms: u32::try_from(spec.session_timeout.as_millis()).unwrap_or(u32::MAX),
            client_id: spec.client_id.clone(),
        })
        .await?;
    Ok(GroupView {
        member_id: response.member_id,
        generation: response.generation,
        assignment: assignment(response.assignment),
    })
}

impl Membership {
    /// Joins the group and starts heartbeating. The first view is returned already marked as changed.
    ///
    /// While the group's coordinator cannot be found (its broker died and the cluster has not elected the next
    /// one yet, or the listed brokers point at one that is gone), the join is tried again with backoff for up to
    /// the session timeout, as Kafka clients look the coordinator up again.
    pub(crate) async fn join(client: BrokerClient, spec: JoinSpec) -> Result<Membership> {
        let started = tokio::time::Instant::now();
        let mut backoff = client.config().retry.backoff();
        let view = loop {
            match join(&client, &spec, String::new()).await {
                Ok(view) => break view,
                Err(e) if coordinator_not_found(&e) && started.elapsed() < spec.session_timeout => {
                    let delay = backoff.next().unwrap_or(spec.session_timeout / 4).min(spec.session_timeout / 4);
                    tracing::info!(group = %spec.group, error = %e, ?delay, "looking for the group's coordinator again");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        };
        tracing::info!(group = %spec.group, member = %view.member_id, generation = view.generation,
            partitions = view.assignment.len(), "joined group");
        let state = Arc::new(parking_lot::Mutex::new(SharedState { view, changed: true }));
        let changed = Arc::new(Notify::new());
        let cancel = CancellationToken::new();
        tokio::spawn(heartbeat_loop(client, spec.clone(), state.clone(), changed.clone(), cancel.clone()));
        Ok(Membership { group: spec.group, state, changed, cancel })
    }

    /// The current view, and whether it changed since the last call.
    pub(crate) fn take_change(&self) -> (GroupView, bool) {
        let mut state = self.state.lock();
        let changed = std::mem::take(&mut state.changed);
        (state.view.clone(), changed)
    }

    /// Member id and generation for commits.
    pub(crate) fn identity(&self) -> (String, u64) {
        let state = self.state.lock();
        (state.view.member_id.clone(), state.view.generation)
    }

    /// One heartbeat now, to learn a new generation (after a commit was fenced as stale).
    pub(crate) async fn refresh(&self, client: &BrokerClient) -> Result<()> {
        let (member_id, generation) = self.identity();
        let request = pb::HeartbeatRequest { group: self.group.clone(), member_id: member_id.clone(), generation };
        let response = client.heartbeat(request).await?;
        if response.member_known && response.generation != generation {
            let view =
                GroupView { member_id, generation: response.generation, assignment: assignment(response.assignment) };
            record(&self.group, &self.state, &self.changed, view);
        }
        Ok(())
    }

    /// Stops heartbeats and leaves the group.
    pub(crate) async fn leave(self, client: &BrokerClient) -> Result<()> {
        self.cancel.cancel();
        let (member_id, _) = self.identity();
        client.leave_group(pb::LeaveGroupRequest { group: self.group.clone(), member_id }).await.map(drop)
    }
}

async fn heartbeat_loop(
    client: BrokerClient,
    spec: JoinSpec,
    state: Arc<parking_lot::Mutex<SharedState>>,
    changed: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(spec.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the join just happened
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (member_id, generation) = {
            let s = state.lock();
            (s.view.member_id.clone(), s.view.generation)
        };
        let request = pb::HeartbeatRequest { group: spec.group.clone(), member_id: member_id.clone(), generation };
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            r = client.heartbeat(request) => r,
        };
        let update = match outcome {
            Ok(r) if !r.member_known => {
                tracing::warn!(group = %spec.group, member = %member_id, "membership expired; joining again");
                match join(&client, &spec, String::new()).await {
                    Ok(view) => Some(view),
                    Err(e) => {
                        tracing::warn!(group = %spec.group, error = %e, "rejoin failed; will retry");
                        None
                    }
                }
            }
            Ok(r) if r.generation != generation => Some(GroupView {
                member_id: member_id.clone(),
                generation: r.generation,
                assignment: assignment(r.assignment),
            }),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(group = %spec.group, error = %e, "heartbeat failed");
                None
            }
        };
        if let Some(view) = update {
            record(&spec.group, &state, &changed, view);
        }
    }
}

/// Whether `e` means the group's coordinator could not be reached or is not known yet (rather than a refusal).
fn coordinator_not_found(e: &crate::error::ClientError) -> bool {
    e.is_transport()
        || e.is_timeout()
        || matches!(e.reason(), Some("not_coordinator" | "not_leader" | "cluster_unavailable" | "not_acknowledged"))
}

/// Stores a new view for the consumer to apply and wakes a consumer waiting for an assignment.
fn record(group: &str, state: &parking_lot::Mutex<SharedState>, changed: &Notify, view: GroupView) {
    tracing::info!(group, member = %view.member_id, generation = view.generation,
        partitions = view.assignment.len(), "group generation changed");
    let mut s = state.lock();
    s.view = view;
    s.changed = true;
    drop(s);
    changed.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_are_sorted_and_unique() {
        let tp = |t: &str, p| pb::TopicPartition { topic: t.into(), partition: p };
        assert_eq!(
            assignment(vec![tp("b", 0), tp("a", 2), tp("a", 1), tp("a", 2)]),
            vec![("a".into(), 1), ("a".into(), 2), ("b".into(), 0)]
        );
    }
}
