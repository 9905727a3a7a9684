//! The JSON documents of the read endpoints, built from snapshots of the shared state, and the readiness rule.
//!
//! Everything here is a pure function of snapshots ([`PartitionView`], [`EgressView`], the rate meters), so the
//! documents are consistent within one answer and the rules can be tested with constructed views. The document
//! types also deserialize (missing fields default), so clients such as `ferryctl` read them through the same types.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::egress::EgressView;
use crate::events::{Event, Severity};
use crate::handle::MirrorHandle;
use crate::state::{PartitionState, PartitionView, SideRates};

/// Partition state names, in the order documents list them (`stalled` is `mirroring` without progress).
pub const STATES: [&str; 5] = ["starting", "mirroring", "stalled", "paused", "halted"];

/// Counts partitions per state; every state in [`STATES`] is present, possibly with 0.
pub fn count_states<'a>(views: impl IntoIterator<Item = &'a PartitionView>) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = STATES.iter().map(|s| ((*s).to_owned(), 0)).collect();
    for v in views {
        *out.entry(v.state.name().to_owned()).or_default() += 1;
    }
    out
}

/// A rate over the 1 s, 10 s and 60 s windows.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Windows {
    /// Last complete second.
    #[serde(rename = "1s")]
    pub w1: f64,
    /// Average over the last 10 complete seconds.
    #[serde(rename = "10s")]
    pub w10: f64,
    /// Average over the last 60 complete seconds.
    #[serde(rename = "60s")]
    pub w60: f64,
}

/// The rates of one side.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SideRateView {
    /// Records per second.
    pub records_per_sec: Windows,
    /// Bytes per second.
    pub bytes_per_sec: Windows,
}

impl SideRateView {
    fn of(rates: &SideRates) -> SideRateView {
        let w = |m: &crate::state::RateMeter| Windows { w1: m.rate(1), w10: m.rate(10), w60: m.rate(60) };
        SideRateView { records_per_sec: w(&rates.records), bytes_per_sec: w(&rates.bytes) }
    }
}

/// Source (received) and target (appended) rates.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RatesView {
    /// Received from the source.
    pub source: SideRateView,
    /// Appended to the target.
    pub target: SideRateView,
}

/// Totals since the process started, and the partitions it owns now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Totals {
    /// Records fetched from the source (a batch fetched again counts again).
    pub records_in: u64,
    /// Batch bytes fetched from the source.
    pub bytes_in: u64,
    /// Records this process newly wrote to the target (batches the target already held are not counted).
    pub records_out: u64,
    /// Batch bytes this process newly wrote to the target.
    pub bytes_out: u64,
    /// Mirrored source topics.
    pub topics: u64,
    /// Partitions owned by this process.
    pub partitions: u64,
    /// Owned partitions per state (every state listed).
    pub partitions_by_state: BTreeMap<String, u64>,
    /// Sum of the owned partitions' lag.
    pub lag: u64,
    /// The largest RPO of the owned partitions, seconds: how long the oldest record not yet on the target has
    /// waited.
    pub rpo_max_seconds: f64,
}

/// `GET /api/v1/status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct StatusView {
    /// `mirror.name`.
    pub mirror: String,
    /// Source cluster alias.
    pub source_cluster: String,
    /// Target cluster alias.
    pub target_cluster: String,
    /// Seconds since the process started.
    pub uptime_seconds: u64,
    /// The active source route.
    pub active_route: String,
    /// Whether a manual switch pinned it.
    pub pinned: bool,
    /// Whether the target is considered unreachable.
    pub target_down: bool,
    /// Rates over 1 s, 10 s and 60 s.
    pub rates: RatesView,
    /// Totals.
    pub totals: Totals,
    /// Paused source topics, sorted.
    pub paused_topics: Vec<String>,
    /// The failover job this process last ran or read, if any.
    pub failover: Option<FailoverSummary>,
}

/// A failover job in the status document (`GET /api/v1/failover` has the whole job).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct FailoverSummary {
    /// The job id.
    pub job: String,
    /// The last step completed (`started`, `fenced`, `drained`, `groups_synced`, `promoted`, `done`).
    pub step: String,
    /// The source topics' fence epoch.
    pub fence_epoch: u64,
    /// Whether it runs in this process now.
    pub running: bool,
    /// The error its last run stopped at.
    pub error: Option<String>,
    /// Topics it covers.
    pub topics: usize,
}

