//! What Kafka clients are told about brokers, leaders and coordinators: on a single broker, node 0 leads everything
//! and coordinates every group; on a cluster, each member is the node of its broker id, at the Kafka address it
//! registered with its membership, and partitions and groups are where the catalog says.

use std::collections::BTreeMap;

use ferry_proto as pb;
use kafka_protocol::ResponseError as E;
use kafka_protocol::messages::BrokerId;
use kafka_protocol::messages::metadata_response::{MetadataResponseBroker, MetadataResponsePartition};

use super::s;
use crate::rpc::kafka::{Kafka, LISTENER_NAME, split_host_port};

/// A single broker's node id.
pub const NODE: i32 = 0;

/// The brokers, this node and the replicated partitions' placements, as one Metadata answer tells them.
#[derive(Debug)]
pub struct View {
    /// This broker's node id.
    pub me: i32,
    /// Node id -> Kafka `host:port`, for every broker with a Kafka listener.
    pub brokers: BTreeMap<i32, String>,
    /// Replicated partitions' placements by (topic, partition).
    placements: BTreeMap<(String, u32), pb::PartitionPlacement>,
}

fn node(id: u32) -> i32 {
    i32::try_from(id).unwrap_or(-1)
}

impl View {
    /// The view for the replicated partitions of `topics` (on a cluster member; a single broker has none).
    pub fn of(k: &Kafka, topics: &[String]) -> View {
        let Some(r) = &k.cluster else {
            return View {
                me: NODE,
                brokers: BTreeMap::from([(NODE, k.advertised.clone())]),
                placements: BTreeMap::new(),
            };
        };
        let mut brokers: BTreeMap<i32, String> =
            r.listener_addresses(LISTENER_NAME).into_iter().map(|(id, a)| (node(id), a)).collect();
        // This member answers, so it is a broker of the answer even before the catalog shows its registration.
        brokers.insert(node(r.broker_id()), k.advertised.clone());
        let placements = if topics.is_empty() {
            BTreeMap::new()
        } else {
            r.placements(topics, None).into_iter().map(|p| ((p.topic.clone(), p.partition), p)).collect()
        };
        View { me: node(r.broker_id()), brokers, placements }
    }

    /// The Metadata answer's brokers.
    pub fn metadata_brokers(&self) -> Vec<MetadataResponseBroker> {
        self.brokers
            .iter()
            .map(|(id, addr)| {
                let (host, port) = split_host_port(addr);
                let mut b = MetadataResponseBroker::default();
                b.node_id = BrokerId(*id);
                b.host = s(host);
                b.port = port;
                b
            })
            .collect()
    }

    /// Partition `index` of `info`: led here for a topic of this broker alone; as placed for a replicated topic,
    /// LEADER_NOT_AVAILABLE while its leader is unknown or has no Kafka listener. Leader epochs are -1: the Kafka
    /// path does not carry them end to end (docs/kafka.md).
    pub fn partition(&self, info: &pb::TopicInfo, index: u32) -> MetadataResponsePartition {
        let mut p = MetadataResponsePartition::default();
        p.partition_index = index as i32;
        p.leader_epoch = -1;
        let replicated = !matches!(info.replication.as_str(), "" | "single");
        if !replicated {
            p.leader_id = BrokerId(self.me);
            p.replica_nodes = vec![BrokerId(self.me)];
            p.isr_nodes = vec![BrokerId(self.me)];
            return p;
        }
        let Some(placed) = self.placements.get(&(info.name.clone(), index)) else {
            p.leader_id = BrokerId(-1);
            p.error_code = E::LeaderNotAvailable.code();
            return p;
        };
        p.replica_nodes = placed.replicas.iter().map(|&id| BrokerId(node(id))).collect();
        p.isr_nodes = placed.isr.iter().map(|&id| BrokerId(node(id))).collect();
        let leader = node(placed.leader_id);
        if placed.leader_id == 0 || !self.brokers.contains_key(&leader) {
            p.leader_id = BrokerId(-1);
            p.error_code = E::LeaderNotAvailable.code();
        } else {
            p.leader_id = BrokerId(leader);
        }
        p
    }
}

/// The node coordinating `group` and its Kafka `host:port`: this broker on a single broker; on a cluster the leader
/// of the group's offsets partition, `None` while it has none or it has no Kafka listener.
pub fn coordinator(k: &Kafka, group: &str) -> Option<(i32, String)> {
    let Some(r) = &k.cluster else { return Some((NODE, k.advertised.clone())) };
    let id = r.group_coordinator(group)?;
    if id == r.broker_id() {
        return Some((node(id), k.advertised.clone()));
    }
    let addr = r.listener_addresses(LISTENER_NAME).remove(&id)?;
    Some((node(id), addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(partition: u32, leader: u32) -> ((String, u32), pb::PartitionPlacement) {
        let p = pb::PartitionPlacement {
            topic: "t".into(),
            partition,
            leader_id: leader,
            replicas: vec![1, 2, 3],
            isr: vec![1, 2],
            ..Default::default()
        };
        (("t".into(), partition), p)
    }

    #[test]
    fn partitions_name_their_leader_only_when_it_has_a_kafka_listener() {
        // Members 1 and 2 have Kafka listeners, 3 does not; this is member 1.
        let view = View {
            me: 1,
            brokers: BTreeMap::from([(1, "a:1".into()), (2, "b:2".into())]),
            placements: BTreeMap::from([placed(0, 2), placed(1, 3), placed(2, 0)]),
        };
        let raft3 =
            pb::TopicInfo { name: "t".into(), partitions: 4, replication: "raft3".into(), ..Default::default() };
        let single = pb::TopicInfo { name: "s".into(), partitions: 1, ..Default::default() };
        let na = E::LeaderNotAvailable.code();
        // (topic, partition, leader, error, replicas, isr)
        type Case<'a> = (&'a pb::TopicInfo, u32, i32, i16, Vec<i32>, Vec<i32>);
        let cases: [Case<'_>; 5] = [
            (&raft3, 0, 2, 0, vec![1, 2, 3], vec![1, 2]),
            (&raft3, 1, -1, na, vec![1, 2, 3], vec![1, 2]),
            (&raft3, 2, -1, na, vec![1, 2, 3], vec![1, 2]),
            (&raft3, 3, -1, na, vec![], vec![]),
            (&single, 0, 1, 0, vec![1], vec![1]),
        ];
        for (info, index, leader, error, replicas, isr) in cases {
            let p = view.partition(info, index);
            let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
            assert_eq!(
                (p.leader_id.0, p.error_code, ids(&p.replica_nodes), ids(&p.isr_nodes), p.leader_epoch),
                (leader, error, replicas, isr, -1),
                "{}/{index}",
                info.name
            );
        }
        let brokers: Vec<(i32, String, i32)> =
            view.metadata_brokers().into_iter().map(|b| (b.node_id.0, b.host.to_string(), b.port)).collect();
        assert_eq!(brokers, vec![(1, "a".into(), 1), (2, "b".into(), 2)]);
    }
}
