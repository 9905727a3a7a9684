//! Message-model groups (docs/messaging.md, "Message models"): broadcast, queue and serial members that poll
//! records and settle each one. [`crate::listener::Listener`] runs a handler over them (push consumption).
//!
//! A group's owner is the leader of the group's partition of `__ferry_queues`; calls follow its NOT_LEADER hints,
//! and a member the owner no longer knows (expired, or the owner moved) joins again by itself.

use std::time::Duration;

use bytes::Bytes;
use ferry_proto as pb;
use parking_lot::Mutex;

use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};

/// The internal topic whose partition leaders own the groups.
const QUEUES_TOPIC: &str = "__ferry_queues";
/// Its partition count.
const QUEUES_PARTITIONS: u32 = 8;
/// How long one call keeps trying while the owner moves or is unreachable (an election takes a lease TTL or two).
const RETRY_FOR: Duration = Duration::from_secs(30);
/// Pause between them.
const PAUSE: Duration = Duration::from_millis(100);

/// A group's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareMode {
    /// Every member receives every record, from its own position.
    Broadcast,
    /// Any member takes any record; each record is locked to one member and succeeds once.
    Queue,
    /// One active member takes the records in order.
    Serial,
}

impl ShareMode {
    /// Parses `broadcast`, `queue` or `serial`.
    pub fn parse(s: &str) -> Option<ShareMode> {
        match s {
            "broadcast" => Some(ShareMode::Broadcast),
            "queue" => Some(ShareMode::Queue),
            "serial" => Some(ShareMode::Serial),
            _ => None,
        }
    }

    fn to_pb(self) -> pb::ShareMode {
        match self {
            ShareMode::Broadcast => pb::ShareMode::Broadcast,
            ShareMode::Queue => pb::ShareMode::Queue,
            ShareMode::Serial => pb::ShareMode::Serial,
        }
    }
}

/// A member's settings.
#[derive(Debug, Clone)]
pub struct ShareConfig {
    /// The group.
    pub group: String,
    /// Its topics.
    pub topics: Vec<String>,
    /// The model.
    pub mode: ShareMode,
    /// The session timeout (the broker clamps it to 1 s..5 min).
    pub session_timeout: Duration,
    /// How long a delivered record stays locked (queue, serial); `None`: the broker's 30 s.
    pub lock_timeout: Option<Duration>,
    /// Most unsettled records per partition (queue, serial); `None`: 2,000. Fixed by the group's first join.
    pub window: Option<u32>,
    /// The retry backoff steps; empty: the broker's (1 s, 5 s, 10 s, 30 s, 1 m, ...).
    pub backoff: Vec<Duration>,
    /// Retries for a record that names none in its `ferry-retries` header; `None`: 16.
    pub retries: Option<u32>,
    /// Start a new group (or broadcast member) at the earliest offset instead of the latest.
    pub from_earliest: bool,
    /// Free text shown by describe.
    pub client_id: String,
}

impl ShareConfig {
    /// A member of `group` over `topics` in `mode`, with the defaults.
    pub fn new(group: impl Into<String>, topics: &[&str], mode: ShareMode) -> ShareConfig {
        ShareConfig {
            group: group.into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            mode,
            session_timeout: Duration::from_secs(10),
            lock_timeout: None,
            window: None,
            backoff: Vec::new(),
            retries: None,
            from_earliest: false,
            client_id: String::new(),
        }
    }
}

/// A delivered record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMessage {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// Its timestamp, ms.
    pub timestamp: i64,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value.
    pub value: Option<Bytes>,
    /// Its headers.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// 1 on the first delivery.
    pub delivery_count: u32,
    /// When its lock ends, ms since the epoch (0 for broadcast).
    pub lock_until_ms: i64,
}

/// What became of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Ack,
    /// It failed: retried after the group's backoff (or `after`), dead-lettered when no retries are left.
    Retry {
        /// Wait this long instead of the policy's backoff.
        after: Option<Duration>,
        /// The error text kept in the history.
        error: String,
    },
    /// To the dead-letter topic now.
    DeadLetter {
        /// Why.
        reason: String,
    },
    /// Given back unprocessed (not a failure).
    Release,
}

impl Outcome {
    /// A retry after the policy's backoff, with `error`.
    pub fn retry(error: impl Into<String>) -> Outcome {
        Outcome::Retry { after: None, error: error.into() }
    }
}

/// A member of a broadcast, queue or serial group.
#[derive(Debug)]
pub struct ShareConsumer {
    client: BrokerClient,
    config: ShareConfig,
    member: Mutex<String>,
    active: std::sync::atomic::AtomicBool,
}

