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
//! change since the last round is held back as [`crate::lane::repeats`] says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cluster::TargetCluster;
use crate::events::EventBus;
use crate::lane::repeats::Repeat;
use crate::sync::Links;
pub use crate::target_health::TargetHealth;
use crate::tp::{Placer, SourceTp, TargetTp, TpHasher};

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
    /// Each owned partition's target name and what its lane was last handed, kept across rounds: a round
    /// allocates no name per partition and builds no map.
    known: HashMap<SourceTp, Known, TpHasher>,
    /// Rounds so far (a partition's [`Known::round`] says the last that saw it).
    rounds: u64,
}

/// What the watch keeps of one owned partition.
struct Known {
    target: TargetTp,
    /// The (log end, cache offset before the read) its lane was last handed.
    handed: Repeat<(u64, u64)>,
    round: u64,
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
        TargetWatch { target, links, health, events, probe, known: HashMap::default(), rounds: 0 }
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
        match tokio::time::timeout(self.probe.timeout, self.target.limits()).await {
            Ok(Ok(_)) => {
                self.health.success(&self.events);
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
        // Each owned partition's names, link and cache offset from before the read, in one list.
        self.rounds += 1;
        let round = self.rounds;
        let mut parts: Vec<(SourceTp, u64, Arc<crate::lane::link::LaneLink>)> = Vec::with_capacity(self.links.len());
        let mut tps: Vec<TargetTp> = Vec::with_capacity(self.links.len());
        for entry in self.links.iter() {
            let status = &entry.value().status;
            let known = match self.known.get_mut(entry.key()) {
                Some(k) if k.target.partition == status.partition && k.target.topic() == status.target_topic => k,
                _ => {
                    let target = TargetTp::new(status.target_topic.as_str(), status.partition);
                    let fresh = Known { target, handed: Repeat::default(), round };
                    self.known.insert(entry.key().clone(), fresh);
                    self.known.get_mut(entry.key()).expect("just inserted")
                }
            };
            known.round = round;
            tps.push(known.target.clone());
            parts.push((entry.key().clone(), status.cache_offset(), Arc::clone(entry.value())));
        }
        // Every partition of the round is marked: anything else is a partition no longer owned.
        if self.known.len() > parts.len() {
            self.known.retain(|_, k| k.round == round);
        }
        let ends = match tokio::time::timeout(self.probe.timeout, self.target.log_ends_many(&tps)).await {
            Ok(Ok(ends)) => ends,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the target's log ends");
                return;
            }
            Err(_) => return,
        };
        let mut placer = Placer::new(&tps);
        for (tp, log_end) in ends {
            let Some(i) = placer.place(&tp) else { continue };
            let (source, cache_before, link) = &parts[i];
            if let Some(known) = self.known.get_mut(source)
                && known.handed.news(&(log_end, *cache_before))
            {
                link.target_log_end(log_end, *cache_before);
            }
        }
    }
}
