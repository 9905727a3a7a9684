//! Produce, Fetch and ListOffsets over the service's Produce, Fetch and ListOffsets.

use bytes::{Bytes, BytesMut};
use ferry_proto as pb;
use ferry_proto::broker_server::Broker;
use kafka_protocol::ResponseError as E;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest, ProduceResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::{s, topic};
use crate::rpc::kafka::Kafka;
use crate::rpc::kafka::errors::{About, code, message};
use crate::rpc::kafka::records::{self, RecordsError};

/// The Kafka code of a refused produced batch.
fn records_code(e: &RecordsError) -> i16 {
    match e {
        RecordsError::Corrupt(_) | RecordsError::Crc { .. } => E::CorruptMessage.code(),
        RecordsError::Compression(_) => E::UnsupportedCompressionType.code(),
        RecordsError::Unsupported(_) => E::UnsupportedForMessageFormat.code(),
        RecordsError::TooLarge(_) => E::MessageTooLarge.code(),
    }
}

/// The Kafka code of a per-partition error of the service.
pub fn partition_code(e: i32) -> i16 {
    use pb::ErrorCode as C;
    match C::try_from(e) {
        Ok(C::None) => 0,
        Ok(C::UnknownTopicOrPartition) => E::UnknownTopicOrPartition.code(),
        Ok(C::OffsetOutOfRange) => E::OffsetOutOfRange.code(),
        Ok(C::CorruptBatch) => E::CorruptMessage.code(),
        Ok(C::BatchTooLarge) => E::MessageTooLarge.code(),
        Ok(C::StorageError) => E::KafkaStorageError.code(),
        Ok(C::NotLeader) => E::NotLeaderOrFollower.code(),
        Ok(C::FencedLeaderEpoch) => E::FencedLeaderEpoch.code(),
        _ => E::UnknownServerError.code(),
    }
}

/// One partition's produce: its Kafka batches re-encoded as Ferry batches, written in one service call.
async fn produce_one(k: &Kafka, name: &str, index: i32, records: Option<Bytes>) -> PartitionProduceResponse {
    let mut r = PartitionProduceResponse::default();
    r.index = index;
    r.base_offset = -1;
    r.log_append_time_ms = -1;
    r.log_start_offset = -1;
    let fail = |mut r: PartitionProduceResponse, error: i16, msg: String| {
        r.error_code = error;
        r.error_message = Some(StrBytes::from_string(msg));
        r
    };
    let Ok(partition) = u32::try_from(index) else {
        return fail(r, E::UnknownTopicOrPartition.code(), format!("partition {index} does not exist"));
    };
    let Some(records) = records else {
        return fail(r, E::CorruptMessage.code(), "no records".into());
    };
    let mut batches = BytesMut::new();
    let converted = records::split_kafka(&records).and_then(|all| {
        for b in all {
            batches.extend_from_slice(&records::to_ferry(b, k.inflate_limit())?);
        }
        Ok(())
    });
    if let Err(e) = converted {
        return fail(r, records_code(&e), e.to_string());
    }
    let req =
        pb::ProduceRequest { topic: name.to_owned(), partition: Some(partition), key: None, batches: batches.freeze() };
    match k.svc.produce(k.rpc(req)).await {
        Ok(p) => {
            r.base_offset = p.into_inner().base_offset as i64;
            r
        }
        Err(e) => fail(r, code(&e, About::Topic), message(&e).to_string()),
    }
}

