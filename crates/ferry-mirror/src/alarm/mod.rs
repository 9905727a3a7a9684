//! The Alarmer: subscribes to the EventBus and turns events into notifications on the configured channels
//! (email, webhook) under the alarm rules, and runs the condition checker (lag, stalls) whose events go through
//! the same bus.
//!
//! One task owns the decisions (rules, throttles, active conditions, repeats); it never waits on a channel. Each
//! channel has its own bounded drop-oldest queue and worker, so a failing or hanging channel delays only itself,
//! never the EventBus subscriber and never mirroring. Outcomes are counted in
//! `ferry_alarms_total{channel,outcome="sent|failed|suppressed|dropped"}` ([`Metrics::alarm_count`] reads them).
//! Every notification is also logged at its rule's severity; secrets (SMTP password, webhook key) are never
//! logged, and webhook URLs are shown without their path (which may carry a token).
//!
//! A new [`AlarmsConfig`] on the reload channel (SIGHUP) rebuilds the rules, templates and channels; queued
//! notices finish on the old channels, active conditions are kept, throttles start afresh. An invalid new
//! config is logged and the old one kept.

mod channel;
pub mod conditions;
mod email;
mod error;
pub mod notice;
mod queue;
pub mod template;
mod throttle;
mod tracker;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::config::rules::{self, Rules, Thresholds};
pub use error::AlarmError;
pub use notice::{AlarmIdentity, Notice, NoticeKind};

use self::channel::Channel;
use self::conditions::ConditionChecker;
use self::queue::{NoticeQueue, run_worker};
use self::template::Templates;
use self::tracker::{Decision, Tracker};
use crate::config::AlarmsConfig;
use crate::config::rules::Channels;
use crate::events::{Event, EventBus, Severity};
use crate::metrics::Metrics;
use crate::state::Shared;

/// How long queued notices may still be delivered at shutdown before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How often idle throttle keys are forgotten.
const FORGET_INTERVAL: Duration = Duration::from_secs(60);
/// The outcomes `ferry_alarms_total` counts per channel.
const OUTCOMES: [&str; 4] = ["sent", "failed", "suppressed", "dropped"];

/// An error with its causes, `a: b: c`, for one log field.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// Rules and channels built from one [`AlarmsConfig`].
struct Setup {
    rules: Arc<Rules>,
    channels: Vec<Arc<Channel>>,
    queue_size: usize,
}

impl Setup {
    fn build(config: &AlarmsConfig, identity: &Arc<AlarmIdentity>) -> Result<Setup, AlarmError> {
        let rules = Rules::load(config.rules.as_deref(), &config.channel_names())
            .map_err(|problems| AlarmError::Rules { problems })?;
        let templates =
            Arc::new(Templates::load(config.rules.as_deref()).map_err(|problems| AlarmError::Templates { problems })?);
        let mut channels = Vec::new();
        for w in &config.webhooks {
            channels.push(Arc::new(Channel::Webhook(webhook::WebhookChannel::new(w, Arc::clone(identity))?)));
        }
        for e in &config.emails {
            channels.push(Arc::new(Channel::Email(email::EmailChannel::new(
                e,
                Arc::clone(&templates),
                Arc::clone(identity),
            )?)));
        }
        Ok(Setup { rules: Arc::new(rules), channels, queue_size: config.queue_size })
    }
}

/// The alarm component. Build it with [`Alarmer::new`] (it subscribes to the bus at once, so no event emitted
/// after that is missed) and drive it with [`Alarmer::run`].
pub struct Alarmer {
    identity: Arc<AlarmIdentity>,
    events: EventBus,
    metrics: Metrics,
    subscription: broadcast::Receiver<Arc<Event>>,
    setup: Setup,
}

impl std::fmt::Debug for Alarmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.setup.channels.iter().map(|c| c.name()).collect();
        f.debug_struct("Alarmer").field("identity", &self.identity).field("channels", &names).finish()
    }
}

impl Alarmer {
    /// Loads the rules and templates and builds the channels. Must run inside a tokio runtime (the SMTP
    /// connection pool starts a task).
    pub fn new(
        config: &AlarmsConfig,
        identity: AlarmIdentity,
        events: EventBus,
        metrics: Metrics,
    ) -> Result<Alarmer, AlarmError> {
        let identity = Arc::new(identity);
        let setup = Setup::build(config, &identity)?;
        Ok(Alarmer { identity, subscription: events.subscribe(), events, metrics, setup })
    }

