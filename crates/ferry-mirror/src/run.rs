//! Bootstrap: config, then validation (already done by [`MirrorConfig::load`]), then the components in order —
//! metrics and events, the target connection, egress, topic discovery, the consumer, the SyncManager, group sync —
//! and on shutdown the same in reverse: stop fetching, drain in-flight appends, commit, leave.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::alarm::{AlarmIdentity, Alarmer};
use crate::config::{MirrorConfig, StartPosition};
use crate::egress::EgressHandle;
use crate::events::EventBus;
use crate::group_sync::GroupSync;
use crate::metrics::Metrics;
use crate::ratelimit::RateLimits;
use crate::state::Shared;
use crate::sync::{Controls, SyncManager, SyncSettings};
use crate::target::{PartitionCtl, PipelineCtx, TargetHealth};
use crate::topics::{Naming, TopicAndOffsetManager, TopicSet};

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

/// A topic name that is not mirrored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic {0:?} is not mirrored by this process")]
pub struct UnknownTopic(pub String);

/// What the monitor and embedders can see and do.
#[derive(Debug, Clone)]
pub struct MirrorHandle {
    /// `mirror.name`.
    pub name: String,
    /// Source alias.
    pub source_cluster: String,
    /// Target alias.
    pub target_cluster: String,
    /// Shared pipeline state.
    pub shared: Arc<Shared>,
    /// Egress.
    pub egress: EgressHandle,
    /// Events.
    pub events: EventBus,
    /// Metrics.
    pub metrics: Metrics,
    /// Per-partition controls.
    pub controls: Controls,
    /// Target reachability.
    pub target_health: Arc<TargetHealth>,
}

impl MirrorHandle {
    fn control(&self, topic: &str, ctl: fn() -> PartitionCtl) -> Result<(), UnknownTopic> {
        if !self.shared.topics.lock().contains_key(topic) {
            return Err(UnknownTopic(topic.to_owned()));
        }
        for e in self.controls.iter() {
            if e.key().0 == topic {
                let _ = e.value().send(ctl());
            }
        }
        Ok(())
    }

    /// Pauses a source topic (its partitions stop appending; positions stay visible).
    pub fn pause(&self, topic: &str) -> Result<(), UnknownTopic> {
        self.control(topic, || PartitionCtl::Pause)?;
        self.shared.paused.lock().insert(topic.to_owned());
        Ok(())
    }

    /// Resumes a paused (or halted) source topic.
    pub fn resume(&self, topic: &str) -> Result<(), UnknownTopic> {
        self.control(topic, || PartitionCtl::Resume)?;
        self.shared.paused.lock().remove(topic);
        Ok(())
    }
}

