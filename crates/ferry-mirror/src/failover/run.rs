//! Runs a failover job from its recorded step: each action, then the step recorded on the target (compare-and-set,
//! so a second run of the same job stops at its first write), an event and an audit record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_client::{Admin, OffsetSpec};

use super::core::{self, Action, PartitionReport, SourceEnd, Step};
use super::job::{self, Job};
use super::{Audit, Deps, Failover, target_admin};
use crate::events::{Details, Event, EventKind, FailoverFacts};

/// One run of a job.
pub struct Runner {
    /// What it needs.
    pub deps: Arc<Deps>,
    /// The job, as recorded at `version`.
    pub job: Job,
    /// See `job`.
    pub version: u64,
    /// How long the drain may take.
    pub drain_timeout: Duration,
    /// Where step records go.
    pub audit: Arc<dyn Audit>,
    /// The service (its last known job).
    pub service: Arc<Failover>,
}

fn facts(job: &Job, records: Option<u64>, took: Option<Duration>) -> Details {
    Details::Failover(FailoverFacts {
        job: job.id.clone(),
        epoch: job.epoch,
        topics: job.topics.len(),
        partitions: job.partition_count(),
        records,
        took_ms: took.map(|d| d.as_millis() as u64),
    })
}

async fn audit(log: &dyn Audit, action: &'static str, job: &Job, outcome: &str, detail: serde_json::Value) {
    log.record(action, &job.id, outcome, detail).await;
}

/// Aborts the process if a drill asks to after `step` (see [`super::CRASH_AFTER_ENV`]).
pub fn drill(step: Step) {
    let listed = std::env::var(super::CRASH_AFTER_ENV).unwrap_or_default();
    if listed.split(',').any(|s| s.trim() == step.name()) {
        tracing::error!(step = step.name(), "aborting after this step, as {} asks", super::CRASH_AFTER_ENV);
        std::process::abort();
    }
}

/// Announces a job that just started.
pub async fn started(deps: &Deps, job: &Job, log: &dyn Audit) {
    let topics = job.source_topics().join(", ");
    deps.events.emit(
        Event::new(
            EventKind::FailoverStarted,
            format!(
                "failover {} started for {} topics ({topics}){}",
                job.id,
                job.topics.len(),
                if job.source_unreachable { " with the source unreachable" } else { "" }
            ),
        )
        .with(facts(job, None, None)),
    );
    let detail = serde_json::json!({"epoch": job.epoch, "topics": job.source_topics(),
        "source_unreachable": job.source_unreachable});
    audit(log, "failover.started", job, "ok", detail).await;
}

impl Runner {
    /// Runs to the end, or to the first error (recorded in the job; running the request again resumes).
    pub async fn run(&mut self) {
        while let Some(action) = core::next(self.job.step, self.job.source_unreachable) {
            let began = Instant::now();
            let outcome = self.act(action).await;
            let step = core::completes(action);
            match outcome {
                Ok(records) => {
                    self.job.step = step;
                    self.job.error = None;
                    self.job.waiting.clear();
                    if step == Step::Done {
                        self.job.finished_ms = Some(super::now_ms());
                    }
                    if let Err(e) = self.save().await {
                        tracing::error!(job = self.job.id, step = step.name(), error = %e, "cannot record the failover step; run it again to finish");
                        return;
                    }
                    self.announce(step, records, began.elapsed()).await;
                    drill(step);
                }
                Err(e) => {
                    tracing::error!(job = self.job.id, step = step.name(), error = %e, "failover stopped; run it again to resume");
                    self.job.error = Some(format!("{}: {e}", step.name()));
                    let _ = self.save().await;
                    audit(
                        &*self.audit,
                        "failover.step",
                        &self.job,
                        "error",
                        serde_json::json!({"step": step.name(), "error": e}),
                    )
                    .await;
                    return;
                }
            }
        }
    }

