//! The service's consumer-group calls. A single broker coordinates every group itself. On a cluster, a group's
//! coordinator is the leader of its offsets partition (see `groups::cluster`): a broker that does not lead it
//! answers NOT_COORDINATOR naming the leader, which the client follows; the coordinator loads the partition's
//! offsets when it takes the leadership, and writes each commit through the partition, answering once the in-sync
//! replicas hold it.

use std::sync::Arc;

use ferry_proto as pb;
use tonic::Request;

use super::{BrokerService, READ, Rpc, ok};
use crate::error::BrokerError;
use crate::groups::CLUSTER_OFFSETS_TOPIC;
use crate::node::partition::Partition;
use crate::rpc::auth::{Scopes, caller, member_scopes, offset_scopes};

/// The offsets partition a cluster member coordinates a group through, at the leader epoch its offsets were
/// loaded at.
struct Coordinating {
    part: Arc<Partition>,
    k: u32,
    epoch: u32,
}

impl BrokerService {
    /// On a cluster: the group's offsets partition, when this broker leads it (its offsets loaded first if this
    /// leadership is new); NOT_COORDINATOR, naming the leader, when it does not. On a single broker: `None`.
    async fn coordinate(&self, group: &str) -> Result<Option<Coordinating>, BrokerError> {
        let Some(cluster) = self.groups.cluster() else { return Ok(None) };
        let k = cluster.partition_of(group);
        let r = self.replication()?;
        let not_coordinator = |leader: u32, address: String, epoch: u32| BrokerError::NotCoordinator {
            group: group.to_owned(),
            leader,
            address,
            epoch,
        };
        let Ok(part) = self.core.partition(CLUSTER_OFFSETS_TOPIC, k) else {
            return Err(match r.not_here(CLUSTER_OFFSETS_TOPIC, k) {
                Some(BrokerError::NotLeader { leader, address, epoch, .. }) => not_coordinator(leader, address, epoch),
                _ => BrokerError::Cluster(
                    "the cluster's offsets partitions do not exist yet: the controller creates them once three \
                     brokers are live; retry"
                        .into(),
                ),
            });
        };
        let Some(replica) = part.replica() else {
            return Err(BrokerError::Internal(format!("{CLUSTER_OFFSETS_TOPIC}/{k} is not replicated")));
        };
        // Only a leader that may act as one (its lease, or the failsafe) coordinates.
        let leading = match r
            .serving()
            .check_leading(&part, None)
            .map_err(|_| ())
            .and_then(|_| replica.leading().map_err(|_| ()))
        {
            Ok(l) => l,
            Err(()) => {
                let n = replica.leading().err().unwrap_or(crate::node::replica::NotLeading {
                    leader: 0,
                    epoch: replica.leader_epoch(),
                    address: String::new(),
                });
                if self.groups.unload_partition(k) {
                    tracing::info!(
                        partition = k,
                        leader = n.leader,
                        "no longer coordinating this offsets partition's groups"
                    );
                }
                return Err(not_coordinator(n.leader, n.address, n.epoch));
            }
        };
        if cluster.loaded_epoch(k) != Some(leading.epoch) {
            let _loading = self.coordinator_loads.lock().await;
            if cluster.loaded_epoch(k) != Some(leading.epoch) {
                self.groups.unload_partition(k);
                let (groups, log, epoch) = (Arc::clone(&self.groups), Arc::clone(part.log()), leading.epoch);
                tokio::task::spawn_blocking(move || match groups.cluster() {
                    Some(c) => c.load(k, epoch, &log),
                    None => Ok(()),
                })
                .await
                .map_err(|e| BrokerError::Internal(format!("loading the offsets partition failed: {e}")))??;
            }
        }
        Ok(Some(Coordinating { part, k, epoch: leading.epoch }))
    }

    /// The partitions of topic `name`, from this broker or the cluster's catalog; `None` when there is no such
    /// topic.
    pub(super) fn partition_count(&self, name: &str) -> Option<u32> {
        match self.core.topic(name) {
            Ok(t) => Some(t.partition_count()),
            Err(_) => self.replication.as_ref().and_then(|r| r.partition_count(name)),
        }
    }