    /// Runs until `shutdown`: dispatches events, checks conditions every `stall_check_interval`, sends repeats,
    /// applies reloads. At shutdown, queued notices get [`SHUTDOWN_GRACE`] to go out; the rest are dropped.
    pub async fn run(
        self,
        shared: Arc<Shared>,
        stall_check_interval: Duration,
        mut reload: watch::Receiver<AlarmsConfig>,
        shutdown: CancellationToken,
    ) {
        let Alarmer { identity, events, metrics, mut subscription, setup } = self;
        let mut state = Running {
            identity,
            metrics,
            tracker: Tracker::new(Arc::clone(&setup.rules)),
            queues: Vec::new(),
            workers: TaskTracker::new(),
            stop: CancellationToken::new(),
        };
        state.start_channels(&setup);
        let mut checker = ConditionChecker::new();
        let mut check = tokio::time::interval(stall_check_interval.max(Duration::from_millis(1)));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut forget = tokio::time::interval(FORGET_INTERVAL);
        forget.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reload_open = true;
        loop {
            let next_repeat = state.tracker.next_repeat();
            // The sleep below is not polled while no condition repeats.
            let repeat_at = next_repeat.unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                // Before events: an event emitted after a reload is judged by the new rules.
                changed = reload.changed(), if reload_open => match changed {
                    Ok(()) => {
                        let config = reload.borrow_and_update().clone();
                        state.reload(&config);
                    }
                    Err(_) => reload_open = false,
                },
                received = subscription.recv() => match received {
                    Ok(event) => {
                        let decision = state.tracker.on_event(event, Instant::now());
                        state.dispatch(decision);
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => state.lagged(n),
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = check.tick() => {
                    let thresholds = state.tracker.rules().thresholds;
                    for event in checker.check(&shared, &thresholds, Instant::now()) {
                        events.emit(event);
                    }
                }
                _ = tokio::time::sleep_until(repeat_at), if next_repeat.is_some() => {
                    for decision in state.tracker.due_repeats(Instant::now()) {
                        state.dispatch(decision);
                    }
                }
                _ = forget.tick() => state.tracker.forget_idle(),
            }
        }
        state.stop_channels().await;
    }
}

/// The Alarmer's state while it runs.
struct Running {
    identity: Arc<AlarmIdentity>,
    metrics: Metrics,
    tracker: Tracker,
    queues: Vec<(String, Arc<NoticeQueue>)>,
    workers: TaskTracker,
    stop: CancellationToken,
}

impl Running {
    fn start_channels(&mut self, setup: &Setup) {
        for queue in self.queues.drain(..) {
            // The old worker delivers what is queued, then ends.
            queue.1.close();
        }
        for channel in &setup.channels {
            // Every outcome of every channel is exposed from the start, at 0: a series that only appears with its
            // first increment is invisible to Prometheus's increase(), so the first failure would never alert.
            for outcome in OUTCOMES {
                self.metrics.alarm_by(channel.name(), outcome, 0);
            }
            let queue = Arc::new(NoticeQueue::new(setup.queue_size));
            self.queues.push((channel.name().to_owned(), Arc::clone(&queue)));
            self.workers.spawn(run_worker(Arc::clone(channel), queue, self.metrics.clone(), self.stop.clone()));
        }
    }

    fn reload(&mut self, config: &AlarmsConfig) {
        match Setup::build(config, &self.identity) {
            Ok(setup) => {
                self.tracker.set_rules(Arc::clone(&setup.rules));
                self.start_channels(&setup);
                let names: Vec<&str> = self.queues.iter().map(|q| q.0.as_str()).collect();
                tracing::info!(channels = %names.join(","), "alarm rules and channels reloaded");
            }
            Err(e) => {
                tracing::error!(error = %chain(&e), "alarm reload refused; keeping the previous rules and channels")
            }
        }
    }

    fn targets(&self, channels: &Channels) -> impl Iterator<Item = &(String, Arc<NoticeQueue>)> {
        self.queues.iter().filter(move |(name, _)| match channels {
            Channels::All => true,
            Channels::Named(list) => list.contains(name),
        })
    }