/// Produce: each partition's batches written through the service (acks 1 and -1 alike: a single broker's write is
/// its whole in-sync set); no answer at all for acks = 0, as Kafka's protocol says.
pub async fn produce(k: &Kafka, req: ProduceRequest) -> Option<ProduceResponse> {
    let mut r = ProduceResponse::default();
    for t in req.topic_data {
        let name = t.name.0.to_string();
        let mut tr = TopicProduceResponse::default();
        tr.name = t.name;
        for p in t.partition_data {
            let pr = if req.transactional_id.is_some() {
                let mut pr = PartitionProduceResponse::default();
                pr.index = p.index;
                pr.error_code = E::TransactionalIdAuthorizationFailed.code();
                pr.error_message = Some(s("transactions are not supported by Ferry's Kafka listener"));
                pr
            } else {
                produce_one(k, &name, p.index, p.records).await
            };
            if pr.error_code != 0 {
                tracing::debug!(topic = %name, partition = p.index, code = pr.error_code, "kafka: produce refused");
            }
            tr.partition_responses.push(pr);
        }
        r.responses.push(tr);
    }
    (req.acks != 0).then_some(r)
}

/// Fetch: one service fetch for every asked partition, the stored batches served as Kafka v2 batches. Fetch
/// sessions (KIP-227) are not kept: a full request (epoch 0, opening one, or -1, without one) gets a full answer
/// with session id 0, "no session made", so the client goes on sending full requests; an incremental one (another
/// epoch) gets FETCH_SESSION_ID_NOT_FOUND and no data, and the client starts over with a full request.
pub async fn fetch(k: &Kafka, req: FetchRequest) -> FetchResponse {
    let session = crate::rpc::kafka::core::session::check(req.session_epoch);
    if session != 0 {
        let mut r = FetchResponse::default();
        r.error_code = session;
        return r;
    }
    let mut asked = Vec::new();
    let mut early: Vec<(String, PartitionData)> = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            let name = t.topic.0.to_string();
            match (u32::try_from(p.partition), u64::try_from(p.fetch_offset)) {
                (Ok(partition), Ok(offset)) => asked.push(pb::PartitionFetch {
                    topic: name,
                    partition,
                    offset,
                    max_bytes: p.partition_max_bytes.max(1) as u64,
                    leader_epoch: None,
                }),
                (Err(_), _) => early.push((name, refused(p.partition, E::UnknownTopicOrPartition.code()))),
                (_, Err(_)) => early.push((name, refused(p.partition, E::OffsetOutOfRange.code()))),
            }
        }
    }
    let call = pb::FetchRequest {
        partitions: asked.clone(),
        max_wait_ms: req.max_wait_ms.max(0) as u32,
        max_bytes: req.max_bytes.max(1) as u64,
    };
    let mut answered: Vec<(String, PartitionData)> = match k.svc.fetch(k.rpc(call)).await {
        Ok(f) => f.into_inner().partitions.into_iter().map(|d| (d.topic.clone(), served(k, d))).collect(),
        Err(e) => {
            let err = code(&e, About::Topic);
            asked.into_iter().map(|a| (a.topic, refused(a.partition as i32, err))).collect()
        }
    };
    answered.append(&mut early);
    let mut r = FetchResponse::default();
    for (name, data) in answered {
        match r.responses.iter_mut().find(|t| t.topic.0.as_str() == name) {
            Some(t) => t.partitions.push(data),
            None => {
                let mut t = FetchableTopicResponse::default();
                t.topic = topic(name);
                t.partitions = vec![data];
                r.responses.push(t);
            }
        }
    }
    r
}

fn refused(partition: i32, error: i16) -> PartitionData {
    let mut d = PartitionData::default();
    d.partition_index = partition;
    d.error_code = error;
    d.high_watermark = -1;
    d.last_stable_offset = -1;
    d.log_start_offset = -1;
    d.preferred_read_replica = BrokerId(-1);
    d.records = Some(Bytes::new());
    d
}

fn served(k: &Kafka, d: pb::PartitionData) -> PartitionData {
    let mut out = refused(d.partition as i32, partition_code(d.error));
    if d.error != 0 {
        return out;
    }
    let mut kafka = BytesMut::with_capacity(d.batches.len() + d.batches.len() / 4);
    if let Err(e) = records::to_kafka(&d.batches, -1, k.inflate_limit(), &mut kafka) {
        tracing::error!(topic = %d.topic, partition = d.partition, error = %e, "kafka: a stored batch could not be served");
        if kafka.is_empty() {
            out.error_code = E::CorruptMessage.code();
            return out;
        }
    }
    out.high_watermark = d.log_end_offset as i64;
    out.last_stable_offset = d.log_end_offset as i64;
    out.log_start_offset = d.log_start_offset as i64;
    out.aborted_transactions = Some(Vec::new());
    out.records = Some(kafka.freeze());
    out
}

