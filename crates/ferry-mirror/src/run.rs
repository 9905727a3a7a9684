//! Bootstrap: the components in order — metrics and events, the target, egress, alarms, the monitor, the target
//! and source watches, topic discovery, the fetcher and the SyncManager with its lanes, the verifier, group sync —
//! and on shutdown the same in reverse: stop fetching, drain in-flight appends, commit, leave, then the rest.
//!
//! Every task hangs off one tree of cancellation tokens and is owned by a `JoinSet` (or a handle that aborts on
//! drop), so no task outlives `run()`: not on an early return, and not after the shutdown grace, when whatever is
//! left is aborted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_client::RetryPolicy;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::alarm::{AlarmIdentity, Alarmer};
use crate::config::{ClusterKind, MirrorConfig, StartPosition};
use crate::egress::EgressHandle;
use crate::events::EventBus;
use crate::fetch::Fetcher;
use crate::group_sync::GroupSync;
pub use crate::handle::{MirrorHandle, UnknownTopic};
use crate::lane::core::SourceKind;
use crate::lane::{LaneCtx, LaneIo};
use crate::metrics::Metrics;
use crate::ratelimit::RateLimits;
use crate::source_watch::SourceWatch;
use crate::state::Shared;
use crate::sync::{Links, SyncManager, SyncSettings};
use crate::target_health::TargetHealth;
use crate::target_watch::{TargetProbe, TargetWatch};
use crate::topics::{Naming, TopicAndOffsetManager, TopicSet};
use crate::verify::Verifier;

/// Why the mirror could not run.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// A client could not be built from the config.
    #[error("invalid connection settings: {0}")]
    Client(#[from] ferry_client::ClientError),
    /// The alarm rules or channels could not be set up.
    #[error(transparent)]
    Alarms(#[from] crate::alarm::AlarmError),
    /// The monitor could not start.
    #[error("monitor: {0}")]
    Monitor(String),
}

/// Options only the process knows.
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Write the monitor's bound address here once it listens.
    pub addr_file: Option<PathBuf>,
    /// New configurations after SIGHUP (topics, groups and alarm rules are applied; the rest needs a restart).
    pub reload: Option<watch::Receiver<Arc<MirrorConfig>>>,
    /// Told the running mirror's handle once it is up (the demo uses it).
    pub on_started: Option<tokio::sync::oneshot::Sender<MirrorHandle>>,
}

/// The mirror's one retry policy for calls that may pass: 200 ms doubling to 5 s, with jitter.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(5),
        multiplier: 2.0,
        jitter: true,
        max_attempts: u32::MAX,
    }
}

/// Calls `f` under the retry policy until it succeeds or `shutdown`, logging each failure.
async fn until_ok<T, F, Fut>(what: &str, shutdown: &CancellationToken, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ferry_client::ClientError>>,
{
    let mut backoff = retry_policy().backoff();
    loop {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) => tracing::warn!(error = %e, "{what} failed; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(backoff.next().unwrap_or_default()) => {}
        }
    }
}

