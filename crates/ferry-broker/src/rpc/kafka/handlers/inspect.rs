//! ListGroups, DescribeGroups, DescribeConfigs and IncrementalAlterConfigs: what the service's group and topic
//! descriptions say, and the topic settings Ferry has.

use ferry_proto as pb;
use ferry_proto::broker_server::Broker;
use kafka_protocol::ResponseError as E;
use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ConsumerProtocolSubscription, DescribeConfigsRequest, DescribeConfigsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ListGroupsRequest,
    ListGroupsResponse,
};
use kafka_protocol::protocol::Encodable;

use super::admin::set_config;
use super::groups::assignment;
use super::s;
use crate::rpc::kafka::Kafka;
use crate::rpc::kafka::errors::{About, code, message};

/// Kafka's resource type of a topic.
const TOPIC: i8 = 2;
/// Kafka's config type LONG.
const LONG: i8 = 5;

fn state(members: usize) -> &'static str {
    if members == 0 { "Empty" } else { "Stable" }
}

/// ListGroups: every group with members or committed offsets, filtered by state when asked (v4+).
pub async fn list_groups(k: &Kafka, req: ListGroupsRequest) -> ListGroupsResponse {
    let mut r = ListGroupsResponse::default();
    match k.svc.list_groups(k.rpc(pb::ListGroupsRequest {})).await {
        Ok(l) => {
            for g in l.into_inner().groups {
                let st = state(g.members as usize);
                if !req.states_filter.is_empty() && !req.states_filter.iter().any(|f| f.as_str() == st) {
                    continue;
                }
                let mut lg = ListedGroup::default();
                lg.group_id = kafka_protocol::messages::GroupId(s(g.group));
                lg.protocol_type = s("consumer");
                lg.group_state = s(st);
                lg.group_type = s("classic");
                r.groups.push(lg);
            }
        }
        Err(e) => r.error_code = code(&e, About::Group),
    }
    r
}

/// A consumer protocol subscription (version 0) of `topics`.
fn subscription(topics: &[String]) -> bytes::Bytes {
    let mut sub = ConsumerProtocolSubscription::default();
    sub.topics = topics.iter().map(|t| s(t.clone())).collect();
    let mut out = bytes::BytesMut::new();
    bytes::BufMut::put_i16(&mut out, 0);
    if sub.encode(&mut out, 0).is_err() {
        return bytes::Bytes::new();
    }
    out.freeze()
}

/// DescribeGroups: members with their subscriptions and Ferry's assignment; the protocol is "ferry" (Ferry deals
/// the partitions). A group with neither members nor commits is "Dead", as Kafka says of an unknown group.
pub async fn describe_groups(k: &Kafka, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let mut r = DescribeGroupsResponse::default();
    for g in req.groups {
        let mut d = DescribedGroup::default();
        d.group_id = g.clone();
        d.authorized_operations = i32::MIN;
        match k.svc.describe_group(k.rpc(pb::DescribeGroupRequest { group: g.0.to_string() })).await {
            Ok(desc) => {
                let desc = desc.into_inner();
                d.group_state = s(if desc.members.is_empty() && desc.offsets.is_empty() {
                    "Dead"
                } else {
                    state(desc.members.len())
                });
                d.protocol_type = s("consumer");
                d.protocol_data = s(if desc.members.is_empty() { "" } else { "ferry" });
                for m in desc.members {
                    let mut dm = DescribedGroupMember::default();
                    dm.member_id = s(m.member_id);
                    dm.client_id = s(m.client_id);
                    dm.member_metadata = subscription(&m.topics);
                    dm.member_assignment = assignment(&m.assignment);
                    d.members.push(dm);
                }
            }
            Err(e) => {
                d.error_code = code(&e, About::Group);
                d.error_message = Some(message(&e));
            }
        }
        r.groups.push(d);
    }
    r
}

/// A topic's effective settings, as Kafka names them (0 retention is Kafka's -1, unlimited).
fn settings(c: &pb::TopicConfig) -> Vec<(&'static str, i64)> {
    let unlimited = |v: Option<u64>| match v.unwrap_or(0) {
        0 => -1,
        n => n as i64,
    };
    vec![
        ("retention.ms", unlimited(c.retention_ms)),
        ("retention.bytes", unlimited(c.retention_bytes)),
        ("segment.bytes", c.segment_bytes.unwrap_or(0) as i64),
        ("segment.ms", c.segment_ms.unwrap_or(0) as i64),
    ]
}

/// DescribeConfigs of topics (other resource types get INVALID_REQUEST).
pub async fn describe_configs(k: &Kafka, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut r = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut out = DescribeConfigsResult::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        if res.resource_type != TOPIC {
            out.error_code = E::InvalidRequest.code();
            out.error_message = Some(s("only topic configs are described"));
            r.results.push(out);
            continue;
        }
        let call = pb::DescribeTopicRequest { name: res.resource_name.to_string(), ..Default::default() };
        match k.svc.describe_topic(k.rpc(call)).await {
            Ok(d) => {
                let config = d.into_inner().topic.and_then(|t| t.config).unwrap_or_default();
                for (name, value) in settings(&config) {
                    if res.configuration_keys.as_ref().is_some_and(|keys| !keys.iter().any(|x| x.as_str() == name)) {
                        continue;
                    }
                    let mut c = DescribeConfigsResourceResult::default();
                    c.name = s(name);
                    c.value = Some(s(value.to_string()));
                    c.config_source = 0;
                    c.config_type = LONG;
                    out.configs.push(c);
                }
            }
            Err(e) => {
                out.error_code = code(&e, About::Topic);
                out.error_message = Some(message(&e));
            }
        }
        r.results.push(out);
    }
    r
}

/// IncrementalAlterConfigs of topics: SET of the settings Ferry has; DELETE, APPEND and SUBTRACT are refused.
pub async fn incremental_alter_configs(
    k: &Kafka,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut r = IncrementalAlterConfigsResponse::default();
    for res in req.resources {
        let mut out = AlterConfigsResourceResponse::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let mut config = pb::TopicConfig::default();
        let checked = if res.resource_type != TOPIC {
            Err((E::InvalidRequest, "only topic configs are altered".to_owned()))
        } else {
            res.configs.iter().try_for_each(|c| match (c.config_operation, c.value.as_ref()) {
                (0, Some(v)) => set_config(&mut config, c.name.as_str(), v.as_str()).map_err(|m| (E::InvalidConfig, m)),
                (op, _) => Err((
                    E::InvalidConfig,
                    format!("{}: only SET (0) with a value is supported, not operation {op}", c.name.as_str()),
                )),
            })
        };
        match checked {
            Err((e, m)) => {
                out.error_code = e.code();
                out.error_message = Some(s(m));
            }
            Ok(()) if req.validate_only => {}
            Ok(()) => {
                let call = pb::AlterTopicConfigRequest { name: res.resource_name.to_string(), config: Some(config) };
                if let Err(e) = k.svc.alter_topic_config(k.rpc(call)).await {
                    out.error_code = code(&e, About::Topic);
                    out.error_message = Some(message(&e));
                }
            }
        }
        r.responses.push(out);
    }
    r
}
