//! Deduplication of a retried delayed produce, without I/O: per target partition and producer id, the delay store
//! remembers the producer's last stored batch (epoch, first sequence, record count, first id). A request carrying
//! the same epoch and sequences is the retry of that batch (its answer was lost): it is answered with the first
//! attempt's ids and stores nothing. The sequences of delayed produces are a space of their own, apart from the
//! producer's plain produces to the same partition (those go to the partition's own idempotent-producer state).

/// The producer a delayed produce's batch names, and how many records it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The producer id (>= 0).
    pub producer_id: i64,
    /// Its epoch.
    pub epoch: i16,
    /// The sequence of the first record.
    pub base_seq: i32,
    /// Records in the request.
    pub count: u32,
}

/// What the delay store keeps of a producer's last stored batch for one target partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastBatch {
    /// Its epoch.
    pub epoch: i16,
    /// The sequence of its first record.
    pub base_seq: i32,
    /// Its records.
    pub count: u32,
    /// The id (delay-store offset) of its first record; the others follow it.
    pub first_id: u64,
}

/// What to do with a delayed produce from a known producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginDecision {
    /// Store it.
    Store,
    /// It is the retry of the last batch: answer these ids, store nothing.
    Duplicate {
        /// The first attempt's first id.
        first_id: u64,
        /// How many.
        count: u32,
    },
    /// Refuse it, for this reason (nothing is stored).
    Refuse(String),
}

/// Most producers remembered per delay-store partition; past it the half stored longest ago is forgotten (a retry
/// from one of them is stored again).
pub const MAX_PRODUCERS: usize = 10_000;

/// Decides about `incoming` given the producer's `last` stored batch for the same target partition.
pub fn decide_origin(last: Option<&LastBatch>, incoming: &Origin) -> OriginDecision {
    let Some(last) = last else { return OriginDecision::Store };
    let pid = incoming.producer_id;
    if incoming.epoch < last.epoch {
        return OriginDecision::Refuse(format!(
            "producer {pid} epoch {} is older than its epoch {} already used here (a fenced producer)",
            incoming.epoch, last.epoch
        ));
    }
    if incoming.epoch > last.epoch {
        return OriginDecision::Store;
    }
    if incoming.base_seq == last.base_seq {
        return if incoming.count == last.count {
            OriginDecision::Duplicate { first_id: last.first_id, count: last.count }
        } else {
            OriginDecision::Refuse(format!(
                "producer {pid} reused delayed sequence {} with {} records, not the {} stored under it",
                incoming.base_seq, incoming.count, last.count
            ))
        };
    }
    let next = i64::from(last.base_seq) + i64::from(last.count);
    if i64::from(incoming.base_seq) < next {
        return OriginDecision::Refuse(format!(
            "producer {pid} sent delayed sequence {} below its next one, {next}: out of order, or the retry of a \
             batch older than its last",
            incoming.base_seq
        ));
    }
    OriginDecision::Store
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(epoch: i16, base_seq: i32, count: u32) -> Origin {
        Origin { producer_id: 7, epoch, base_seq, count }
    }

    /// A row: the last batch known, the new batch, what it is (a duplicate's first id and count, or a refusal).
    type Row = (Option<LastBatch>, Origin, Result<Option<(u64, u32)>, &'static str>);

    #[test]
    fn retries_are_duplicates_and_stale_or_reordered_sequences_are_refused() {
        let last = LastBatch { epoch: 2, base_seq: 10, count: 3, first_id: 500 };
        let table: &[Row] = &[
            (None, o(0, 0, 1), Ok(None)),
            (Some(last), o(2, 10, 3), Ok(Some((500, 3)))),
            (Some(last), o(2, 13, 1), Ok(None)),
            // A gap is stored: sequences of delayed produces need not be contiguous.
            (Some(last), o(2, 40, 1), Ok(None)),
            (Some(last), o(3, 0, 1), Ok(None)),
            (Some(last), o(1, 13, 1), Err("older than its epoch 2")),
            (Some(last), o(2, 10, 2), Err("reused delayed sequence 10")),
            (Some(last), o(2, 12, 1), Err("below its next one, 13")),
            (Some(last), o(2, 5, 1), Err("below its next one")),
        ];
        for (last, incoming, want) in table {
            let got = decide_origin(last.as_ref(), incoming);
            match (want, &got) {
                (Ok(None), OriginDecision::Store) => {}
                (Ok(Some((id, n))), OriginDecision::Duplicate { first_id, count }) => {
                    assert_eq!((id, n), (first_id, count), "{incoming:?}")
                }
                (Err(w), OriginDecision::Refuse(g)) => assert!(g.contains(w), "{incoming:?}: {g:?} lacks {w:?}"),
                _ => panic!("{last:?} {incoming:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