/// Runs the mirror until `shutdown` (SIGTERM/SIGINT), then stops gracefully within `sync.shutdown_timeout`.
pub async fn run(
    config: MirrorConfig,
    mut options: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), MirrorError> {
    // The token tree: `root` stops everything (dropped on any return); the pipeline and the components stop in turn.
    let root = CancellationToken::new();
    let _root_guard = root.clone().drop_guard();
    let components = root.child_token();
    let pipeline = root.child_token();
    let mut tasks: JoinSet<()> = JoinSet::new();

    let metrics = Metrics::new();
    let events = EventBus::new(metrics.clone());
    let shared = Arc::new(Shared::default());

    let target = crate::sides::target(&config)?;
    // Learn the source cluster id recorded on existing mirror topics, so a route into another cluster is refused
    // from the first probe. Bounded by the target probe's timeout: the monitor starts after this, and it must serve
    // while the target is down, also when the target hangs rather than refuses (the client would retry its request
    // timeout several times over).
    let listed = tokio::time::timeout(config.target.health.timeout, target.list_topics()).await;
    let learned = match listed {
        Ok(Ok(topics)) => topics
            .iter()
            .filter_map(|t| t.mirror.as_ref())
            .find(|m| m.source_cluster == config.source.cluster && !m.source_cluster_id.is_empty())
            .map(|m| m.source_cluster_id.clone()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "target not reachable at start; will keep trying");
            None
        }
        Err(_) => {
            let timeout = config.target.health.timeout;
            tracing::warn!(?timeout, "target did not answer at start; will keep trying");
            None
        }
    };
    let factory = |route: &crate::config::Route| crate::sides::source_route(&config, route);
    let egress = EgressHandle::new(&config.source, &factory, learned, events.clone())?;
    tasks.spawn(egress.clone().run(metrics.clone(), components.clone()));

    // Alarms: rules, channels and the lag/stall checks; SIGHUP sends new [alarms] settings on alarms_tx.
    let (alarms_tx, alarms_rx) = watch::channel(config.alarms.clone());
    let identity = AlarmIdentity {
        mirror: config.name.clone(),
        source_cluster: config.source.cluster.clone(),
        target_cluster: config.target.cluster.clone(),
    };
    let alarmer = Alarmer::new(&config.alarms, identity, events.clone(), metrics.clone())?;
    tasks.spawn(alarmer.run(Arc::clone(&shared), config.sync.stall_check_interval, alarms_rx, components.clone()));

    let links: Links = Arc::new(crate::sync::LinkMap::default());
    // `[target.health]`, each key defaulting to `[source.health]`'s.
    let health = &config.target.health;
    let target_health = Arc::new(TargetHealth::new(health.failure_threshold));
    let handle = MirrorHandle {
        name: config.name.clone(),
        source_cluster: config.source.cluster.clone(),
        target_cluster: config.target.cluster.clone(),
        shared: Arc::clone(&shared),
        egress: egress.clone(),
        events: events.clone(),
        metrics: metrics.clone(),
        links: Arc::clone(&links),
        target_health: Arc::clone(&target_health),
        failover: Arc::new(crate::failover::Failover::default()),
    };
    // The monitor serves from here on, also while the target is down and while the pipeline drains; it stops last.
    let monitor_stop = root.child_token();
    let (monitor_addr, monitor_task) = crate::monitor::start(handle.clone(), &config.monitor, monitor_stop.clone())
        .await
        .map_err(|e| MirrorError::Monitor(e.to_string()))?;
    let monitor_task = AbortOnDropHandle::new(monitor_task);
    if let Some(path) = &options.addr_file {
        // Write then rename, so a reader never sees a partial address.
        let tmp = path.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, monitor_addr.to_string()).and_then(|()| std::fs::rename(&tmp, path)) {
            tracing::warn!(file = %path.display(), error = %e, "cannot write the monitor address file");
        }
    }
    if let Some(tx) = options.on_started.take() {
        let _ = tx.send(handle.clone());
    }
    let probe = TargetProbe { check_interval: health.check_interval, timeout: health.timeout };
    let watch =
        TargetWatch::new(Arc::clone(&target), Arc::clone(&links), Arc::clone(&target_health), events.clone(), probe);
    tasks.spawn(watch.run(components.clone()));
    let source_health = &config.source.health;
    let source_watch =
        SourceWatch::new(egress.clone(), Arc::clone(&links), source_health.check_interval, source_health.timeout);
    tasks.spawn(source_watch.run(components.clone()));

    let Some(limits) = until_ok("reading the target's limits", &shutdown, || target.limits()).await else {
        return Ok(());
    };
    let source_group = format!("ferry-mirror.{}", config.name);
    let first_run_latest = if config.topics.start_position == StartPosition::Latest {
        let committed = until_ok("reading the mirror's source group", &shutdown, || {
            let source = Arc::clone(&egress.active().cluster);
            let group = source_group.clone();
            async move { source.committed(&group, &[]).await }
        })
        .await;
        let Some(committed) = committed else { return Ok(()) };
        committed.is_empty()
    } else {
        false
    };
    if first_run_latest {
        tracing::info!("first run: partitions present now start at the source's log end (start_position = latest)");
    }

    let (topics_tx, topics_rx) = watch::channel(Arc::new(TopicSet::default()));
    let (rules_tx, rules_rx) = watch::channel(config.topics.clone());
    let (groups_tx, groups_rx) = watch::channel(config.groups.clone());
    let manager = TopicAndOffsetManager::new(
        Naming {
            source_cluster: config.source.cluster.clone(),
            target_cluster: config.target.cluster.clone(),
            target_replication: config.target.replication.clone(),
        },
        rules_rx,
        Arc::clone(&target),
        egress.clone(),
        events.clone(),
        Arc::clone(&shared),
        topics_tx,
    );
    tasks.spawn(manager.run(components.clone()));

    let (gather, gather_task) =
        crate::lane::gather::Gather::new(Arc::clone(&target), egress.clone(), source_group.clone());
    tasks.spawn(gather_task.run(components.clone()));
    let io = Arc::new(LaneIo {
        target: Arc::clone(&target),
        egress: egress.clone(),
        limits: Arc::new(RateLimits::new(config.sync.max_bytes_per_sec, config.sync.max_records_per_sec)),
        target_health: Arc::clone(&target_health),
        events: events.clone(),
        source_group: source_group.clone(),
        retry: retry_policy(),
        gather,
    });
    let ctx = LaneCtx { io, metrics: metrics.clone(), shared: Arc::clone(&shared) };
    let fetch_stop = pipeline.child_token();
    let fetcher = Fetcher::new(
        egress.clone(),
        retry_policy(),
        crate::sides::session_factory(&config, egress.clone(), metrics.clone(), Arc::clone(&shared)),
        fetch_stop,
    );
    let source_kind = match config.source.kind {
        ClusterKind::Ferry => SourceKind::Ferry,
        ClusterKind::Kafka => SourceKind::Kafka,
    };
    let sync = SyncManager::new(
        SyncSettings {
            mirror_name: config.name.clone(),
            commit_interval: config.sync.commit_interval,
            queue_bytes: config.sync.queue_bytes,
            max_memory: config.sync.max_memory,
            max_request_bytes: config.sync.max_request_bytes.min(limits.max_message_bytes / 2).max(64 * 1024),
            session_timeout: config.sync.group_session_timeout,
            shutdown_timeout: config.sync.shutdown_timeout,
            first_run_latest,
            on_divergence: config.on_divergence,
            target_max_batch: limits.max_batch_bytes,
            source_kind,
        },
        ctx,
        Arc::clone(&target),
        topics_rx.clone(),
        events.subscribe(),
        fetcher,
        Arc::clone(&links),
        pipeline.child_token(),
    );
    let sync_stop = pipeline.child_token();
    let sync_task = AbortOnDropHandle::new(tokio::spawn(sync.run(sync_stop.clone())));
    let verifier = Verifier::new(
        config.verify.bytes_per_sec,
        egress.clone(),
        Arc::clone(&target),
        Arc::clone(&shared),
        events.clone(),
        metrics.clone(),
    );
    tasks.spawn(verifier.run(components.clone()));
    handle.failover.ready(crate::failover::Deps {
        mirror: config.name.clone(),
        source_kind: config.source.kind,
        target_kind: config.target.kind,
        target: Arc::clone(&target),
        egress: egress.clone(),
        topics: topics_rx.clone(),
        groups: (!config.groups.include.is_empty())
            .then(|| GroupSync::new(groups_rx.clone(), topics_rx.clone(), Arc::clone(&target), egress.clone())),
        shared: Arc::clone(&shared),
        links: Arc::clone(&links),
        events: events.clone(),
        poll: Duration::from_millis(200),
    });
    tasks.spawn(GroupSync::new(groups_rx, topics_rx, Arc::clone(&target), egress.clone()).run(components.clone()));

    tracing::info!(mirror = %config.name, source = %config.source.cluster, target = %config.target.cluster, "ferry-mirror running");

    // Apply reloads until shutdown.
    loop {
        let reload = async {
            match options.reload.as_mut() {
                Some(rx) => rx.changed().await.map(|_| rx.borrow_and_update().clone()).ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            new = reload => match new {
                Some(new) => {
                    tracing::info!("configuration reloaded: topic, group and alarm rules applied");
                    let _ = rules_tx.send(new.topics.clone());
                    let _ = groups_tx.send(new.groups.clone());
                    let _ = alarms_tx.send(new.alarms.clone());
                }
                // The reload sender is gone: no more reloads, but keep waiting for shutdown.
                None => options.reload = None,
            },
        }
    }

    // Reverse order: the SyncManager (its lanes drain in-flight appends, then it commits, leaves, and stops the
    // fetcher), then everything else, then the monitor. Whatever outlives its grace is aborted.
    tracing::info!("shutting down: draining in-flight appends and committing offsets");
    sync_stop.cancel();
    let budget = config.sync.shutdown_timeout + Duration::from_secs(1);
    if tokio::time::timeout(budget, sync_task).await.is_err() {
        tracing::warn!("the SyncManager did not stop within shutdown_timeout; stopping it");
    }
    pipeline.cancel();
    components.cancel();
    let drained =
        tokio::time::timeout(Duration::from_secs(5), async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("some components did not stop within 5 s; stopping them");
        tasks.abort_all();
    }
    monitor_stop.cancel();
    let _ = tokio::time::timeout(crate::monitor::SHUTDOWN_GRACE + Duration::from_secs(1), monitor_task).await;
    tracing::info!("ferry-mirror stopped");
    Ok(())
}
