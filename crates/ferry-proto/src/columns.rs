//! The column form of ListOffsets ([`ListOffsetsColumns`], [`ListOffsetsAnswers`]): how a broker reads the
//! partitions asked and writes each answer, and how a client reads the answers back, so that both ends agree.

use crate::v1::{ListOffsetsAnswers, ListOffsetsColumns, ListOffsetsFailure, ListOffsetsResult};
use crate::v1::{list_offsets_columns, list_offsets_partition};

/// An optional value as a column entry: the value plus one, 0 for unset.
fn plus_one(v: Option<u64>) -> u64 {
    v.map_or(0, |v| v.saturating_add(1))
}

/// A column entry back as an optional value.
fn minus_one(v: u64) -> Option<u64> {
    v.checked_sub(1)
}

/// A partition's spec as the one spec of an ask in columns.
impl From<list_offsets_partition::Spec> for list_offsets_columns::Spec {
    fn from(s: list_offsets_partition::Spec) -> Self {
        match s {
            list_offsets_partition::Spec::Earliest(b) => Self::Earliest(b),
            list_offsets_partition::Spec::Latest(b) => Self::Latest(b),
            list_offsets_partition::Spec::TimestampMs(ts) => Self::TimestampMs(ts),
        }
    }
}

/// The one spec of an ask in columns, as each of its partitions'.
impl From<list_offsets_columns::Spec> for list_offsets_partition::Spec {
    fn from(s: list_offsets_columns::Spec) -> Self {
        match s {
            list_offsets_columns::Spec::Earliest(b) => Self::Earliest(b),
            list_offsets_columns::Spec::Latest(b) => Self::Latest(b),
            list_offsets_columns::Spec::TimestampMs(ts) => Self::TimestampMs(ts),
        }
    }
}

impl ListOffsetsColumns {
    /// The partitions asked, in order: each with its topic's place in `topics` and its leader epoch (`None`: none
    /// known). An error names what does not add up: counts that do not sum to the partitions, a count for no
    /// topic, or leader epochs that are neither none nor one per partition.
    pub fn asked(&self) -> Result<Vec<(usize, u32, Option<u32>)>, String> {
        if self.counts.len() != self.topics.len() {
            return Err(format!("{} counts for {} topics", self.counts.len(), self.topics.len()));
        }
        let total: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        if total != self.partitions.len() as u64 {
            return Err(format!("counts adding up to {total} for {} partitions", self.partitions.len()));
        }
        if !self.leader_epochs.is_empty() && self.leader_epochs.len() != self.partitions.len() {
            return Err(format!(
                "{} leader epochs for {} partitions (give none, or one per partition)",
                self.leader_epochs.len(),
                self.partitions.len()
            ));
        }
        let topic_of = self.counts.iter().enumerate().flat_map(|(t, &c)| std::iter::repeat_n(t, c as usize));
        Ok(topic_of
            .zip(&self.partitions)
            .enumerate()
            .map(|(i, (t, &p))| (t, p, self.leader_epochs.get(i).copied().filter(|&e| e > 0)))
            .collect())
    }
}

impl ListOffsetsAnswers {
    /// Appends the answer for the next partition asked (an error goes whole into `failures`; its `topic` is not
    /// carried either way).
    pub fn push(&mut self, mut r: ListOffsetsResult) {
        let index = self.log_end_offsets.len() as u32;
        let failed = r.error != 0;
        let columns = if failed { ListOffsetsResult::default() } else { r.clone() };
        self.log_start_offsets.push(columns.log_start_offset);
        self.log_end_offsets.push(columns.log_end_offset);
        self.stored_end_offsets.push(columns.stored_end_offset);
        self.leader_epochs.push(columns.leader_epoch);
        self.offsets.push(plus_one(columns.offset));
        self.log_end_ages_ms.push(plus_one(columns.log_end_age_ms));
        self.fence_epochs.push(plus_one(columns.fence_epoch));
        if failed {
            r.topic.clear();
            self.failures.push(ListOffsetsFailure { index, result: Some(r) });
        }
    }

