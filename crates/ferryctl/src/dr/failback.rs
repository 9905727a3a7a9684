//! `ferryctl failback --from NEW_PRIMARY --to OLD_PRIMARY --topics PATTERN --write-config FILE [--dry-run]`:
//! brings an old primary back as a mirror of the new one, losing nothing.
//!
//! 1. Fence the old primary's topics, so nothing more lands there.
//! 2. Find each partition's split point: where the new primary's history leaves the mirrored one (the end of the
//!    last partition epoch below the promotion's floor, `EpochEnd`), checked by the CRC of the batch before it.
//! 3. Copy every record the old primary holds past the split to `{topic}.recovered` on the new primary, with
//!    lineage headers (`ferry-origin-cluster`, `-topic`, `-partition`, `-offset`, `-epoch`); a rerun resumes after
//!    the last origin offset copied.
//! 4. Mark the old primary's topics as mirror topics of the new primary, then truncate them at the split.
//! 5. Move the old primary's committed group offsets past the split back to it (those records are in
//!    `.recovered` now).
//! 6. Write the reverse mirror's config: a `ferry-mirror` started with it resumes at the split.
//!
//! Every step is idempotent: a topic already marked whose log follows the new primary's past the split is left
//! alone, so a second failback changes nothing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use ferry_client::{Admin, BrokerClient, OffsetSpec};

use super::recover::{self, Kept};
use crate::common::{GlobalOpts, parse_duration};

/// `failback` options.
#[derive(Args)]
pub struct FailbackArgs {
    /// The new primary's brokers (the failover's target), comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub from: Vec<String>,
    /// The old primary's brokers (the failover's source), comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub to: Vec<String>,
    /// Topics to fail back: a regular expression matched against the whole name (the same names on both sides).
    #[arg(long)]
    pub topics: String,
    /// Where to write the reverse mirror's config.
    #[arg(long, value_name = "FILE")]
    pub write_config: PathBuf,
    /// Print the plan; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The new primary's alias in the reverse mirror (its source cluster).
    #[arg(long, default_value = "new-primary")]
    pub from_cluster: String,
    /// The old primary's alias in the reverse mirror (its target cluster).
    #[arg(long, default_value = "old-primary")]
    pub to_cluster: String,
    /// The reverse mirror's monitor address.
    #[arg(long, default_value = "127.0.0.1:9300")]
    pub monitor_listen: String,
    /// How long the old primary may take to settle its fenced partitions (every record acknowledged).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub settle_timeout: Duration,
}

