//! What the message models' owner reads and writes outside its own state: a user partition's records (here, or
//! from its leader), and appends to a partition any member leads (dead letters, redriven records).

use bytes::Bytes;
use ferry_batch::{BatchBuilder, Compression, Header, ProducerInfo, Record};
use ferry_proto as pb;

use super::BrokerService;
use crate::error::BrokerError;
use crate::node::registry::now_ms;

type Result<T> = std::result::Result<T, BrokerError>;

/// Records read from a partition.
#[derive(Debug, Default)]
pub(super) struct Read {
    /// The records at or after the asked offset, in order.
    pub records: Vec<Record>,
    /// The partition's log start.
    pub log_start: u64,
    /// The end readers see.
    pub end: u64,
}

impl BrokerService {
    /// Reads `topic`/`partition` from `offset`, up to about `max_bytes`: here when this broker leads it, else from
    /// its leader (a member's fetch).
    pub(super) async fn read_any(&self, topic: &str, partition: u32, offset: u64, max_bytes: u64) -> Result<Read> {
        let req = pb::FetchRequest {
            partitions: vec![pb::PartitionFetch {
                topic: topic.to_owned(),
                partition,
                offset,
                max_bytes,
                leader_epoch: None,
            }],
            max_wait_ms: 0,
            max_bytes,
        };
        let limit = crate::rpc::fetch::response_limit(self.max_batch_bytes);
        let local =
            crate::rpc::fetch::fetch(&self.reads(), req.clone(), self.max_fetch_wait, limit, 0, &self.shutdown).await;
        let mut data = local.partitions.into_iter().next().unwrap_or_default();
        if data.error == pb::ErrorCode::NotLeader as i32
            && let Some(leader) = data.leader.as_ref().map(|h| h.leader_id).filter(|l| *l != 0)
            && let Some(mut client) = self.replication.as_ref().and_then(|r| r.member_client(leader))
        {
            let answer = client.fetch(req).await.map_err(|s| {
                BrokerError::Cluster(format!("reading {topic}/{partition} at broker {leader}: {}", s.message()))
            })?;
            data = answer.into_inner().partitions.into_iter().next().unwrap_or_default();
        }
        if data.error == pb::ErrorCode::OffsetOutOfRange as i32 {
            return Ok(Read { records: Vec::new(), log_start: data.log_start_offset, end: data.log_end_offset });
        }
        if data.error != pb::ErrorCode::None as i32 {
            return Err(BrokerError::Cluster(format!(
                "reading {topic}/{partition} from {offset}: {} ({})",
                data.message,
                pb::ErrorCode::try_from(data.error).map_or("unknown", |c| c.as_str_name())
            )));
        }
        let bad = |e: ferry_batch::BatchError| BrokerError::CorruptBatch {
            topic: topic.to_owned(),
            partition,
            reason: format!("at or after offset {offset}: {e}"),
        };
        let inflate = ferry_batch::decode_limit(self.max_batch_bytes);
        let mut records = Vec::new();
        for (_, batch) in ferry_batch::split_verified(&data.batches).map_err(bad)? {
            for r in ferry_batch::decode_records_shared(&batch, inflate).map_err(bad)? {
                if r.offset >= offset {
                    records.push(r);
                }
            }
        }
        Ok(Read { records, log_start: data.log_start_offset, end: data.log_end_offset })
    }

    /// Appends `batch` to `topic`/`partition`, here or at its leader, once its in-sync replicas hold it.
    pub(super) async fn append_any(&self, topic: &str, partition: u32, batch: Bytes) -> Result<pb::ProduceResponse> {
        let leader = match self.append_here(topic, partition, batch.clone()).await {
            Ok(r) => return Ok(r),
            Err(BrokerError::NotLeader { leader, .. }) if leader != 0 => leader,
            Err(e) => return Err(e),
        };
        let mut client = self.replication.as_ref().and_then(|r| r.member_client(leader)).ok_or_else(|| {
            BrokerError::Cluster(format!("no address for broker {leader}, leader of {topic}/{partition}"))
        })?;
        let request = pb::MoveDelayedRequest { topic: topic.to_owned(), partition, batches: batch };
        let answer = client.move_delayed(request).await.map_err(|s| {
            BrokerError::Cluster(format!("appending to {topic}/{partition} at broker {leader}: {}", s.message()))
        })?;
        Ok(answer.into_inner())
    }

    /// Creates `name` with one partition when it does not exist (a dead-letter topic): raft3 on a cluster.
    pub(super) async fn ensure_topic(&self, name: &str) -> Result<()> {
        if self.partition_count(name).is_some() {
            return Ok(());
        }
        let created = match &self.replication {
            Some(r) => r
                .create_topic(
                    name,
                    1,
                    crate::node::topic::Replication::Raft3,
                    false,
                    crate::node::topic::TopicSettings::default(),
                    None,
                )
                .await
                .map(drop),
            None => self.core.create_topic(name, 1, crate::node::topic::TopicSettings::default(), None).await.map(drop),
        };
        match created {
            Ok(()) | Err(BrokerError::TopicExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A record to write: key, value, headers, timestamp.
pub(super) type Out = (Option<Bytes>, Option<Bytes>, Vec<Header>, i64);

/// One batch of `records` under `producer` (an idempotent identity with its first sequence).
pub(super) fn batch_of(records: &[Out], producer: ProducerInfo) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None, producer);
    for (i, (key, value, headers, ts)) in records.iter().enumerate() {
        b.push(i as u32, *ts, key.as_deref(), value.as_deref(), headers);
    }
    b.build(0, 0)
}

/// A header with a text value.
pub(super) fn header(key: &str, value: impl ToString) -> Header {
    Header { key: key.to_owned(), value: Some(Bytes::from(value.to_string())) }
}

/// The retries `record` asks for in its `ferry-retries` header, if it names a valid count.
pub(super) fn record_retries(record: &Record) -> Option<u32> {
    let h = record.headers.iter().rev().find(|h| h.key == crate::share::RETRIES_HEADER)?;
    let n: u32 = std::str::from_utf8(h.value.as_deref()?).ok()?.trim().parse().ok()?;
    Some(n.min(crate::share::core::MAX_RETRIES))
}

/// Now, ms.
pub(super) fn now() -> i64 {
    now_ms()
}
