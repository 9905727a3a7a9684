//! Where a stored record came from, decided from what the brokers answer (no I/O here): the leader it was
//! written to, when that is knowable, and the transaction whose commit appended it.
//!
//! Invariants:
//! - A single broker leads every epoch of its partitions, so the leader at write time is that broker. A cluster
//!   keeps no leader per past epoch (a replica's leader-epoch history maps epochs to offsets, not to brokers, and
//!   batches carry the partition epoch, not the leader epoch), so there it is never guessed: `None`.
//! - A transaction's messages are appended under the transaction's own producer id, so a batch belongs to the
//!   transaction with that producer id; where the transaction lists its offsets, the record must lie inside one
//!   of its ranges on that partition too. A transaction the brokers no longer remember is not guessed either.

use ferry_client::proto as pb;

/// How the leader at write time was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaderBasis {
    /// A single broker: it led every epoch.
    SingleBroker,
    /// A cluster: the leader of past writes is not recorded.
    NotRecorded,
}

/// The leader a record was written to: its address when known, and why.
pub fn leader_at_write(single_broker: bool, broker_address: &str) -> (Option<String>, LeaderBasis) {
    if single_broker {
        (Some(broker_address.to_owned()), LeaderBasis::SingleBroker)
    } else {
        (None, LeaderBasis::NotRecorded)
    }
}

/// The transaction (of those the brokers list) whose commit wrote the record at `topic/partition/offset` in a
/// batch of `producer_id`.
pub fn transaction_of<'a>(
    producer_id: i64,
    topic: &str,
    partition: u32,
    offset: u64,
    txns: &'a [pb::TxnInfo],
) -> Option<&'a pb::TxnInfo> {
    if producer_id < 0 {
        return None;
    }
    txns.iter().find(|t| {
        t.producer_id == producer_id
            && (t.offsets.is_empty()
                || t.offsets.iter().any(|o| {
                    o.topic == topic && o.partition == partition && o.base_offset <= offset && offset <= o.last_offset
                }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(id: &str, producer_id: i64, offsets: &[(&str, u32, u64, u64)]) -> pb::TxnInfo {
        pb::TxnInfo {
            group: "g".into(),
            txn_id: id.into(),
            state: "committed".into(),
            producer_id,
            offsets: offsets
                .iter()
                .map(|&(t, p, b, l)| pb::TxnOffsets { topic: t.into(), partition: p, base_offset: b, last_offset: l })
                .collect(),
            ..pb::TxnInfo::default()
        }
    }

    #[test]
    fn a_batch_belongs_to_the_transaction_with_its_producer_id_and_range() {
        let txns = [txn("a", 7, &[("t", 0, 3, 4)]), txn("b", 9, &[]), txn("c", 7, &[("t", 1, 0, 0)])];
        let cases: &[(i64, &str, u32, u64, Option<&str>)] = &[
            (7, "t", 0, 3, Some("a")),
            (7, "t", 0, 4, Some("a")),
            (7, "t", 1, 0, Some("c")),
            (7, "t", 0, 5, None),
            (7, "u", 0, 3, None),
            (9, "t", 0, 100, Some("b")),
            (8, "t", 0, 3, None),
            (-1, "t", 0, 3, None),
        ];
        for &(pid, t, p, o, want) in cases {
            assert_eq!(transaction_of(pid, t, p, o, &txns).map(|x| x.txn_id.as_str()), want, "{pid} {t}/{p}/{o}");
        }
    }

    #[test]
    fn only_a_single_broker_names_the_leader_of_a_past_write() {
        assert_eq!(leader_at_write(true, "h:1"), (Some("h:1".to_owned()), LeaderBasis::SingleBroker));
        assert_eq!(leader_at_write(false, "h:1"), (None, LeaderBasis::NotRecorded));
    }
}
