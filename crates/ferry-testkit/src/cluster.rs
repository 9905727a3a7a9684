//! [`FaultyCluster`]: a Ferry cluster on loopback built for fault tests. One real etcd; `members` real brokers on
//! ports reserved up front; each broker's link to etcd through a [`Proxy`] of its own, and each broker's link to
//! each other member through a proxy of its own (`cluster.peer_addrs`). Clients reach the brokers directly. So one
//! member can be cut off from etcd alone, or from one peer alone, while everything else goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::broker::BrokerProcess;
use crate::error::Result;
use crate::etcd::EtcdProcess;
use crate::proxy::Proxy;
use crate::util::reserve_port;

/// What a [`FaultyCluster`] runs.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// How many members (broker ids 1..=members).
    pub members: u32,
    /// The cluster id.
    pub cluster_id: String,
    /// `cluster.lease_ttl`.
    pub lease_ttl: Duration,
    /// `cluster.replica_lag_max`.
    pub replica_lag: Duration,
    /// `cluster.ack_timeout`.
    pub ack_timeout: Duration,
    /// Lines of each member's `[storage]` section (e.g. `flush = "sync"`).
    pub storage: String,
    /// More TOML sections for each member's config.
    pub extra: String,
    /// Whether the members run on the journaled file layer, for [`BrokerProcess::power_loss`].
    pub sync_journal: bool,
    /// When set, each member runs a Kafka listener on a port of its own: these lines are the rest of its `[kafka]`
    /// section (`extra` must then have none).
    pub kafka: Option<String>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            members: 3,
            cluster_id: "dc-a".into(),
            lease_ttl: Duration::from_secs(2),
            replica_lag: Duration::from_secs(2),
            ack_timeout: Duration::from_secs(8),
            storage: "flush = \"sync\"\n".into(),
            extra: String::new(),
            sync_journal: false,
            kafka: None,
        }
    }
}

