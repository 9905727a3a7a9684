//! `ferryctl mirror verify --source ADDR --target ADDR [--topic T]`: proves that every mirror topic on the target
//! holds exactly the source's batches, partition by partition, over the offsets both logs hold
//! (`[max(log starts), min(log ends))`).
//!
//! The target's mirror topics name their source topic (`mirror.source_topic`); a source topic re-created since
//! (another topic id), a missing partition, or a target that holds offsets the source does not is a difference
//! too. A target behind its source (mirror lag) is not: the line says how far behind it is. The comparison itself
//! and the reading are the mirror's own ([`ferry_mirror::verify`]: its background verifier runs the same code).
//! [`verify`] is also what `ferryctl demo` runs at its end.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use ferry_client::admin::{PartitionInfo, TopicInfo};
use ferry_client::{Admin, BrokerClient};
use serde::Serialize;

use crate::common::GlobalOpts;
use crate::output::Format;
use ferry_mirror::verify::FetchStream;
use ferry_mirror::verify::compare::{self, Difference, Side};

/// The verdict on one partition.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartitionReport {
    /// Target (mirror) topic.
    pub topic: String,
    /// Its source topic.
    pub source_topic: String,
    /// Partition.
    pub partition: u32,
    /// True when no difference was found.
    pub identical: bool,
    /// Records found equal on both sides.
    pub records_compared: u64,
    /// The compared range `[start_offset, end_offset)`.
    pub start_offset: u64,
    /// End of the compared range.
    pub end_offset: u64,
    /// Source log start.
    pub source_log_start_offset: u64,
    /// Source log end.
    pub source_log_end_offset: u64,
    /// Target log start.
    pub target_log_start_offset: u64,
    /// Target log end.
    pub target_log_end_offset: u64,
    /// The first differing offset, when there is one.
    pub difference_offset: Option<u64>,
    /// Why it differs.
    pub reason: Option<String>,
    /// Context that is not a difference (the target is behind).
    pub note: Option<String>,
}

impl PartitionReport {
    fn new(topic: &TopicInfo, source_topic: &str, partition: u32) -> Self {
        PartitionReport {
            topic: topic.name.clone(),
            source_topic: source_topic.to_owned(),
            partition,
            identical: true,
            records_compared: 0,
            start_offset: 0,
            end_offset: 0,
            source_log_start_offset: 0,
            source_log_end_offset: 0,
            target_log_start_offset: 0,
            target_log_end_offset: 0,
            difference_offset: None,
            reason: None,
            note: None,
        }
    }

    fn differs(mut self, d: Difference) -> Self {
        self.identical = false;
        self.difference_offset = d.offset;
        self.reason = Some(d.reason);
        self
    }

    /// The text line: `orders/0: identical (N records compared)` or `orders/0: differs at offset X: reason`.
    pub fn line(&self) -> String {
        let name = if self.source_topic == self.topic {
            format!("{}/{}", self.topic, self.partition)
        } else {
            format!("{}/{} (source {}/{})", self.topic, self.partition, self.source_topic, self.partition)
        };
        let verdict = match (&self.reason, self.difference_offset) {
            (None, _) => format!("identical ({} records compared)", self.records_compared),
            (Some(r), Some(o)) => format!("differs at offset {o}: {r}"),
            (Some(r), None) => format!("differs: {r}"),
        };
        match &self.note {
            Some(n) => format!("{name}: {verdict}; {n}"),
            None => format!("{name}: {verdict}"),
        }
    }
}

/// The verdict on every partition.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    /// Source broker address(es).
    pub source: String,
    /// Target broker address(es).
    pub target: String,
    /// True when every partition is identical.
    pub identical: bool,
    /// Mirror topics verified.
    pub topics: usize,
    /// Partitions verified.
    pub partitions_compared: usize,
    /// Partitions with a difference.
    pub partitions_differing: usize,
    /// Records found equal, over all partitions.
    pub records_compared: u64,
    /// Per partition, sorted by topic and partition.
    pub partitions: Vec<PartitionReport>,
}

impl Report {
    fn new(source: String, target: String, topics: usize, partitions: Vec<PartitionReport>) -> Self {
        let differing = partitions.iter().filter(|p| !p.identical).count();
        Report {
            source,
            target,
            identical: differing == 0,
            topics,
            partitions_compared: partitions.len(),
            partitions_differing: differing,
            records_compared: partitions.iter().map(|p| p.records_compared).sum(),
            partitions,
        }
    }

    /// The summary line.
    pub fn summary(&self) -> String {
        if self.identical {
            format!(
                "identical: {} partitions of {} mirror topics, {} records compared",
                self.partitions_compared, self.topics, self.records_compared
            )
        } else {
            format!(
                "differs: {} of {} partitions differ, {} records compared",
                self.partitions_differing, self.partitions_compared, self.records_compared
            )
        }
    }

    /// Every partition line, then the summary.
    pub fn text(&self) -> String {
        let mut out: String = self.partitions.iter().map(|p| p.line() + "\n").collect();
        out.push_str(&self.summary());
        out.push('\n');
        out
    }
}

