//! `[cluster]`: the etcd master a broker registers with (docs/cluster.md).

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
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection { etcd: Vec::new(), broker_id: None, advertised_addr: None, lease_ttl: Duration::from_secs(10) }
    }
}

impl ClusterSection {
    /// Whether the broker is a cluster member (etcd endpoints are set).
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
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
        if self.advertised_addr.as_ref().is_some_and(|a| a.is_empty() || a.contains(char::is_whitespace)) {
            p.push("cluster.advertised_addr", "must be a host:port without spaces");
        }
    }
}
