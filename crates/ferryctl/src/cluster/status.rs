//! `ferryctl cluster status`: a cluster's members and, per replicated partition, its leader, leader epoch,
//! replicas, in-sync set, high watermark, log end, each follower's lag and its state (in sync, under-replicated,
//! at risk, moving, offline).
//!
//! The placement comes from the member `--broker` names (which reads it from etcd); the progress of each partition
//! comes from its leader, which is asked in turn. A leader that does not answer leaves its partitions' progress
//! empty; the placement is still printed.

use std::collections::BTreeMap;

use ferry_client::proto as pb;
use serde::Serialize;

use crate::common::GlobalOpts;
use crate::output::{Format, Table};

#[derive(Debug, Serialize)]
struct StatusJson {
    cluster_id: String,
    controller_id: u32,
    etcd_reachable: bool,
    brokers: Vec<BrokerJson>,
    /// Brokers being drained.
    draining: Vec<u32>,
    under_replicated_partitions: usize,
    partitions_at_risk: usize,
    partitions: Vec<PartitionJson>,
}

#[derive(Debug, Serialize)]
struct BrokerJson {
    broker_id: u32,
    address: String,
}

#[derive(Debug, Serialize)]
struct PartitionJson {
    topic: String,
    partition: u32,
    leader: u32,
    leader_epoch: u32,
    replicas: Vec<u32>,
    isr: Vec<u32>,
    replication: String,
    /// While the partition moves: the replicas it moves to.
    target_replicas: Vec<u32>,
    under_replicated: bool,
    at_risk: bool,
    /// Unset when the leader did not answer.
    high_watermark: Option<u64>,
    log_end_offset: Option<u64>,
    followers: Vec<FollowerJson>,
}

#[derive(Debug, Serialize)]
struct FollowerJson {
    broker_id: u32,
    log_end_offset: u64,
    lag_records: u64,
    caught_up_ms_ago: u64,
}

/// `cluster status`.
pub(super) async fn status(global: &GlobalOpts, format: Format, internal: bool) -> anyhow::Result<()> {
    let mut status = global.client()?.cluster_status(pb::ClusterStatusRequest {}).await?;
    if !internal {
        status.partitions.retain(|p| p.placement.as_ref().is_none_or(|pl| !pl.topic.starts_with("__ferry")));
    }
    // Each leader knows its followers' progress: ask every member for the partitions it leads.
    let mut led: BTreeMap<(String, u32), pb::PartitionStatus> = BTreeMap::new();
    for broker in &status.brokers {
        let answer = match global.client_for(std::slice::from_ref(&broker.address)) {
            Ok(c) => c.cluster_status(pb::ClusterStatusRequest {}).await,
            Err(e) => return Err(e),
        };
        match answer {
            Ok(theirs) => {
                for p in theirs.partitions.into_iter().filter(|p| p.led_here) {
                    if let Some(pl) = &p.placement {
                        led.insert((pl.topic.clone(), pl.partition), p);
                    }
                }
            }
            Err(e) => eprintln!("warning: broker {} ({}) did not answer: {e}", broker.broker_id, broker.address),
        }
    }
    let partitions: Vec<PartitionJson> = status
        .partitions
        .iter()
        .filter_map(|p| Some((p, p.placement.as_ref()?)))
        .map(|(p, pl)| {
            let progress = led
                .get(&(pl.topic.clone(), pl.partition))
                .filter(|p| p.placement.as_ref().is_some_and(|theirs| theirs.leader_id == pl.leader_id));
            PartitionJson {
                topic: pl.topic.clone(),
                partition: pl.partition,
                leader: pl.leader_id,
                leader_epoch: pl.leader_epoch,
                replicas: pl.replicas.clone(),
                isr: pl.isr.clone(),
                replication: p.replication.clone(),
                target_replicas: pl.target_replicas.clone(),
                under_replicated: p.under_replicated,
                at_risk: p.at_risk,
                high_watermark: progress.map(|p| p.high_watermark),
                log_end_offset: progress.map(|p| p.log_end_offset),
                followers: progress
                    .map(|p| {
                        p.followers
                            .iter()
                            .map(|f| FollowerJson {
                                broker_id: f.broker_id,
                                log_end_offset: f.log_end_offset,
                                lag_records: f.lag_records,
                                caught_up_ms_ago: f.caught_up_ms_ago,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    let json = StatusJson {
        under_replicated_partitions: partitions.iter().filter(|p| p.under_replicated).count(),
        partitions_at_risk: partitions.iter().filter(|p| p.at_risk).count(),
        draining: status.draining.clone(),
        cluster_id: status.cluster_id,
        controller_id: status.controller_id,
        etcd_reachable: status.etcd_reachable,
        brokers: status
            .brokers
            .iter()
            .map(|b| BrokerJson { broker_id: b.broker_id, address: b.address.clone() })
            .collect(),
        partitions,
    };
    match format {
        Format::Json => println!("{}", serde_json::to_string(&json)?),
        Format::Text => print!("{}", text(&json)),
    }
    Ok(())
}

fn ids(list: &[u32]) -> String {
    list.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn text(s: &StatusJson) -> String {
    let mut out = format!("Cluster:     {}\n", s.cluster_id);
    let controller = if s.controller_id == 0 { "none".to_owned() } else { s.controller_id.to_string() };
    out.push_str(&format!("Controller:  {controller}\n"));
    if !s.etcd_reachable {
        out.push_str("etcd:        UNREACHABLE from the answering broker (placement as last read)\n");
    }
    if !s.draining.is_empty() {
        out.push_str(&format!("Draining:    {}\n", ids(&s.draining)));
    }
    out.push_str(&format!(
        "Partitions:  {} under-replicated, {} at risk\n",
        s.under_replicated_partitions, s.partitions_at_risk
    ));
    let mut brokers = Table::new(&["BROKER", "ADDRESS"]);
    for b in &s.brokers {
        brokers.row(vec![b.broker_id.to_string(), b.address.clone()]);
    }
    out.push('\n');
    out.push_str(&brokers.render());
    let mut parts =
        Table::new(&["TOPIC", "PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "HW", "LEO", "MAX LAG", "STATE"]);
    for p in &s.partitions {
        let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        let lag = p.followers.iter().map(|f| f.lag_records).max();
        let leader = if p.leader == 0 { "none".to_owned() } else { p.leader.to_string() };
        parts.row(vec![
            p.topic.clone(),
            p.partition.to_string(),
            leader,
            p.leader_epoch.to_string(),
            ids(&p.replicas),
            ids(&p.isr),
            opt(p.high_watermark),
            opt(p.log_end_offset),
            opt(lag),
            state(p),
        ]);
    }
    out.push('\n');
    out.push_str(&parts.render());
    out
}

/// A partition's state in one word or two: what the operator must look at first.
fn state(p: &PartitionJson) -> String {
    if p.leader == 0 {
        "OFFLINE".to_owned()
    } else if p.at_risk {
        "AT RISK".to_owned()
    } else if !p.target_replicas.is_empty() {
        format!("moving to {}", ids(&p.target_replicas))
    } else if p.under_replicated {
        "under-replicated".to_owned()
    } else {
        "ok".to_owned()
    }
}