/// Runs `failback`.
pub async fn run(args: FailbackArgs, global: &GlobalOpts) -> anyhow::Result<()> {
    let pattern = regex::Regex::new(&format!("^(?:{})$", args.topics)).map_err(|e| {
        crate::common::UsageError(format!("--topics {:?} is not a regular expression: {e}", args.topics))
    })?;
    let new_client = global.client_for(&args.from)?;
    let old_client = global.client_for(&args.to)?;
    let (new, old) = (Admin::new(new_client.clone()), Admin::new(old_client.clone()));
    let new_id = new.metadata().await.context("reading the new primary's metadata")?.cluster_id;
    let old_id = old.metadata().await.context("reading the old primary's metadata")?.cluster_id;
    let old_topics = old.list_topics().await.context("listing the old primary's topics")?;
    let new_topics = new.list_topics().await.context("listing the new primary's topics")?;
    let mut chosen = Vec::new();
    for t in new_topics.iter().filter(|t| pattern.is_match(&t.name) && !t.name.ends_with(recover::SUFFIX)) {
        let Some(o) = old_topics.iter().find(|o| o.name == t.name) else {
            eprintln!("skipping {:?}: the old primary has no such topic", t.name);
            continue;
        };
        if t.promote_epoch == 0 {
            bail!(
                "topic {:?} on the new primary was not promoted by `ferryctl failover` (no promotion epoch): its split \
                 point is unknown",
                t.name
            );
        }
        let marked = o.mirror.as_ref().is_some_and(|m| m.source_cluster_id == new_id && m.source_topic == t.name);
        chosen.push((t.clone(), o.clone(), marked));
    }
    if chosen.is_empty() {
        bail!("no topic on the new primary matches {:?} and exists on the old primary", args.topics);
    }
    // 1. The fence, for topics not failed back yet.
    let epoch = u64::try_from(ferry_mirror::failover::now_ms()).unwrap_or(1);
    let to_fence: Vec<String> = chosen.iter().filter(|(_, _, m)| !m).map(|(t, ..)| t.name.clone()).collect();
    if !args.dry_run && !to_fence.is_empty() {
        let reason = format!("failback to {}", args.from_cluster);
        for o in old.fence_topics(&to_fence, epoch, &reason).await.context("fencing the old primary")? {
            if let Err((r, m)) = o.result {
                bail!("the old primary refused to fence {:?}: {m} ({r})", o.topic);
            }
        }
        settle(&old, &chosen, args.settle_timeout).await?;
        eprintln!("fenced {} topics on the old primary", to_fence.len());
    }
    // 2.-5., per topic.
    let mut receipt = Vec::new();
    for (t, _, marked) in &chosen {
        let plan = split_points(&new, &old, &new_client, &old_client, t, *marked).await?;
        if args.dry_run {
            for p in &plan {
                receipt.push(Kept {
                    topic: t.name.clone(),
                    partition: p.partition,
                    split: p.split,
                    old_end: p.old_end,
                    recovered: None,
                    outcome: if p.done { "already failed back".into() } else { "would keep and truncate".into() },
                });
            }
            continue;
        }
        let origin = recover::Origin { cluster: old_id.clone(), topic: t.name.clone() };
        let mut kept = Vec::new();
        for p in plan.iter().filter(|p| !p.done && p.old_end > p.split) {
            let range =
                recover::copy(&new, &new_client, &old_client, &origin, t, p.partition, p.split, p.old_end).await?;
            kept.push((p.partition, range));
        }
        let mark = ferry_client::proto::MirrorSource {
            source_cluster_id: new_id.clone(),
            source_topic_id: t.topic_id.clone(),
            source_topic: t.name.clone(),
            source_cluster: args.from_cluster.clone(),
        };
        old.mark_mirror(&t.name, mark).await.with_context(|| format!("marking {:?} on the old primary", t.name))?;
        for p in &plan {
            let range = kept.iter().find(|(k, _)| *k == p.partition).map(|(_, r)| *r);
            let outcome = if p.done {
                "already failed back".to_owned()
            } else {
                old.truncate_partition(&t.name, p.partition, p.split)
                    .await
                    .with_context(|| format!("truncating {}/{} on the old primary", t.name, p.partition))?;
                match range {
                    Some(_) => format!("kept {} records in {}{}", p.old_end - p.split, t.name, recover::SUFFIX),
                    None => "nothing past the split".into(),
                }
            };
            receipt.push(Kept {
                topic: t.name.clone(),
                partition: p.partition,
                split: p.split,
                old_end: p.old_end,
                recovered: range,
                outcome,
            });
        }
        recover::clamp_groups(&old, &t.name, &plan.iter().map(|p| (p.partition, p.split)).collect::<Vec<_>>()).await?;
    }
    let names: Vec<String> = chosen.iter().map(|(t, ..)| t.name.clone()).collect();
    let config = reverse_config(&args, &names);
    print_receipt(&receipt, args.dry_run);
    if args.dry_run {
        println!("dry run: nothing was changed; the reverse mirror's config would be:\n{config}");
        return Ok(());
    }
    std::fs::write(&args.write_config, &config)
        .with_context(|| format!("writing the reverse mirror's config to {}", args.write_config.display()))?;
    recover::record_receipt(&new, &args.to_cluster, &receipt).await;
    println!(
        "failback done: the old primary mirrors the new one; start the reverse mirror with `ferry-mirror --config {}`",
        args.write_config.display()
    );
    Ok(())
}

/// One partition's split, as planned.
#[derive(Debug, Clone)]
pub struct Split {
    /// Partition.
    pub partition: u32,
    /// Where the histories split.
    pub split: u64,
    /// The old primary's log end.
    pub old_end: u64,
    /// Nothing to do: the old primary already follows the new one past the split.
    pub done: bool,
}

