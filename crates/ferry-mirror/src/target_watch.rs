//! TargetWatch: the target side's health, seen whether or not data flows.
//!
//! Every `check_interval` (`[target.health]`, defaulting to `[source.health]`) it probes the target with a bounded
//! call; `failure_threshold` consecutive failures (of probes or of the lanes' target calls) raise
//! `target_net_not_available`, and the first success after that `target_net_recovered`. The monitor's `/readyz`
//! answers 503 meanwhile. So an idle mirror, or one whose target is down when it starts, still tells.
//!
//! Each probe also reads every owned partition's log end on the target (one ListOffsets per target leader for all of
//! them, not a call per topic) and hands it to the
//! partition's lane together with the cache offset from before the read: a lane whose target log end is below its
//! cache offset (the target lost an acknowledged tail, e.g. a power loss under async flush) copies again from the
//! target's log end, and its lag counts the missing records until then. A (log end, cache offset) pair that did not
//! change since the last round is held back as [`crate::lane::repeats`] says (the link keeps what its lane was last
//! handed, so a round looks nothing up per partition).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cluster::TargetCluster;
use crate::events::EventBus;
use crate::sync::{LinkList, Links};
pub use crate::target_health::TargetHealth;
use crate::tp::Placer;

/// How the target is probed.
#[derive(Debug, Clone, Copy)]
pub struct TargetProbe {
    /// How often.
    pub check_interval: Duration,
    /// Bound of each call.
    pub timeout: Duration,
}

/// The TargetWatch component.
pub struct TargetWatch {
    target: Arc<dyn TargetCluster>,
    links: Links,
    health: Arc<TargetHealth>,
    events: EventBus,
    probe: TargetProbe,
    /// The partitions a round probes, listed again only when the set changed.
    listed: LinkList,
}

impl TargetWatch {
    /// A watch over `target` for the partitions in `links`.
    pub fn new(
        target: Arc<dyn TargetCluster>,
        links: Links,
        health: Arc<TargetHealth>,
        events: EventBus,
        probe: TargetProbe,
    ) -> TargetWatch {
        TargetWatch { target, links, health, events, probe, listed: LinkList::default() }
    }

    /// Probes until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.probe.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.round().await,
            }
        }
    }

    async fn round(&mut self) {
        let began = self.health.ticket();
        match tokio::time::timeout(self.probe.timeout, self.target.limits()).await {
            Ok(Ok(_)) => {
                self.health.success(&self.events, began);
            }
            Ok(Err(e)) => {
                self.health.failure(&self.events, &e.to_string());
                return;
            }
            Err(_) => {
                self.health.failure(&self.events, &format!("no answer within {:?}", self.probe.timeout));
                return;
            }
        }
        // Each owned partition's cache offset from before the read.
        self.listed.refresh(&self.links);
        let (tps, links) = (&self.listed.targets, &self.listed.links);
        let before: Vec<u64> = links.iter().map(|link| link.status.cache_offset()).collect();
        let ends = match tokio::time::timeout(self.probe.timeout, self.target.log_ends_many(tps)).await {
            Ok(Ok(ends)) => ends,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the target's log ends");
                return;
            }
            Err(_) => return,
        };
        let mut placer = Placer::new(tps);
        for (tp, log_end) in ends {
            let Some(i) = placer.place(&tp) else { continue };
            links[i].probed_target_log_end(log_end, before[i]);
        }
    }
}
