//! Switching decisions: automatic failover once the active route has been unavailable for `switch_after`,
//! automatic switch-back to the primary (`switch_back = "auto"`), and manual switches that pin a route. No route
//! that leads into another cluster is ever switched to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{EgressHandle, Inner};
use crate::config::SwitchBack;
use crate::events::{Details, Event, EventKind, RouteFacts, SwitchFacts};

/// Why a manual switch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// No route has that name.
    #[error("no route named {0:?}")]
    UnknownRoute(String),
    /// The route leads to another cluster than the source, or the source's id is not known and the route was
    /// never verified: refused, forced or not.
    #[error("route {route:?} cannot be used: {reason}")]
    WrongCluster {
        /// Route name.
        route: String,
        /// Why.
        reason: String,
    },
    /// The route is unhealthy and `force` was not set.
    #[error("route {route:?} is unhealthy ({reason}); pass force to switch anyway")]
    RouteUnhealthy {
        /// Route name.
        route: String,
        /// Why it is unhealthy.
        reason: String,
    },
}

impl EgressHandle {
    /// A manual switch: pins the route. Refused for an unknown route, and for an unhealthy one unless forced.
    pub fn switch(&self, route: &str, force: bool) -> Result<(), SwitchError> {
        let mut inner = self.shared.inner.lock();
        let Some(i) = inner.routes.iter().position(|r| r.name == route) else {
            return Err(SwitchError::UnknownRoute(route.to_owned()));
        };
        let r = &inner.routes[i];
        // No route into another cluster is ever used, forced or not.
        match (&inner.expected_cluster_id, &r.cluster_id) {
            (Some(expected), Some(id)) if id != expected => {
                return Err(SwitchError::WrongCluster {
                    route: route.to_owned(),
                    reason: format!("it leads to cluster {id:?}, not the source cluster {expected:?}"),
                });
            }
            (None, _) if i != inner.active && !r.ever_healthy => {
                return Err(SwitchError::WrongCluster {
                    route: route.to_owned(),
                    reason: "the source cluster's id is not known yet and this route was never verified to lead \
                             to it (set source.cluster_id, or let the active route answer first)"
                        .to_owned(),
                });
            }
            _ => {}
        }
        if !r.healthy && !force {
            let reason = r.last_error.clone().unwrap_or_else(|| "not probed successfully yet".into());
            return Err(SwitchError::RouteUnhealthy { route: route.to_owned(), reason });
        }
        inner.pinned = true;
        if inner.active != i {
            self.switch_to(&mut inner, i, "manual switch by an operator");
        }
        Ok(())
    }

    /// Why `route` must not be fetched from now: it reported another cluster's id than the source's.
    pub fn leads_elsewhere(&self, route: &str) -> Option<String> {
        let inner = self.shared.inner.lock();
        let r = inner.routes.iter().find(|r| r.name == route)?;
        match (&inner.expected_cluster_id, &r.cluster_id) {
            (Some(expected), Some(id)) if id != expected => {
                Some(format!("route {route:?} leads to cluster {id:?}, not the source cluster {expected:?}"))
            }
            _ => None,
        }
    }

    /// Removes the pin of a manual switch; automatic switching applies again.
    pub fn unpin(&self) {
        let mut inner = self.shared.inner.lock();
        inner.pinned = false;
        self.evaluate(&mut inner);
    }

    fn switch_to(&self, inner: &mut Inner, to: usize, reason: &str) {
        let from = inner.active;
        // Stream failures only describe the active route; the route we leave is judged by its probes from now on.
        inner.routes[from].stream_failures = 0;
        inner.active = to;
        inner.generation += 1;
        inner.last_switch = Some(Instant::now());
        let route = &inner.routes[to];
        self.shared.tx.send_replace(Arc::new(route.active(inner.generation)));
        let (from_name, to_name) = (inner.routes[from].name.clone(), route.name.clone());
        self.shared.events.emit(
            Event::new(
                EventKind::SourceNetBeSwitched,
                format!("switched source route {from_name:?} -> {to_name:?}: {reason}"),
            )
            .route(&to_name)
            .with(Details::Switch(SwitchFacts { from: from_name, to: to_name, reason: reason.to_owned() })),
        );
    }

    /// Decides on automatic switches after a probe round or a reported failure.
    pub(super) fn evaluate(&self, inner: &mut Inner) {
        if inner.pinned {
            return;
        }
        let h = &self.shared.health;
        let spaced = inner.last_switch.is_none_or(|t| t.elapsed() >= h.min_switch_interval);
        let active = inner.active;
        let a = &inner.routes[active];
        if a.failing(h.failure_threshold) {
            let long_enough = a.unavailable_since.is_some_and(|t| t.elapsed() >= h.switch_after);
            if !long_enough || !spaced {
                return;
            }
            let reason = format!(
                "route {:?} unavailable for {}: {}",
                a.name,
                humantime::format_duration(Duration::from_secs(
                    a.unavailable_since.map_or(0, |t| t.elapsed().as_secs())
                )),
                a.last_error.clone().unwrap_or_default()
            );
            match inner.routes.iter().position(|r| r.healthy && !r.failing(h.failure_threshold)) {
                Some(to) if to != active => {
                    inner.no_route_alarmed = false;
                    self.switch_to(inner, to, &reason);
                }
                _ => {
                    if !inner.no_route_alarmed {
                        inner.no_route_alarmed = true;
                        self.shared.events.emit(
                            Event::new(
                                EventKind::SourceNetNotAvailable,
                                format!("no healthy source route to switch to; staying on {:?}", a.name),
                            )
                            .route("*")
                            .with(Details::Route(RouteFacts { active: Some(a.name.clone()), ..Default::default() })),
                        );
                    }
                }
            }
        } else if h.switch_back == SwitchBack::Auto && active != 0 && spaced {
            let primary = &inner.routes[0];
            if primary.healthy && !primary.failing(h.failure_threshold) {
                self.switch_to(inner, 0, "the primary route recovered (switch_back = auto)");
            }
        }
    }
}
