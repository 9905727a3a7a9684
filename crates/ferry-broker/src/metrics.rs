//! The broker's Prometheus metrics on `[metrics] listen` (`GET /metrics`, the text format), built on each scrape
//! from the partitions and, on a cluster member, the replication state:
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `ferry_broker_partition_high_watermark` | topic, partition | the end clients read to (a single broker's: its log end) |
//! | `ferry_broker_partition_log_end_offset` | topic, partition | the local log end |
//! | `ferry_broker_partition_leader_epoch` | topic, partition | raft3: the leader epoch this replica knows |
//! | `ferry_broker_partition_isr_size` | topic, partition | raft3: in-sync replicas, as etcd last said |
//! | `ferry_broker_partition_leader` | topic, partition | raft3: 1 when this broker leads it |
//! | `ferry_broker_under_replicated_partitions` | | replicated partitions led here with fewer in sync than replicas |
//! | `ferry_broker_partitions_at_risk` | | double_write partitions led here in the risk phase: writes acknowledged by the leader alone |
//! | `ferry_broker_replication_lag_records` | topic, partition, follower | raft3, on the leader: offsets a follower is behind |
//! | `ferry_broker_replication_lag_bytes` | topic, partition, follower | raft3, on the leader: bytes of log a follower is behind (to within one index interval) |
//! | `ferry_broker_controller` | | 1 when this broker is the controller |
//! | `ferry_broker_etcd_reachable` | | 1 when the last read of etcd succeeded |
//! | `ferry_broker_subscribe_beats_total` | | position beats sent on subscribe streams: each carries every subscribed partition's position, on the stream's beat, busy or idle |
//! | `ferry_broker_delay_pending`, `ferry_broker_delay_pending_bytes` | partition (of `__ferry_delay`) | delayed records pending in the delay-store partitions this broker owns |
//! | `ferry_broker_delay_due_backlog` | partition | delayed records already due, not yet moved |
//! | `ferry_broker_delay_earliest_due_ms`, `ferry_broker_delay_latest_due_ms` | partition | earliest and latest due time pending (0: none) |
//! | `ferry_broker_delay_moves_total` | | delayed records moved to their partitions since start |
//! | `ferry_broker_delay_lateness_ms` | quantile (0.5, 0.99) | how late the last 10,000 moved records became readable |
//! | `ferry_broker_group_backlog` | group, mode | a queue, serial or broadcast group owned here: records not settled (broadcast: the slowest member's lag) |
//! | `ferry_broker_group_in_flight`, `ferry_broker_group_retry_wait` | group, mode | records locked to members now; records failed and waiting for their retry |
//! | `ferry_broker_group_redeliveries`, `ferry_broker_group_lock_expiries`, `ferry_broker_group_dead_lettered`, `ferry_broker_group_settled` | group, mode | since this owner loaded the group: deliveries after the first, locks that ended unanswered, dead letters, successes |
//! | `ferry_broker_group_members` | group, mode | live members |
//! | `ferry_broker_events_total` | event | leader_change, leader_elected, isr_shrink, isr_expand, fenced, replica_repair, move_done, risk_phase_entered, risk_phase_left |

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use std::sync::OnceLock;

use crate::cluster::manager::Replication;
use crate::delay::Delays;
use crate::node::registry::BrokerCore;
use crate::readiness::Readiness;

type Labels = Vec<(&'static str, String)>;

/// What the endpoint reads: the broker's partitions, its replication manager once it has joined its cluster, and
/// its readiness.
#[derive(Clone)]
pub struct Sources {
    core: Arc<BrokerCore>,
    replication: Arc<OnceLock<Arc<Replication>>>,
    ready: Arc<Readiness>,
    txns: Arc<OnceLock<Arc<crate::txn::Transactions>>>,
    delays: Arc<OnceLock<Arc<Delays>>>,
    shares: crate::share::gauges::ShareGauges,
}

impl Sources {
    /// The sources of a broker over `core`, whose replication manager is put in `replication` once it exists.
    pub fn new(core: Arc<BrokerCore>, replication: Arc<OnceLock<Arc<Replication>>>, ready: Arc<Readiness>) -> Sources {
        Sources { core, replication, ready, txns: Arc::default(), delays: Arc::default(), shares: Default::default() }
    }

    /// Also the transactional messages' counts, once `txns` holds them.
    pub fn with_transactions(mut self, txns: Arc<OnceLock<Arc<crate::txn::Transactions>>>) -> Sources {
        self.txns = txns;
        self
    }

    /// Reports the message-model groups owned here.
    pub fn with_shares(mut self, shares: crate::share::gauges::ShareGauges) -> Sources {
        self.shares = shares;
        self
    }

    /// Reports the delay timer put in `delays` once it runs.
    pub fn with_delays(mut self, delays: Arc<OnceLock<Arc<Delays>>>) -> Sources {
        self.delays = delays;
        self
    }
}

/// Serves `GET /metrics` and `GET /readyz` on `listener` until `stop`.
pub async fn serve(listener: tokio::net::TcpListener, sources: Sources, stop: CancellationToken) {
    let app = Router::new().route("/metrics", get(scrape)).route("/readyz", get(readyz)).with_state(sources);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        tracing::error!(error = %e, "the metrics endpoint failed");
    }
}

async fn scrape(State(s): State<Sources>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        render(
            &s.core,
            s.replication.get().map(|r| &**r),
            s.txns.get().map(|t| &**t),
            s.delays.get().map(|d| &**d),
            Some(&s.shares),
        ),
    )
}

