//! `[cluster]`: the etcd master a broker registers with (docs/cluster.md).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;

/// `[cluster]`: the etcd master this broker registers with. With no `etcd` endpoints the broker runs alone, needing
/// no etcd and no other key of this section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// etcd client URLs (`http://host:2379`); empty: single-broker mode.
    pub etcd: Vec<String>,
    /// This broker's id in the cluster, unique among its members. Required with `etcd`.
    pub broker_id: Option<u32>,
    /// The address other brokers and clients reach this broker at; unset: `broker.advertised_address`, else the
    /// bound listen address.
    pub advertised_addr: Option<String>,
    /// TTL of the etcd lease that holds this broker's membership: a broker that stops renewing it (killed, or cut
    /// off from etcd) leaves the cluster this long after its last renewal.
    #[serde(deserialize_with = "de::duration")]
    pub lease_ttl: Duration,
    /// A raft3 leader takes a follower out of the in-sync set once it has not caught up for this long.
    #[serde(deserialize_with = "de::duration")]
    pub replica_lag_max: Duration,
    /// How long a raft3 produce waits for the in-sync set to acknowledge it before it answers `not_acknowledged`.
    #[serde(deserialize_with = "de::duration")]
    pub ack_timeout: Duration,
    /// Test-only: the address this broker dials for another member's id, instead of the one it registered (tests
    /// route broker-to-broker links through a fault proxy). Keys are broker ids.
    pub peer_addrs: BTreeMap<String, String>,
    /// File holding the bearer token this member presents to the other members (their `[[auth.tokens]]` must give
    /// it the replica scope); unset: none is sent, which members that require tokens refuse.
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle that the other members' certificates are checked against; set: members are dialled over TLS
    /// (and, with `[broker.tls]`, this member presents its own certificate). Unset: plaintext.
    pub tls_ca_file: Option<PathBuf>,
    /// Named listeners (`[[cluster.listeners]]`): more addresses this broker serves on, each advertised under its
    /// name, so that clients on another network (a mirror's backup route) are told addresses they can reach.
    pub listeners: Vec<ListenerSection>,
}

/// One `[[cluster.listeners]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    /// Its name, as clients ask for it (a mirror route's `listener`).
    pub name: String,
    /// The address it binds.
    pub addr: std::net::SocketAddr,
    /// The address advertised for it; unset: the bound address.
    #[serde(default)]
    pub advertised: Option<String>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            etcd: Vec::new(),
            broker_id: None,
            advertised_addr: None,
            lease_ttl: Duration::from_secs(10),
            replica_lag_max: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(15),
            peer_addrs: BTreeMap::new(),
            token_file: None,
            tls_ca_file: None,
            listeners: Vec::new(),
        }
    }
}

impl ClusterSection {
    /// Whether the broker is a cluster member (etcd endpoints are set).
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }

    /// The dial address overrides of `peer_addrs`, by broker id (the bad keys were refused by validation).
    pub fn peer_overrides(&self) -> BTreeMap<u32, String> {
        self.peer_addrs.iter().filter_map(|(k, v)| Some((k.parse().ok()?, v.clone()))).collect()
    }

    /// Every problem of `[cluster]`.
    pub(crate) fn validate(&self, p: &mut Problems) {
        for url in &self.etcd {
            let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
                p.push("cluster.etcd", format!("{url:?} is not an etcd client URL such as \"http://127.0.0.1:2379\""));
            }
        }
        if self.enabled() && self.broker_id.is_none() {
            p.push("cluster.broker_id", "is required with cluster.etcd (or --broker-id): each member needs its own id");
        }
        if let Some(id) = self.broker_id
            && !(1..=1_000_000).contains(&id)
        {
            p.push("cluster.broker_id", format!("{id} is outside 1..1000000"));
        }
        if !(Duration::from_secs(2)..=Duration::from_secs(300)).contains(&self.lease_ttl) {
            p.push("cluster.lease_ttl", format!("{:?} is outside 2s..300s", self.lease_ttl));
        }
        if !(Duration::from_millis(500)..=Duration::from_secs(300)).contains(&self.replica_lag_max) {
            p.push("cluster.replica_lag_max", format!("{:?} is outside 500ms..300s", self.replica_lag_max));
        }
        if self.ack_timeout <= self.replica_lag_max || self.ack_timeout > Duration::from_secs(600) {
            p.push(
                "cluster.ack_timeout",
                format!(
                    "{:?} must be above cluster.replica_lag_max ({:?}, so that a write outlives a dead follower's \
                     removal from the in-sync set) and at most 600s",
                    self.ack_timeout, self.replica_lag_max
                ),
            );
        }
        for (id, addr) in &self.peer_addrs {
            if id.parse::<u32>().is_err() {
                p.push("cluster.peer_addrs", format!("key {id:?} is not a broker id"));
            }
            if addr.is_empty() || addr.contains(char::is_whitespace) {
                p.push("cluster.peer_addrs", format!("{addr:?} (broker {id}) must be a host:port without spaces"));
            }
        }
        for (key, path) in [("cluster.token_file", &self.token_file), ("cluster.tls_ca_file", &self.tls_ca_file)] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                p.push(key, "must name a file");
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let key = format!("cluster.listeners[{i}]");
            let valid_name = !l.name.is_empty()
                && l.name.len() <= 64
                && l.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !valid_name {
                p.push(format!("{key}.name"), format!("{:?} must be 1-64 characters of A-Z a-z 0-9 - _", l.name));
            }
            if !names.insert(l.name.as_str()) {
                p.push(format!("{key}.name"), format!("{:?} is named twice", l.name));
            }
            if l.advertised.as_ref().is_some_and(|a| a.is_empty() || a.contains(char::is_whitespace)) {
                p.push(format!("{key}.advertised"), "must be a host:port without spaces");
            }
        }
        if !self.listeners.is_empty() && !self.enabled() {
            p.push("cluster.listeners", "named listeners are advertised through the cluster: set cluster.etcd too");
        }
        if self.advertised_addr.as_ref().is_some_and(|a| a.is_empty() || a.contains(char::is_whitespace)) {
            p.push("cluster.advertised_addr", "must be a host:port without spaces");
        }
    }
}