    fn dispatch(&self, decision: Decision) {
        match decision {
            Decision::LogOnly => {}
            Decision::Suppressed { event, channels } => {
                for (name, _) in self.targets(&channels) {
                    self.metrics.alarm(name, "suppressed");
                }
                tracing::debug!(event = event.kind.name(), key = %event.key(), "alarm suppressed by the throttle");
            }
            Decision::Send { notice, channels } => {
                let mut names = Vec::new();
                for (name, queue) in self.targets(&channels) {
                    names.push(name.as_str());
                    if let Some(old) = queue.push(notice.clone()) {
                        self.metrics.alarm(name, "dropped");
                        tracing::warn!(channel = %name, event = old.event.kind.name(), key = %old.event.key(), "alarm queue full: dropped the oldest notice");
                    }
                }
                log_notice(&notice, &names.join(","));
            }
        }
    }

    fn lagged(&self, n: u64) {
        for (name, _) in &self.queues {
            self.metrics.alarm_by(name, "dropped", n);
        }
        tracing::warn!(count = n, "the alarmer fell behind the event bus; events were lost and counted as dropped");
    }

    async fn stop_channels(self) {
        for (_, q) in &self.queues {
            q.close();
        }
        self.workers.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.workers.wait()).await.is_err() {
            self.stop.cancel();
            self.workers.wait().await;
        }
    }
}

fn log_notice(notice: &Notice, channels: &str) {
    let e = &notice.event;
    let (event, kind, severity, key, message) =
        (e.kind.name(), notice.kind.name(), notice.severity.name(), e.key(), e.message.as_str());
    match notice.severity {
        Severity::Critical => tracing::error!(event, notice = kind, severity, key, channels, "alarm: {message}"),
        Severity::Warning => tracing::warn!(event, notice = kind, severity, key, channels, "alarm: {message}"),
        Severity::Info => tracing::info!(event, notice = kind, severity, key, channels, "alarm: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EmailConfig, SmtpServer, SmtpTls, WebhookConfig};
    use crate::events::EventKind;

    fn config(rules: Option<std::path::PathBuf>) -> AlarmsConfig {
        AlarmsConfig {
            rules,
            queue_size: 10,
            webhooks: vec![WebhookConfig {
                name: "ops".into(),
                url: "http://127.0.0.1:9/hook".into(),
                secret_file: None,
                secret: None,
                timeout: Duration::from_secs(1),
                retries: 0,
            }],
            emails: vec![EmailConfig {
                name: "oncall".into(),
                smtp: SmtpServer { host: "127.0.0.1".into(), port: 9 },
                tls: SmtpTls::None,
                ca_file: None,
                username: None,
                password_file: None,
                password_env: None,
                password: None,
                from: "ferry@example.org".into(),
                to: vec!["oncall@example.org".into()],
                timeout: Duration::from_secs(1),
            }],
        }
    }

    #[tokio::test]
    async fn a_lagging_subscriber_counts_the_lost_events_as_dropped() {
        let metrics = Metrics::new();
        let bus = EventBus::new(metrics.clone());
        let alarmer = Alarmer::new(&config(None), identity(), bus.clone(), metrics.clone()).unwrap();
        // The alarmer is not running yet: its subscription falls behind the bus's 4096 slots.
        for i in 0..5000u32 {
            bus.emit(Event::new(EventKind::AddTopic, "t").partition("t", i));
        }
        let (_tx, rx) = watch::channel(config(None));
        let stop = CancellationToken::new();
        let task = tokio::spawn(alarmer.run(Arc::new(Shared::default()), Duration::from_secs(60), rx, stop.clone()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while metrics.alarm_count("ops", "dropped") == 0 && Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert_eq!(metrics.alarm_count("ops", "dropped"), 5000 - 4096);
        assert_eq!(metrics.alarm_count("oncall", "dropped"), 5000 - 4096);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn every_channel_exposes_each_outcome_at_zero_from_the_start() {
        let metrics = Metrics::new();
        let identity = Arc::new(identity());
        let setup = Setup::build(&config(None), &identity).unwrap();
        let mut running = Running {
            identity,
            metrics: metrics.clone(),
            tracker: Tracker::new(Arc::clone(&setup.rules)),
            queues: Vec::new(),
            workers: TaskTracker::new(),
            stop: CancellationToken::new(),
        };
        running.start_channels(&setup);
        let text = metrics.encode();
        for channel in ["ops", "oncall"] {
            for outcome in OUTCOMES {
                let series = format!("ferry_alarms_total{{channel=\"{channel}\",outcome=\"{outcome}\"}} 0\n");
                assert!(text.contains(&series), "missing {series} in\n{text}");
            }
        }
        running.stop_channels().await;
    }

    fn identity() -> AlarmIdentity {
        AlarmIdentity { mirror: "m".into(), source_cluster: "a".into(), target_cluster: "b".into() }
    }
}
