//! What a member does between connecting to etcd and registering: every replica of a partition placed on it that
//! etcd counts in sync, but whose log came back from an unclean shutdown (no clean-shutdown marker, a recovery that
//! cut anything, or no log at all, as after a disk replacement), is taken out of the in-sync set by a
//! compare-and-swap (`core::eligibility`), before this member can be elected or counted (Kafka's KIP-966).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use etcd_client::Client;
use tokio_util::sync::CancellationToken;

use super::catalog;
use super::core::eligibility::{self, Restart};
use super::membership::{ClusterError, Connected, Membership};
use super::peers::{MemberKey, PeerLinks};
use crate::config::ClusterSection;
use crate::node::registry::BrokerCore;
use crate::readiness::Readiness;

/// How this member's replica of `topic`/`p` (of topic id `topic_id`) came back at start.
fn restart_of(core: &BrokerCore, topic: &str, topic_id: &str, p: u32) -> Restart {
    match core.topic(topic) {
        Ok(t) if t.id() == topic_id => match t.partition(p) {
            Ok(part) if part.log().opened().intact() => Restart::Clean,
            _ => Restart::Unclean,
        },
        _ => Restart::Unclean,
    }
}

/// Takes this member (`me`) out of the in-sync set of every partition whose replica here came back unclean.
/// Retries, with backoff, until etcd answers and every compare-and-swap went through, or `stop`. Returns how many
/// partitions it left.
pub async fn leave_isr_where_unclean(etcd: &mut Client, core: &BrokerCore, me: u32, stop: &CancellationToken) -> usize {
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build();
    let mut left = 0;
    loop {
        let pending = match catalog::snapshot(etcd).await {
            Ok(snap) => {
                let mut conflict = false;
                for ((topic, p), v) in &snap.partitions {
                    let Some(record) = snap.topics.get(topic) else { continue };
                    if !v.state.isr.contains(&me) {
                        continue;
                    }
                    let how = restart_of(core, topic, &record.topic_id, *p);
                    let Some(next) = eligibility::on_restart(&v.state, me, how) else { continue };
                    match catalog::swap_partition(etcd, topic, *p, v.revision, &next, None).await {
                        Ok(Some(_)) => {
                            left += 1;
                            tracing::warn!(
                                event = "unclean_restart",
                                topic,
                                partition = p,
                                isr = ?next.isr,
                                leader = next.leader,
                                leader_epoch = next.leader_epoch,
                                "this replica came back from an unclean shutdown: out of the in-sync set until it has \
                                 caught up from a leader"
                            );
                        }
                        Ok(None) => conflict = true,
                        Err(e) => {
                            tracing::warn!(error = %e, "taking an unclean replica out of the in-sync set failed; retrying");
                            conflict = true;
                        }
                    }
                }
                conflict
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the catalog at start; retrying");
                true
            }
        };
        if !pending {
            return left;
        }
        tokio::select! {
            _ = stop.cancelled() => return left,
            _ = tokio::time::sleep(backoff.next().unwrap_or(Duration::from_secs(2))) => {}
        }
    }
}

/// A member that joined its cluster.
#[derive(Debug)]
pub struct Joined {
    /// Its membership, renewed in the background.
    pub membership: Membership,
    /// How many of its replicas it took out of their in-sync sets.
    pub left_isr: usize,
}

/// Joins the cluster of `section`: connects to etcd (waiting, with backoff, while it cannot be reached, and saying
/// so through `ready`), learns the members' secret (into `members`, and the credential `links` present), takes
/// this member's unclean replicas out of the in-sync sets, then registers `advertised` and the named `listeners`.
#[allow(clippy::too_many_arguments)]
pub async fn join(
    section: &ClusterSection,
    core: &BrokerCore,
    advertised: &str,
    listeners: &std::collections::BTreeMap<String, String>,
    members: &MemberKey,
    links: &PeerLinks,
    ready: &Readiness,
    stop: &CancellationToken,
) -> Result<Joined, ClusterError> {
    let me = section.broker_id.unwrap_or_default();
    let connected = Connected::connect(section, core.cluster_id(), &|why| ready.waiting(why), stop).await?;
    members.set(&connected.member_secret().await?);
    if let Some(credential) = members.credential(me) {
        links.set_member(&credential);
    }
    ready.waiting("checking this broker's replicas against the catalog");
    let left_isr = leave_isr_where_unclean(&mut connected.client(), core, me, stop).await;
    ready.waiting("registering with the cluster");
    let membership = connected.register(advertised, listeners).await?;
    Ok(Joined { membership, left_isr })
}
