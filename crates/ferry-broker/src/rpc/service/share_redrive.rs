//! The redrive job: a group's dead letters sent back (to their origin topics, or one named), run by the group's
//! owner, rate-limited, resumable and idempotent.
//!
//! - The job takes the dead-letter topic's end when it starts and never reads past it, so a redrive into the
//!   dead-letter topic itself ends.
//! - Each step reads a run of dead letters, writes them to their targets under the redrive producer of each target
//!   partition with the sequences the job record holds, and only then records the step (next offset, counts,
//!   sequences). A new owner redoes an unrecorded step with the same sequences: the writes are duplicates.
//! - A finished job marks the dead letters it covered as redriven: a later job starts past them, so running the
//!   same redrive again adds nothing.

use std::time::Duration;

use ferry_batch::{Header, ProducerInfo};
use ferry_proto as pb;
use tonic::Request;

use super::share_io::{Out, batch_of, header, now};
use super::{BrokerService, Rpc, ok};
use crate::error::BrokerError;
use crate::rpc::auth::{Scopes, caller};
use crate::share::state::{Change, Job};
use crate::share::{dlq_topic, headers, producer_id};

type Result<T> = std::result::Result<T, BrokerError>;

/// Most dead letters one step copies.
const STEP_RECORDS: usize = 500;
/// Most bytes one step reads.
const STEP_BYTES: u64 = 1 << 20;
/// Most records per second a job may ask for.
const MAX_RATE: u32 = 1_000_000;

fn response(job: Option<&Job>) -> pb::RedriveResponse {
    let Some(j) = job else { return pb::RedriveResponse { state: "NONE".into(), ..Default::default() } };
    pb::RedriveResponse {
        job_id: j.id.clone(),
        state: j.state.clone(),
        from_offset: j.from,
        end_offset: j.end,
        next_offset: j.next,
        copied: j.copied,
        per_topic: j.per_topic.clone().into_iter().collect(),
        dry_run: j.dry_run,
        error: j.error.clone(),
        started_ms: j.started_ms,
        finished_ms: j.finished_ms,
    }
}

