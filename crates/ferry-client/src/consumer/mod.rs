//! [`Consumer`]: manual assignment or group membership, long-poll fetch over every assigned partition, records
//! decoded from batches, positions and commits.
//!
//! Two positions per partition:
//! - the *fetch position*, the next offset to fetch, which advances when a fetch is decoded;
//! - the *consumed position*, one past the last record handed to the caller, which is what `commit` stores.
//!
//! Fetched records wait in an internal buffer until `poll` or `stream` hands them out, so a dropped stream or a
//! caller that stops early never commits records it did not receive. A partition answering OFFSET_OUT_OF_RANGE
//! is reset per `auto_offset_reset` with a warning; any other partition error is returned by `poll`.
//!
//! Fetches go to each partition's leader (see [`BrokerClient::for_partition`]): one fetch in flight per leader,
//! each long-polling on its own, and `poll` takes whichever answers first, leaving the others in flight for the
//! next round. An answer is used only for partitions whose position is still the one it asked for (a seek or a
//! new assignment meanwhile makes it stale). A partition answering NOT_LEADER is fetched from the leader its
//! answer names at the next round, with no error.

mod config;
mod decode;
mod group;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ferry_proto as pb;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use tokio::time::Instant;

pub use self::config::{ConsumerConfig, ConsumerRecord, OffsetReset, StartAt};
use self::group::{JoinSpec, Membership};
use crate::admin::{Admin, OffsetSpec};
use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};

type Key = (String, u32);

#[derive(Debug, Clone)]
struct PartitionState {
    start: StartAt,
    fetch: Option<u64>,
    consumed: Option<u64>,
}

impl PartitionState {
    fn new(start: StartAt) -> Self {
        PartitionState { start, fetch: None, consumed: None }
    }
}

/// A fetch at one leader: the client it went to, the positions it asked for, and its answer.
type Fetched = (BrokerClient, BTreeMap<Key, u64>, Result<pb::FetchResponse>);

/// The fetches in flight, one per leader at most.
#[derive(Default)]
struct InFlight {
    fetches: FuturesUnordered<Pin<Box<dyn Future<Output = Fetched> + Send>>>,
    /// Partitions with a fetch in flight.
    asked: BTreeSet<Key>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").field("fetches", &self.fetches.len()).field("asked", &self.asked).finish()
    }
}

/// Reads records from a Ferry cluster. Not `Clone`: one consumer, one set of positions.
#[derive(Debug)]
pub struct Consumer {
    client: BrokerClient,
    admin: Admin,
    config: ConsumerConfig,
    partitions: BTreeMap<Key, PartitionState>,
    buffer: VecDeque<ConsumerRecord>,
    membership: Option<Membership>,
    pending_error: Option<ClientError>,
    /// Set when the last fetch answers named no leader for a partition.
    leaderless: bool,
    last_commit: Instant,
    closed: bool,
    /// Most decompressed bytes one batch may inflate to: the broker's decode limit, learnt from its Metadata on
    /// the first fetch.
    decode_limit: Option<usize>,
    in_flight: InFlight,
}

impl Consumer {
    /// A consumer over `client` with nothing assigned yet.
    pub fn new(client: BrokerClient, config: ConsumerConfig) -> Result<Self> {
        config.validate()?;
        Ok(Consumer {
            admin: Admin::new(client.clone()),
            client,
            config,
            partitions: BTreeMap::new(),
            buffer: VecDeque::new(),
            membership: None,
            pending_error: None,
            leaderless: false,
            last_commit: Instant::now(),
            closed: false,
            decode_limit: None,
            in_flight: InFlight::default(),
        })
    }

    /// The group in use for commits, if any.
    pub fn group(&self) -> Option<&str> {
        self.config.group.as_deref()
    }

    /// The partitions currently assigned, sorted.
    pub fn assignment(&self) -> Vec<(String, u32)> {
        self.partitions.keys().cloned().collect()
    }

