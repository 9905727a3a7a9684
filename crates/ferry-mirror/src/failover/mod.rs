//! Failover as one job (`POST /api/v1/failover`, `ferryctl failover`): fence the source topics, wait until the
//! target holds everything up to the fence, sync group offsets a last time, promote every target topic as one
//! cut, and stop mirroring them. The decisions are in [`core`]; the job's record is in [`job`], kept on the target
//! so that a job interrupted anywhere (the command, or this process killed) is finished by running it again.
//!
//! With `source_unreachable` the fence and the drain are skipped: the target is promoted at the offsets it holds,
//! and the report says, per partition, what the mirror last saw on the source and how long the oldest record not
//! on the target had waited.

pub mod core;
pub mod job;
mod precheck;
mod run;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_client::Admin;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use self::core::Step;
use self::job::{Job, JobTopic};
use crate::cluster::TargetCluster;
use crate::config::ClusterKind;
use crate::egress::EgressHandle;
use crate::events::EventBus;
use crate::group_sync::GroupSync;
use crate::state::Shared;
use crate::topics::TopicSet;

/// The environment variable a failover drill sets to make this process abort right after it recorded one of the
/// listed steps (snake_case names, comma separated), as a kill -9 there would: the next run must finish the job.
/// With every step listed, each run of the process records one step.
pub const CRASH_AFTER_ENV: &str = "FERRY_MIRROR_FAILOVER_CRASH_AFTER";

/// How long the drain waits by default before it stops with a report of the partitions still behind.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a job's step records go (the monitor's audit log).
#[async_trait::async_trait]
pub trait Audit: Send + Sync {
    /// Records `action` of job `job` with its `outcome` and `detail`.
    async fn record(&self, action: &'static str, job: &str, outcome: &str, detail: serde_json::Value);
}

/// What a failover needs of the running mirror.
pub struct Deps {
    /// `mirror.name`.
    pub mirror: String,
    /// Source and target kinds.
    pub source_kind: ClusterKind,
    /// See `source_kind`.
    pub target_kind: ClusterKind,
    /// The target.
    pub target: Arc<dyn TargetCluster>,
    /// The source routes.
    pub egress: EgressHandle,
    /// The mirrored topics.
    pub topics: watch::Receiver<Arc<TopicSet>>,
    /// The group-offset sync (its final round), when `[groups]` selects any group.
    pub groups: Option<GroupSync>,
    /// The pipeline's state (positions, RPO clocks, pauses).
    pub shared: Arc<Shared>,
    /// The lanes' links (stopping a topic pauses them).
    pub links: crate::sync::Links,
    /// Events.
    pub events: EventBus,
    /// How often the drain reads both sides.
    pub poll: Duration,
}

/// A failover request (`POST /api/v1/failover`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// A regular expression over source topic names, matched whole.
    pub topics: String,
    /// Must be true: a failover is not undone.
    #[serde(default)]
    pub confirm: bool,
    /// Print the plan and the pre-checks; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Refuse when a partition's RPO is above this, e.g. "5s".
    #[serde(default)]
    pub max_rpo: Option<String>,
    /// The source cannot be reached: no fence, no drain.
    #[serde(default)]
    pub source_unreachable: bool,
    /// How long the drain may take, e.g. "5m" (default 5 minutes).
    #[serde(default)]
    pub drain_timeout: Option<String>,
}

/// One pre-check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it passed (a failed one refuses the failover).
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// The answer to a request: the plan and pre-checks, and the job (none on a dry run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The job id.
    pub job_id: String,
    /// Whether the request continues a job that was recorded before.
    pub resumed: bool,
    /// The topics.
    pub topics: Vec<JobTopic>,
    /// The pre-checks (empty when a recorded job resumes: they ran when it started).
    pub checks: Vec<Check>,
    /// Records the target lacks now, over the partitions this process mirrors (reported, never gating).
    pub lag: u64,
    /// The job as recorded.
    pub job: Option<Job>,
    /// Whether the job runs in this process now.
    pub running: bool,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request is malformed.
    #[error("{0}")]
    Bad(String),
    /// The failover cannot go ahead (a failed pre-check, another job in the way).
    #[error("{0}")]
    Refused(String),
    /// A side could not be reached or answered an error; running the request again retries.
    #[error("{0}")]
    Unavailable(String),
}

/// The failover service of one mirror process.
#[derive(Default)]
pub struct Failover {
    deps: OnceLock<Arc<Deps>>,
    last: parking_lot::Mutex<Option<Job>>,
    running: AtomicBool,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover").field("running", &self.running.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

fn duration(field: &str, value: &Option<String>) -> Result<Option<Duration>, Refusal> {
    value
        .as_deref()
        .map(|v| {
            humantime::parse_duration(v).map_err(|e| Refusal::Bad(format!("{field} {v:?} is not a duration: {e}")))
        })
        .transpose()
}

impl Failover {
    /// Gives the service what it needs, once the pipeline is built (before, requests are unavailable).
    pub fn ready(&self, deps: Deps) {
        let _ = self.deps.set(Arc::new(deps));
    }

    fn deps(&self) -> Result<Arc<Deps>, Refusal> {
        self.deps.get().cloned().ok_or_else(|| Refusal::Unavailable("the mirror is still starting; try again".into()))
    }

    /// The job as this process last knew it.
    pub fn last(&self) -> Option<Job> {
        self.last.lock().clone()
    }

