//! ApiVersions, Metadata (with auto-creation), FindCoordinator and InitProducerId.

use ferry_proto as pb;
use ferry_proto::broker_server::Broker;
use kafka_protocol::ResponseError as E;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    ApiVersionsResponse, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest,
    InitProducerIdResponse, MetadataRequest, MetadataResponse, ProducerId,
};

use super::cluster::{View, coordinator};
use super::{s, topic};
use crate::rpc::kafka::errors::{About, code};
use crate::rpc::kafka::versions::Versions;
use crate::rpc::kafka::{Kafka, split_host_port};

/// The ApiVersions answer: the ledger's APIs and versions.
pub fn api_versions(versions: &Versions) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.api_keys = versions
        .all()
        .map(|(key, min, max)| {
            let mut a = ApiVersion::default();
            a.api_key = key;
            a.min_version = min;
            a.max_version = max;
            a
        })
        .collect();
    r.finalized_features_epoch = -1;
    r
}

/// A topic's metadata, each partition as `view` places it.
fn described(info: &pb::TopicInfo, view: &View) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(topic(info.name.clone()));
    t.topic_id = uuid::Uuid::parse_str(&info.topic_id).unwrap_or_default();
    t.partitions = (0..info.partitions).map(|i| view.partition(info, i)).collect();
    t.topic_authorized_operations = i32::MIN;
    t
}

fn unknown(name: &str, error: i16) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(topic(name));
    t.error_code = error;
    t
}

/// Metadata: the brokers with a Kafka listener, and the asked topics (all of them when the request names none, as
/// Kafka's versions say). A missing topic is created when `kafka.auto_create_topics` and the client allow it.
pub async fn metadata(k: &Kafka, req: MetadataRequest, version: i16) -> MetadataResponse {
    let mut r = MetadataResponse::default();
    r.cluster_authorized_operations = i32::MIN;
    let brokers = View::of(k, &[]);
    r.brokers = brokers.metadata_brokers();
    // Admin requests go to the controller: any member answers them, so each names itself.
    r.controller_id = BrokerId(brokers.me);
    if let Ok(m) = k.svc.metadata(k.rpc(pb::MetadataRequest::default())).await {
        r.cluster_id = Some(s(m.into_inner().cluster_id));
    }
    let listed = match k.svc.list_topics(k.rpc(pb::ListTopicsRequest::default())).await {
        Ok(l) => l.into_inner().topics,
        Err(e) => {
            let err = code(&e, About::Topic);
            r.topics = req
                .topics
                .unwrap_or_default()
                .iter()
                .filter_map(|t| t.name.as_ref())
                .map(|n| unknown(n.0.as_str(), err))
                .collect();
            return r;
        }
    };
    let asked: Option<Vec<String>> = match req.topics {
        None => None,
        Some(ts) if ts.is_empty() && version == 0 => None,
        Some(ts) => Some(ts.into_iter().filter_map(|t| t.name.map(|n| n.0.to_string())).collect()),
    };
    let names: Vec<String> = match &asked {
        Some(a) => a.clone(),
        None => listed.iter().filter(|t| !t.name.starts_with("__")).map(|t| t.name.clone()).collect(),
    };
    let view = View::of(k, &names);
    let Some(asked) = asked else {
        r.topics = listed.iter().filter(|t| !t.name.starts_with("__")).map(|t| described(t, &view)).collect();
        return r;
    };
    let may_create = k.cfg.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    for name in asked {
        if let Some(info) = listed.iter().find(|t| t.name == name) {
            r.topics.push(described(info, &view));
            continue;
        }
        if !may_create {
            r.topics.push(unknown(&name, E::UnknownTopicOrPartition.code()));
            continue;
        }
        let create = pb::CreateTopicRequest {
            name: name.clone(),
            partitions: k.cfg.default_partitions,
            replication: super::admin::default_replication(k).to_owned(),
            ..Default::default()
        };
        match k.svc.create_topic(k.rpc(create)).await {
            Ok(c) => match c.into_inner().topic {
                Some(info) => {
                    tracing::info!(topic = %name, partitions = info.partitions, "kafka: topic auto-created");
                    // Placed by the catalog just now: the next Metadata names the leaders.
                    r.topics.push(described(&info, &View::of(k, std::slice::from_ref(&name))));
                }
                None => r.topics.push(unknown(&name, E::LeaderNotAvailable.code())),
            },
            // Created meanwhile by another client: the next Metadata finds it.
            Err(e) if crate::rpc::kafka::errors::reason(&e) == "topic_exists" => {
                r.topics.push(unknown(&name, E::LeaderNotAvailable.code()))
            }
            Err(e) => r.topics.push(unknown(&name, code(&e, About::Cluster))),
        }
    }
    r
}

/// FindCoordinator: the broker coordinating each group (this one on a single broker; the leader of the group's
/// offsets partition on a cluster, COORDINATOR_NOT_AVAILABLE while it has none with a Kafka listener).
pub fn find_coordinator(k: &Kafka, req: FindCoordinatorRequest, version: i16) -> FindCoordinatorResponse {
    let find = |key: &str| -> (i16, i32, String, i32) {
        match coordinator(k, key) {
            Some((id, addr)) => {
                let (host, port) = split_host_port(&addr);
                (0, id, host, port)
            }
            None => (E::CoordinatorNotAvailable.code(), -1, String::new(), -1),
        }
    };
    let mut r = FindCoordinatorResponse::default();
    if version >= 4 {
        r.coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let (error, id, host, port) = find(key.as_str());
                let mut c = Coordinator::default();
                c.key = key;
                c.error_code = error;
                c.node_id = BrokerId(id);
                c.host = s(host);
                c.port = port;
                c
            })
            .collect();
    } else {
        let (error, id, host, port) = find(req.key.as_str());
        r.error_code = error;
        r.node_id = BrokerId(id);
        r.host = s(host);
        r.port = port;
    }
    r
}

/// InitProducerId for an idempotent producer (a transactional id is refused: no transactions here).
pub async fn init_producer_id(k: &Kafka, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    if req.transactional_id.is_some() {
        r.error_code = E::InvalidRequest.code();
        return r;
    }
    match k.svc.init_producer(k.rpc(pb::InitProducerRequest {})).await {
        Ok(p) => {
            let p = p.into_inner();
            match i16::try_from(p.producer_epoch) {
                Ok(epoch) => {
                    r.producer_id = ProducerId(p.producer_id);
                    r.producer_epoch = epoch;
                }
                Err(_) => r.error_code = E::UnknownServerError.code(),
            }
        }
        Err(e) => r.error_code = code(&e, About::Cluster),
    }
    r
}
