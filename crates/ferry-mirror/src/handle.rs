//! What the monitor and embedders (the demo) can see of a running mirror and do to it.

use std::sync::Arc;

use crate::egress::EgressHandle;
use crate::events::EventBus;
use crate::metrics::Metrics;
use crate::state::Shared;
use crate::sync::Links;
use crate::target_health::TargetHealth;

/// A topic name that is not mirrored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic {0:?} is not mirrored by this process")]
pub struct UnknownTopic(pub String);

/// A running mirror, as the monitor sees it.
#[derive(Debug, Clone)]
pub struct MirrorHandle {
    /// `mirror.name`.
    pub name: String,
    /// Source alias.
    pub source_cluster: String,
    /// Target alias.
    pub target_cluster: String,
    /// Shared pipeline state.
    pub shared: Arc<Shared>,
    /// Egress.
    pub egress: EgressHandle,
    /// Events.
    pub events: EventBus,
    /// Metrics.
    pub metrics: Metrics,
    /// The lanes' links (pause and resume go through them).
    pub links: Links,
    /// Target reachability.
    pub target_health: Arc<TargetHealth>,
    /// Failover jobs.
    pub failover: Arc<crate::failover::Failover>,
}

impl MirrorHandle {
    fn set_paused(&self, topic: &str, paused: bool) -> Result<(), UnknownTopic> {
        if !self.shared.topics.lock().contains_key(topic) {
            return Err(UnknownTopic(topic.to_owned()));
        }
        {
            let mut set = self.shared.paused.lock();
            if paused {
                set.insert(topic.to_owned());
            } else {
                set.remove(topic);
            }
        }
        for link in self.links.iter().filter(|e| e.key().topic() == topic) {
            link.value().set_paused(paused);
        }
        Ok(())
    }

    /// Pauses a source topic (its partitions stop appending; positions stay visible).
    pub fn pause(&self, topic: &str) -> Result<(), UnknownTopic> {
        self.set_paused(topic, true)
    }

    /// Resumes a paused (or halted) source topic.
    pub fn resume(&self, topic: &str) -> Result<(), UnknownTopic> {
        self.set_paused(topic, false)
    }
}
