//! What the timer reports: per delay-store partition owned here, its pending entries and bytes, the backlog of
//! entries due but not yet fired, and the earliest and latest due times; over all, moves and the lateness
//! percentiles. Updated by the timer on every tick (so at most a tick old), read by the metrics endpoint.

use std::collections::HashMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Delays;
use super::partition::PartState;
use crate::node::registry::now_ms;

/// One partition's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartGauges {
    /// Entries pending (not fired, not cancelled).
    pub pending: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Entries already due, not yet fired.
    pub backlog: u64,
    /// Earliest due time on the wheel, ms (0: none).
    pub earliest_ms: i64,
    /// Latest due time on the wheel, ms (0: none).
    pub latest_ms: i64,
}

impl PartGauges {
    /// The figures of `state` at `now_ms`.
    pub fn of(state: &PartState, now_ms: i64) -> PartGauges {
        let (pending, bytes) = state.totals();
        let backlog = state.current.iter().filter(|l| l.entry.due_ms <= now_ms).count() as u64;
        let current = state.current.iter().map(|l| l.entry.due_ms);
        let (mut earliest, mut latest) = state.wheel.due_range().unwrap_or((i64::MAX, i64::MIN));
        for due in current {
            earliest = earliest.min(due);
            latest = latest.max(due);
        }
        let (earliest_ms, latest_ms) = if pending == 0 || earliest > latest { (0, 0) } else { (earliest, latest) };
        PartGauges { pending, bytes, backlog, earliest_ms, latest_ms }
    }
}

/// The figures of every partition owned here.
pub type Gauges = HashMap<u32, PartGauges>;

impl Delays {
    /// Records partition `k`'s figures (`None`: no longer owned here).
    pub(super) fn note_gauges(&self, k: u32, state: Option<&PartState>) {
        let mut g = self.gauges.lock();
        match state {
            Some(s) => {
                g.insert(k, PartGauges::of(s, now_ms()));
            }
            None => {
                g.remove(&k);
            }
        }
    }

    /// Registers the timer's metrics in `r`.
    pub fn register_metrics(&self, r: &mut Registry) {
        let family = |r: &mut Registry, name: &str, help: &str| {
            let f = Family::<Vec<(&'static str, String)>, Gauge>::default();
            r.register(name, help, f.clone());
            f
        };
        let pending =
            family(r, "ferry_broker_delay_pending", "Delayed entries pending, per delay-store partition owned here");
        let bytes = family(r, "ferry_broker_delay_pending_bytes", "Payload bytes of the pending delayed entries");
        let backlog = family(r, "ferry_broker_delay_due_backlog", "Delayed entries already due and not yet moved");
        let earliest = family(r, "ferry_broker_delay_earliest_due_ms", "Earliest due time pending, ms since the epoch");
        let latest = family(r, "ferry_broker_delay_latest_due_ms", "Latest due time pending, ms since the epoch");
        for (k, g) in self.gauges.lock().iter() {
            let labels = vec![("partition", k.to_string())];
            pending.get_or_create(&labels).set(i64::try_from(g.pending).unwrap_or(i64::MAX));
            bytes.get_or_create(&labels).set(i64::try_from(g.bytes).unwrap_or(i64::MAX));
            backlog.get_or_create(&labels).set(i64::try_from(g.backlog).unwrap_or(i64::MAX));
            earliest.get_or_create(&labels).set(g.earliest_ms);
            latest.get_or_create(&labels).set(g.latest_ms);
        }
        let (moves, lateness) = self.mover_stats();
        let counter = Counter::<u64>::default();
        counter.inc_by(moves);
        r.register("ferry_broker_delay_moves", "Delayed entries fired (records moved to their partitions)", counter);
        let quantiles = family(r, "ferry_broker_delay_lateness_ms", "How late the last 10000 entries fired, ms");
        if let Some((p50, p99)) = lateness {
            quantiles.get_or_create(&vec![("quantile", "0.5".into())]).set(i64::try_from(p50).unwrap_or(i64::MAX));
            quantiles.get_or_create(&vec![("quantile", "0.99".into())]).set(i64::try_from(p99).unwrap_or(i64::MAX));
        }
    }
}
