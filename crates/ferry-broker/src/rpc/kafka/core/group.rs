//! How a Kafka group member's view meets the Ferry group it is a member of.
//!
//! Kafka's classic protocol has the group leader assign partitions; here Ferry's server-side rule deals them
//! (docs/kafka.md, "Groups"), so a Kafka member and a Ferry member of one group share one assignment and one set of
//! committed offsets. A Kafka member learns its generation from JoinGroup and is told to rejoin when the Ferry
//! group's generation moved on. Ferry's generations are 64-bit (a cluster coordinator's epoch is the high half);
//! Kafka's are 31-bit non-negative, so the Kafka generation is the low 31 bits, and a Kafka generation is taken as
//! the group's current one when those bits match.

/// Kafka error codes of the group answers.
pub mod codes {
    /// Success.
    pub const NONE: i16 = 0;
    /// The generation is not the group's.
    pub const ILLEGAL_GENERATION: i16 = 22;
    /// The member's protocols share none with the group's.
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    /// The member is unknown (never joined, left, or expired).
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// The group rebalanced: rejoin.
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
}

/// The Kafka generation of a Ferry generation.
pub fn kafka_generation(ferry: u64) -> i32 {
    (ferry & 0x7fff_ffff) as i32
}

/// The answer to a Heartbeat or SyncGroup of a member at Kafka generation `theirs`, given what the Ferry group
/// says: whether it knows the member, and its current generation.
pub fn member_check(known: bool, current: u64, theirs: i32) -> i16 {
    if !known {
        codes::UNKNOWN_MEMBER_ID
    } else if kafka_generation(current) != theirs {
        codes::REBALANCE_IN_PROGRESS
    } else {
        codes::NONE
    }
}

/// The Ferry generation an OffsetCommit at Kafka generation `theirs` commits under: the group's current one when
/// it is the same generation, else one the group refuses as stale (never the current one).
pub fn commit_generation(current: u64, theirs: i32) -> u64 {
    if kafka_generation(current) == theirs { current } else { current.wrapping_add(1) }
}

/// The protocol (assignor name) the group answers with: the member's first eager one. Ferry deals the partitions
/// itself and changes them eagerly, so an incremental ("cooperative") protocol would mislead the client.
pub fn pick_protocol<'a>(offered: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    offered.into_iter().find(|p| !p.contains("cooperative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_map_to_kafka_s_31_bits() {
        let cases: &[(u64, i32)] = &[(0, 0), (1, 1), (0x7fff_ffff, 0x7fff_ffff), (0x8000_0000, 0), ((3 << 32) | 5, 5)];
        for &(ferry, kafka) in cases {
            assert_eq!(kafka_generation(ferry), kafka, "{ferry:#x}");
        }
    }

    #[test]
    fn member_checks() {
        let cases: &[(bool, u64, i32, i16)] = &[
            (true, 4, 4, codes::NONE),
            (true, 5, 4, codes::REBALANCE_IN_PROGRESS),
            (true, (2 << 32) | 4, 4, codes::NONE),
            (false, 4, 4, codes::UNKNOWN_MEMBER_ID),
            (false, 5, -1, codes::UNKNOWN_MEMBER_ID),
            (true, 4, -1, codes::REBALANCE_IN_PROGRESS),
        ];
        for &(known, current, theirs, want) in cases {
            assert_eq!(member_check(known, current, theirs), want, "{known} {current} {theirs}");
        }
    }

    #[test]
    fn commits_under_the_current_generation_only_when_it_is_theirs() {
        assert_eq!(commit_generation(7, 7), 7);
        assert_eq!(commit_generation((1 << 32) | 7, 7), (1 << 32) | 7);
        assert_eq!(commit_generation(8, 7), 9);
        assert_ne!(commit_generation(8, -1), 8);
    }

    #[test]
    fn the_first_eager_protocol_is_picked() {
        assert_eq!(pick_protocol(["range", "roundrobin"]), Some("range"));
        assert_eq!(pick_protocol(["cooperative-sticky", "roundrobin"]), Some("roundrobin"));
        assert_eq!(pick_protocol(["cooperative-sticky"]), None);
        assert_eq!(pick_protocol([]), None);
    }
}