/// ListOffsets: earliest (-2), latest (-1) and the first offset at or after a timestamp.
pub async fn list_offsets(k: &Kafka, req: ListOffsetsRequest) -> ListOffsetsResponse {
    use pb::list_offsets_partition::Spec;
    let mut r = ListOffsetsResponse::default();
    let mut asked = Vec::new();
    for t in &req.topics {
        let mut tr = ListOffsetsTopicResponse::default();
        tr.name = t.name.clone();
        for p in &t.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            pr.leader_epoch = -1;
            let spec = match p.timestamp {
                -2 => Some(Spec::Earliest(true)),
                -1 => Some(Spec::Latest(true)),
                ts if ts >= 0 => Some(Spec::TimestampMs(ts)),
                _ => None,
            };
            match (spec, u32::try_from(p.partition_index)) {
                (Some(spec), Ok(partition)) => asked.push(pb::ListOffsetsPartition {
                    topic: t.name.0.to_string(),
                    partition,
                    spec: Some(spec),
                    leader_epoch: None,
                }),
                (None, _) => pr.error_code = E::InvalidRequest.code(),
                (_, Err(_)) => pr.error_code = E::UnknownTopicOrPartition.code(),
            }
            tr.partitions.push(pr);
        }
        r.topics.push(tr);
    }
    let results = k.svc.list_offsets(k.rpc(pb::ListOffsetsRequest { partitions: asked, ..Default::default() })).await;
    let results = match results {
        Ok(l) => l.into_inner().partitions,
        Err(e) => {
            let err = code(&e, About::Topic);
            for pr in r.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()).filter(|p| p.error_code == 0) {
                pr.error_code = err;
            }
            return r;
        }
    };
    for res in results {
        let Some(pr) = r
            .topics
            .iter_mut()
            .filter(|t| t.name.0.as_str() == res.topic)
            .flat_map(|t| t.partitions.iter_mut())
            .find(|p| p.partition_index == res.partition as i32 && p.error_code == 0)
        else {
            continue;
        };
        if res.error != 0 {
            pr.error_code = partition_code(res.error);
            continue;
        }
        pr.offset = res.offset.map_or(-1, |o| o as i64);
        // For a timestamp, Kafka answers the found record's own timestamp (clients refuse a negative one).
        let by_time = req.topics.iter().any(|t| {
            t.name.0.as_str() == res.topic
                && t.partitions.iter().any(|p| p.partition_index == res.partition as i32 && p.timestamp >= 0)
        });
        if let (true, Some(offset)) = (by_time, res.offset) {
            pr.timestamp = record_timestamp(k, &res.topic, res.partition, offset).await;
        }
    }
    r
}

/// The timestamp of the record at `offset` (read through the service's Fetch), -1 when it cannot be read.
async fn record_timestamp(k: &Kafka, topic: &str, partition: u32, offset: u64) -> i64 {
    let asked = pb::PartitionFetch { topic: topic.to_owned(), partition, offset, max_bytes: 1, leader_epoch: None };
    let call = pb::FetchRequest { partitions: vec![asked], max_wait_ms: 0, max_bytes: 1 };
    let Ok(f) = k.svc.fetch(k.rpc(call)).await else { return -1 };
    let Some(d) = f.into_inner().partitions.into_iter().next() else { return -1 };
    let Ok(batches) = ferry_batch::split_verified(&d.batches) else { return -1 };
    for (_, bytes) in batches {
        let Ok(records) = ferry_batch::decode_records_bounded(&bytes, k.inflate_limit()) else { return -1 };
        if let Some(r) = records.iter().find(|r| r.offset == offset) {
            return r.timestamp;
        }
    }
    -1
}