/// `mirror verify` options.
#[derive(Args)]
pub struct VerifyArgs {
    /// Source cluster broker address(es), comma separated.
    #[arg(long, required = true, value_delimiter = ',')]
    pub source: Vec<String>,
    /// Target cluster broker address(es), comma separated.
    #[arg(long, required = true, value_delimiter = ',')]
    pub target: Vec<String>,
    /// Only this mirror topic (its target or its source name).
    #[arg(long)]
    pub topic: Option<String>,
}

/// Runs `mirror verify`.
pub async fn run(args: VerifyArgs, format: Format, global: &GlobalOpts) -> anyhow::Result<()> {
    let source = global.client_for(&args.source)?;
    let target = global.client_for(&args.target)?;
    let progress = Progress::new(std::io::stderr().is_terminal());
    let report = verify(&source, &target, args.topic.as_deref(), &progress).await;
    progress.finish();
    let report = report?;
    match format {
        Format::Json => println!("{}", serde_json::to_string(&report)?),
        Format::Text => print!("{}", report.text()),
    }
    if report.identical {
        Ok(())
    } else {
        Err(anyhow!(
            "the target differs from the source in {} of {} partitions",
            report.partitions_differing,
            report.partitions_compared
        ))
    }
}

/// Compares every mirror topic on `target` (or the one named `only`, by its target or source name) with its source.
pub async fn verify(
    source: &BrokerClient,
    target: &BrokerClient,
    only: Option<&str>,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let (source_admin, target_admin) = (Admin::new(source.clone()), Admin::new(target.clone()));
    let (src_addr, tgt_addr) = (source.config().brokers.join(","), target.config().brokers.join(","));
    let all =
        target_admin.list_topics().await.with_context(|| format!("cannot list the topics of the target {tgt_addr}"))?;
    let mut mirrors: Vec<TopicInfo> = all
        .iter()
        .filter(|t| t.mirror.as_ref().is_some_and(|m| only.is_none_or(|name| t.name == name || m.source_topic == name)))
        .cloned()
        .collect();
    mirrors.sort_by(|a, b| a.name.cmp(&b.name));
    if mirrors.is_empty() {
        return Err(match only {
            Some(name) if all.iter().any(|t| t.name == name) => {
                anyhow!("topic {name:?} on the target {tgt_addr} is not a mirror topic")
            }
            Some(name) => anyhow!("the target {tgt_addr} has no mirror topic named {name:?} or mirroring {name:?}"),
            None => anyhow!("the target {tgt_addr} has no mirror topics to verify"),
        });
    }
    let mut reports = Vec::new();
    for topic in &mirrors {
        reports.extend(verify_topic(&source_admin, &target_admin, topic, &src_addr, progress).await?);
    }
    Ok(Report::new(src_addr, tgt_addr, mirrors.len(), reports))
}

async fn verify_topic(
    source: &Admin,
    target: &Admin,
    topic: &TopicInfo,
    src_addr: &str,
    progress: &Progress,
) -> anyhow::Result<Vec<PartitionReport>> {
    let Some(mirror) = &topic.mirror else { return Ok(Vec::new()) };
    let src_name = mirror.source_topic.as_str();
    // The target first: read after it, the source's log ends are at or past the target's for a healthy mirror.
    let tgt = target
        .describe_topic(&topic.name)
        .await
        .with_context(|| format!("cannot describe {:?} on the target", topic.name))?;
    let whole_topic = |reason: String| -> Vec<PartitionReport> {
        tgt.partitions
            .iter()
            .map(|p| {
                PartitionReport::new(topic, src_name, p.partition).differs(Difference {
                    offset: None,
                    side: Side::Source,
                    reason: reason.clone(),
                })
            })
            .collect()
    };
    let src = match source.describe_topic(src_name).await {
        Ok(d) => d,
        Err(e) if e.is_not_found() => {
            return Ok(whole_topic(format!("the source topic {src_name:?} does not exist on {src_addr}")));
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot describe {src_name:?} on the source"))),
    };
    if !mirror.source_topic_id.is_empty() && mirror.source_topic_id != src.topic.topic_id {
        return Ok(whole_topic(format!(
            "the source topic {src_name:?} was re-created: it has id {}, the target mirrors id {}",
            src.topic.topic_id, mirror.source_topic_id
        )));
    }
    let count = tgt.partitions.len().max(src.partitions.len());
    let mut out = Vec::with_capacity(count);
    for p in 0..count as u32 {
        let t = tgt.partitions.iter().find(|i| i.partition == p);
        let s = src.partitions.iter().find(|i| i.partition == p);
        let report = PartitionReport::new(topic, src_name, p);
        let missing = |side: Side| Difference {
            offset: None,
            side,
            reason: format!("partition {p} does not exist on the {}", side.name()),
        };
        out.push(match (s, t) {
            (Some(s), Some(t)) => {
                progress.partition(&topic.name, p);
                verify_partition(source.client(), target.client(), report, s, t, progress).await?
            }
            (None, _) => report.differs(missing(Side::Source)),
            (_, None) => report.differs(missing(Side::Target)),
        });
    }
    Ok(out)
}

async fn verify_partition(
    source: &BrokerClient,
    target: &BrokerClient,
    mut report: PartitionReport,
    s: &PartitionInfo,
    t: &PartitionInfo,
    progress: &Progress,
) -> anyhow::Result<PartitionReport> {
    let start = s.log_start_offset.max(t.log_start_offset);
    let end = s.log_end_offset.min(t.log_end_offset);
    report.start_offset = start;
    report.end_offset = end.max(start);
    report.source_log_start_offset = s.log_start_offset;
    report.source_log_end_offset = s.log_end_offset;
    report.target_log_start_offset = t.log_start_offset;
    report.target_log_end_offset = t.log_end_offset;
    if s.log_end_offset > t.log_end_offset {
        report.note = Some(format!("the target is {} records behind the source", s.log_end_offset - t.log_end_offset));
    }
    let outcome = if start < end {
        let src = FetchStream::new(source.clone(), Side::Source, &report.source_topic, s.partition, start, end);
        let tgt = FetchStream::new(target.clone(), Side::Target, &report.topic, t.partition, start, end);
        compare::compare(src, tgt, start, end, u64::MAX, &mut |n| progress.records(n)).await?
    } else {
        compare::Outcome { records: 0, bytes: 0, verified_to: start, difference: None }
    };
    progress.partition_done(outcome.records);
    report.records_compared = outcome.records;
    if let Some(d) = outcome.difference {
        return Ok(report.differs(d));
    }
    if t.log_end_offset > s.log_end_offset {
        let at = s.log_end_offset.max(start);
        return Ok(report.differs(Difference::at(
            at,
            format!("the target holds offsets up to {} but the source ends at {}", t.log_end_offset, s.log_end_offset),
        )));
    }
    Ok(report)
}

/// Progress on stderr while verifying (only when stderr is a terminal): the partition being compared, how many
/// were done, and the records compared so far.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    state: std::sync::Mutex<ProgressState>,
}

