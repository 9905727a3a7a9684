//! Prometheus metrics of the mirror. Names follow `ferry_<name>_<unit>[_total]` and labels come from bounded sets
//! (topic, partition, route, channel, direction, event), never per-message values. prometheus-client appends
//! `_total` to counters, so counters are registered without it.
//!
//! Exported (design §5, plus a few more):
//! - `ferry_mirror_partition_lag_records{topic,partition}`
//! - `ferry_mirror_partition_offset{topic,partition,kind="source|cache|commit|target"}`
//! - `ferry_mirror_records_total{direction="in|out"}`, `ferry_mirror_bytes_total{direction}`: "in" is what was
//!   fetched from the source (a batch fetched again after a reconnect counts again: it crossed the link again);
//!   "out" is what this process newly wrote to the target (a batch the target already held, after a retried append
//!   or from another writer, is not counted again)
//! - `ferry_mirror_replication_latency_seconds` (histogram: append time minus record timestamp)
//! - `ferry_mirror_route_active{route}`, `ferry_mirror_route_healthy{route}`
//! - `ferry_alarms_total{channel,outcome="sent|suppressed|failed|dropped"}`
//! - `ferry_mirror_events_total{event}`
//! - `ferry_mirror_partitions{state}`
//! - `ferry_mirror_rpo_seconds{topic,partition}`, `ferry_mirror_rpo_max_seconds`: how long the oldest source record
//!   not yet on the target has waited (see `crate::rpo`)
//! - `ferry_mirror_records_lost_before_mirroring_total{topic,partition}`: offsets source retention deleted before
//!   they were mirrored (each a gap the target records)
//! - `ferry_mirror_verified_bytes_total`, `ferry_mirror_verify_mismatch_total`: the background verifier's source
//!   batch bytes compared with their copies, and the mismatches it raised

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The mirror's metric families, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: parking_lot::Mutex<Registry>,
    lag: Family<Labels, Gauge>,
    offsets: Family<Labels, Gauge>,
    records: Family<Labels, Counter>,
    bytes: Family<Labels, Counter>,
    latency: Histogram,
    route_active: Family<Labels, Gauge>,
    route_healthy: Family<Labels, Gauge>,
    alarms: Family<Labels, Counter>,
    events: Family<Labels, Counter>,
    partitions: Family<Labels, Gauge>,
    rpo: Family<Labels, Gauge<f64, AtomicU64>>,
    rpo_max: Gauge<f64, AtomicU64>,
    lost: Family<Labels, Counter>,
    verified_bytes: Counter,
    verify_mismatches: Counter,
    discovery_rounds: Family<Labels, Counter>,
    process_rss: Gauge,
    process_cpu: Gauge<f64, AtomicU64>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let lag = Family::<Labels, Gauge>::default();
        registry.register(
            "ferry_mirror_partition_lag_records",
            "Source log end minus cache offset, per partition",
            lag.clone(),
        );
        let offsets = Family::<Labels, Gauge>::default();
        registry.register(
            "ferry_mirror_partition_offset",
            "Per-partition offsets (next-offset positions): source, cache, commit, target",
            offsets.clone(),
        );
        let records = Family::<Labels, Counter>::default();
        registry.register(
            "ferry_mirror_records",
            "Records fetched from the source (in) and newly written to the target by this process (out; batches the \
             target already held are not counted)",
            records.clone(),
        );
        let bytes = Family::<Labels, Counter>::default();
        registry.register(
            "ferry_mirror_bytes",
            "Batch bytes fetched from the source (in) and newly written to the target by this process (out; batches \
             the target already held are not counted)",
            bytes.clone(),
        );
        let latency = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        registry.register(
            "ferry_mirror_replication_latency_seconds",
            "Time from a batch's newest record timestamp to its append on the target",
            latency.clone(),
        );
        let route_active = Family::<Labels, Gauge>::default();
        registry.register("ferry_mirror_route_active", "1 for the source route in use", route_active.clone());
        let route_healthy = Family::<Labels, Gauge>::default();
        registry.register(
            "ferry_mirror_route_healthy",
            "1 while a source route passes its probes",
            route_healthy.clone(),
        );
        let alarms = Family::<Labels, Counter>::default();
        registry.register("ferry_alarms", "Alarm notifications per channel and outcome", alarms.clone());
        let events = Family::<Labels, Counter>::default();
        registry.register("ferry_mirror_events", "Events raised, by kind", events.clone());
        let partitions = Family::<Labels, Gauge>::default();
        registry.register("ferry_mirror_partitions", "Partitions owned by this process, by state", partitions.clone());
        let rpo = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "ferry_mirror_rpo_seconds",
            "How long the oldest source record not yet on the target has been waiting, per partition (0 when caught up)",
            rpo.clone(),
        );
        let rpo_max = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "ferry_mirror_rpo_max_seconds",
            "The largest ferry_mirror_rpo_seconds of the partitions this process owns",
            rpo_max.clone(),
        );
        let lost = Family::<Labels, Counter>::default();
        registry.register(
            "ferry_mirror_records_lost_before_mirroring",
            "Offsets source retention deleted before they were mirrored (gaps the target records), per partition",
            lost.clone(),
        );
        let verified_bytes = Counter::default();
        registry.register(
            "ferry_mirror_verified_bytes",
            "Source batch bytes the background verifier compared with their copies on the target (as many are read \
             from each side)",
            verified_bytes.clone(),
        );
        let verify_mismatches = Counter::default();
        registry.register(
            "ferry_mirror_verify_mismatch",
            "Mismatches the background verifier raised (verify_mismatch events)",
            verify_mismatches.clone(),
        );
        let discovery_rounds = Family::<Labels, Counter>::default();
        registry.register(
            "ferry_mirror_discovery_rounds",
            "Topic discovery rounds: read (the topic lists were read and decided on) or unchanged (both sides' lists, \
             the rules and the source cluster were as a quiet round left them: skipped)",
            discovery_rounds.clone(),
        );
        let process_rss = Gauge::default();
        registry.register(
            "ferry_mirror_process_resident_memory_bytes",
            "Resident set size of the mirror process",
            process_rss.clone(),
        );
        let process_cpu = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "ferry_mirror_process_cpu_seconds",
            "CPU time used by the mirror process (user + system)",
            process_cpu.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry: parking_lot::Mutex::new(registry),
                lag,
                offsets,
                records,
                bytes,
                latency,
                route_active,
                route_healthy,
                alarms,
                events,
                partitions,
                rpo,
                rpo_max,
                lost,
                verified_bytes,
                verify_mismatches,
                discovery_rounds,
                process_rss,
                process_cpu,
            }),
        }
    }

    /// Counts a discovery round: `read`, or skipped as `unchanged`.
    pub fn discovery_round(&self, result: &'static str) {
        self.inner.discovery_rounds.get_or_create(&vec![("result", result.to_owned())]).inc();
    }

    /// Sets a partition's lag and offsets.
    pub fn partition(&self, topic: &str, partition: u32, source: u64, cache: u64, commit: u64, target: u64) {
        let tp = || vec![("topic", topic.to_owned()), ("partition", partition.to_string())];
        self.inner.lag.get_or_create(&tp()).set(source.saturating_sub(cache) as i64);
        for (kind, v) in [("source", source), ("cache", cache), ("commit", commit), ("target", target)] {
            let mut l = tp();
            l.push(("kind", kind.to_owned()));
            self.inner.offsets.get_or_create(&l).set(v as i64);
        }
    }

    /// Sets every partition's RPO, in seconds, and their largest.
    pub fn rpo<'a>(&self, partitions: impl IntoIterator<Item = (&'a str, u32, f64)>) {
        let mut max = 0.0f64;
        for (topic, partition, seconds) in partitions {
            self.inner
                .rpo
                .get_or_create(&vec![("topic", topic.to_owned()), ("partition", partition.to_string())])
                .set(seconds);
            max = max.max(seconds);
        }
        self.inner.rpo_max.set(max);
    }

    /// Counts offsets lost before mirroring on a partition (0 exposes the series).
    pub fn lost_before_mirroring(&self, topic: &str, partition: u32, records: u64) {
        self.inner
            .lost
            .get_or_create(&vec![("topic", topic.to_owned()), ("partition", partition.to_string())])
            .inc_by(records);
    }

    /// Counts source batch bytes the verifier compared with their copies.
    pub fn verified(&self, bytes: u64) {
        self.inner.verified_bytes.inc_by(bytes);
    }

    /// Counts a verify_mismatch.
    pub fn verify_mismatch(&self) {
        self.inner.verify_mismatches.inc();
    }

    /// Forgets a partition's series (it moved to another process or its topic was removed).
    pub fn remove_partition(&self, topic: &str, partition: u32) {
        let tp = || vec![("topic", topic.to_owned()), ("partition", partition.to_string())];
        self.inner.lag.remove(&tp());
        self.inner.rpo.remove(&tp());
        self.inner.lost.remove(&tp());
        for kind in ["source", "cache", "commit", "target"] {
            let mut l = tp();
            l.push(("kind", kind.to_owned()));
            self.inner.offsets.remove(&l);
        }
    }

    /// Counts records and bytes received from the source.
    pub fn received(&self, records: u64, bytes: u64) {
        self.inner.records.get_or_create(&vec![("direction", "in".to_owned())]).inc_by(records);
        self.inner.bytes.get_or_create(&vec![("direction", "in".to_owned())]).inc_by(bytes);
    }

    /// Counts records and bytes newly written to the target, and the replication latency of the append.
    pub fn appended(&self, records: u64, bytes: u64, latency_seconds: Option<f64>) {
        self.inner.records.get_or_create(&vec![("direction", "out".to_owned())]).inc_by(records);
        self.inner.bytes.get_or_create(&vec![("direction", "out".to_owned())]).inc_by(bytes);
        if let Some(l) = latency_seconds {
            self.inner.latency.observe(l.max(0.0));
        }
    }

    /// Sets a route's active and healthy gauges.
    pub fn route(&self, route: &str, active: bool, healthy: bool) {
        let l = vec![("route", route.to_owned())];
        self.inner.route_active.get_or_create(&l).set(i64::from(active));
        self.inner.route_healthy.get_or_create(&l).set(i64::from(healthy));
    }

    /// Counts an alarm outcome on a channel (`sent`, `suppressed`, `failed`, `dropped`).
    pub fn alarm(&self, channel: &str, outcome: &str) {
        self.inner.alarms.get_or_create(&vec![("channel", channel.to_owned()), ("outcome", outcome.to_owned())]).inc();
    }

    /// Counts `n` alarm outcomes at once on a channel (e.g. events lost by a lagging subscriber).
    pub fn alarm_by(&self, channel: &str, outcome: &str, n: u64) {
        self.inner
            .alarms
            .get_or_create(&vec![("channel", channel.to_owned()), ("outcome", outcome.to_owned())])
            .inc_by(n);
    }

    /// The count of an alarm outcome so far.
    pub fn alarm_count(&self, channel: &str, outcome: &str) -> u64 {
        self.inner.alarms.get_or_create(&vec![("channel", channel.to_owned()), ("outcome", outcome.to_owned())]).get()
    }

    /// Counts an event.
    pub fn event(&self, name: &str) {
        self.inner.events.get_or_create(&vec![("event", name.to_owned())]).inc();
    }

    /// Exposes the event counters of `names` at 0. A series that only appears with its first increment is
    /// invisible to Prometheus's increase(), so the first partition_diverged would never fire the alert rule: the
    /// event bus exposes every kind when it is made.
    pub fn expose_events<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            let _ = self.inner.events.get_or_create(&vec![("event", name.to_owned())]);
        }
    }

    /// Sets how many partitions are in each state.
    pub fn partition_states(&self, counts: &[(&str, i64)]) {
        for (state, n) in counts {
            self.inner.partitions.get_or_create(&vec![("state", (*state).to_owned())]).set(*n);
        }
    }

    /// Sets the process gauges.
    pub fn process(&self, rss_bytes: u64, cpu_seconds: f64) {
        self.inner.process_rss.set(rss_bytes as i64);
        self.inner.process_cpu.set(cpu_seconds);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.inner.registry.lock();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_the_contract_names() {
        let m = Metrics::new();
        m.partition("orders", 3, 100, 90, 80, 90);
        m.received(5, 500);
        m.appended(5, 500, Some(0.01));
        m.route("primary", true, true);
        m.alarm("ops", "sent");
        m.rpo([("orders", 3, 2.5), ("orders", 4, 7.25)]);
        m.lost_before_mirroring("orders", 3, 40);
        m.verified(4096);
        m.verify_mismatch();
        let text = m.encode();
        for needle in [
            "ferry_mirror_partition_lag_records{topic=\"orders\",partition=\"3\"} 10",
            "ferry_mirror_records_total{direction=\"in\"} 5",
            "ferry_mirror_bytes_total{direction=\"out\"} 500",
            "ferry_mirror_replication_latency_seconds_count 1",
            "ferry_mirror_route_active{route=\"primary\"} 1",
            "ferry_mirror_route_healthy{route=\"primary\"} 1",
            "ferry_alarms_total{channel=\"ops\",outcome=\"sent\"} 1",
            "ferry_mirror_rpo_seconds{topic=\"orders\",partition=\"3\"} 2.5",
            "ferry_mirror_rpo_max_seconds 7.25",
            "ferry_mirror_records_lost_before_mirroring_total{topic=\"orders\",partition=\"3\"} 40",
            "ferry_mirror_verified_bytes_total 4096",
            "ferry_mirror_verify_mismatch_total 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