/// Retries `f` until it succeeds or `shutdown`, logging each failure once per `what`.
async fn retry<T, F, Fut>(what: &str, shutdown: &CancellationToken, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ferry_client::ClientError>>,
{
    let mut backoff = Duration::from_millis(200);
    loop {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) => tracing::warn!(error = %e, "{what} failed; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Runs the mirror until `shutdown` (SIGTERM/SIGINT), then stops gracefully within `sync.shutdown_timeout`.
pub async fn run(
    config: MirrorConfig,
    mut options: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), MirrorError> {
    let metrics = Metrics::new();
    let events = EventBus::new(metrics.clone());
    let shared = Arc::new(Shared::default());
    let tasks = TaskTracker::new();
    let components = CancellationToken::new();

    let target = crate::sides::target(&config)?;
    // Learn the source cluster id recorded on existing mirror topics, so a route into another cluster is refused
    // from the first probe.
    let learned = match target.list_topics().await {
        Ok(topics) => topics
            .iter()
            .filter_map(|t| t.mirror.as_ref())
            .find(|m| m.source_cluster == config.source.cluster && !m.source_cluster_id.is_empty())
            .map(|m| m.source_cluster_id.clone()),
        Err(e) => {
            tracing::warn!(error = %e, "target not reachable at start; will keep trying");
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
    let alarmer = Alarmer::new(&config.alarms, identity, events.clone(), metrics.clone()).map_err(|e| {
        components.cancel();
        MirrorError::Alarms(e)
    })?;
    tasks.spawn(alarmer.run(Arc::clone(&shared), config.sync.stall_check_interval, alarms_rx, components.clone()));

    let controls: Controls = Arc::new(dashmap::DashMap::new());
    let target_health = Arc::new(TargetHealth::default());
    let handle = MirrorHandle {
        name: config.name.clone(),
        source_cluster: config.source.cluster.clone(),
        target_cluster: config.target.cluster.clone(),
        shared: Arc::clone(&shared),
        egress: egress.clone(),
        events: events.clone(),
        metrics: metrics.clone(),
        controls: Arc::clone(&controls),
        target_health: Arc::clone(&target_health),
    };
    // The monitor serves from here on, also while the pipeline drains; it stops when run() returns, on any path.
    let monitor_stop = CancellationToken::new();
    let _monitor_guard = monitor_stop.clone().drop_guard();
    let (monitor_addr, monitor_task) =
        crate::monitor::start(handle.clone(), &config.monitor, monitor_stop.clone()).await.map_err(|e| {
            components.cancel();
            MirrorError::Monitor(e.to_string())
        })?;
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

    let Some(limits) = retry("reading the target's limits", &shutdown, || target.limits()).await else {
        return Ok(());
    };
    let source_group = format!("ferry-mirror.{}", config.name);
    let first_run_latest = if config.topics.start_position == StartPosition::Latest {
        let committed = retry("reading the mirror's source group", &shutdown, || {
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
        Naming { source_cluster: config.source.cluster.clone(), target_cluster: config.target.cluster.clone() },
        rules_rx,
        Arc::clone(&target),
        egress.clone(),
        events.clone(),
        Arc::clone(&shared),
        topics_tx,
    );
    tasks.spawn(manager.run(components.clone()));

    let (consumer_tx, consumer_rx) = mpsc::unbounded_channel();
    let consumer_stop = CancellationToken::new();
    let consumer_task = crate::sides::spawn_consumer(
        &config,
        consumer_rx,
        egress.clone(),
        metrics.clone(),
        Arc::clone(&shared),
        consumer_stop.clone(),
    );

    let ctx = PipelineCtx {
        target: Arc::clone(&target),
        egress: egress.clone(),
        consumer: consumer_tx.clone(),
        on_divergence: config.on_divergence,
        max_request_bytes: config.sync.max_request_bytes.min(limits.max_message_bytes / 2).max(64 * 1024),
        target_max_batch: limits.max_batch_bytes,
        limits: Arc::new(RateLimits::new(config.sync.max_bytes_per_sec, config.sync.max_records_per_sec)),
        events: events.clone(),
        metrics: metrics.clone(),
        shared: Arc::clone(&shared),
        target_health: Arc::clone(&target_health),
        source_group: source_group.clone(),
    };
    let sync = SyncManager::new(
        SyncSettings {
            mirror_name: config.name.clone(),
            commit_interval: config.sync.commit_interval,
            queue_bytes: config.sync.queue_bytes,
            max_memory: config.sync.max_memory,
            session_timeout: config.sync.group_session_timeout,
            shutdown_timeout: config.sync.shutdown_timeout,
            first_run_latest,
        },
        ctx,
        topics_rx.clone(),
        consumer_tx,
        Arc::clone(&controls),
    );
    let sync_stop = CancellationToken::new();
    let sync_task = tokio::spawn(sync.run(sync_stop.clone()));
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

    // Reverse order: stop the SyncManager (its tasks drain in-flight appends, then it commits and leaves), then
    // the consumer, then everything else.
    tracing::info!("shutting down: draining in-flight appends and committing offsets");
    sync_stop.cancel();
    let budget = config.sync.shutdown_timeout + Duration::from_secs(1);
    if tokio::time::timeout(budget, sync_task).await.is_err() {
        tracing::warn!("the SyncManager did not stop within shutdown_timeout");
    }
    consumer_stop.cancel();
    let _ = consumer_task.await;
    components.cancel();
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await;
    monitor_stop.cancel();
    let _ = tokio::time::timeout(crate::monitor::SHUTDOWN_GRACE + Duration::from_secs(1), monitor_task).await;
    tracing::info!("ferry-mirror stopped");
    Ok(())
}