    /// The answers for `partitions` (the partitions asked, in order): each a row read from the columns, or its
    /// failure whole; `None` when the columns do not hold exactly one entry per partition or a failure names no
    /// partition asked.
    pub fn into_answers(self, partitions: impl IntoIterator<Item = u32>) -> Option<Vec<Answer>> {
        let n = self.log_end_offsets.len();
        let lengths = [
            self.log_start_offsets.len(),
            self.stored_end_offsets.len(),
            self.leader_epochs.len(),
            self.offsets.len(),
            self.log_end_ages_ms.len(),
            self.fence_epochs.len(),
        ];
        if lengths.iter().any(|&l| l != n) {
            return None;
        }
        let mut out: Vec<Answer> = Vec::with_capacity(n);
        for (i, partition) in partitions.into_iter().enumerate() {
            if i >= n {
                return None;
            }
            out.push(Ok(OffsetsRow {
                partition,
                log_start_offset: self.log_start_offsets[i],
                log_end_offset: self.log_end_offsets[i],
                stored_end_offset: self.stored_end_offsets[i],
                leader_epoch: self.leader_epochs[i],
                offset: minus_one(self.offsets[i]),
                log_end_age_ms: minus_one(self.log_end_ages_ms[i]),
                fence_epoch: minus_one(self.fence_epochs[i]),
            }));
        }
        if out.len() != n {
            return None;
        }
        for f in self.failures {
            let slot = out.get_mut(f.index as usize)?;
            let mut r = f.result?;
            r.partition = slot.as_ref().map_or_else(|f| f.partition, |row| row.partition);
            r.topic.clear();
            *slot = Err(Box::new(r));
        }
        Some(out)
    }

    /// [`ListOffsetsAnswers::into_answers`], each as a whole [`ListOffsetsResult`] (its `topic` empty).
    pub fn into_results(self, partitions: impl IntoIterator<Item = u32>) -> Option<Vec<ListOffsetsResult>> {
        let answers = self.into_answers(partitions)?;
        Some(answers.into_iter().map(|a| a.map_or_else(|f| *f, ListOffsetsResult::from)).collect())
    }
}

/// One partition's answer without an error, as a client reads thousands of them from the columns: small and
/// `Copy`, with no name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffsetsRow {
    /// The partition asked.
    pub partition: u32,
    /// As [`ListOffsetsResult::log_start_offset`].
    pub log_start_offset: u64,
    /// As [`ListOffsetsResult::log_end_offset`].
    pub log_end_offset: u64,
    /// As [`ListOffsetsResult::stored_end_offset`].
    pub stored_end_offset: u64,
    /// As [`ListOffsetsResult::leader_epoch`].
    pub leader_epoch: u32,
    /// As [`ListOffsetsResult::offset`].
    pub offset: Option<u64>,
    /// As [`ListOffsetsResult::log_end_age_ms`].
    pub log_end_age_ms: Option<u64>,
    /// As [`ListOffsetsResult::fence_epoch`].
    pub fence_epoch: Option<u64>,
}

/// One partition's answer: its row, or (an error) the result whole.
pub type Answer = Result<OffsetsRow, Box<ListOffsetsResult>>;

impl From<OffsetsRow> for ListOffsetsResult {
    fn from(r: OffsetsRow) -> Self {
        ListOffsetsResult {
            partition: r.partition,
            log_start_offset: r.log_start_offset,
            log_end_offset: r.log_end_offset,
            stored_end_offset: r.stored_end_offset,
            leader_epoch: r.leader_epoch,
            offset: r.offset,
            log_end_age_ms: r.log_end_age_ms,
            fence_epoch: r.fence_epoch,
            ..Default::default()
        }
    }
}

