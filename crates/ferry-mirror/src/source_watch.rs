//! SourceWatch: an independent probe of the source's log ends and starts, whether or not data flows.
//!
//! Every `source.health.check_interval` it asks the active route's source cluster for the (log start, log end) of
//! every partition this process owns, each at its leader (one ListOffsets per leader, whatever broker the fetch
//! stream follows; a deposed leader cut off from etcd answers none, case 4 of the cluster analysis), bounded by
//! `source.health.timeout`. Nothing of the
//! fetch stream is involved, so a stream that stopped delivering positions, a lane stuck on a refusing target or a
//! paused partition are all still measured:
//! - the log end feeds the partition's RPO clock and the stall watchdog ([`PartitionStatus::set_probed_source`]);
//!   it never moves the pipeline's own position (a probe may be older than the stream's last word);
//! - the answer itself, dated when the round was asked, bounds what the mirror cannot see: a partition whose
//!   leader has not answered for `check_interval + timeout` counts its RPO from the last answered round
//!   ([`crate::rpo`]), since records its leader acknowledged meanwhile may wait unseen;
//! - the log start goes to the partition's lane ([`LaneLink::source_log_start`]), which reports what source
//!   retention deleted before it was mirrored (`data_lost_before_mirroring`); a log start that did not move since
//!   the last round is held back as [`crate::lane::repeats`] says ([`LaneLink::probed_source_log_start`]).
//!
//! Each leader is asked on its own: one that fails or does not answer within the timeout leaves only its own
//! partitions unanswered. A route into another cluster is never probed. A failed round is logged and skipped:
//! route health is the Egress's business. A source without a cheap call for many partitions' offsets (a Kafka source, see
//! [`SourceCluster::log_offsets_many`]) answers nothing, and the fetch stream's positions alone feed the RPO clock
//! and the watchdog.
//!
//! [`SourceCluster::log_offsets_many`]: crate::cluster::SourceCluster::log_offsets_many
//!
//! [`PartitionStatus::set_probed_source`]: crate::state::PartitionStatus::set_probed_source
//! [`LaneLink::source_log_start`]: crate::lane::link::LaneLink::source_log_start
//! [`LaneLink::probed_source_log_start`]: crate::lane::link::LaneLink::probed_source_log_start

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::egress::EgressHandle;
use crate::rpo::Heard;
use crate::sync::{LinkList, Links};
use crate::tp::Placer;

/// The SourceWatch component.
pub struct SourceWatch {
    egress: EgressHandle,
    links: Links,
    /// The partitions a round probes, listed again only when the set changed.
    listed: LinkList,
    check_interval: Duration,
    timeout: Duration,
}

impl SourceWatch {
    /// A watch over the partitions in `links`, probing every `check_interval` with calls bounded by `timeout`.
    pub fn new(egress: EgressHandle, links: Links, check_interval: Duration, timeout: Duration) -> SourceWatch {
        SourceWatch { egress, links, listed: LinkList::default(), check_interval, timeout }
    }

    /// Probes until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.round().await,
            }
        }
    }

    async fn round(&mut self) {
        self.listed.refresh(&self.links);
        let (tps, links) = (&self.listed.tps, &self.listed.links);
        if tps.is_empty() {
            return;
        }
        let route = self.egress.active();
        if self.egress.leads_elsewhere(&route.name).is_some() {
            return;
        }
        // Each leader answers within the timeout or its partitions go unanswered this round; the whole round is
        // bounded too, should the leaders' look-up itself hang.
        let asked = Instant::now();
        let probe = route.cluster.log_offsets_many(tps, self.timeout);
        let offsets = match tokio::time::timeout(2 * self.timeout, probe).await {
            Ok(Ok(offsets)) => offsets,
            Ok(Err(e)) => {
                tracing::debug!(route = %route.name, error = %e, "cannot probe the source's log ends");
                return;
            }
            Err(_) => {
                tracing::debug!(route = %route.name, timeout = ?self.timeout, "the source's log ends probe timed out");
                return;
            }
        };
        // A healthy probe answers every check interval, each answer within the timeout.
        let heard = Heard { asked, grace: self.check_interval + self.timeout };
        let mut placer = Placer::new(tps);
        for p in offsets {
            let Some(i) = placer.place(&p.tp) else { continue };
            links[i].status.set_probed_source(p.log_start, p.log_end, p.end_age, heard);
            links[i].probed_source_log_start(p.log_start);
        }
    }
}
