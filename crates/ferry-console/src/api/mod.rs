//! The JSON API under `/api/v1/` (docs/openapi-console.yaml): reads in [`read`], browsing and scans in
//! [`browse`], a message's trace in [`trace`], the audited actions in [`actions`].

pub mod actions;
pub mod browse;
pub mod read;
pub mod trace;

use crate::error::{ApiError, ApiResult};
use crate::{AppState, Cluster};

/// The cluster named in a path, with the clients the current caller's requests go through: with
/// `forward_user_token`, those presenting the caller's own token (anonymous readers: the cluster's `token_file`).
pub fn cluster(state: &AppState, name: &str) -> ApiResult<Cluster> {
    let c = state
        .clusters
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| ApiError::NotFound(format!("no cluster named {name:?} is configured")))?;
    let (Some(users), Some(caller)) = (&c.per_user, crate::auth::caller_digest()) else { return Ok(c.clone()) };
    users.get(&caller).cloned().ok_or_else(|| {
        ApiError::Forbidden(format!("cluster {name:?} forwards callers' tokens and has no client for this caller"))
    })
}

/// The dead-letter topic of a group.
pub fn dlq_topic(group: &str) -> String {
    format!("{group}.dlq")
}

/// Milliseconds since the epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
