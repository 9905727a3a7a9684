//! Job records kept by the broker: a long operation's durable state (a failover's steps and report), written by
//! whoever runs the job (the mirror) and read back when it is run again. They live in the internal topic
//! `__ferry_jobs` (see `crate::state`), so on a cluster they are replicated like any acknowledged write and a job
//! survives the loss of a member.
//!
//! A job is written by compare-and-set on its version: a writer names the version it read, and a writer that lost
//! a race (two processes running the same job) is refused with `job_conflict` rather than overwriting.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use ferry_batch::Record;

use crate::error::{BrokerError, Result};
use crate::node::internal::InternalTopic;
use crate::state::{Entry, Owners, Replayed, StateLogs};

/// The internal topic of job records.
pub static JOBS_TOPIC: InternalTopic = crate::node::internal::JOBS;

/// Longest job id.
pub const MAX_JOB_ID: usize = 128;
/// Largest job body (a failover's report of every partition fits: about 100 bytes a partition).
pub const MAX_JOB_BYTES: usize = 4 << 20;
/// The log size past which the job records are compacted (written again whole, the older segments dropped).
const COMPACT_BYTES: u64 = 64 << 20;

/// Every job: id -> (version, body).
#[derive(Debug, Default)]
pub struct Jobs(BTreeMap<String, (u64, Bytes)>);

impl Replayed for Jobs {
    fn apply(&mut self, _offset: u64, record: &Record) {
        let (Some(key), Some(value)) = (&record.key, &record.value) else { return };
        let (Ok(id), Some(version)) = (std::str::from_utf8(key), value.get(..8)) else { return };
        let version = u64::from_be_bytes(version.try_into().unwrap_or_default());
        self.0.insert(id.to_owned(), (version, value.slice(8..)));
    }
}

fn entry(id: &str, version: u64, body: &[u8]) -> Entry {
    let mut value = BytesMut::with_capacity(8 + body.len());
    value.put_u64(version);
    value.put_slice(body);
    Entry { key: Bytes::copy_from_slice(id.as_bytes()), value: value.freeze() }
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_JOB_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(BrokerError::InvalidArgument(format!(
            "job id {id:?} must be 1 to {MAX_JOB_ID} characters of letters, digits, '-', '_' and '.'"
        )))
    }
}

/// Writes job `id` if its version is `expected` (0: it must not exist). Returns the new version.
pub async fn put(owners: &Owners<Jobs>, logs: &StateLogs, id: &str, expected: u64, body: &[u8]) -> Result<u64> {
    check_id(id)?;
    if body.len() > MAX_JOB_BYTES {
        return Err(BrokerError::InvalidArgument(format!(
            "job {id:?} is {} bytes, above the limit of {MAX_JOB_BYTES}",
            body.len()
        )));
    }
    let mut g = owners.lock_key(logs, id.as_bytes()).await?;
    let current = g.state().0.get(id).map_or(0, |(v, _)| *v);
    if current != expected {
        return Err(BrokerError::JobConflict { job: id.to_owned(), expected, current });
    }
    let version = current + 1;
    g.write(&[entry(id, version, body)]).await?;
    if g.owned().part.log().stats().size_bytes > COMPACT_BYTES {
        let snapshot: Vec<Entry> = g.state().0.iter().map(|(id, (v, b))| entry(id, *v, b)).collect();
        g.compact(&snapshot).await?;
    }
    Ok(version)
}

/// Job `id`: its version and body, if it exists.
pub async fn get(owners: &Owners<Jobs>, logs: &StateLogs, id: &str) -> Result<Option<(u64, Bytes)>> {
    check_id(id)?;
    let g = owners.lock_key(logs, id.as_bytes()).await?;
    Ok(g.state().0.get(id).cloned())
}
