//! The failover job's record: what it covers, the last step it completed, and its report. It is kept on the
//! target (the broker's job records, `PutJob`/`GetJob`, replicated on a cluster), written by compare-and-set, so a
//! job killed anywhere is found and finished by the next run, and two runs never both write it.

use bytes::Bytes;
use ferry_client::{Admin, ClientError};
use serde::{Deserialize, Serialize};

use super::core::{PartitionReport, Step, TopicLoss};

/// One topic of the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTopic {
    /// Source topic.
    pub source: String,
    /// Target topic.
    pub target: String,
    /// Partition count.
    pub partitions: u32,
}

/// A failover job, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// `failover.{mirror name}`.
    pub id: String,
    /// The fence epoch: above every earlier job's.
    pub epoch: u64,
    /// The topics, by source name.
    pub topics: Vec<JobTopic>,
    /// Run without fence and drain, at the offsets on the target.
    pub source_unreachable: bool,
    /// The last step completed.
    pub step: Step,
    /// When it started and last changed, ms since the Unix epoch.
    pub started_ms: i64,
    /// See `started_ms`.
    pub updated_ms: i64,
    /// When it finished.
    #[serde(default)]
    pub finished_ms: Option<i64>,
    /// The promotion's partition epoch floor, once chosen.
    #[serde(default)]
    pub epoch_floor: u32,
    /// The report, per partition (filled by the drain, or from the last positions seen).
    #[serde(default)]
    pub partitions: Vec<PartitionReport>,
    /// The loss window per topic.
    #[serde(default)]
    pub loss: Vec<TopicLoss>,
    /// The error the last run stopped at (running the command again retries from the recorded step).
    #[serde(default)]
    pub error: Option<String>,
    /// While draining: partitions the target does not hold up to the fence yet (`topic/partition`).
    #[serde(default)]
    pub waiting: Vec<String>,
}

impl Job {
    /// The partition count over all topics.
    pub fn partition_count(&self) -> usize {
        self.topics.iter().map(|t| t.partitions as usize).sum()
    }

    /// The source topic names.
    pub fn source_topics(&self) -> Vec<String> {
        self.topics.iter().map(|t| t.source.clone()).collect()
    }

    /// The target topic names.
    pub fn target_topics(&self) -> Vec<String> {
        self.topics.iter().map(|t| t.target.clone()).collect()
    }
}

/// A job id for a mirror: `failover.` and the mirror's name, with characters outside `[A-Za-z0-9._-]` replaced.
pub fn job_id(mirror: &str) -> String {
    let name: String = mirror
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    format!("failover.{name}")
}

/// The job's record on the target, with the version a write must name.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The job.
    pub job: Job,
    /// Its version.
    pub version: u64,
}

/// Reads job `id` from the target.
pub async fn load(target: &Admin, id: &str) -> Result<Option<Stored>, ClientError> {
    let Some(found) = target.get_job(id).await? else { return Ok(None) };
    let job: Job = serde_json::from_slice(&found.body).map_err(|e| ClientError::Protocol {
        rpc: "GetJob",
        broker: String::new(),
        message: format!("job {id:?} on the target is not a failover job this version reads: {e}"),
    })?;
    Ok(Some(Stored { job, version: found.version }))
}

/// Writes `job` over version `version`, returning the new one.
pub async fn save(target: &Admin, job: &Job, version: u64) -> Result<u64, ClientError> {
    let body = serde_json::to_vec(job).unwrap_or_default();
    target.put_job(&job.id, version, Bytes::from(body)).await
}