/// A running cluster with a proxy on every link but the clients' (see the module docs).
#[derive(Debug)]
pub struct FaultyCluster {
    /// The master.
    pub etcd: EtcdProcess,
    /// Broker id `i + 1` at index `i`.
    pub brokers: Vec<BrokerProcess>,
    spec: ClusterSpec,
    etcd_links: Vec<Proxy>,
    /// (from, to): the link `from` dials `to` through.
    peer_links: BTreeMap<(u32, u32), Proxy>,
    /// Each member's Kafka listener (`host:port`), when [`ClusterSpec::kafka`] is set.
    kafka_addrs: Vec<String>,
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl FaultyCluster {
    /// Starts etcd, the proxies and the members, in id order.
    pub async fn start(spec: ClusterSpec) -> Result<FaultyCluster> {
        let etcd = EtcdProcess::start().await?;
        let etcd_addr = etcd.url().trim_start_matches("http://").parse().map_err(|e| crate::Error::Etcd {
            url: etcd.url().to_owned(),
            message: format!("not a socket address: {e}"),
        })?;
        let n = spec.members;
        // Each member's port stays bound here until its broker starts, so the proxies below (port 0) cannot take it.
        let mut held = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..n {
            let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .map_err(|source| crate::Error::Net { action: "bind", addr: "127.0.0.1:0".into(), source })?;
            ports.push(
                listener
                    .local_addr()
                    .map_err(|source| crate::Error::Net {
                        action: "read the address of",
                        addr: "127.0.0.1:0".into(),
                        source,
                    })?
                    .port(),
            );
            held.push(Some(listener));
        }
        let mut etcd_links = Vec::new();
        for _ in 0..n {
            etcd_links.push(Proxy::start(etcd_addr).await?);
        }
        let mut peer_links = BTreeMap::new();
        for from in 1..=n {
            for to in (1..=n).filter(|to| *to != from) {
                let upstream = format!("127.0.0.1:{}", ports[to as usize - 1]).parse().expect("loopback address");
                peer_links.insert((from, to), Proxy::start(upstream).await?);
            }
        }
        let mut brokers = Vec::new();
        let mut kafka_addrs = Vec::new();
        for id in 1..=n {
            let kafka = match &spec.kafka {
                Some(lines) => {
                    let addr = format!("127.0.0.1:{}", reserve_port()?);
                    kafka_addrs.push(addr.clone());
                    format!("\n[kafka]\nlisten = \"{addr}\"\n{lines}\n")
                }
                None => String::new(),
            };
            let peers: Vec<String> = (1..=n)
                .filter(|to| *to != id)
                .map(|to| format!("\"{to}\" = \"{}\"", peer_links[&(id, to)].addr()))
                .collect();
            let config = format!(
                "[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"{}\"\nreplica_lag_max = \"{}\"\n\
                 ack_timeout = \"{}\"\npeer_addrs = {{ {} }}\n\n[storage]\n{}\n{}{kafka}",
                etcd_links[id as usize - 1].endpoint(),
                secs(spec.lease_ttl),
                secs(spec.replica_lag),
                secs(spec.ack_timeout),
                peers.join(", "),
                spec.storage,
                spec.extra,
            );
            // Another process may still take the port between its release and the broker's bind: then the member
            // starts on a fresh one, and the peers' proxies are pointed at it.
            held[id as usize - 1] = None;
            let mut attempt = 0;
            let broker = loop {
                let mut builder = BrokerProcess::builder()
                    .cluster_id(spec.cluster_id.clone())
                    .config(config.clone())
                    .port(ports[id as usize - 1]);
                if spec.sync_journal {
                    builder = builder.sync_journal();
                }
                match builder.start().await {
                    Err(crate::Error::EarlyExit { log_tail, .. })
                        if attempt < 3 && log_tail.contains("Address already in use") =>
                    {
                        attempt += 1;
                        let port = reserve_port()?;
                        ports[id as usize - 1] = port;
                        let upstream = format!("127.0.0.1:{port}").parse().expect("loopback address");
                        for from in (1..=n).filter(|from| *from != id) {
                            peer_links[&(from, id)].set_upstream(upstream);
                        }
                    }
                    other => break other?,
                }
            };
            brokers.push(broker);
        }
        Ok(FaultyCluster { etcd, brokers, spec, etcd_links, peer_links, kafka_addrs })
    }

    /// What it runs.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// Member `id`'s Kafka listener (`host:port`); `None` without [`ClusterSpec::kafka`].
    pub fn kafka_addr(&self, id: u32) -> Option<&str> {
        self.kafka_addrs.get((id as usize).checked_sub(1)?).map(String::as_str)
    }

    /// Every member's address, in id order.
    pub fn addrs(&self) -> Vec<String> {
        self.brokers.iter().map(|b| b.addr().to_string()).collect()
    }

    /// Member `id`.
    pub fn broker(&mut self, id: u32) -> &mut BrokerProcess {
        &mut self.brokers[id as usize - 1]
    }

    /// Member `id`'s link to etcd.
    pub fn etcd_link(&self, id: u32) -> &Proxy {
        &self.etcd_links[id as usize - 1]
    }

    /// Cuts member `id` off from etcd (its connections are reset, new ones refused).
    pub fn cut_from_etcd(&self, id: u32) {
        self.etcd_link(id).cut();
    }

    /// Gives member `id` its etcd link back.
    pub fn heal_etcd(&self, id: u32) {
        self.etcd_link(id).restore();
    }

    /// Cuts the links between members `a` and `b`, both ways.
    pub fn cut_between(&self, a: u32, b: u32) {
        for key in [(a, b), (b, a)] {
            if let Some(p) = self.peer_links.get(&key) {
                p.cut();
            }
        }
    }

    /// Gives members `a` and `b` their links back.
    pub fn heal_between(&self, a: u32, b: u32) {
        for key in [(a, b), (b, a)] {
            if let Some(p) = self.peer_links.get(&key) {
                p.restore();
            }
        }
    }

    /// Heals every link.
    pub fn heal_all(&self) {
        for p in self.etcd_links.iter().chain(self.peer_links.values()) {
            p.restore();
        }
    }
}