async fn readyz(State(s): State<Sources>) -> impl IntoResponse {
    match s.ready.state() {
        Ok(()) => (axum::http::StatusCode::OK, "ready\n".to_owned()),
        Err(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

fn family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    registry.register(name, help, f.clone());
    f
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g = Gauge::<i64>::default();
    g.set(value);
    registry.register(name, help, g);
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The metrics text of `core` (and `replication`, on a cluster member; the transactions', the delay timer's and the
/// message-model groups').
pub fn render(
    core: &BrokerCore,
    replication: Option<&Replication>,
    txns: Option<&crate::txn::Transactions>,
    delays: Option<&Delays>,
    shares: Option<&crate::share::gauges::ShareGauges>,
) -> String {
    let mut r = Registry::default();
    let hw = family(&mut r, "ferry_broker_partition_high_watermark", "The offset clients read up to, per partition");
    let leo = family(&mut r, "ferry_broker_partition_log_end_offset", "The local log end offset, per partition");
    let epoch = family(&mut r, "ferry_broker_partition_leader_epoch", "raft3: the leader epoch this replica knows");
    let isr = family(&mut r, "ferry_broker_partition_isr_size", "raft3: in-sync replicas, as etcd last said");
    let leads = family(&mut r, "ferry_broker_partition_leader", "raft3: 1 when this broker leads the partition");
    let lag =
        family(&mut r, "ferry_broker_replication_lag_records", "raft3, on the leader: offsets a follower is behind");
    let lag_bytes = family(
        &mut r,
        "ferry_broker_replication_lag_bytes",
        "raft3, on the leader: bytes of log a follower is behind (to within one index interval)",
    );
    let snapshot = replication.map(Replication::snapshot);
    let (mut under, mut at_risk) = (0, 0);
    for topic in core.topics() {
        for p in topic.partitions() {
            let labels: Labels = vec![("topic", p.topic().to_owned()), ("partition", p.index().to_string())];
            let log_end = p.log().log_end_offset();
            hw.get_or_create(&labels).set(as_i64(p.visible_end()));
            leo.get_or_create(&labels).set(as_i64(log_end));
            let Some(replica) = p.replica() else { continue };
            epoch.get_or_create(&labels).set(i64::from(replica.leader_epoch()));
            let state = snapshot.as_ref().and_then(|s| s.partitions.get(&(p.topic().to_owned(), p.index())));
            if let Some(v) = state {
                isr.get_or_create(&labels).set(v.state.isr.len() as i64);
            }
            let leading = replica.leading().ok();
            leads.get_or_create(&labels).set(i64::from(leading.is_some()));
            if let Some(l) = leading {
                if l.isr.len() < l.replicas.len() {
                    under += 1;
                }
                if replica.min_insync() < 2 && l.isr.len() < 2 {
                    at_risk += 1;
                }
                for (id, f) in &l.followers {
                    let mut labels = labels.clone();
                    labels.push(("follower", id.to_string()));
                    lag.get_or_create(&labels).set(as_i64(log_end.saturating_sub(f.leo)));
                    lag_bytes.get_or_create(&labels).set(as_i64(p.log().bytes_from(f.leo)));
                }
            }
        }
    }
    gauge(
        &mut r,
        "ferry_broker_under_replicated_partitions",
        "replicated partitions led here with fewer in sync than replicas",
        under,
    );
    gauge(
        &mut r,
        "ferry_broker_partitions_at_risk",
        "double_write partitions led here in the risk phase: writes acknowledged by the leader alone",
        at_risk,
    );
    let beats = Counter::<u64>::default();
    beats.inc_by(core.beats());
    r.register(
        "ferry_broker_subscribe_beats",
        "Position beats sent on subscribe streams (every subscribed partition's position, busy or idle)",
        beats,
    );
    if let Some(rep) = replication {
        gauge(
            &mut r,
            "ferry_broker_controller",
            "1 when this broker is the controller",
            i64::from(rep.is_controller()),
        );
        gauge(
            &mut r,
            "ferry_broker_etcd_reachable",
            "1 when the last read of etcd succeeded",
            i64::from(rep.etcd_reachable()),
        );
        let events = Family::<Labels, Counter>::default();
        r.register("ferry_broker_events", "Cluster events (each also a log line with event=...)", events.clone());
        for (name, count) in rep.events().counts() {
            events.get_or_create(&vec![("event", name.to_owned())]).inc_by(count);
        }
    }
    if let Some(t) = txns {
        txn_metrics(&mut r, &t.counters);
    }
    if let Some(d) = delays {
        d.register_metrics(&mut r);
    }
    if let Some(g) = shares {
        g.register(&mut r);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// The `ferry_broker_txn_*` metrics.
fn txn_metrics(r: &mut Registry, c: &crate::txn::Counters) {
    use std::sync::atomic::Ordering::Relaxed;
    gauge(r, "ferry_broker_txn_pending", "Pending transactions owned here", c.pending.load(Relaxed));
    gauge(
        r,
        "ferry_broker_txn_waiting",
        "Pending transactions due for a check with no producer of their group connected",
        c.waiting.load(Relaxed),
    );
    for (name, help, v) in [
        ("ferry_broker_txn_committed", "Transactions committed here", &c.committed),
        ("ferry_broker_txn_rolled_back", "Transactions rolled back here, expired ones included", &c.rolled_back),
        ("ferry_broker_txn_expired", "Transactions rolled back after max_checks unknown answers", &c.expired),
        ("ferry_broker_txn_checks_sent", "Check-back requests sent to producers", &c.checks_sent),
        ("ferry_broker_txn_checks_answered", "Check-back requests producers answered", &c.checks_answered),
        ("ferry_broker_txn_waits", "Times a due transaction started waiting for a producer of its group", &c.waits),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(v.load(Relaxed));
        r.register(name, help, counter);
    }
}
