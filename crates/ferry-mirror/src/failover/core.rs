//! The failover job's decisions, as plain functions of what the job recorded and what the clusters answered: which
//! step comes next, whether the target holds everything up to the fence, the partition epoch of the promotion's
//! cut, and the per-partition and per-topic report. No I/O and no clock: the runner (`super::run`) performs them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The steps of a failover, in order. A job records the last step it completed; running it again starts at the
/// next one, and every step is idempotent, so a job killed anywhere ends the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The pre-checks passed and the job is recorded.
    Started,
    /// The source topics are fenced (skipped with the source unreachable).
    Fenced,
    /// The target holds everything up to the fence (skipped with the source unreachable).
    Drained,
    /// The final group-offset sync ran.
    GroupsSynced,
    /// Every target topic is promoted, as one cut.
    Promoted,
    /// Mirroring of those topics stopped: the job is done.
    Done,
}

impl Step {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Step::Started => "started",
            Step::Fenced => "fenced",
            Step::Drained => "drained",
            Step::GroupsSynced => "groups_synced",
            Step::Promoted => "promoted",
            Step::Done => "done",
        }
    }
}

/// What the runner does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fence the source topics at the job's epoch.
    Fence,
    /// Wait until the target holds everything up to the fence.
    Drain,
    /// Record the final positions the mirror saw (the source is unreachable): no fence, no drain.
    RecordLastSeen,
    /// Run a final group-offset sync.
    SyncGroups,
    /// Promote every target topic at one partition epoch floor.
    Promote,
    /// Stop mirroring those topics.
    Stop,
}

/// The action after `done`, or `None` when the job is finished.
pub fn next(done: Step, source_unreachable: bool) -> Option<Action> {
    match (done, source_unreachable) {
        (Step::Started, false) => Some(Action::Fence),
        (Step::Fenced, _) => Some(Action::Drain),
        (Step::Started, true) => Some(Action::RecordLastSeen),
        (Step::Drained, _) => Some(Action::SyncGroups),
        (Step::GroupsSynced, _) => Some(Action::Promote),
        (Step::Promoted, _) => Some(Action::Stop),
        (Step::Done, _) => None,
    }
}

/// The step an action completes.
pub fn completes(action: Action) -> Step {
    match action {
        Action::Fence => Step::Fenced,
        Action::Drain | Action::RecordLastSeen => Step::Drained,
        Action::SyncGroups => Step::GroupsSynced,
        Action::Promote => Step::Promoted,
        Action::Stop => Step::Done,
    }
}

/// A source partition as its leader answered after the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceEnd {
    /// The fence in force there.
    pub fence_epoch: Option<u64>,
    /// What its readers see (a replicated partition's high watermark).
    pub visible_end: u64,
    /// Its leader's own log end.
    pub stored_end: u64,
}

/// Whether a fenced source partition's content is final: the job's fence is in force at its leader and every
/// record it holds is visible (acknowledged). Returns the final end.
pub fn final_end(job_epoch: u64, s: &SourceEnd) -> Option<u64> {
    (s.fence_epoch.is_some_and(|e| e >= job_epoch) && s.visible_end == s.stored_end).then_some(s.visible_end)
}

/// What is still missing on the target: per partition (key `topic/partition`), the final source end it must reach
/// and the target's end now. Partitions whose source end is not final yet count as missing with `None`.
pub fn behind(
    finals: &BTreeMap<String, Option<u64>>,
    target_ends: &BTreeMap<String, u64>,
) -> Vec<(String, Option<u64>, u64)> {
    finals
        .iter()
        .filter_map(|(key, fin)| {
            let have = target_ends.get(key).copied().unwrap_or(0);
            match fin {
                Some(end) if have >= *end => None,
                _ => Some((key.clone(), *fin, have)),
            }
        })
        .collect()
}

/// The partition epoch of the promotion's cut: above every epoch either side has used, so each promoted
/// partition's first local write starts a history no earlier batch shares (failback finds the split by it).
pub fn epoch_floor(epochs: impl IntoIterator<Item = u32>) -> u32 {
    epochs.into_iter().max().unwrap_or(0).saturating_add(1)
}

/// One partition's line of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PartitionReport {
    /// Source topic.
    pub topic: String,
    /// Target topic.
    pub target_topic: String,
    /// Partition.
    pub partition: u32,
    /// The source's final end (fenced), or the last end the mirror saw (source unreachable).
    pub source_end: u64,
    /// The target's end at promotion.
    pub target_end: u64,
    /// Records the target does not hold: 0 when fenced and drained.
    pub records_lost: u64,
    /// The RPO achieved, seconds: 0 when fenced; else how long the oldest record not on the target had waited.
    pub rpo_seconds: f64,
}

