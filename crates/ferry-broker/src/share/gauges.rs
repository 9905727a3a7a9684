//! What the message models report per group owned here, refreshed by the owner's housekeeping tick and read by the
//! metrics endpoint: backlog, records in flight and waiting for a retry, and the counters of redeliveries, lock
//! expiries, dead letters and settled records since this owner loaded the group.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One group's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupGauges {
    /// The model.
    pub mode: &'static str,
    /// Records not settled, over its partitions (queue, serial: end − start; broadcast: the slowest member's lag).
    pub backlog: u64,
    /// Records locked to members now.
    pub in_flight: u64,
    /// Records failed and waiting for their retry.
    pub retry_wait: u64,
    /// Deliveries after the first.
    pub redeliveries: u64,
    /// Locks that ended without an answer.
    pub lock_expiries: u64,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// Records settled as succeeded.
    pub settled: u64,
    /// Live members.
    pub members: u64,
}

/// The figures of the groups owned here, by group.
#[derive(Debug, Clone, Default)]
pub struct ShareGauges(Arc<Mutex<BTreeMap<String, GroupGauges>>>);

impl ShareGauges {
    /// Replaces the figures with `now` (the groups owned at this tick).
    pub fn set(&self, now: BTreeMap<String, GroupGauges>) {
        *self.0.lock() = now;
    }

    /// Registers the `ferry_broker_group_*` metrics in `r`.
    pub fn register(&self, r: &mut Registry) {
        let family = |r: &mut Registry, name: &str, help: &str| {
            let f = Family::<Vec<(&'static str, String)>, Gauge>::default();
            r.register(name, help, f.clone());
            f
        };
        let backlog =
            family(r, "ferry_broker_group_backlog", "Records not settled yet, per queue, serial or broadcast group");
        let in_flight = family(r, "ferry_broker_group_in_flight", "Records locked to members now");
        let retry_wait = family(r, "ferry_broker_group_retry_wait", "Records failed and waiting for their retry");
        let redeliveries = family(
            r,
            "ferry_broker_group_redeliveries",
            "Deliveries after the first, since this owner loaded the group",
        );
        let expiries = family(r, "ferry_broker_group_lock_expiries", "Locks that ended without an answer");
        let dead = family(r, "ferry_broker_group_dead_lettered", "Records dead-lettered");
        let settled = family(r, "ferry_broker_group_settled", "Records settled as succeeded");
        let members = family(r, "ferry_broker_group_members", "Live members");
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for (group, g) in self.0.lock().iter() {
            let labels = vec![("group", group.clone()), ("mode", g.mode.to_owned())];
            backlog.get_or_create(&labels).set(as_i64(g.backlog));
            in_flight.get_or_create(&labels).set(as_i64(g.in_flight));
            retry_wait.get_or_create(&labels).set(as_i64(g.retry_wait));
            redeliveries.get_or_create(&labels).set(as_i64(g.redeliveries));
            expiries.get_or_create(&labels).set(as_i64(g.lock_expiries));
            dead.get_or_create(&labels).set(as_i64(g.dead_lettered));
            settled.get_or_create(&labels).set(as_i64(g.settled));
            members.get_or_create(&labels).set(as_i64(g.members));
        }
    }
}