/// Builds the status document.
pub fn status(handle: &MirrorHandle) -> StatusView {
    let shared = &handle.shared;
    let views = shared.partition_views(None);
    let egress = handle.egress.view();
    let total = |r: &SideRates| (r.records_total.load(Ordering::Relaxed), r.bytes_total.load(Ordering::Relaxed));
    let (records_in, bytes_in) = total(&shared.source_rates);
    let (records_out, bytes_out) = total(&shared.target_rates);
    StatusView {
        mirror: handle.name.clone(),
        source_cluster: handle.source_cluster.clone(),
        target_cluster: handle.target_cluster.clone(),
        uptime_seconds: shared.started.elapsed().as_secs(),
        active_route: egress.active,
        pinned: egress.pinned,
        target_down: handle.target_health.is_down(),
        rates: RatesView {
            source: SideRateView::of(&shared.source_rates),
            target: SideRateView::of(&shared.target_rates),
        },
        totals: Totals {
            records_in,
            bytes_in,
            records_out,
            bytes_out,
            topics: shared.topics.lock().len() as u64,
            partitions: views.len() as u64,
            partitions_by_state: count_states(&views),
            lag: views.iter().map(|v| v.lag).sum(),
            rpo_max_seconds: views.iter().map(|v| v.rpo_seconds).fold(0.0, f64::max),
        },
        paused_topics: shared.paused.lock().iter().cloned().collect(),
        failover: handle.failover.last().map(|j| FailoverSummary {
            job: j.id.clone(),
            step: j.step.name().to_owned(),
            fence_epoch: j.epoch,
            running: handle.failover.running(),
            error: j.error.clone(),
            topics: j.topics.len(),
        }),
    }
}

/// One source topic in `GET /api/v1/topics`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopicView {
    /// Source topic.
    pub topic: String,
    /// Target topic.
    pub target_topic: String,
    /// Partitions owned by this process.
    pub partitions: u64,
    /// Sum of their lag.
    pub lag: u64,
    /// The largest RPO of its partitions, seconds.
    pub rpo_max_seconds: f64,
    /// Sum of their source log ends.
    pub source_offset: u64,
    /// Sum of their cache offsets.
    pub cache_offset: u64,
    /// Sum of their committed offsets.
    pub commit_offset: u64,
    /// Sum of their target log ends.
    pub target_offset: u64,
    /// Partitions per state (every state listed).
    pub states: BTreeMap<String, u64>,
    /// Whether an operator paused the topic.
    pub paused: bool,
}

/// Builds the per-topic documents, sorted by source topic.
pub fn topics(handle: &MirrorHandle) -> Vec<TopicView> {
    let shared = &handle.shared;
    let views = shared.partition_views(None);
    let names = shared.topics.lock().clone();
    let paused = shared.paused.lock().clone();
    names
        .into_iter()
        .map(|(topic, target_topic)| {
            let mine: Vec<&PartitionView> = views.iter().filter(|v| v.topic == topic).collect();
            let sum = |f: fn(&PartitionView) -> u64| mine.iter().map(|v| f(v)).sum();
            TopicView {
                partitions: mine.len() as u64,
                lag: sum(|v| v.lag),
                rpo_max_seconds: mine.iter().map(|v| v.rpo_seconds).fold(0.0, f64::max),
                source_offset: sum(|v| v.source_offset),
                cache_offset: sum(|v| v.cache_offset),
                commit_offset: sum(|v| v.commit_offset),
                target_offset: sum(|v| v.target_offset),
                states: count_states(mine.iter().copied()),
                paused: paused.contains(&topic),
                topic,
                target_topic,
            }
        })
        .collect()
}

/// One entry of `GET /api/v1/events`: the event plus the severity the shipped rules give its kind.
#[derive(Debug, Serialize)]
pub struct EventView<'a> {
    /// The event.
    #[serde(flatten)]
    pub event: &'a Event,
    /// `info`, `warning` or `critical`.
    pub severity: Severity,
}

/// One reason the mirror is not ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotReady {
    /// Stable short code: `route_unavailable`, `route_unhealthy`, `target_down`, `partition_halted`,
    /// `partition_stalled`, `starting`.
    pub reason: &'static str,
    /// One sentence for humans.
    pub message: String,
    /// The route involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The source topic involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The partition involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
}

/// `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// True when mirroring.
    pub ready: bool,
    /// The distinct reason codes, sorted.
    pub reasons: Vec<&'static str>,
    /// Each reason with its route, topic or partition.
    pub details: Vec<NotReady>,
}

impl NotReady {
    fn new(reason: &'static str, message: String) -> NotReady {
        NotReady { reason, message, route: None, topic: None, partition: None }
    }
}