    fn topic_counts(&self) -> impl Fn(&str) -> u32 + '_ {
        |t: &str| self.partition_count(t).unwrap_or(0)
    }

    /// Refuses a partitioned join of a group that is a queue, serial or broadcast group, when this broker owns
    /// that group's state (always on a single broker; on a cluster when it leads the group's `__ferry_queues`
    /// partition too).
    async fn refuse_share_group(&self, group: &str) -> Result<(), BrokerError> {
        let Ok(guard) = self.share_lock(group).await else { return Ok(()) };
        if let Some(s) = guard.state().groups.get(group).and_then(|g| g.settings.as_ref()) {
            return Err(BrokerError::InvalidArgument(format!(
                "group \"{group}\" is a {} group; it cannot be joined as a partitioned group",
                s.mode.name()
            )));
        }
        Ok(())
    }

    pub(super) async fn join_group_rpc(&self, req: Request<pb::JoinGroupRequest>) -> Rpc<pb::JoinGroupResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let need = member_scopes(&req.group);
        who.allow_group("JoinGroup", need, &req.group)?;
        for t in &req.topics {
            who.allow_topic("JoinGroup", need, t)?;
        }
        for t in &req.topics {
            if self.partition_count(t).is_none() {
                return Err(BrokerError::UnknownTopic { topic: t.clone() }.into());
            }
        }
        self.coordinate(&req.group).await?;
        self.refuse_share_group(&req.group).await?;
        let j = self.groups.join(&req, &self.topic_counts())?;
        ok(pb::JoinGroupResponse {
            member_id: j.member_id,
            generation: j.generation,
            assignment: j.assignment,
            members: j.members,
        })
    }

    pub(super) async fn heartbeat_rpc(&self, req: Request<pb::HeartbeatRequest>) -> Rpc<pb::HeartbeatResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("Heartbeat", member_scopes(&req.group), &req.group)?;
        self.coordinate(&req.group).await?;
        ok(self.groups.heartbeat(&req, &self.topic_counts()))
    }

    pub(super) async fn leave_group_rpc(&self, req: Request<pb::LeaveGroupRequest>) -> Rpc<pb::LeaveGroupResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        who.allow_group("LeaveGroup", member_scopes(&req.group), &req.group)?;
        self.coordinate(&req.group).await?;
        self.groups.leave(&req.group, &req.member_id, &self.topic_counts());
        ok(pb::LeaveGroupResponse {})
    }

    pub(super) async fn commit_offsets_rpc(
        &self,
        req: Request<pb::CommitOffsetsRequest>,
    ) -> Rpc<pb::CommitOffsetsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let need = offset_scopes(&req.group);
        who.allow_group("CommitOffsets", need, &req.group)?;
        for o in &req.offsets {
            who.allow_topic("CommitOffsets", need, &o.topic)?;
        }
        // Offsets only for partitions that exist, so no offset outlives its topic (see delete_topic).
        for o in &req.offsets {
            match self.partition_count(&o.topic) {
                None => return Err(BrokerError::UnknownTopic { topic: o.topic.clone() }.into()),
                Some(count) if o.partition >= count => {
                    let (topic, partition) = (o.topic.clone(), o.partition);
                    return Err(BrokerError::UnknownPartition { topic, partition, count }.into());
                }
                Some(_) => {}
            }
        }
        let Some(at) = self.coordinate(&req.group).await? else {
            let groups = Arc::clone(&self.groups);
            tokio::task::spawn_blocking(move || groups.commit(&req))
                .await
                .map_err(|e| BrokerError::Internal(format!("commit task failed: {e}")))??;
            return ok(pb::CommitOffsetsResponse {});
        };
        self.groups.check_commit(&req)?;
        let Some(cluster) = self.groups.cluster() else { return ok(pb::CommitOffsetsResponse {}) };
        let commit = cluster.encode(&req.group, &req.offsets, &|t| self.groups.topic_id(t));
        // Written and registered in log order; applied, in that order, once acknowledged.
        let mut written = Vec::new();
        {
            let order = cluster.write_order(at.k);
            let _order = order.lock().await;
            for (batch, entries) in commit.batches {
                let produced =
                    self.produce_to(&at.part, batch).await.map_err(|e| self.lost_coordination(&req.group, e))?;
                cluster.register(at.k, at.epoch, produced.last_offset, entries);
                written.push(produced);
            }
        }
        for produced in &written {
            self.acknowledged(&at.part, produced).await?;
        }
        cluster.apply_through(at.k, at.epoch, at.part.visible_end());
        self.compact_if_due(&at).await;
        ok(pb::CommitOffsetsResponse {})
    }

    /// Deletes a group with no members: its committed offsets are dropped (with tombstones, through the offsets
    /// partition on a cluster, answered once the in-sync replicas hold them). Whether there was such a group.
    /// Refused while it has members (`group_has_members`); on a cluster, NOT_COORDINATOR from a broker that does not
    /// coordinate it. Kafka's DeleteGroups (no gRPC call yet).
    pub(crate) async fn delete_group(&self, req: Request<String>) -> Result<bool, tonic::Status> {
        let who = caller(&req)?;
        let group = req.into_inner();
        who.allow_group("DeleteGroups", offset_scopes(&group).or(Scopes::ADMIN), &group)?;
        let Some(at) = self.coordinate(&group).await? else {
            let found = self.groups.check_delete(&group)?;
            let (groups, name) = (Arc::clone(&self.groups), group.clone());
            tokio::task::spawn_blocking(move || groups.delete_offsets(&name))
                .await
                .map_err(|e| BrokerError::Internal(format!("delete task failed: {e}")))??;
            return Ok(found);
        };
        let found = self.groups.check_delete(&group)?;
        let Some(cluster) = self.groups.cluster() else { return Ok(found) };
        let tombstones = cluster.tombstones(&group);
        let mut written = Vec::new();
        {
            let order = cluster.write_order(at.k);
            let _order = order.lock().await;
            for (batch, entries) in tombstones.batches {
                let produced = self.produce_to(&at.part, batch).await.map_err(|e| self.lost_coordination(&group, e))?;
                cluster.register(at.k, at.epoch, produced.last_offset, entries);
                written.push(produced);
            }
        }
        for produced in &written {
            self.acknowledged(&at.part, produced).await?;
        }
        cluster.apply_through(at.k, at.epoch, at.part.visible_end());
        Ok(found)
    }

    /// Compacts the offsets partition when it is due (see `ClusterOffsets::compaction`): every offset is written
    /// again, and once the in-sync replicas hold them, the segments before them are deleted (the followers follow
    /// the leader's log start). A failure leaves harmless copies and is retried after the next commit.
    async fn compact_if_due(&self, at: &Coordinating) {
        let Some(cluster) = self.groups.cluster() else { return };
        // Under the write order, and only once every written commit is applied (see `ClusterOffsets::compaction`).
        let order = cluster.write_order(at.k);
        let Ok(_order) = order.try_lock() else { return };
        let Some(batches) = cluster.compaction(at.k, at.part.log().stats().size_bytes) else { return };
        let start = at.part.log().log_end_offset();
        for batch in batches {
            let written = match self.produce_to(&at.part, batch).await {
                Ok(produced) => self.acknowledged(&at.part, &produced).await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                tracing::warn!(partition = at.k, error = %e, "compacting an offsets partition failed; retried later");
                return;
            }
        }
        let log = Arc::clone(at.part.log());
        match tokio::task::spawn_blocking(move || {
            log.delete_segments_before(start).map(|n| (n, log.stats().size_bytes))
        })
        .await
        {
            Ok(Ok((deleted, size))) => {
                cluster.compacted(at.k, size);
                tracing::info!(
                    partition = at.k,
                    rewritten_at = start,
                    deleted_segments = deleted,
                    "compacted an offsets partition"
                );
            }
            Ok(Err(e)) => tracing::warn!(partition = at.k, error = %e, "deleting compacted segments failed"),
            Err(e) => tracing::warn!(partition = at.k, error = %e, "the compaction task failed"),
        }
    }

    /// A write to the offsets partition refused because this broker no longer leads it: NOT_COORDINATOR.
    fn lost_coordination(&self, group: &str, e: BrokerError) -> BrokerError {
        match e {
            BrokerError::NotLeader { leader, address, epoch, .. } => {
                BrokerError::NotCoordinator { group: group.to_owned(), leader, address, epoch }
            }
            other => other,
        }
    }

    pub(super) async fn fetch_committed_offsets_rpc(
        &self,
        req: Request<pb::FetchCommittedOffsetsRequest>,
    ) -> Rpc<pb::FetchCommittedOffsetsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let need = offset_scopes(&req.group);
        who.allow_group("FetchCommittedOffsets", need, &req.group)?;
        for p in &req.partitions {
            who.allow_topic("FetchCommittedOffsets", need, &p.topic)?;
        }
        self.coordinate(&req.group).await?;
        // Asked for every partition (none named): only those of topics the token may see.
        let mut offsets = self.groups.committed(&req.group, &req.partitions);
        offsets.retain(|o| who.sees_topic(&o.topic));
        ok(pb::FetchCommittedOffsetsResponse { offsets })
    }

    pub(super) async fn list_groups_rpc(&self, req: Request<pb::ListGroupsRequest>) -> Rpc<pb::ListGroupsResponse> {
        let who = caller(&req)?;
        who.allow("ListGroups", READ.or(Scopes::ADMIN))?;
        let mut groups = self.groups.list();
        groups.retain(|g| who.sees_group(&g.group));
        ok(pb::ListGroupsResponse { groups })
    }

    pub(super) async fn describe_group_rpc(
        &self,
        req: Request<pb::DescribeGroupRequest>,
    ) -> Rpc<pb::DescribeGroupResponse> {
        let who = caller(&req)?;
        let group = req.into_inner().group;
        who.allow_group("DescribeGroup", READ.or(Scopes::ADMIN), &group)?;
        self.coordinate(&group).await?;
        let mut described = self.groups.describe(&group);
        described.offsets.retain(|o| who.sees_topic(&o.topic));
        ok(described)
    }
}
