//! raft3 with cut links, through the testkit's proxy: every broker reaches etcd through a proxy of its own, and
//! every other member through one proxy per direction (`cluster.peer_addrs`). First the leader's link to etcd is
//! cut: it loses its lease, the others elect a new leader, and the old one, unaware, acknowledges nothing. Then the
//! new leader's links to its followers are cut: it takes them out of the ISR and refuses writes until they are
//! back. Nothing is acknowledged twice or lost.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig};
use ferry_testkit::{BrokerProcess, EtcdProcess, Proxy, deadline, wait_until};

use crate::common::{IO_BUDGET, STOP_GRACE};
use crate::raft3::{LEASE_TTL, REPLICA_LAG, TOPIC, assert_replicas_identical, produce_all};

/// Brokers `1..=3` with their proxies: `etcd[i]` in front of etcd for broker `i + 1`, `links[(from, to)]` in front
/// of broker `to` for broker `from`.
struct Wired {
    cluster: crate::raft3::Cluster,
    etcd: Vec<Proxy>,
    links: BTreeMap<(u32, u32), Proxy>,
}

impl Wired {
    async fn start() -> anyhow::Result<Wired> {
        ferry_testkit::init_tracing();
        let etcd = EtcdProcess::start().await?;
        let etcd_addr: SocketAddr = etcd.url().trim_start_matches("http://").parse()?;
        let placeholder: SocketAddr = "127.0.0.1:9".parse()?;
        let mut etcd_proxies = Vec::new();
        let mut links = BTreeMap::new();
        for from in 1..=3u32 {
            etcd_proxies.push(Proxy::start(etcd_addr).await?);
            for to in (1..=3u32).filter(|t| *t != from) {
                links.insert((from, to), Proxy::start(placeholder).await?);
            }
        }
        let mut brokers = Vec::new();
        for id in 1..=3u32 {
            let peers: Vec<String> = (1..=3u32)
                .filter(|to| *to != id)
                .map(|to| format!("\"{to}\" = \"{}\"", links[&(id, to)].addr()))
                .collect();
            let config = format!(
                "[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"2s\"\nreplica_lag_max = \"2s\"\n\
                 ack_timeout = \"8s\"\npeer_addrs = {{ {} }}\n\n[storage]\nflush = \"sync\"\n",
                etcd_proxies[id as usize - 1].endpoint(),
                peers.join(", ")
            );
            brokers.push(BrokerProcess::builder().cluster_id("dc-a").config(config).start().await?);
        }
        for ((_, to), proxy) in &links {
            proxy.set_upstream(brokers[*to as usize - 1].addr());
        }
        Ok(Wired { cluster: crate::raft3::Cluster { etcd, brokers }, etcd: etcd_proxies, links })
    }

    /// Cuts (or restores) every link into broker `to` from the other members.
    fn links_into(&self, to: u32, cut: bool) {
        for ((_, t), proxy) in &self.links {
            if *t == to {
                if cut { proxy.cut() } else { proxy.restore() }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_etcd_and_then_one_cut_from_its_followers_lose_and_duplicate_nothing() -> anyhow::Result<()> {
    let mut w = Wired::start().await?;
    Admin::new(w.cluster.client_of(1)).create_replicated_topic(TOPIC, 1, "raft3").await?;
    let first = w.cluster.wait_leader(1, 0, 3, deadline(&[LEASE_TTL])).await?;
    let mut config = ClientConfig::new(w.cluster.addrs());
    config.request_timeout = deadline(&[LEASE_TTL, LEASE_TTL]);
    let client = BrokerClient::new(config)?;
    let producer =
        Producer::new(client, ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET]), ..Default::default() })
            .await?;
    let mut acked = produce_all(&producer, 0..100).await?;

    // 1. The leader's link to etcd goes: its lease runs out and another member leads. The old leader, which cannot
    //    read etcd, still takes writes but can acknowledge none: its followers have moved on.
    let a = first.leader_id;
    let other = first.replicas.iter().copied().find(|r| *r != a).expect("replicas");
    w.etcd[a as usize - 1].cut();
    let second = w.cluster.wait_leader(other, a, 2, deadline(&[LEASE_TTL, LEASE_TTL])).await?;
    acked.extend(produce_all(&producer, 100..200).await?);
    w.etcd[a as usize - 1].restore();
    wait_until("the old leader back in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        w.cluster.placement(other).await.map(|p| p.isr.len() == 3)
    })
    .await?;

    // 2. The new leader's links to its followers go: it takes them out of the ISR and refuses writes meanwhile;
    //    the load waits, and goes on once the links are back.
    let b = second.leader_id;
    let load = {
        let producer = producer.clone();
        tokio::spawn(async move { produce_all(&producer, 200..300).await })
    };
    w.links_into(b, true);
    wait_until("the new leader alone in its ISR", deadline(&[REPLICA_LAG, LEASE_TTL]), async || {
        w.cluster.placement(b).await.map(|p| p.leader_id == b && p.isr == [b])
    })
    .await?;
    w.links_into(b, false);
    acked.extend(load.await??);
    producer.close().await;
    wait_until("all three in sync", deadline(&[LEASE_TTL, REPLICA_LAG, IO_BUDGET]), async || {
        w.cluster.placement(b).await.map(|p| p.isr.len() == 3)
    })
    .await?;

    let offsets: Vec<u64> = acked.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..300).collect::<Vec<u64>>(), "one producer's acknowledged offsets");
    crate::raft3::assert_log_is(&w.cluster, b, &acked, "the log after both cuts").await;
    for broker in &mut w.cluster.brokers {
        assert_eq!(broker.terminate(STOP_GRACE).await?.code(), Some(0));
    }
    assert_replicas_identical(&w.cluster)?;
    Ok(())
}