/// Waits until every fenced partition of the old primary is final (the fence applied at its leader, every record
/// acknowledged).
async fn settle(
    old: &Admin,
    chosen: &[(ferry_client::proto::TopicInfo, ferry_client::proto::TopicInfo, bool)],
    timeout: Duration,
) -> anyhow::Result<()> {
    let asks: Vec<(String, u32, OffsetSpec)> = chosen
        .iter()
        .filter(|(_, _, m)| !m)
        .flat_map(|(_, o, _)| (0..o.partitions).map(|p| (o.name.clone(), p, OffsetSpec::Latest)))
        .collect();
    let deadline = Instant::now() + timeout;
    loop {
        let answers = old.list_offsets_each(&asks).await?;
        let pending: Vec<String> = asks
            .iter()
            .zip(&answers)
            .filter(|(_, a)| !matches!(a, Ok(a) if a.fence_epoch.is_some() && a.log_end_offset == a.stored_end_offset))
            .map(|((t, p, _), _)| format!("{t}/{p}"))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the old primary did not settle within {timeout:?}: {} partitions pending ({})",
                pending.len(),
                pending.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The split of every partition of topic `t`.
async fn split_points(
    new: &Admin,
    old: &Admin,
    new_client: &BrokerClient,
    old_client: &BrokerClient,
    t: &ferry_client::proto::TopicInfo,
    marked: bool,
) -> anyhow::Result<Vec<Split>> {
    let mut out = Vec::new();
    for p in 0..t.partitions {
        let end = new.epoch_end(&t.name, p, t.promote_epoch - 1).await?;
        let promoted_at = end.end_offset;
        let old_end = old.list_offset(&t.name, p, OffsetSpec::Latest).await?.log_end_offset;
        let split = promoted_at.min(old_end);
        if split > 0 {
            let a = recover::batch_crc(new_client, &t.name, p, split - 1).await?;
            let b = recover::batch_crc(old_client, &t.name, p, split - 1).await?;
            if a != b {
                bail!(
                    "{}/{p}: the two primaries' batches holding offset {} differ: their histories split earlier than the \
                     promotion; run `ferryctl mirror verify` to find where, nothing past the fence was changed",
                    t.name,
                    split - 1
                );
            }
        }
        // Already failed back: marked, and past the split the old primary holds what the new one holds.
        let done = marked
            && (old_end <= split
                || recover::batch_crc(old_client, &t.name, p, split).await?
                    == recover::batch_crc(new_client, &t.name, p, split).await?);
        out.push(Split { partition: p, split, old_end, done });
    }
    Ok(out)
}

fn print_receipt(receipt: &[Kept], dry_run: bool) {
    println!("{}receipt (topic/partition  split  old_end  recovered  outcome):", if dry_run { "dry run " } else { "" });
    for k in receipt {
        let recovered = k.recovered.map_or("-".to_owned(), |(a, b)| format!("[{a}, {b})"));
        println!("  {}/{}  {}  {}  {recovered}  {}", k.topic, k.partition, k.split, k.old_end, k.outcome);
    }
    let kept: u64 = receipt.iter().filter(|k| k.recovered.is_some()).map(|k| k.old_end - k.split).sum();
    if !dry_run {
        println!(
            "event failback_kept_records records={kept} partitions={}",
            receipt.iter().filter(|k| k.recovered.is_some()).count()
        );
    }
}

/// The reverse mirror's config.
fn reverse_config(args: &FailbackArgs, topics: &[String]) -> String {
    let quoted = |v: &[String]| v.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let include: Vec<String> = topics.iter().map(|t| format!("^{}$", regex::escape(t))).collect();
    format!(
        "# The reverse mirror written by `ferryctl failback`: {from} -> {to}. It resumes each partition at the split\n\
         # (the old primary's log end after the failback), with no re-copy.\n\
         [mirror]\nname = \"{from}_to_{to}\"\n\n\
         [source]\ncluster = \"{from}\"\n\n[[source.routes]]\nname = \"primary\"\nbrokers = [{src}]\n\n\
         [target]\ncluster = \"{to}\"\nbrokers = [{dst}]\n\n\
         [topics]\ninclude = [{inc}]\nrename = \"identity\"\n\n\
         [monitor]\nlisten = \"{listen}\"\n",
        from = args.from_cluster,
        to = args.to_cluster,
        src = quoted(&args.from),
        dst = quoted(&args.to),
        inc = quoted(&include),
        listen = args.monitor_listen,
    )
}
