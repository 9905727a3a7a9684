//! The consumer's periodic look at the source: watermarks (position heartbeats, positions outside the log) and,
//! when needed, topic metadata (partitions that appear or disappear). It runs on the blocking pool so that the
//! fetch loop never waits for the cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ferry_client::ClientError;
use rdkafka::consumer::Consumer;
use tokio::task::JoinHandle;

use super::partitions::PartState;
use super::{KafkaSession, Kc};
use crate::kafka::watermarks::{Tp, watermarks};
use crate::lane::core::{SourceFault, SourcePos};

/// What one background refresh found.
pub(super) struct Refresh {
    /// Each fetching partition's expected offset when the refresh was asked.
    pub(super) asked_at: BTreeMap<Tp, u64>,
    pub(super) watermarks: Result<BTreeMap<Tp, (u64, u64)>, ClientError>,
    /// Topic partition counts, when metadata was asked too.
    pub(super) topics: Option<Result<BTreeMap<String, u32>, ClientError>>,
    pub(super) out_of_range: bool,
    pub(super) truncation: bool,
}

impl KafkaSession {
    pub(super) fn spawn_refresh(
        &self,
        consumer: &Arc<Kc>,
        with_topics: bool,
        out_of_range: bool,
        truncation: bool,
    ) -> JoinHandle<Refresh> {
        let asked_at: BTreeMap<Tp, u64> = self
            .parts
            .iter()
            .filter(|(_, p)| p.state == PartState::Fetching)
            .map(|(tp, p)| (tp.clone(), p.batcher.expected()))
            .collect();
        let c = Arc::clone(consumer);
        let timeout = self.settings.call_timeout;
        let brokers = self.brokers.clone();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let tps: Vec<Tp> = asked_at.keys().cloned().collect();
            let cause =
                |c: &Kc| c.context().last_error_since(started).map(|e| format!("; {}", e.reason)).unwrap_or_default();
            let topics = with_topics.then(|| {
                c.fetch_metadata(None, timeout)
                    .map(|md| {
                        md.topics()
                            .iter()
                            .filter(|t| t.error().is_none())
                            .map(|t| (t.name().to_owned(), t.partitions().len() as u32))
                            .collect()
                    })
                    .map_err(|e| crate::kafka::error::map_error(&e, "metadata", "", &brokers, &cause(&c)))
            });
            // Without metadata the cluster is not answering: do not wait out more timeouts.
            let watermarks = match &topics {
                Some(Err(e)) => Err(e.clone()),
                _ => watermarks(c.as_ref(), &tps, timeout).map_err(|e| {
                    crate::kafka::error::map_error(&e, "watermarks of", "the mirrored partitions", &brokers, &cause(&c))
                }),
            };
            Refresh { asked_at, watermarks, topics, out_of_range, truncation }
        })
    }

    pub(super) fn on_refresh(
        &mut self,
        consumer: &Kc,
        r: Refresh,
        topics_known: &mut BTreeMap<String, u32>,
    ) -> Result<(), ClientError> {
        if let Some(topics) = r.topics {
            let topics = topics?;
            let mut assign = Vec::new();
            let mut gone = Vec::new();
            for (tp, p) in self.parts.iter_mut() {
                let exists = topics.get(&tp.0).is_some_and(|&n| tp.1 < n);
                match (p.state, exists) {
                    (PartState::Missing, true) => {
                        p.state = PartState::Fetching;
                        assign.push((tp.clone(), p.batcher.expected()));
                    }
                    (PartState::Fetching | PartState::Stopped, false) => {
                        if p.assigned() {
                            gone.push(tp.clone());
                        }
                        p.state = PartState::Missing;
                        p.paused = false;
                    }
                    _ => {}
                }
            }
            self.unassign(consumer, &gone);
            self.assign(consumer, &assign);
            if !gone.is_empty() {
                self.report_missing();
            }
            *topics_known = topics;
        }
        let marks = r.watermarks?;
        let mut stop = Vec::new();
        for (tp, (lo, hi)) in marks {
            let Some(p) = self.parts.get_mut(&tp) else { continue };
            if p.state != PartState::Fetching {
                continue;
            }
            let asked = r.asked_at.get(&tp).copied().unwrap_or(0);
            p.lo = lo;
            p.hi = hi;
            let expected = p.batcher.expected();
            if r.out_of_range && expected < lo && !p.paused {
                p.link.error(
                    SourceFault::OutOfRange,
                    format!("{}/{}: offset {expected} is below the log start {lo}", tp.0, tp.1),
                    SourcePos { log_start: lo, log_end: hi, epoch: 0, topic_id: p.topic_id.clone() },
                );
                p.state = PartState::Stopped;
                stop.push(tp.clone());
                continue;
            }
            let mut pos = p.pos();
            if hi < asked && r.truncation {
                // The source holds less than was read from it: the producer halts the partition (divergence).
                pos.log_end = hi;
            }
            p.link.position(pos);
        }
        self.unassign(consumer, &stop);
        Ok(())
    }
}