struct ProgressState {
    partitions_done: u64,
    records_done: u64,
    current: String,
    last_draw: Instant,
}

impl Progress {
    /// Shows progress when `visible`.
    pub fn new(visible: bool) -> Self {
        let bar = visible.then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} verifying {msg}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let state =
            ProgressState { partitions_done: 0, records_done: 0, current: String::new(), last_draw: Instant::now() };
        Progress { bar, state: std::sync::Mutex::new(state) }
    }

    fn partition(&self, topic: &str, partition: u32) {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.current = format!("{topic}/{partition}");
        self.draw(&s, 0);
    }

    fn records(&self, in_partition: u64) {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.last_draw.elapsed() >= Duration::from_millis(100) {
            s.last_draw = Instant::now();
            self.draw(&s, in_partition);
        }
    }

    fn partition_done(&self, records: u64) {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.partitions_done += 1;
        s.records_done += records;
    }

    fn draw(&self, s: &ProgressState, in_partition: u64) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!(
                "{} ({} partitions done): {} records compared",
                s.current,
                s.partitions_done,
                s.records_done + in_partition
            ));
        }
    }

    /// Removes the progress line.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(reason: Option<(Option<u64>, &str)>, source_topic: &str, note: Option<&str>) -> PartitionReport {
        let topic = TopicInfo { name: "orders".into(), ..Default::default() };
        let mut r = PartitionReport::new(&topic, source_topic, 2);
        r.records_compared = 1200;
        r.note = note.map(Into::into);
        match reason {
            Some((offset, why)) => r.differs(Difference { offset, side: Side::Target, reason: why.into() }),
            None => r,
        }
    }

    #[test]
    fn lines_and_summary_read_as_documented() {
        assert_eq!(report(None, "orders", None).line(), "orders/2: identical (1200 records compared)");
        assert_eq!(
            report(None, "src", Some("the target is 5 records behind the source")).line(),
            "orders/2 (source src/2): identical (1200 records compared); the target is 5 records behind the source"
        );
        assert_eq!(report(Some((Some(57), "bad")), "orders", None).line(), "orders/2: differs at offset 57: bad");
        assert_eq!(report(Some((None, "gone")), "orders", None).line(), "orders/2: differs: gone");
        let ok = Report::new("a".into(), "b".into(), 1, vec![report(None, "orders", None)]);
        assert_eq!(ok.summary(), "identical: 1 partitions of 1 mirror topics, 1200 records compared");
        let bad = Report::new(
            "a".into(),
            "b".into(),
            1,
            vec![report(None, "orders", None), report(Some((Some(1), "x")), "orders", None)],
        );
        assert!(!bad.identical);
        assert_eq!(bad.summary(), "differs: 1 of 2 partitions differ, 2400 records compared");
        assert!(
            bad.text().ends_with(
                "orders/2: differs at offset 1: x\ndiffers: 1 of 2 partitions differ, 2400 records compared\n"
            )
        );
    }
}
