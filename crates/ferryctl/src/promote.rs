//! `ferryctl topic promote NAME` and `topic promote --all-from CLUSTER`: the failover step, making mirror topics on
//! `--broker` (the target cluster) writable.
//!
//! `--all-from` picks every mirror topic whose recorded source cluster (alias or id) is CLUSTER. With `--monitor`,
//! the mirror's monitor is asked first how many source records each partition of those topics had not copied yet
//! (`source_offset - cache_offset`; target topics are matched through the partitions' `target_topic`), so the
//! operator sees what the failover leaves behind before it happens. Promotion is idempotent: a topic that is no
//! longer a mirror topic is reported and left alone.

use anyhow::anyhow;
use clap::Args;
use ferry_client::Admin;
use ferry_client::admin::MirrorSource;

use crate::common::{GlobalOpts, UsageError, explain};
use crate::monitor::{MonitorClient, PartitionDoc, PartitionsDoc};
use crate::output::Table;

/// `topic promote` options.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["name", "all_from"]))]
pub struct PromoteArgs {
    /// Topic name.
    pub name: Option<String>,
    /// Promote every mirror topic whose source cluster (alias or cluster id) is CLUSTER.
    #[arg(long, value_name = "CLUSTER")]
    pub all_from: Option<String>,
}

/// Runs `topic promote`.
pub async fn run(args: PromoteArgs, admin: &Admin, global: &GlobalOpts) -> anyhow::Result<()> {
    let on = global.brokers();
    let topics: Vec<(String, Option<MirrorSource>)> = match (args.name, &args.all_from) {
        (Some(name), _) => vec![(name, None)],
        (None, Some(cluster)) => {
            let all = admin.list_topics().await?;
            let mut chosen: Vec<(String, Option<MirrorSource>)> = all
                .into_iter()
                .filter_map(|t| {
                    let m = t.mirror?;
                    (m.source_cluster == *cluster || m.source_cluster_id == *cluster).then_some((t.name, Some(m)))
                })
                .collect();
            chosen.sort_by(|a, b| a.0.cmp(&b.0));
            if chosen.is_empty() {
                return Err(anyhow!("{on} has no mirror topics from cluster {cluster:?}; nothing to promote"));
            }
            chosen
        }
        (None, None) => return Err(UsageError("give a topic name or --all-from CLUSTER".into()).into()),
    };
    if global.monitor.is_some() {
        let names: Vec<&str> = topics.iter().map(|(n, _)| n.as_str()).collect();
        print!("{}", unmirrored_report(global, &names).await?);
    }
    let mut promoted = 0usize;
    for (name, mirror) in &topics {
        let answer = admin.promote(name).await.map_err(|e| {
            let err = explain(e, name, &on);
            if promoted > 0 { anyhow!("promoted {promoted} of {} topics, then: {err}", topics.len()) } else { err }
        })?;
        let of = mirror
            .as_ref()
            .or(answer.topic.mirror.as_ref())
            .map(|m| format!(" (mirror of {}/{})", m.source_cluster, m.source_topic));
        if answer.was_mirror {
            println!("promoted topic {name:?}{}: it is writable and no longer mirrored", of.unwrap_or_default());
            promoted += 1;
        } else {
            println!("topic {name:?} was not a mirror topic; nothing changed");
        }
    }
    if let Some(cluster) = &args.all_from {
        println!("promoted {promoted} topics from cluster {cluster:?} on {on}");
    }
    Ok(())
}

/// What the mirror had not copied of `targets` (target topic names), per partition, from its monitor.
async fn unmirrored_report(global: &GlobalOpts, targets: &[&str]) -> anyhow::Result<String> {
    let monitor = MonitorClient::new(global)?;
    let (_, doc) = monitor
        .get::<PartitionsDoc>(&["api", "v1", "partitions"], None)
        .await
        .map_err(|e| anyhow!("{e}; run without --monitor to promote without the report of unmirrored records"))?;
    Ok(unmirrored_text(&doc.partitions, targets, monitor.addr()))
}

/// The report: a table of the partitions of `targets` and a total.
pub fn unmirrored_text(parts: &[PartitionDoc], targets: &[&str], addr: &str) -> String {
    let target_of = |p: &PartitionDoc| if p.target_topic.is_empty() { p.topic.clone() } else { p.target_topic.clone() };
    let mut mine: Vec<&PartitionDoc> = parts.iter().filter(|p| targets.contains(&target_of(p).as_str())).collect();
    mine.sort_by_key(|a| (target_of(a), a.partition));
    if mine.is_empty() {
        return format!(
            "the mirror at {addr} reports no partitions of these topics; it cannot tell what is not mirrored\n"
        );
    }
    let mut table =
        Table::new(&["TOPIC", "PARTITION", "SOURCE_TOPIC", "SOURCE_OFFSET", "MIRRORED_UP_TO", "NOT_MIRRORED"]);
    let mut total = 0u64;
    for p in &mine {
        let missing = p.source_offset.saturating_sub(p.cache_offset);
        total += missing;
        table.row(vec![
            target_of(p),
            p.partition.to_string(),
            p.topic.clone(),
            p.source_offset.to_string(),
            p.cache_offset.to_string(),
            missing.to_string(),
        ]);
    }
    format!(
        "Source records not yet mirrored, as the mirror at {addr} last saw the source:\n{}{total} source records in {} \
         partitions are not on the target\n\n",
        table.render(),
        mine.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(topic: &str, target: &str, p: u32, source: u64, cache: u64) -> PartitionDoc {
        PartitionDoc {
            topic: topic.into(),
            target_topic: target.into(),
            partition: p,
            source_offset: source,
            cache_offset: cache,
            ..Default::default()
        }
    }

    #[test]
    fn the_report_maps_target_topics_back_to_source_partitions() {
        let parts = [
            part("orders", "dc-a.orders", 1, 50, 50),
            part("orders", "dc-a.orders", 0, 120, 100),
            part("payments", "dc-a.payments", 0, 9, 2),
        ];
        let text = unmirrored_text(&parts, &["dc-a.orders"], "m:1");
        assert_eq!(
            text,
            "Source records not yet mirrored, as the mirror at m:1 last saw the source:\n\
             TOPIC        PARTITION  SOURCE_TOPIC  SOURCE_OFFSET  MIRRORED_UP_TO  NOT_MIRRORED\n\
             dc-a.orders  0          orders        120            100             20\n\
             dc-a.orders  1          orders        50             50              0\n\
             20 source records in 2 partitions are not on the target\n\n"
        );
        assert!(unmirrored_text(&parts, &["other"], "m:1").starts_with("the mirror at m:1 reports no partitions"));
    }
}