impl BrokerService {
    pub(super) async fn redrive_rpc(&self, req: Request<pb::RedriveRequest>) -> Rpc<pb::RedriveResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("Redrive", Scopes::ADMIN, &req.group)?;
        if req.rate > MAX_RATE {
            return Err(BrokerError::InvalidArgument(format!("rate {} is above {MAX_RATE} records/s", req.rate)).into());
        }
        if !req.to.is_empty() {
            who.allow_topic("Redrive", Scopes::ADMIN, &req.to)?;
            if self.partition_count(&req.to).is_none() {
                return Err(BrokerError::UnknownTopic { topic: req.to.clone() }.into());
            }
        }
        let mut guard = self.share_lock(&req.group).await?;
        let g = guard.state().groups.get(&req.group).cloned().unwrap_or_default();
        if req.status_only || g.redrive.as_ref().is_some_and(|j| j.state == "RUNNING") {
            return ok(response(g.redrive.as_ref()));
        }
        let dlq = dlq_topic(&req.group);
        if self.partition_count(&dlq).is_none() {
            return Err(BrokerError::InvalidArgument(format!(
                "group \"{}\" has no dead letters (no topic {dlq})",
                req.group
            ))
            .into());
        }
        let ends = self.read_any(&dlq, 0, u64::MAX, 1).await?;
        let from = g.redriven_below.max(ends.log_start);
        let job = Job {
            id: uuid::Uuid::new_v4().to_string(),
            to: req.to.clone(),
            rate: req.rate,
            dry_run: req.dry_run,
            from,
            end: ends.end.max(from),
            next: from,
            state: "RUNNING".into(),
            started_ms: now(),
            // The redrive producers' sequences go on from the last job's.
            seqs: g.redrive.as_ref().map(|j| j.seqs.clone()).unwrap_or_default(),
            ..Job::default()
        };
        self.share_write(&mut guard, &req.group, &[Change::Redrive(job.clone())]).await?;
        drop(guard);
        tracing::info!(group = %req.group, job = %job.id, from = job.from, end = job.end, dry_run = job.dry_run, "redrive started");
        if self.redrives.lock().insert(req.group.clone()) {
            let svc = self.clone();
            let group = req.group.clone();
            tokio::spawn(async move { svc.run_redrive(group).await });
        }
        ok(response(Some(&job)))
    }

    /// Runs `group`'s redrive job until it is done, fails, or this broker stops owning the group.
    pub(super) async fn run_redrive(self, group: String) {
        loop {
            match self.redrive_step(&group).await {
                Ok(Some(pause)) => {
                    tokio::select! {
                        _ = self.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(group, error = %e, "a redrive step failed; the owner resumes it");
                    break;
                }
            }
        }
        self.redrives.lock().remove(&group);
    }

    /// One step: returns the pause before the next (the rate), or `None` once the job is over.
    async fn redrive_step(&self, group: &str) -> Result<Option<Duration>> {
        let mut guard = self.share_lock(group).await?;
        let Some(mut job) = guard.state().groups.get(group).and_then(|g| g.redrive.clone()) else { return Ok(None) };
        if job.state != "RUNNING" {
            return Ok(None);
        }
        if job.next >= job.end {
            job.state = "DONE".into();
            job.finished_ms = now();
            self.share_write(&mut guard, group, &[Change::Redrive(job.clone())]).await?;
            tracing::info!(group, job = %job.id, copied = job.copied, "redrive finished");
            return Ok(None);
        }
        let dlq = dlq_topic(group);
        let read = self.read_any(&dlq, 0, job.next, STEP_BYTES).await?;
        let step = if job.rate == 0 { STEP_RECORDS } else { (job.rate as usize / 10).clamp(1, STEP_RECORDS) };
        let records: Vec<_> = read.records.into_iter().filter(|r| r.offset < job.end).take(step).collect();
        if records.is_empty() {
            // Retention took what was left, or the log holds nothing more below the end.
            job.next = read.log_start.max(job.end);
            self.share_write(&mut guard, group, &[Change::Redrive(job)]).await?;
            return Ok(Some(Duration::ZERO));
        }
        let mut by_target: std::collections::BTreeMap<(String, u32), Vec<Out>> = std::collections::BTreeMap::new();
        for r in &records {
            let text = |k: &str| {
                r.headers
                    .iter()
                    .rev()
                    .find(|h| h.key == k)
                    .and_then(|h| h.value.as_deref())
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .map(str::to_owned)
            };
            let origin = text(headers::TOPIC).unwrap_or_default();
            let topic = if job.to.is_empty() { origin.clone() } else { job.to.clone() };
            let Some(count) = self.partition_count(&topic).filter(|_| !topic.is_empty()) else {
                job.state = "FAILED".into();
                job.error =
                    format!("dead letter {dlq}/0/{} names no existing topic to go back to ({origin:?})", r.offset);
                job.finished_ms = now();
                self.share_write(&mut guard, group, &[Change::Redrive(job)]).await?;
                return Ok(None);
            };
            let partition = match (job.to.is_empty(), text(headers::PARTITION).and_then(|p| p.parse::<u32>().ok())) {
                (true, Some(p)) if p < count => p,
                _ => r
                    .key
                    .as_deref()
                    .map_or((r.offset % u64::from(count)) as u32, |k| ferry_proto::partition_for_key(k, count)),
            };
            let mut hs: Vec<Header> =
                r.headers.iter().filter(|h| !headers::ALL.contains(&h.key.as_str())).cloned().collect();
            hs.push(header(headers::REDRIVEN_FROM, format!("{dlq}/0/{}", r.offset)));
            by_target.entry((topic, partition)).or_default().push((r.key.clone(), r.value.clone(), hs, r.timestamp));
        }
        for ((topic, partition), recs) in &by_target {
            let key = format!("{topic}/{partition}");
            let seq = job.seqs.get(&key).copied().unwrap_or(0);
            if !job.dry_run {
                let producer = ProducerInfo {
                    producer_id: producer_id("redrive", &format!("{group}/{key}")),
                    producer_epoch: 0,
                    base_sequence: seq,
                };
                self.append_any(topic, *partition, batch_of(recs, producer)).await?;
                job.seqs.insert(key, seq.wrapping_add(recs.len() as i32));
            }
            *job.per_topic.entry(topic.clone()).or_default() += recs.len() as u64;
            job.copied += recs.len() as u64;
        }
        job.next = records.last().map_or(job.next, |r| r.offset + 1);
        let n = records.len();
        self.share_write(&mut guard, group, &[Change::Redrive(job.clone())]).await?;
        Ok(Some(if job.rate == 0 { Duration::ZERO } else { Duration::from_secs_f64(n as f64 / f64::from(job.rate)) }))
    }
}