    /// The consumed position of a partition (one past the last record handed out), once known.
    pub fn position(&self, topic: &str, partition: u32) -> Option<u64> {
        self.partitions.get(&(topic.to_owned(), partition)).and_then(|s| s.consumed)
    }

    /// Assigns partitions manually, replacing any previous manual assignment.
    pub fn assign(&mut self, partitions: Vec<(String, u32, StartAt)>) -> Result<()> {
        self.ensure_open()?;
        if self.membership.is_some() {
            return Err(ClientError::Usage("assign is not possible on a consumer that joined a group".into()));
        }
        if self.config.group.is_none() && partitions.iter().any(|(_, _, s)| *s == StartAt::Committed) {
            return Err(ClientError::Usage("StartAt::Committed needs a group (ConsumerConfig::group)".into()));
        }
        self.partitions = partitions.into_iter().map(|(t, p, start)| ((t, p), PartitionState::new(start))).collect();
        self.buffer.retain(|r| self.partitions.contains_key(&(r.topic.clone(), r.partition)));
        Ok(())
    }

    /// Moves a partition's position: the next record handed out for it is at `offset`.
    pub fn seek(&mut self, topic: &str, partition: u32, offset: u64) -> Result<()> {
        let state = self
            .partitions
            .get_mut(&(topic.to_owned(), partition))
            .ok_or_else(|| ClientError::Usage(format!("{topic}/{partition} is not assigned to this consumer")))?;
        *state = PartitionState { start: StartAt::Offset(offset), fetch: Some(offset), consumed: Some(offset) };
        self.buffer.retain(|r| !(r.topic == topic && r.partition == partition));
        Ok(())
    }

    /// Joins `group` subscribing to `topics`; partitions follow the group's assignment from then on.
    pub async fn subscribe(&mut self, group: &str, topics: Vec<String>) -> Result<()> {
        self.ensure_open()?;
        if self.membership.is_some() {
            return Err(ClientError::Usage("this consumer already joined a group".into()));
        }
        if group.is_empty() || topics.is_empty() {
            return Err(ClientError::Usage("subscribe needs a group name and at least one topic".into()));
        }
        let spec = JoinSpec {
            group: group.to_owned(),
            topics,
            session_timeout: self.config.session_timeout,
            heartbeat_interval: self.config.heartbeat_interval,
            client_id: self.config.client_id.clone(),
        };
        self.membership = Some(Membership::join(self.client.clone(), spec).await?);
        self.config.group = Some(group.to_owned());
        self.partitions.clear();
        self.buffer.clear();
        self.apply_group_change().await;
        Ok(())
    }

    /// Records at or after the positions, waiting up to `max_wait` for some to arrive. May return none.
    pub async fn poll(&mut self, max_wait: Duration) -> Result<Vec<ConsumerRecord>> {
        self.ensure_open()?;
        if self.buffer.is_empty() {
            self.fill(max_wait).await?;
        }
        let records: Vec<ConsumerRecord> = self.buffer.drain(..).collect();
        for r in &records {
            self.mark_consumed(r);
        }
        Ok(records)
    }