/// The readiness rule. Not ready when:
/// - the active route is unavailable (`route_unavailable`: it failed `failure_threshold` times in a row) or
///   unhealthy (`route_unhealthy`: its last probe failed or it leads to another cluster);
/// - the target is down (`target_down`);
/// - a partition is halted (`partition_halted`) or stalled (`partition_stalled`);
/// - topics are known but no owned partition has left `starting` yet (`starting`).
///
/// Paused partitions are an operator's choice and do not make the mirror unready.
pub fn readiness(
    egress: &EgressView,
    target_down: bool,
    topics_known: usize,
    partitions: &[PartitionView],
) -> Readiness {
    let mut details = Vec::new();
    match egress.routes.iter().find(|r| r.name == egress.active) {
        Some(r) if !r.available => details.push(NotReady {
            route: Some(r.name.clone()),
            ..NotReady::new(
                "route_unavailable",
                format!(
                    "active source route {:?} is unavailable: {}",
                    r.name,
                    r.last_error.as_deref().unwrap_or("repeated failures")
                ),
            )
        }),
        Some(r) if !r.healthy => details.push(NotReady {
            route: Some(r.name.clone()),
            ..NotReady::new(
                "route_unhealthy",
                format!(
                    "active source route {:?} is unhealthy: {}",
                    r.name,
                    r.last_error.as_deref().unwrap_or("not probed successfully yet")
                ),
            )
        }),
        Some(_) => {}
        None => details.push(NotReady::new("route_unhealthy", format!("no route named {:?}", egress.active))),
    }
    if target_down {
        details.push(NotReady::new("target_down", "the target cluster cannot be reached".into()));
    }
    for p in partitions {
        let (reason, what) = match p.state {
            PartitionState::Halted => ("partition_halted", "halted"),
            PartitionState::Stalled => ("partition_stalled", "stalled"),
            _ => continue,
        };
        let why = p.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        details.push(NotReady {
            topic: Some(p.topic.clone()),
            partition: Some(p.partition),
            ..NotReady::new(reason, format!("partition {}/{} is {what}{why}", p.topic, p.partition))
        });
    }
    if topics_known > 0 && partitions.iter().all(|p| p.state == PartitionState::Starting) {
        details.push(NotReady::new(
            "starting",
            format!("{topics_known} topic(s) known but no partition is mirroring yet ({} starting)", partitions.len()),
        ));
    }
    let mut reasons: Vec<&'static str> = details.iter().map(|d| d.reason).collect();
    reasons.sort_unstable();
    reasons.dedup();
    Readiness { ready: details.is_empty(), reasons, details }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::RouteView;

    fn route(name: &str, active: bool, healthy: bool, available: bool) -> RouteView {
        RouteView {
            name: name.into(),
            brokers: vec!["127.0.0.1:1".into()],
            bind: None,
            active,
            healthy,
            available,
            consecutive_failures: 0,
            stream_failures: 0,
            cluster_id: Some("A".into()),
            last_error: (!healthy).then(|| "connection refused".to_owned()),
            last_probe_ms_ago: Some(5),
        }
    }

    fn egress(healthy: bool, available: bool) -> EgressView {
        EgressView {
            active: "primary".into(),
            pinned: false,
            expected_cluster_id: Some("A".into()),
            routes: vec![route("primary", true, healthy, available), route("backup", false, false, true)],
        }
    }

    fn partition(topic: &str, p: u32, state: &str) -> PartitionView {
        PartitionView {
            topic: topic.into(),
            partition: p,
            target_topic: topic.into(),
            source_offset: 10,
            source_log_start_offset: 0,
            cache_offset: 7,
            commit_offset: 5,
            target_offset: 7,
            lag: 3,
            state: PartitionState::from_name(state).expect("a state name"),
            last_error: (state == "halted").then(|| "diverged at 4".to_owned()),
            latency_ms: 1,
            ..Default::default()
        }
    }

    #[test]
    fn ready_when_route_healthy_target_up_and_partitions_mirroring() {
        let parts = [partition("a", 0, "mirroring"), partition("a", 1, "paused"), partition("b", 0, "starting")];
        let r = readiness(&egress(true, true), false, 2, &parts);
        assert_eq!(r, Readiness { ready: true, reasons: vec![], details: vec![] });
        // Nothing to mirror yet is ready too (discovery found no topic).
        assert!(readiness(&egress(true, true), false, 0, &[]).ready);
    }

    #[test]
    fn each_condition_gives_its_reason() {
        let r = readiness(&egress(false, true), false, 1, &[partition("a", 0, "mirroring")]);
        assert_eq!(r.reasons, ["route_unhealthy"]);
        assert_eq!(r.details[0].route.as_deref(), Some("primary"));
        assert!(r.details[0].message.contains("connection refused"));

        let r = readiness(&egress(false, false), true, 1, &[partition("a", 0, "mirroring")]);
        assert_eq!(r.reasons, ["route_unavailable", "target_down"]);

        let parts = [partition("a", 0, "halted"), partition("a", 1, "stalled"), partition("a", 2, "mirroring")];
        let r = readiness(&egress(true, true), false, 1, &parts);
        assert!(!r.ready);
        assert_eq!(r.reasons, ["partition_halted", "partition_stalled"]);
        assert_eq!((r.details[0].topic.as_deref(), r.details[0].partition), (Some("a"), Some(0)));
        assert_eq!(r.details[0].message, "partition a/0 is halted: diverged at 4");
        assert_eq!(r.details[1].message, "partition a/1 is stalled");

        let r = readiness(&egress(true, true), false, 1, &[partition("a", 0, "starting")]);
        assert_eq!(r.reasons, ["starting"]);
        let r = readiness(&egress(true, true), false, 1, &[]);
        assert_eq!(r.reasons, ["starting"]);
    }

    #[test]
    fn state_counts_list_every_state() {
        let parts = [partition("a", 0, "halted"), partition("a", 1, "mirroring"), partition("a", 2, "mirroring")];
        let c = count_states(&parts);
        assert_eq!(
            c.into_iter().collect::<Vec<_>>(),
            [
                ("halted".to_owned(), 1),
                ("mirroring".to_owned(), 2),
                ("paused".to_owned(), 0),
                ("stalled".to_owned(), 0),
                ("starting".to_owned(), 0)
            ]
        );
    }
}
