//! Unit tests of the egress: failover, switch-back, cluster-id checks, manual switches and stream failures.

use std::time::Duration;

use super::*;
use crate::config::{ClusterKind, HealthConfig, Route, SwitchBack};
use crate::events::EventKind;
use crate::metrics::Metrics;

pub(crate) fn source(threshold: u32, switch_back: SwitchBack) -> SourceConfig {
    SourceConfig {
        cluster: "dc-a".into(),
        cluster_id: Some("A".into()),
        kind: ClusterKind::Ferry,
        token_file: None,
        token: None,
        tls: None,
        routes: vec![
            Route { name: "primary".into(), brokers: vec!["127.0.0.1:1".into()], bind: None, listener: None },
            Route { name: "backup".into(), brokers: vec!["127.0.0.1:2".into()], bind: None, listener: None },
        ],
        health: HealthConfig {
            check_interval: Duration::from_millis(100),
            timeout: Duration::from_millis(100),
            failure_threshold: threshold,
            switch_after: Duration::ZERO,
            switch_back,
            min_switch_interval: Duration::ZERO,
        },
        kafka: Default::default(),
    }
}

fn kinds(bus: &EventBus) -> Vec<EventKind> {
    bus.recent().iter().map(|e| e.kind).collect()
}

#[tokio::test]
async fn fails_over_after_threshold_and_only_to_the_right_cluster() {
    let bus = EventBus::new(Metrics::new());
    let e = EgressHandle::new(
        &source(2, SwitchBack::Manual),
        &ferry_routes(&source(2, SwitchBack::Manual), false, 4 << 20),
        None,
        bus.clone(),
    )
    .unwrap();
    // The primary worked once; the backup leads to another cluster: never used.
    e.probe_result(0, Ok("A".into()));
    e.probe_result(1, Ok("B".into()));
    e.probe_result(0, Err("refused".into()));
    e.probe_result(0, Err("refused".into()));
    e.evaluate(&mut e.shared.inner.lock());
    assert_eq!(e.active().name, "primary");
    assert!(e.view().routes[1].last_error.as_deref().unwrap().contains("not the source cluster"));
    // Now the backup reports the right id: switch.
    e.probe_result(1, Ok("A".into()));
    e.evaluate(&mut e.shared.inner.lock());
    assert_eq!(e.active().name, "backup");
    assert_eq!(
        kinds(&bus),
        vec![EventKind::SourceNetNotAvailable, EventKind::SourceNetNotAvailable, EventKind::SourceNetBeSwitched]
    );
    // Primary recovers: notice, but manual switch-back stays on backup.
    e.probe_result(0, Ok("A".into()));
    e.evaluate(&mut e.shared.inner.lock());
    assert_eq!(e.active().name, "backup");
    assert_eq!(*kinds(&bus).last().unwrap(), EventKind::SourceNetRecovered);
}

#[tokio::test]
async fn the_cluster_id_is_learned_from_the_active_route_only() {
    let bus = EventBus::new(Metrics::new());
    let mut cfg = source(1, SwitchBack::Manual);
    cfg.cluster_id = None;
    let e = EgressHandle::new(&cfg, &ferry_routes(&cfg, false, 4 << 20), None, bus.clone()).unwrap();
    // The primary is down at the first round and a backup answers with another cluster's id: not learned,
    // and the backup is not healthy.
    e.probe_result(0, Err("refused".into()));
    e.probe_result(1, Ok("X".into()));
    assert_eq!(e.expected_cluster_id(), None);
    assert!(!e.view().routes[1].healthy);
    e.evaluate(&mut e.shared.inner.lock());
    assert_eq!(e.active().name, "primary", "never switch into an unverified cluster");
    // The primary answers: its id is the source's; the backup is judged against it.
    e.probe_result(0, Ok("A".into()));
    e.probe_result(1, Ok("X".into()));
    assert_eq!(e.expected_cluster_id().as_deref(), Some("A"));
    assert!(!e.view().routes[1].healthy);
    e.probe_result(1, Ok("A".into()));
    assert!(e.view().routes[1].healthy);
    // The primary failed its threshold (1) before it ever worked: a misconfiguration alarm, once.
    let syncs = bus.recent().iter().filter(|ev| ev.kind == EventKind::SyncError).count();
    assert_eq!(syncs, 1);
    assert!(bus.recent().iter().any(|ev| ev.kind == EventKind::SyncError && ev.message.contains("has not reached")));
}

#[tokio::test]
async fn no_switch_forced_or_not_leads_into_another_cluster() {
    let bus = EventBus::new(Metrics::new());
    let mut cfg = source(1, SwitchBack::Manual);
    cfg.cluster_id = None;
    let e = EgressHandle::new(&cfg, &ferry_routes(&cfg, false, 4 << 20), None, bus).unwrap();
    // The source's id is not known yet: a route never verified is refused, forced or not.
    e.probe_result(1, Ok("X".into()));
    assert!(matches!(e.switch("backup", true), Err(SwitchError::WrongCluster { .. })));
    // Known now: a route reporting another id is refused even when forced, and never fetched from.
    e.probe_result(0, Ok("A".into()));
    e.probe_result(1, Ok("X".into()));
    match e.switch("backup", true) {
        Err(SwitchError::WrongCluster { route, reason }) => {
            assert_eq!(route, "backup");
            assert!(reason.contains("\"X\"") && reason.contains("\"A\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((e.active().name.as_str(), e.view().pinned), ("primary", false));
    assert!(e.leads_elsewhere("backup").is_some_and(|r| r.contains("\"X\"")));
    assert_eq!(e.leads_elsewhere("primary"), None);
    // Once it leads to the source, a forced switch to it is taken.
    e.probe_result(1, Ok("A".into()));
    e.switch("backup", true).unwrap();
    assert_eq!(e.active().name, "backup");
}

#[tokio::test]
async fn manual_switch_pins_and_checks() {
    let bus = EventBus::new(Metrics::new());
    let e = EgressHandle::new(
        &source(1, SwitchBack::Auto),
        &ferry_routes(&source(1, SwitchBack::Auto), false, 4 << 20),
        None,
        bus,
    )
    .unwrap();
    assert_eq!(e.switch("nope", false), Err(SwitchError::UnknownRoute("nope".into())));
    assert!(matches!(e.switch("backup", false), Err(SwitchError::RouteUnhealthy { .. })));
    e.probe_result(1, Ok("A".into()));
    e.switch("backup", false).unwrap();
    assert_eq!(e.active().name, "backup");
    assert!(e.view().pinned);
    // Pinned: a healthy primary with auto switch-back does not move it.
    e.probe_result(0, Ok("A".into()));
    e.evaluate(&mut e.shared.inner.lock());
    assert_eq!(e.active().name, "backup");
    e.unpin();
    assert_eq!(e.active().name, "primary");
}

#[tokio::test]
async fn stream_failures_count_even_while_probes_pass() {
    let bus = EventBus::new(Metrics::new());
    let e = EgressHandle::new(
        &source(2, SwitchBack::Manual),
        &ferry_routes(&source(2, SwitchBack::Manual), false, 4 << 20),
        None,
        bus,
    )
    .unwrap();
    e.probe_result(0, Ok("A".into()));
    e.probe_result(1, Ok("A".into()));
    e.report_failure("primary", "stream silent");
    e.probe_result(0, Ok("A".into()));
    e.report_failure("primary", "stream silent");
    assert_eq!(e.active().name, "backup");
}
