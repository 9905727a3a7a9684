//! Route health: probe rounds every `check_interval`, fetch-stream failures and successes reported by the
//! consumer, the failure threshold that makes a route unavailable, and the alarms a failing, recovering or
//! never-working route raises.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{EgressHandle, Inner};
use crate::cluster::SourceCluster;
use crate::events::{Details, Event, EventKind, RouteFacts};

impl EgressHandle {
    /// A fetch-stream failure on `route` (counts toward its failure threshold).
    pub fn report_failure(&self, route: &str, reason: &str) {
        let mut inner = self.shared.inner.lock();
        let threshold = self.shared.health.failure_threshold;
        let Some(i) = inner.routes.iter().position(|r| r.name == route) else { return };
        let r = &mut inner.routes[i];
        r.stream_failures += 1;
        r.last_error = Some(reason.to_owned());
        let newly_failing = r.stream_failures == threshold && r.failures < threshold;
        if newly_failing {
            self.mark_unavailable(&mut inner, i, reason);
        }
        self.evaluate(&mut inner);
    }

    /// The active route's stream delivered again.
    pub fn report_success(&self, route: &str) {
        let mut inner = self.shared.inner.lock();
        if let Some(r) = inner.routes.iter_mut().find(|r| r.name == route) {
            r.stream_failures = 0;
        }
    }

    fn mark_unavailable(&self, inner: &mut Inner, i: usize, reason: &str) {
        let r = &mut inner.routes[i];
        if r.available {
            r.available = false;
            r.unavailable_since = Some(Instant::now());
            self.shared.events.emit(
                Event::new(
                    EventKind::SourceNetNotAvailable,
                    format!(
                        "source route {:?} failed {} times in a row: {reason}",
                        r.name, self.shared.health.failure_threshold
                    ),
                )
                .route(&r.name)
                .with(Details::Route(RouteFacts {
                    reason: Some(reason.to_string()),
                    brokers: Some(r.brokers.join(",")),
                    active: None,
                })),
            );
        }
    }

    /// Records one probe result.
    pub(super) fn probe_result(&self, i: usize, result: Result<String, String>) {
        let mut inner = self.shared.inner.lock();
        let threshold = self.shared.health.failure_threshold;
        // Learn the source cluster id only from the active route (the primary at start): a backup that answers
        // first while the primary is briefly down must not teach the mirror a foreign cluster's id.
        if let Ok(id) = &result
            && inner.expected_cluster_id.is_none()
            && i == inner.active
        {
            tracing::info!(route = %inner.routes[i].name, cluster_id = %id, "learned the source cluster id from the active route");
            inner.expected_cluster_id = Some(id.clone());
        }
        let expected = inner.expected_cluster_id.clone();
        let configured = inner.configured_cluster_id;
        let outcome = match result {
            Ok(id) if expected.as_deref() == Some(id.as_str()) => Ok(id),
            // Until the source cluster's id is known, no other route can be trusted to lead to it.
            // It answered: not a fault of the route itself, so no misconfiguration alarm for it.
            Ok(id) if expected.is_none() => Err((
                Some(id),
                "the source cluster id is not known yet (set source.cluster_id, or let the active route answer first)"
                    .to_owned(),
                false,
            )),
            Ok(id) => Err((
                Some(id.clone()),
                format!(
                    "leads to cluster {id:?}, not the source cluster {:?}{}",
                    expected.unwrap_or_default(),
                    if configured { " (source.cluster_id)" } else { "" }
                ),
                true,
            )),
            Err(e) => Err((None, e, true)),
        };
        let r = &mut inner.routes[i];
        r.last_probe = Some(Instant::now());
        match outcome {
            Ok(id) => {
                r.cluster_id = Some(id);
                r.healthy = true;
                r.ever_healthy = true;
                r.failures = 0;
                r.last_error = None;
                if !r.available && r.stream_failures < threshold {
                    r.available = true;
                    r.unavailable_since = None;
                    let name = r.name.clone();
                    self.shared.events.emit(
                        Event::new(EventKind::SourceNetRecovered, format!("source route {name:?} is healthy again"))
                            .route(&name),
                    );
                }
            }
            Err((id, reason, route_fault)) => {
                if id.is_some() {
                    r.cluster_id = id;
                }
                r.healthy = false;
                r.failures = r.failures.saturating_add(1);
                r.last_error = Some(reason.clone());
                if r.failures == threshold {
                    // A route that never worked since the start is most likely misconfigured (a wrong address, an
                    // endpoint of another kind, credentials): say so once, besides the availability alarm.
                    if route_fault && !r.ever_healthy && !r.misconfig_alarmed {
                        r.misconfig_alarmed = true;
                        let (name, brokers) = (r.name.clone(), r.brokers.join(","));
                        self.shared.events.emit(
                            Event::new(
                                EventKind::SyncError,
                                format!(
                                    "source route {name:?} ({brokers}) has not reached the source cluster since the \
                                     mirror started: {reason}"
                                ),
                            )
                            .route(&name)
                            .with(Details::Route(RouteFacts {
                                reason: Some(reason.clone()),
                                brokers: Some(brokers),
                                active: None,
                            })),
                        );
                    }
                    self.mark_unavailable(&mut inner, i, &reason);
                }
            }
        }
    }

    /// Probes every route every `check_interval` until `shutdown`.
    pub async fn run(self, metrics: crate::metrics::Metrics, shutdown: CancellationToken) {
        let h = self.shared.health.clone();
        let mut tick = tokio::time::interval(h.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let clusters: Vec<Arc<dyn SourceCluster>> =
                self.shared.inner.lock().routes.iter().map(|r| Arc::clone(&r.endpoint.cluster)).collect();
            let probes = clusters.into_iter().map(|c| async move {
                match c.probe(h.timeout).await {
                    Ok(cluster_id) => Ok(cluster_id),
                    Err(e) => {
                        // Drop a possibly dead connection so the next probe dials afresh.
                        c.reconnect();
                        Err(e.to_string())
                    }
                }
            });
            let results = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = futures::future::join_all(probes) => r,
            };
            for (i, r) in results.into_iter().enumerate() {
                self.probe_result(i, r);
            }
            let mut inner = self.shared.inner.lock();
            self.evaluate(&mut inner);
            for (i, r) in inner.routes.iter().enumerate() {
                metrics.route(&r.name, i == inner.active, r.healthy);
            }
        }
    }
}