/// One topic's loss window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopicLoss {
    /// Source topic.
    pub topic: String,
    /// Records the target does not hold, over its partitions.
    pub records_lost: u64,
    /// The loss window, seconds: records produced in the last this many seconds before the failover may be lost
    /// (0 when none is).
    pub window_seconds: f64,
}

/// The per-topic loss windows of a report.
pub fn losses(report: &[PartitionReport]) -> Vec<TopicLoss> {
    let mut by_topic: BTreeMap<&str, TopicLoss> = BTreeMap::new();
    for p in report {
        let t = by_topic.entry(&p.topic).or_insert_with(|| TopicLoss { topic: p.topic.clone(), ..Default::default() });
        t.records_lost += p.records_lost;
        if p.records_lost > 0 {
            t.window_seconds = t.window_seconds.max(p.rpo_seconds);
        }
    }
    by_topic.into_values().collect()
}

/// The pre-check of the RPO against `max_rpo_seconds`: the worst partition, when it is above.
pub fn rpo_refusal(rpos: &[(String, f64)], max_rpo_seconds: Option<f64>) -> Option<String> {
    let max = max_rpo_seconds?;
    let (worst, rpo) = rpos.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    (*rpo > max).then(|| format!("partition {worst} has an RPO of {rpo:.1} s, above --max-rpo {max:.1} s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_follow_in_order_and_skip_fence_and_drain_when_the_source_is_unreachable() {
        let walk = |unreachable: bool| {
            let mut done = Step::Started;
            let mut actions = Vec::new();
            while let Some(a) = next(done, unreachable) {
                actions.push(a);
                done = completes(a);
            }
            actions
        };
        use Action::*;
        assert_eq!(walk(false), vec![Fence, Drain, SyncGroups, Promote, Stop]);
        assert_eq!(walk(true), vec![RecordLastSeen, SyncGroups, Promote, Stop]);
        assert_eq!(next(Step::Done, false), None);
        // Resuming after any recorded step runs the rest only.
        assert_eq!(next(Step::Drained, false), Some(SyncGroups));
    }

    #[test]
    fn a_source_end_is_final_once_fenced_at_the_job_epoch_and_acknowledged() {
        let end = |fence, visible, stored| SourceEnd { fence_epoch: fence, visible_end: visible, stored_end: stored };
        let cases = [
            ("fenced, all acknowledged", end(Some(7), 10, 10), Some(10)),
            ("a newer fence counts", end(Some(8), 10, 10), Some(10)),
            ("not fenced yet at its leader", end(None, 10, 10), None),
            ("an older fence", end(Some(6), 10, 10), None),
            ("records past the high watermark", end(Some(7), 9, 10), None),
        ];
        for (name, s, want) in cases {
            assert_eq!(final_end(7, &s), want, "{name}");
        }
    }

    #[test]
    fn behind_lists_partitions_short_of_the_fence() {
        let finals: BTreeMap<String, Option<u64>> =
            [("a/0".into(), Some(10)), ("a/1".into(), Some(5)), ("b/0".into(), None)].into();
        let target: BTreeMap<String, u64> = [("a/0".into(), 10), ("a/1".into(), 4)].into();
        assert_eq!(behind(&finals, &target), vec![("a/1".into(), Some(5), 4), ("b/0".into(), None, 0)]);
        let done: BTreeMap<String, u64> = [("a/0".into(), 11), ("a/1".into(), 5), ("b/0".into(), 0)].into();
        let finals: BTreeMap<String, Option<u64>> = [("a/0".into(), Some(10)), ("a/1".into(), Some(5))].into();
        assert!(behind(&finals, &done).is_empty());
    }

    #[test]
    fn the_floor_is_above_every_epoch_and_losses_sum_per_topic() {
        assert_eq!(epoch_floor([3, 9, 4]), 10);
        assert_eq!(epoch_floor([]), 1);
        let p = |topic: &str, lost, rpo| PartitionReport {
            topic: topic.into(),
            records_lost: lost,
            rpo_seconds: rpo,
            ..Default::default()
        };
        let l = losses(&[p("a", 3, 2.5), p("a", 0, 9.0), p("a", 2, 4.0), p("b", 0, 0.0)]);
        assert_eq!(
            l,
            vec![
                TopicLoss { topic: "a".into(), records_lost: 5, window_seconds: 4.0 },
                TopicLoss { topic: "b".into(), records_lost: 0, window_seconds: 0.0 },
            ]
        );
        let rpos = [("a/0".to_owned(), 1.0), ("a/1".to_owned(), 6.5)];
        assert_eq!(rpo_refusal(&rpos, Some(5.0)).unwrap(), "partition a/1 has an RPO of 6.5 s, above --max-rpo 5.0 s");
        assert_eq!(rpo_refusal(&rpos, Some(7.0)), None);
        assert_eq!(rpo_refusal(&rpos, None), None);
    }
}