impl ListOffsetsResult {
    /// The answer this result is: its row when it carries no error, else itself.
    pub fn into_answer(self) -> Answer {
        if self.error != 0 {
            return Err(Box::new(self));
        }
        Ok(OffsetsRow {
            partition: self.partition,
            log_start_offset: self.log_start_offset,
            log_end_offset: self.log_end_offset,
            stored_end_offset: self.stored_end_offset,
            leader_epoch: self.leader_epoch,
            offset: self.offset,
            log_end_age_ms: self.log_end_age_ms,
            fence_epoch: self.fence_epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::ErrorCode;

    #[test]
    fn answers_go_into_columns_and_come_back_the_same() {
        let ok = |partition: u32, end: u64| ListOffsetsResult {
            topic: "t".into(),
            partition,
            log_start_offset: 3,
            log_end_offset: end,
            stored_end_offset: end + 1,
            leader_epoch: 7,
            offset: Some(end),
            log_end_age_ms: Some(0),
            fence_epoch: Some(u64::MAX),
            ..Default::default()
        };
        let failed = ListOffsetsResult {
            topic: "t".into(),
            partition: 9,
            error: ErrorCode::UnknownTopicOrPartition as i32,
            message: "partition 9 does not exist".into(),
            ..Default::default()
        };
        let unset = ListOffsetsResult { partition: 2, ..Default::default() };
        let answers = [ok(0, 10), failed.clone(), unset.clone(), ok(1, 0)];
        let mut columns = ListOffsetsAnswers::default();
        for a in &answers {
            columns.push(a.clone());
        }
        assert_eq!(columns.failures.len(), 1);
        let back = columns.clone().into_results([0, 9, 2, 1]).expect("one entry per partition");
        let named: Vec<ListOffsetsResult> =
            answers.iter().map(|a| ListOffsetsResult { topic: String::new(), ..a.clone() }).collect();
        let mut want = named;
        // u64::MAX + 1 saturates: the largest fence epoch reads back one lower.
        want[0].fence_epoch = Some(u64::MAX - 1);
        want[3].fence_epoch = Some(u64::MAX - 1);
        assert_eq!(back, want);
        // The same as rows: each answer without an error is its row, the failure is whole.
        let rows = columns.clone().into_answers([0, 9, 2, 1]).expect("one entry per partition");
        let as_rows: Vec<Answer> = want.iter().cloned().map(ListOffsetsResult::into_answer).collect();
        assert_eq!(rows, as_rows);
        assert_eq!(rows[1].as_ref().unwrap_err().message, "partition 9 does not exist");
        assert_eq!(rows[0].as_ref().unwrap().log_end_offset, 10);
        // Columns of the wrong length, or a failure outside them, are no answer.
        assert_eq!(columns.clone().into_results([0, 9, 2]), None);
        let mut stray = columns;
        stray.failures[0].index = 4;
        assert_eq!(stray.into_results([0, 9, 2, 1]), None);
    }

    #[test]
    fn an_ask_in_columns_is_read_partition_by_partition_and_what_does_not_add_up_is_named() {
        let ask = ListOffsetsColumns {
            topics: vec!["a".into(), "b".into()],
            counts: vec![2, 1],
            partitions: vec![0, 3, 7],
            leader_epochs: vec![0, 4, 9],
            ..Default::default()
        };
        assert_eq!(ask.asked(), Ok(vec![(0, 0, None), (0, 3, Some(4)), (1, 7, Some(9))]));
        let no_epochs = ListOffsetsColumns { leader_epochs: vec![], ..ask.clone() };
        assert_eq!(no_epochs.asked(), Ok(vec![(0, 0, None), (0, 3, None), (1, 7, None)]));
        let bad = |f: fn(&mut ListOffsetsColumns)| {
            let mut a = ask.clone();
            f(&mut a);
            a.asked().unwrap_err()
        };
        assert_eq!(bad(|a| a.counts.push(0)), "3 counts for 2 topics");
        assert_eq!(bad(|a| a.counts[1] = u32::MAX), "counts adding up to 4294967297 for 3 partitions");
        assert_eq!(
            bad(|a| a.leader_epochs.pop().map(drop).unwrap_or(())),
            "2 leader epochs for 3 partitions (give none, or one per partition)"
        );
    }
}
