//! Disaster recovery's calls on [`Admin`]: fence, promote as one cut, mark as a mirror topic, and job records.

use bytes::Bytes;
use ferry_proto as pb;

use super::Admin;
use crate::error::Result;

/// One topic's outcome of a call over many topics.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicOutcome {
    /// The topic.
    pub topic: String,
    /// Its description afterwards, or the broker's refusal (reason, message).
    pub result: std::result::Result<pb::TopicInfo, (String, String)>,
    /// For a promotion: whether it was a mirror topic.
    pub was_mirror: bool,
}

fn outcomes(results: Vec<pb::TopicResult>) -> Vec<TopicOutcome> {
    results
        .into_iter()
        .map(|r| TopicOutcome {
            result: if r.error.is_empty() {
                r.info.ok_or_else(|| ("protocol".to_owned(), "the broker left out the topic".to_owned()))
            } else {
                Err((r.error, r.message))
            },
            topic: r.topic,
            was_mirror: r.was_mirror,
        })
        .collect()
}

/// A job record as the broker keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its version (compare-and-set).
    pub version: u64,
    /// Its body.
    pub body: Bytes,
}

impl Admin {
    /// Fences `topics` read-only at `epoch`, naming `reason` in every refused write.
    pub async fn fence_topics(&self, topics: &[String], epoch: u64, reason: &str) -> Result<Vec<TopicOutcome>> {
        let request =
            pb::FenceTopicsRequest { topics: topics.to_vec(), epoch, reason: reason.to_owned(), unfence: false };
        Ok(outcomes(self.client.fence_topics(request).await?.results))
    }

    /// Lifts the fences of `topics`.
    pub async fn unfence_topics(&self, topics: &[String]) -> Result<Vec<TopicOutcome>> {
        let request = pb::FenceTopicsRequest { topics: topics.to_vec(), unfence: true, ..Default::default() };
        Ok(outcomes(self.client.fence_topics(request).await?.results))
    }

    /// Promotes `topics` as one cut: each partition's next local write starts a partition epoch >= `epoch_floor`.
    pub async fn promote_topics(&self, topics: &[String], epoch_floor: u32) -> Result<Vec<TopicOutcome>> {
        let request = pb::PromoteTopicsRequest { topics: topics.to_vec(), epoch_floor };
        Ok(outcomes(self.client.promote_topics(request).await?.results))
    }

    /// Marks `topic` as a mirror topic of `mirror`, lifting its fence.
    pub async fn mark_mirror(&self, topic: &str, mirror: pb::MirrorSource) -> Result<pb::TopicInfo> {
        let request = pb::MarkMirrorRequest { topic: topic.to_owned(), mirror: Some(mirror) };
        self.require("MarkMirror", self.client.mark_mirror(request).await?.topic)
    }

    /// Job `id`, if the broker keeps one.
    pub async fn get_job(&self, id: &str) -> Result<Option<Job>> {
        let r = self.client.get_job(pb::GetJobRequest { job_id: id.to_owned() }).await?;
        Ok(r.found.then_some(Job { version: r.version, body: r.body }))
    }

    /// Writes job `id` over version `expected` (0: a new job). Returns the new version; a lost race is the
    /// broker's `job_conflict` refusal.
    pub async fn put_job(&self, id: &str, expected: u64, body: Bytes) -> Result<u64> {
        let request = pb::PutJobRequest { job_id: id.to_owned(), expected_version: expected, body };
        Ok(self.client.put_job(request).await?.version)
    }
}
