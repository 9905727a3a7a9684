//! The JSON API under `/api/v1/` (docs/openapi-console.yaml): reads in [`read`], browsing and scans in
//! [`browse`], a message's trace in [`trace`], the audited actions in [`actions`].

pub mod actions;
pub mod browse;
pub mod read;
pub mod trace;

use crate::error::{ApiError, ApiResult};
use crate::{AppState, Cluster};

/// The cluster named in a path.
pub fn cluster(state: &AppState, name: &str) -> ApiResult<Cluster> {
    state
        .clusters
        .iter()
        .find(|c| c.name == name)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no cluster named {name:?} is configured")))
}

/// The dead-letter topic of a group.
pub fn dlq_topic(group: &str) -> String {
    format!("{group}.dlq")
}

/// Milliseconds since the epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
