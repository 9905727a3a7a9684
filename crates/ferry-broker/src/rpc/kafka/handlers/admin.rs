//! CreateTopics, DeleteTopics and CreatePartitions, each answered per topic.

use ferry_proto as pb;
use ferry_proto::broker_server::Broker;
use kafka_protocol::ResponseError as E;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse,
};

use super::s;
use crate::rpc::kafka::Kafka;
use crate::rpc::kafka::errors::{About, code, message};

/// Sets one Kafka topic config on a Ferry topic config: the retention and segment settings Ferry has. Kafka's -1
/// ("unlimited") is Ferry's 0 for the retentions.
pub fn set_config(c: &mut pb::TopicConfig, name: &str, value: &str) -> Result<(), String> {
    let n: i64 = value.parse().map_err(|_| format!("{name}: {value:?} is not a number"))?;
    let unlimited =
        |n: i64| if n == -1 { Ok(0) } else { u64::try_from(n).map_err(|_| format!("{name}: {n} is negative")) };
    let plain = |n: i64| u64::try_from(n).map_err(|_| format!("{name}: {n} is negative"));
    match name {
        "retention.ms" => c.retention_ms = Some(unlimited(n)?),
        "retention.bytes" => c.retention_bytes = Some(unlimited(n)?),
        "segment.bytes" => c.segment_bytes = Some(plain(n)?),
        "segment.ms" => c.segment_ms = Some(plain(n)?),
        other => {
            return Err(format!(
                "config {other:?} is not one Ferry has (retention.ms, retention.bytes, segment.bytes, segment.ms)"
            ));
        }
    }
    Ok(())
}

/// A CreateTopics topic's configs as Ferry's.
fn topic_config(t: &CreatableTopic) -> Result<pb::TopicConfig, String> {
    let mut c = pb::TopicConfig::default();
    for kv in &t.configs {
        if let Some(value) = kv.value.as_ref() {
            set_config(&mut c, kv.name.as_str(), value.as_str())?;
        }
    }
    Ok(c)
}

/// Ferry's replication of a topic created with Kafka's default replication factor (-1) or auto-created: a single
/// broker's topic, raft3 on a cluster (so that every member's Kafka listener serves it).
pub fn default_replication(k: &Kafka) -> &'static str {
    if k.cluster.is_some() { "raft3" } else { "" }
}

/// Ferry's replication for a Kafka replication factor (-1: the default).
fn replication(k: &Kafka, factor: i16) -> Option<&'static str> {
    match factor {
        -1 => Some(default_replication(k)),
        1 => Some(""),
        2 => Some("double_write"),
        3 => Some("raft3"),
        _ => None,
    }
}

/// CreateTopics: each topic created (or, with validate_only, checked) on its own.
pub async fn create_topics(k: &Kafka, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut r = CreateTopicsResponse::default();
    for t in req.topics {
        let mut tr = CreatableTopicResult::default();
        tr.name = t.name.clone();
        tr.num_partitions = -1;
        tr.replication_factor = -1;
        let partitions =
            if t.num_partitions == -1 { Ok(k.cfg.default_partitions) } else { u32::try_from(t.num_partitions) };
        let checked = match (partitions, replication(k, t.replication_factor), topic_config(&t)) {
            (Err(_), _, _) | (Ok(0), _, _) => Err((E::InvalidPartitions, format!("{} partitions", t.num_partitions))),
            (_, None, _) => Err((
                E::InvalidReplicationFactor,
                format!("replication factor {} is not 1 (single), 2 (double_write) or 3 (raft3)", t.replication_factor),
            )),
            (_, _, Err(m)) => Err((E::InvalidConfig, m)),
            (_, _, _) if !t.assignments.is_empty() => {
                Err((E::InvalidRequest, "manual replica assignments are not supported".to_owned()))
            }
            (Ok(p), Some(rep), Ok(config)) => Ok((p, rep, config)),
        };
        match checked {
            Err((e, m)) => {
                tr.error_code = e.code();
                tr.error_message = Some(s(m));
            }
            Ok((p, _, _)) if req.validate_only => {
                tr.num_partitions = p as i32;
                tr.replication_factor = t.replication_factor;
            }
            Ok((partitions, rep, config)) => {
                let call = pb::CreateTopicRequest {
                    name: t.name.0.to_string(),
                    partitions,
                    config: Some(config),
                    replication: rep.to_owned(),
                    ..Default::default()
                };
                match k.svc.create_topic(k.rpc(call)).await {
                    Ok(c) => {
                        if let Some(info) = c.into_inner().topic {
                            tr.topic_id = uuid::Uuid::parse_str(&info.topic_id).unwrap_or_default();
                            tr.num_partitions = info.partitions as i32;
                            tr.replication_factor = t.replication_factor.max(1);
                        }
                    }
                    Err(e) => {
                        tr.error_code = code(&e, About::Cluster);
                        tr.error_message = Some(message(&e));
                    }
                }
            }
        }
        r.topics.push(tr);
    }
    r
}

/// DeleteTopics (by name, v1-5).
pub async fn delete_topics(k: &Kafka, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut r = DeleteTopicsResponse::default();
    for name in req.topic_names {
        let mut tr = DeletableTopicResult::default();
        tr.name = Some(name.clone());
        if let Err(e) = k.svc.delete_topic(k.rpc(pb::DeleteTopicRequest { name: name.0.to_string() })).await {
            tr.error_code = code(&e, About::Cluster);
            tr.error_message = Some(message(&e));
        }
        r.responses.push(tr);
    }
    r
}

/// CreatePartitions: each topic grown to its asked count.
pub async fn create_partitions(k: &Kafka, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let mut r = CreatePartitionsResponse::default();
    for t in req.topics {
        let mut tr = CreatePartitionsTopicResult::default();
        tr.name = t.name.clone();
        match u32::try_from(t.count) {
            Err(_) => {
                tr.error_code = E::InvalidPartitions.code();
                tr.error_message = Some(s(format!("{} partitions", t.count)));
            }
            Ok(_) if req.validate_only => {}
            Ok(partitions) => {
                let call = pb::AlterPartitionsRequest { name: t.name.0.to_string(), partitions };
                if let Err(e) = k.svc.alter_partitions(k.rpc(call)).await {
                    tr.error_code = code(&e, About::Cluster);
                    tr.error_message = Some(message(&e));
                }
            }
        }
        r.results.push(tr);
    }
    r
}