impl ShareConsumer {
    /// Joins the group.
    pub async fn join(client: BrokerClient, config: ShareConfig) -> Result<ShareConsumer> {
        let c = ShareConsumer {
            client,
            config,
            member: Mutex::new(String::new()),
            active: std::sync::atomic::AtomicBool::new(false),
        };
        c.rejoin().await?;
        Ok(c)
    }

    /// The member id the owner gave.
    pub fn member_id(&self) -> String {
        self.member.lock().clone()
    }

    /// The group's settings.
    pub fn config(&self) -> &ShareConfig {
        &self.config
    }

    /// Serial: whether this member was active at its last poll.
    pub fn is_active(&self) -> bool {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Calls the group's owner (see [`call_owner`]).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(crate::RawClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        call_owner(&self.client, owner_partition(&self.config.group), f).await
    }

    async fn rejoin(&self) -> Result<()> {
        let c = &self.config;
        let req = pb::ShareJoinRequest {
            group: c.group.clone(),
            member_id: self.member_id(),
            topics: c.topics.clone(),
            mode: c.mode.to_pb() as i32,
            session_timeout_ms: c.session_timeout.as_millis() as u32,
            lock_timeout_ms: c.lock_timeout.map_or(0, |d| d.as_millis() as u32),
            window: c.window.unwrap_or(0),
            retry: Some(pb::RetryPolicy {
                backoff_ms: c.backoff.iter().map(|d| d.as_millis() as u64).collect(),
                retries: c.retries,
            }),
            from_earliest: c.from_earliest,
            client_id: c.client_id.clone(),
        };
        let joined = self
            .call(|mut raw| {
                let req = req.clone();
                async move { raw.share_join(req).await }
            })
            .await?;
        *self.member.lock() = joined.member_id;
        self.active.store(joined.active, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Takes up to `max_records` records, waiting up to `max_wait` for the first. Also the member's heartbeat.
    pub async fn poll(&self, max_records: u32, max_wait: Duration) -> Result<Vec<ShareMessage>> {
        for _ in 0..2 {
            let req = pb::SharePollRequest {
                group: self.config.group.clone(),
                member_id: self.member_id(),
                max_records,
                max_bytes: 0,
                max_wait_ms: max_wait.as_millis() as u32,
            };
            let got = self
                .call(|mut raw| {
                    let req = req.clone();
                    async move { raw.share_poll(req).await }
                })
                .await?;
            if !got.member_known {
                self.rejoin().await?;
                continue;
            }
            self.active.store(got.active, std::sync::atomic::Ordering::Relaxed);
            return Ok(got.records.into_iter().map(from_pb).collect());
        }
        Ok(Vec::new())
    }

    /// Settles records this member holds; returns, per record, `None` or the owner's refusal (not held).
    pub async fn ack(&self, outcomes: &[(&ShareMessage, Outcome)]) -> Result<Vec<Option<String>>> {
        if outcomes.is_empty() {
            return Ok(Vec::new());
        }
        let acks: Vec<pb::ShareAck> = outcomes
            .iter()
            .map(|(m, o)| {
                let (outcome, after, error) = match o {
                    Outcome::Ack => (pb::AckOutcome::Ack, None, String::new()),
                    Outcome::Retry { after, error } => {
                        (pb::AckOutcome::Retry, after.map(|d| d.as_millis() as u64), error.clone())
                    }
                    Outcome::DeadLetter { reason } => (pb::AckOutcome::DeadLetter, None, reason.clone()),
                    Outcome::Release => (pb::AckOutcome::Release, None, String::new()),
                };
                pb::ShareAck {
                    topic: m.topic.clone(),
                    partition: m.partition,
                    offset: m.offset,
                    outcome: outcome as i32,
                    retry_after_ms: after,
                    error,
                }
            })
            .collect();
        let req = pb::ShareAckRequest { group: self.config.group.clone(), member_id: self.member_id(), acks };
        let answer = self
            .call(|mut raw| {
                let req = req.clone();
                async move { raw.share_ack(req).await }
            })
            .await?;
        Ok(answer.results.into_iter().map(|r| (r.error != pb::ErrorCode::None as i32).then_some(r.message)).collect())
    }

    /// Leaves the group: the records it holds are NEW again at once.
    pub async fn leave(&self) -> Result<()> {
        let req = pb::ShareLeaveRequest { group: self.config.group.clone(), member_id: self.member_id() };
        self.call(|mut raw| {
            let req = req.clone();
            async move { raw.share_leave(req).await }
        })
        .await
        .map(drop)
    }
}

/// Operator calls about message-model groups (describe, unpin, a record's status, redrive).
#[derive(Debug, Clone)]
pub struct ShareAdmin {
    client: BrokerClient,
}

impl ShareAdmin {
    /// Over `client`.
    pub fn new(client: BrokerClient) -> ShareAdmin {
        ShareAdmin { client }
    }

    async fn call<T, F, Fut>(&self, group: &str, f: F) -> Result<T>
    where
        F: Fn(crate::RawClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        call_owner(&self.client, owner_partition(group), f).await
    }

    /// Every message-model group, from each state partition's owner: (group, mode, live members).
    pub async fn list(&self) -> Result<Vec<pb::ShareGroupSummary>> {
        let mut all = Vec::new();
        for k in 0..QUEUES_PARTITIONS {
            let req = pb::ShareListRequest { partition: k };
            let got = call_owner(&self.client, k, |mut raw| async move { raw.share_list(req).await }).await?;
            all.extend(got.groups);
        }
        all.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(all)
    }

    /// The group's mode, members and backlog.
    pub async fn describe(&self, group: &str) -> Result<pb::ShareDescribeResponse> {
        let req = pb::ShareDescribeRequest { group: group.to_owned() };
        self.call(group, |mut raw| {
            let req = req.clone();
            async move { raw.share_describe(req).await }
        })
        .await
    }

    /// Serial: moves the active role to the next member; returns it.
    pub async fn unpin(&self, group: &str) -> Result<String> {
        let req = pb::ShareUnpinRequest { group: group.to_owned() };
        let r = self
            .call(group, |mut raw| {
                let req = req.clone();
                async move { raw.share_unpin(req).await }
            })
            .await?;
        Ok(r.active)
    }

    /// A record's status in `group` and its history.
    pub async fn status(
        &self,
        group: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<pb::MessageStatusResponse> {
        let req = pb::MessageStatusRequest { group: group.to_owned(), topic: topic.to_owned(), partition, offset };
        self.call(group, |mut raw| {
            let req = req.clone();
            async move { raw.message_status(req).await }
        })
        .await
    }

    /// Starts (or attaches to, or with `status_only` reports) the group's redrive job.
    pub async fn redrive(&self, req: pb::RedriveRequest) -> Result<pb::RedriveResponse> {
        let group = req.group.clone();
        self.call(&group, |mut raw| {
            let req = req.clone();
            async move { raw.redrive(req).await }
        })
        .await
    }
}

/// The partition of `__ferry_queues` whose leader owns `group`.
fn owner_partition(group: &str) -> u32 {
    ferry_proto::partition_for_key(group.as_bytes(), QUEUES_PARTITIONS)
}

/// Calls the owner of partition `k` of `__ferry_queues`, following NOT_LEADER and riding out a moving or
/// restarting owner: a gone owner is forgotten, so the next try asks the listed brokers, which name the new one.
async fn call_owner<T, F, Fut>(client: &BrokerClient, k: u32, f: F) -> Result<T>
where
    F: Fn(crate::RawClient) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let forget = |owner: &BrokerClient| {
        client.forget_leader(QUEUES_TOPIC, k);
        owner.reconnect();
    };
    let mut last = None;
    let until = tokio::time::Instant::now() + RETRY_FOR;
    while tokio::time::Instant::now() < until {
        let owner = client.for_partition(QUEUES_TOPIC, k);
        let broker = owner.address();
        let raw = match owner.raw().await {
            Ok(raw) => raw,
            Err(e) => {
                forget(&owner);
                last = Some(e);
                tokio::time::sleep(PAUSE).await;
                continue;
            }
        };
        match f(raw).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(status) => {
                let e = ClientError::from_status(&status, &broker);
                if owner.follow_hint(&status) {
                    last = Some(e);
                    continue;
                }
                if !e.is_retriable() {
                    return Err(e);
                }
                forget(&owner);
                last = Some(e);
                tokio::time::sleep(PAUSE).await;
            }
        }
    }
    Err(last.unwrap_or(ClientError::Closed("the group's owner")))
}

fn from_pb(r: pb::ShareRecord) -> ShareMessage {
    ShareMessage {
        topic: r.topic,
        partition: r.partition,
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key,
        value: r.value,
        headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
        delivery_count: r.delivery_count,
        lock_until_ms: r.lock_until_ms,
    }
}