    /// The records as a stream, one at a time, each fetch waiting up to `ConsumerConfig::max_wait`. Errors are
    /// yielded and the stream goes on; it ends when the consumer is closed. Dropping it loses nothing.
    pub fn stream(&mut self) -> impl Stream<Item = Result<ConsumerRecord>> + '_ {
        futures::stream::unfold(self, |consumer| async move {
            loop {
                if consumer.closed {
                    return None;
                }
                if let Some(record) = consumer.buffer.pop_front() {
                    consumer.mark_consumed(&record);
                    return Some((Ok(record), consumer));
                }
                let wait = consumer.config.max_wait;
                if let Err(e) = consumer.fill(wait).await {
                    return Some((Err(e), consumer));
                }
            }
        })
    }

    /// Commits the consumed positions to the group (as member and generation in group mode; with an empty member
    /// id and generation 0 for manual assignment). Needs a group.
    pub async fn commit(&mut self) -> Result<()> {
        let group =
            self.config.group.clone().ok_or_else(|| {
                ClientError::Usage("commit needs a group (ConsumerConfig::group or subscribe)".into())
            })?;
        let offsets: Vec<pb::CommittedOffset> = self
            .partitions
            .iter()
            .filter_map(|((topic, partition), s)| {
                s.consumed.map(|offset| pb::CommittedOffset {
                    topic: topic.clone(),
                    partition: *partition,
                    offset,
                    metadata: String::new(),
                })
            })
            .collect();
        self.last_commit = Instant::now();
        if offsets.is_empty() {
            return Ok(());
        }
        let (member_id, generation) = self.membership.as_ref().map(Membership::identity).unwrap_or_default();
        let mut request = pb::CommitOffsetsRequest { group, member_id, generation, offsets };
        match (self.client.commit_offsets(request.clone()).await, &self.membership) {
            (Err(e), Some(membership)) if e.is_failed_precondition() => {
                // A rebalance the heartbeat has not seen yet: learn the generation and commit once more. The
                // consumer still owns what it consumed until it applies the new assignment on its next poll.
                membership.refresh(&self.client).await?;
                let (member_id, generation) = membership.identity();
                if generation == request.generation {
                    return Err(e);
                }
                request.member_id = member_id;
                request.generation = generation;
                self.client.commit_offsets(request).await.map(drop)
            }
            (result, _) => result.map(drop),
        }
    }

    /// Commits (group mode with auto-commit), leaves the group, and closes the consumer.
    pub async fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let mut result = Ok(());
        if self.membership.is_some() && self.config.auto_commit {
            result = self.commit().await;
        }
        self.closed = true;
        if let Some(membership) = self.membership.take() {
            let left = membership.leave(&self.client).await;
            if result.is_ok() {
                result = left;
            }
        }
        result
    }

    fn ensure_open(&self) -> Result<()> {
        if self.closed { Err(ClientError::Closed("consumer")) } else { Ok(()) }
    }

    fn mark_consumed(&mut self, record: &ConsumerRecord) {
        if let Some(state) = self.partitions.get_mut(&(record.topic.clone(), record.partition)) {
            state.consumed = Some(record.offset.saturating_add(1));
        }
    }

    /// One round: apply group changes, auto-commit, resolve positions, fetch into the buffer.
    async fn fill(&mut self, max_wait: Duration) -> Result<()> {
        if let Some(e) = self.pending_error.take() {
            return Err(e);
        }
        self.apply_group_change().await;
        if self.membership.is_some()
            && self.config.auto_commit
            && self.last_commit.elapsed() >= self.config.auto_commit_interval
            && let Err(e) = self.commit().await
        {
            tracing::warn!(error = %e, "auto-commit failed");
        }
        self.resolve_positions().await?;
        if self.partitions.is_empty() {
            // Nothing to fetch: wait for an assignment (or the time asked).
            match &self.membership {
                Some(m) => {
                    let _ = tokio::time::timeout(max_wait, m.changed.notified()).await;
                }
                None => tokio::time::sleep(max_wait).await,
            }
            return Ok(());
        }
        self.fetch(max_wait).await
    }

    /// The decode limit of the broker's batches (`max(2 x max_batch_bytes, 4 MiB)`), asked once.
    async fn decode_limit(&mut self) -> Result<usize> {
        if let Some(limit) = self.decode_limit {
            return Ok(limit);
        }
        let max_batch_bytes = self.client.metadata().await?.max_batch_bytes;
        // A broker that does not say (0) gets the default broker's limit.
        let limit = ferry_batch::decode_limit(if max_batch_bytes == 0 { 1 << 20 } else { max_batch_bytes });
        self.decode_limit = Some(limit);
        Ok(limit)
    }

    async fn fetch(&mut self, max_wait: Duration) -> Result<()> {
        let decode_limit = self.decode_limit().await?;
        // One fetch per leader for the partitions that have none in flight.
        let mut groups: BTreeMap<String, (BrokerClient, Vec<pb::PartitionFetch>)> = BTreeMap::new();
        for ((topic, partition), s) in &self.partitions {
            let Some(offset) = s.fetch else { continue };
            if self.in_flight.asked.contains(&(topic.clone(), *partition)) {
                continue;
            }
            let client = self.client.for_partition(topic, *partition);
            let fetch = pb::PartitionFetch {
                topic: topic.clone(),
                partition: *partition,
                offset,
                max_bytes: self.config.partition_max_bytes,
                leader_epoch: self.client.known_leader_epoch(topic, *partition),
            };
            groups.entry(client.address()).or_insert_with(|| (client, Vec::new())).1.push(fetch);
        }
        let max_wait_ms = u32::try_from(max_wait.as_millis()).unwrap_or(u32::MAX);
        for (_, (client, partitions)) in groups {
            let asked: BTreeMap<Key, u64> =
                partitions.iter().map(|p| ((p.topic.clone(), p.partition), p.offset)).collect();
            self.in_flight.asked.extend(asked.keys().cloned());
            let request = pb::FetchRequest { partitions, max_wait_ms, max_bytes: self.config.fetch_max_bytes };
            self.in_flight.fetches.push(Box::pin(async move {
                let response = client.fetch(request).await;
                (client, asked, response)
            }));
        }
        // The first answer, and every other one that is in already.
        let Some(first) = self.in_flight.fetches.next().await else { return Ok(()) };
        let mut answers = vec![first];
        while let Some(Some(more)) = self.in_flight.fetches.next().now_or_never() {
            answers.push(more);
        }
        let mut first_error = None;
        self.leaderless = false;
        for (client, asked, response) in answers {
            for key in asked.keys() {
                self.in_flight.asked.remove(key);
            }
            match response {
                Ok(response) => self.take(&client, &asked, response, decode_limit, &mut first_error),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            if self.buffer.is_empty() {
                return Err(e);
            }
            self.pending_error = Some(e);
        }
        if self.leaderless && self.buffer.is_empty() {
            // No broker named a leader: give the cluster a moment before asking again.
            tokio::time::sleep(self.client.config().retry.initial_backoff).await;
        }
        Ok(())
    }

    /// Takes one fetch answer into the buffer: the data of partitions still at the position it asked for.
    fn take(
        &mut self,
        client: &BrokerClient,
        asked: &BTreeMap<Key, u64>,
        response: pb::FetchResponse,
        decode_limit: usize,
        first_error: &mut Option<ClientError>,
    ) {
        for data in response.partitions {
            let key = (data.topic.clone(), data.partition);
            let Some(state) = self.partitions.get_mut(&key) else { continue };
            let Some(position) = state.fetch else { continue };
            if asked.get(&key) != Some(&position) {
                // Sought, reset or reassigned while the fetch was in flight.
                continue;
            }
            let code = pb::ErrorCode::try_from(data.error).unwrap_or(pb::ErrorCode::StorageError);
            // NOT_LEADER or FENCED_LEADER_EPOCH naming the leader: the next fetch goes there. Naming none (an election
            // runs, or the broker fenced itself), the next fetch asks the listed brokers again, after a pause.
            if matches!(code, pb::ErrorCode::NotLeader | pb::ErrorCode::FencedLeaderEpoch)
                && let Some(hint) = &data.leader
            {
                if !client.take_hint(&data.topic, data.partition, hint) {
                    self.client.forget_leader(&data.topic, data.partition);
                    self.client.reconnect();
                    self.leaderless = true;
                }
                tracing::debug!(topic = %data.topic, partition = data.partition, leader = %hint.leader_address, "fetching from the leader named");
                continue;
            }
            if code == pb::ErrorCode::None && data.leader_epoch > 0 {
                // The epoch this leader serves the partition at: later fetches name it.
                client.learn_leader(&data.topic, data.partition, data.leader_epoch, &client.address());
            }
            if code == pb::ErrorCode::OffsetOutOfRange {
                tracing::warn!(
                    topic = %data.topic,
                    partition = data.partition,
                    position,
                    log_start_offset = data.log_start_offset,
                    log_end_offset = data.log_end_offset,
                    reset = ?self.config.auto_offset_reset,
                    message = %data.message,
                    "position out of range; resetting"
                );
                *state = PartitionState::new(self.config.auto_offset_reset.into());
                continue;
            }
            if code != pb::ErrorCode::None {
                first_error.get_or_insert(ClientError::Partition {
                    topic: data.topic,
                    partition: data.partition,
                    code,
                    message: data.message,
                });
                continue;
            }
            let decoded = decode::decode_partition(
                &data.topic,
                data.partition,
                &data.batches,
                data.next_offset,
                position,
                decode_limit,
            );
            state.fetch = Some(decoded.position);
            self.buffer.extend(decoded.records);
            if let Some(e) = decoded.error {
                first_error.get_or_insert(e);
            }
        }
    }

    /// Applies a new group generation: commit what was consumed, then switch to the new assignment.
    async fn apply_group_change(&mut self) {
        let Some(membership) = &self.membership else { return };
        let (view, changed) = membership.take_change();
        if !changed {
            return;
        }
        if self.config.auto_commit
            && !self.partitions.is_empty()
            && let Err(e) = self.commit().await
        {
            tracing::warn!(error = %e, "commit before switching to the new assignment failed");
        }
        let mut next = BTreeMap::new();
        for key in view.assignment {
            let state = self.partitions.remove(&key).unwrap_or_else(|| PartitionState::new(StartAt::Committed));
            next.insert(key, state);
        }
        self.partitions = next;
        self.buffer.retain(|r| self.partitions.contains_key(&(r.topic.clone(), r.partition)));
    }

    /// Gives every partition without a position one: its offset, the committed offset, or earliest/latest.
    async fn resolve_positions(&mut self) -> Result<()> {
        let unresolved: Vec<(Key, StartAt)> =
            self.partitions.iter().filter(|(_, s)| s.fetch.is_none()).map(|(k, s)| (k.clone(), s.start)).collect();
        if unresolved.is_empty() {
            return Ok(());
        }
        let mut resolved: Vec<(Key, u64)> = Vec::new();
        let mut lookups: Vec<(String, u32, OffsetSpec)> = Vec::new();
        let reset_spec = match self.config.auto_offset_reset {
            OffsetReset::Earliest => OffsetSpec::Earliest,
            OffsetReset::Latest => OffsetSpec::Latest,
        };
        let committed_keys: Vec<Key> =
            unresolved.iter().filter(|(_, s)| *s == StartAt::Committed).map(|(k, _)| k.clone()).collect();
        let committed = match (&self.config.group, committed_keys.is_empty()) {
            (Some(group), false) => self.admin.fetch_committed_offsets(group, &committed_keys).await?,
            _ => Vec::new(),
        };
        for (key, start) in unresolved {
            match start {
                StartAt::Offset(o) => resolved.push((key, o)),
                StartAt::Earliest => lookups.push((key.0, key.1, OffsetSpec::Earliest)),
                StartAt::Latest => lookups.push((key.0, key.1, OffsetSpec::Latest)),
                StartAt::Committed => match committed.iter().find(|c| c.topic == key.0 && c.partition == key.1) {
                    Some(c) => resolved.push((key, c.offset)),
                    None => lookups.push((key.0, key.1, reset_spec)),
                },
            }
        }
        if !lookups.is_empty() {
            for r in self.admin.list_offsets(&lookups).await? {
                let offset = r.offset.unwrap_or(r.log_end_offset);
                resolved.push(((r.topic, r.partition), offset));
            }
        }
        for (key, offset) in resolved {
            if let Some(state) = self.partitions.get_mut(&key) {
                tracing::debug!(topic = %key.0, partition = key.1, offset, "starting position");
                state.fetch = Some(offset);
                state.consumed = Some(offset);
            }
        }
        Ok(())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if !self.closed && self.membership.is_some() {
            tracing::debug!("consumer dropped without close: heartbeats stop, the session will expire");
        }
    }
}