    async fn save(&mut self) -> Result<(), String> {
        self.job.updated_ms = super::now_ms();
        *self.service.last.lock() = Some(self.job.clone());
        let admin = target_admin(&self.deps).map_err(|e| e.to_string())?;
        self.version = job::save(&admin, &self.job, self.version).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn announce(&self, step: Step, records: Option<u64>, took: Duration) {
        let job = &self.job;
        let (kind, message) = match step {
            Step::Fenced => (Some(EventKind::Fenced), format!("source topics fenced at epoch {}", job.epoch)),
            Step::Drained => (
                Some(EventKind::Drained),
                if job.source_unreachable {
                    format!("source unreachable: {} records are not on the target", records.unwrap_or(0))
                } else {
                    "the target holds everything the fenced source topics hold".into()
                },
            ),
            Step::Promoted => (
                Some(EventKind::Promoted),
                format!(
                    "{} target topics promoted as one cut at partition epoch {}",
                    job.topics.len(),
                    job.epoch_floor
                ),
            ),
            _ => (None, String::new()),
        };
        if let Some(kind) = kind {
            self.deps.events.emit(Event::new(kind, message).with(facts(job, records, Some(took))));
        }
        let detail = serde_json::json!({"step": step.name(), "took_ms": took.as_millis() as u64, "records": records});
        audit(&*self.audit, "failover.step", job, "ok", detail).await;
    }

    fn source_admin(&self) -> Result<Admin, String> {
        self.deps
            .egress
            .active()
            .client
            .clone()
            .map(Admin::new)
            .ok_or_else(|| "the source is not a Ferry cluster".into())
    }

    /// Performs `action`; returns the records it concerns, when it counts any.
    async fn act(&mut self, action: Action) -> Result<Option<u64>, String> {
        match action {
            Action::Fence => {
                let source = self.source_admin()?;
                let reason = format!("failover {} of mirror {}", self.job.id, self.deps.mirror);
                let outcomes = source
                    .fence_topics(&self.job.source_topics(), self.job.epoch, &reason)
                    .await
                    .map_err(|e| e.to_string())?;
                let refused: Vec<String> = outcomes
                    .iter()
                    .filter_map(|o| o.result.as_ref().err().map(|(r, m)| format!("{}: {m} ({r})", o.topic)))
                    .collect();
                if !refused.is_empty() {
                    return Err(format!("the source refused to fence: {}", refused.join("; ")));
                }
                Ok(None)
            }
            Action::Drain => self.drain().await.map(|()| Some(0)),
            Action::RecordLastSeen => Ok(Some(self.record_last_seen().await?)),
            Action::SyncGroups => {
                if let Some(g) = &self.deps.groups {
                    let round = g.round().await.map_err(|e| format!("group offset sync: {e}"))?;
                    tracing::info!(
                        offsets = round.committed,
                        skipped_active = round.skipped_active,
                        "failover: final group offset sync"
                    );
                }
                Ok(None)
            }
            Action::Promote => self.promote().await.map(|()| None),
            Action::Stop => {
                for t in &self.job.topics {
                    self.deps.shared.paused.lock().insert(t.source.clone());
                }
                for t in &self.job.topics {
                    for link in self.deps.links.iter().filter(|e| e.key().topic() == t.source) {
                        link.value().set_paused(true);
                    }
                }
                Ok(None)
            }
        }
    }

    /// Every partition of the job, as `topic/partition` keys with its source and target names.
    fn partitions(&self) -> Vec<(String, String, String, u32)> {
        let mut out = Vec::new();
        for t in &self.job.topics {
            for p in 0..t.partitions {
                out.push((format!("{}/{p}", t.source), t.source.clone(), t.target.clone(), p));
            }
        }
        out
    }

    async fn ends(
        admin: &Admin,
        asks: Vec<(String, u32, OffsetSpec)>,
    ) -> Result<Vec<ferry_client::PartitionOffsets>, String> {
        let mut out = Vec::with_capacity(asks.len());
        for chunk in asks.chunks(1000) {
            for r in admin.list_offsets_each(chunk).await.map_err(|e| e.to_string())? {
                out.push(r.map_err(|e| e.to_string())?);
            }
        }
        Ok(out)
    }

    async fn drain(&mut self) -> Result<(), String> {
        let source = self.source_admin()?;
        let target = target_admin(&self.deps).map_err(|e| e.to_string())?;
        let parts = self.partitions();
        let deadline = Instant::now() + self.drain_timeout;
        loop {
            let src =
                Self::ends(&source, parts.iter().map(|(_, s, _, p)| (s.clone(), *p, OffsetSpec::Latest)).collect())
                    .await;
            let dst =
                Self::ends(&target, parts.iter().map(|(_, _, t, p)| (t.clone(), *p, OffsetSpec::Latest)).collect())
                    .await;
            if let (Ok(src), Ok(dst)) = (&src, &dst) {
                let mut finals = BTreeMap::new();
                let mut target_ends = BTreeMap::new();
                for ((key, ..), (s, d)) in parts.iter().zip(src.iter().zip(dst)) {
                    let end = SourceEnd {
                        fence_epoch: s.fence_epoch,
                        visible_end: s.log_end_offset,
                        stored_end: s.stored_end_offset,
                    };
                    finals.insert(key.clone(), core::final_end(self.job.epoch, &end));
                    target_ends.insert(key.clone(), d.log_end_offset);
                }
                let behind = core::behind(&finals, &target_ends);
                if behind.is_empty() {
                    self.job.partitions = parts
                        .iter()
                        .map(|(key, s, t, p)| PartitionReport {
                            topic: s.clone(),
                            target_topic: t.clone(),
                            partition: *p,
                            source_end: finals[key].unwrap_or(0),
                            target_end: target_ends[key],
                            records_lost: 0,
                            rpo_seconds: 0.0,
                        })
                        .collect();
                    self.job.loss = core::losses(&self.job.partitions);
                    return Ok(());
                }
                self.job.waiting = behind
                    .iter()
                    .take(50)
                    .map(|(k, fin, have)| match fin {
                        Some(end) => format!("{k}: target at {have} of {end}"),
                        None => format!("{k}: the source's fence or acknowledgement is pending"),
                    })
                    .collect();
                *self.service.last.lock() = Some(self.job.clone());
            }
            if Instant::now() >= deadline {
                let why = match (src, dst) {
                    (Err(e), _) => format!("cannot read the source: {e}"),
                    (_, Err(e)) => format!("cannot read the target: {e}"),
                    _ => format!("{} partitions behind: {}", self.job.waiting.len(), self.job.waiting.join("; ")),
                };
                return Err(format!("the drain did not finish within {:?}: {why}", self.drain_timeout));
            }
            tokio::time::sleep(self.deps.poll).await;
        }
    }

    /// The report from what the mirror last saw of the source (it cannot be read). Returns the records not on
    /// the target.
    async fn record_last_seen(&mut self) -> Result<u64, String> {
        let target = target_admin(&self.deps).map_err(|e| e.to_string())?;
        let parts = self.partitions();
        let dst =
            Self::ends(&target, parts.iter().map(|(_, _, t, p)| (t.clone(), *p, OffsetSpec::Latest)).collect()).await?;
        let views: BTreeMap<String, crate::state::PartitionView> = self
            .job
            .topics
            .iter()
            .flat_map(|t| self.deps.shared.partition_views(Some(&t.source)))
            .map(|v| (format!("{}/{}", v.topic, v.partition), v))
            .collect();
        self.job.partitions = parts
            .iter()
            .zip(dst)
            .map(|((key, s, t, p), d)| {
                let seen = views.get(key).map_or(0, |v| v.source_offset.max(v.probed_source_offset));
                let lost = seen.saturating_sub(d.log_end_offset);
                PartitionReport {
                    topic: s.clone(),
                    target_topic: t.clone(),
                    partition: *p,
                    source_end: seen.max(d.log_end_offset),
                    target_end: d.log_end_offset,
                    records_lost: lost,
                    rpo_seconds: if lost > 0 { views.get(key).map_or(0.0, |v| v.rpo_seconds) } else { 0.0 },
                }
            })
            .collect();
        self.job.loss = core::losses(&self.job.partitions);
        Ok(self.job.partitions.iter().map(|p| p.records_lost).sum())
    }

    async fn promote(&mut self) -> Result<(), String> {
        let target = target_admin(&self.deps).map_err(|e| e.to_string())?;
        if self.job.epoch_floor == 0 {
            let mut epochs = Vec::new();
            for t in &self.job.topics {
                let d = target.describe_topic(&t.target).await.map_err(|e| e.to_string())?;
                epochs.extend(d.partitions.iter().map(|p| p.epoch));
                if !self.job.source_unreachable
                    && let Ok(source) = self.source_admin()
                    && let Ok(d) = source.describe_topic(&t.source).await
                {
                    epochs.extend(d.partitions.iter().map(|p| p.epoch));
                }
            }
            self.job.epoch_floor = core::epoch_floor(epochs);
            // Recorded before any topic is promoted: a run resumed after a kill promotes the rest at the same floor.
            self.save().await?;
        }
        let targets = self.job.target_topics();
        for chunk in targets.chunks(500) {
            let outcomes = target.promote_topics(chunk, self.job.epoch_floor).await.map_err(|e| e.to_string())?;
            let refused: Vec<String> = outcomes
                .iter()
                .filter_map(|o| o.result.as_ref().err().map(|(r, m)| format!("{}: {m} ({r})", o.topic)))
                .collect();
            if !refused.is_empty() {
                return Err(format!("the target refused to promote: {}", refused.join("; ")));
            }
        }
        Ok(())
    }
}
