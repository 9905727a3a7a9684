//! `[groups]`: consumer-group bounds and, on a cluster, the offsets partitions.

use std::time::Duration;

use ferry_config::{Problems, de};
use serde::Deserialize;

/// `[groups]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupsSection {
    /// Smallest session timeout a member may ask for.
    #[serde(deserialize_with = "de::duration")]
    pub min_session_timeout: Duration,
    /// Largest session timeout a member may ask for.
    #[serde(deserialize_with = "de::duration")]
    pub max_session_timeout: Duration,
    /// Longest member id and client id a member may present, in bytes.
    pub max_id_bytes: usize,
    /// Most members of one group.
    pub max_members: usize,
    /// Most groups, with members or committed offsets.
    pub max_groups: usize,
    /// Longest metadata of one committed offset, in bytes.
    pub max_metadata_bytes: usize,
    /// On a cluster: partitions of the replicated internal topic of committed offsets, whose leaders coordinate
    /// the groups hashed to them. Read when the topic is created (by the controller, once).
    pub offsets_partitions: u32,
}

impl Default for GroupsSection {
    fn default() -> Self {
        GroupsSection {
            min_session_timeout: Duration::from_millis(1000),
            max_session_timeout: Duration::from_secs(300),
            max_id_bytes: 255,
            max_members: 1000,
            max_groups: 10_000,
            max_metadata_bytes: 4096,
            offsets_partitions: 8,
        }
    }
}

impl GroupsSection {
    /// Every problem of `[groups]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        if self.min_session_timeout > self.max_session_timeout {
            p.push("groups.min_session_timeout", "is larger than groups.max_session_timeout");
        }
        // A generated member id is the client id (cut to fit) and a 37-byte UUID suffix.
        if !(64..=4096).contains(&self.max_id_bytes) {
            p.push("groups.max_id_bytes", format!("{} is outside 64..4096", self.max_id_bytes));
        }
        if !(1..=100_000).contains(&self.max_members) {
            p.push("groups.max_members", format!("{} is outside 1..100000", self.max_members));
        }
        if !(1..=1_000_000).contains(&self.max_groups) {
            p.push("groups.max_groups", format!("{} is outside 1..1000000", self.max_groups));
        }
        if self.max_metadata_bytes > 1 << 20 {
            p.push("groups.max_metadata_bytes", format!("{} is above 1048576", self.max_metadata_bytes));
        }
        if !(1..=256).contains(&self.offsets_partitions) {
            p.push("groups.offsets_partitions", format!("{} is outside 1..256", self.offsets_partitions));
        }
    }

    /// The limits the group coordinator enforces.
    pub fn group_limits(&self) -> crate::groups::Limits {
        crate::groups::Limits {
            max_id_bytes: self.max_id_bytes,
            max_members: self.max_members,
            max_groups: self.max_groups,
            max_metadata_bytes: self.max_metadata_bytes,
        }
    }
}