    /// Whether a job runs in this process now.
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// The job as recorded on the target (this process's view when the target cannot be read).
    pub async fn status(&self) -> Result<Option<Job>, Refusal> {
        let deps = self.deps()?;
        let admin = target_admin(&deps)?;
        match job::load(&admin, &job::job_id(&deps.mirror)).await {
            Ok(found) => {
                let job = found.map(|s| s.job);
                if job.is_some() {
                    *self.last.lock() = job.clone();
                }
                Ok(job)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the failover job from the target; answering the last known");
                Ok(self.last())
            }
        }
    }

    /// Handles a request: validates it, runs the pre-checks of a new job (or finds the recorded one), records the
    /// job and starts it in the background. `audit` gets one record per step.
    pub async fn start(self: &Arc<Self>, req: Request, audit: Arc<dyn Audit>) -> Result<Answer, Refusal> {
        if !req.confirm && !req.dry_run {
            return Err(Refusal::Bad(
                "a failover fences the source and promotes the target, and is not undone: send \"confirm\": true \
                 (or \"dry_run\": true to see the plan)"
                    .into(),
            ));
        }
        let max_rpo = duration("max_rpo", &req.max_rpo)?;
        let drain_timeout = duration("drain_timeout", &req.drain_timeout)?.unwrap_or(DEFAULT_DRAIN_TIMEOUT);
        let pattern = regex::Regex::new(&format!("^(?:{})$", req.topics))
            .map_err(|e| Refusal::Bad(format!("topics {:?} is not a regular expression: {e}", req.topics)))?;
        let deps = self.deps()?;
        let admin = target_admin(&deps)?;
        let id = job::job_id(&deps.mirror);
        let stored = job::load(&admin, &id).await.map_err(|e| unavailable("reading the job from the target", e))?;
        // A recorded job whose topics the request names is resumed (unfinished) or answered (finished), whatever
        // the mirror lists now: its target topics may be promoted already, and then they are no longer mirrored.
        if let Some(s) = &stored
            && s.job.topics.iter().all(|t| pattern.is_match(&t.source))
            && s.job.source_unreachable == req.source_unreachable
        {
            *self.last.lock() = Some(s.job.clone());
            let finished = s.job.step == Step::Done;
            if !finished && !req.dry_run {
                self.spawn(Arc::clone(&deps), s.job.clone(), s.version, drain_timeout, audit);
            }
            return Ok(Answer {
                job_id: id,
                resumed: true,
                topics: s.job.topics.clone(),
                checks: Vec::new(),
                lag: if finished { 0 } else { precheck::lag(&deps, &s.job.topics) },
                job: Some(s.job.clone()),
                running: self.running(),
            });
        }
        if let Some(s) = &stored
            && s.job.step != Step::Done
        {
            return Err(Refusal::Refused(format!(
                "failover job {id} is recorded at step {} for topics {} (source unreachable: {}); run it again with \
                 topics matching those and the same options to finish it first",
                s.job.step.name(),
                s.job.source_topics().join(", "),
                s.job.source_unreachable
            )));
        }
        let topics = precheck::select(&deps, &pattern)?;
        let checks = precheck::run(&deps, &topics, &req, max_rpo).await;
        let lag = precheck::lag(&deps, &topics);
        let mut answer = Answer { job_id: id.clone(), resumed: false, topics, checks, lag, job: None, running: false };
        let failed: Vec<String> =
            answer.checks.iter().filter(|c| !c.ok).map(|c| format!("{}: {}", c.name, c.detail)).collect();
        if req.dry_run {
            return Ok(answer);
        }
        if !failed.is_empty() {
            return Err(Refusal::Refused(format!("pre-checks failed: {}", failed.join("; "))));
        }
        let now = now_ms();
        let epoch = stored.as_ref().map_or(0, |s| s.job.epoch + 1).max(u64::try_from(now).unwrap_or_default());
        let job = Job {
            id,
            epoch,
            topics: answer.topics.clone(),
            source_unreachable: req.source_unreachable,
            step: Step::Started,
            started_ms: now,
            updated_ms: now,
            finished_ms: None,
            epoch_floor: 0,
            partitions: Vec::new(),
            loss: Vec::new(),
            error: None,
            waiting: Vec::new(),
        };
        let version = job::save(&admin, &job, stored.as_ref().map_or(0, |s| s.version))
            .await
            .map_err(|e| unavailable("recording the job on the target", e))?;
        run::started(&deps, &job, &*audit).await;
        *self.last.lock() = Some(job.clone());
        run::drill(Step::Started);
        self.spawn(Arc::clone(&deps), job.clone(), version, drain_timeout, audit);
        answer.job = Some(job);
        answer.running = self.running();
        Ok(answer)
    }

    /// Runs `job` from its recorded step in the background, unless a run is going on in this process already.
    fn spawn(
        self: &Arc<Self>,
        deps: Arc<Deps>,
        job: Job,
        version: u64,
        drain_timeout: Duration,
        audit: Arc<dyn Audit>,
    ) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut runner = run::Runner { deps, job, version, drain_timeout, audit, service: Arc::clone(&me) };
            runner.run().await;
            me.running.store(false, Ordering::Release);
        });
    }
}

fn target_admin(deps: &Deps) -> Result<Admin, Refusal> {
    deps.target
        .ferry_client()
        .map(Admin::new)
        .ok_or_else(|| Refusal::Refused("the target is a Kafka cluster: Ferry cannot promote its topics".into()))
}

fn unavailable(what: &str, e: ferry_client::ClientError) -> Refusal {
    Refusal::Unavailable(format!("{what}: {e}"))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
