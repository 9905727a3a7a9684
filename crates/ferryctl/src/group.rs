//! `ferryctl group list|describe|unpin|reset-offsets`: consumer groups of every mode.
//!
//! `describe` shows a partitioned group's members, assignment and lag, or a queue, serial or broadcast group's mode,
//! members and backlog per partition (records waiting, in flight, failed, dead-lettered, and lag).

use anyhow::anyhow;
use clap::Subcommand;
use ferry_client::proto as pb;
use ferry_client::{Admin, OffsetSpec, ShareAdmin};
use serde_json::json;

use crate::common::GlobalOpts;

/// `group` subcommands.
#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// Every group: partitioned ones (with members or committed offsets) and queue, serial and broadcast ones.
    List,
    /// A group: its mode, members and backlog.
    Describe {
        /// The group.
        group: String,
    },
    /// A serial group: move the active role to the next member.
    Unpin {
        /// The group.
        group: String,
    },
    /// Set a partitioned group's committed offsets; refused while it has members.
    ResetOffsets {
        /// The group.
        group: String,
        /// Its topic.
        #[arg(long)]
        topic: String,
        /// earliest, latest, an offset, or a time (RFC 3339, or ms since the epoch with a trailing "ms").
        #[arg(long)]
        to: String,
    },
}

/// Runs `group`.
pub async fn run(cmd: GroupCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    let client = global.client()?;
    let admin = Admin::new(client.clone());
    match cmd {
        GroupCommand::List => {
            for g in admin.list_groups().await? {
                println!("{}\tpartitioned\tmembers={}\tgeneration={}", g.group, g.members, g.generation);
            }
            for g in ShareAdmin::new(client).list().await? {
                let mode = pb::ShareMode::try_from(g.mode).map_or("unknown", mode_name);
                println!("{}\t{mode}\tmembers={}", g.group, g.members);
            }
            Ok(())
        }
        GroupCommand::Describe { group } => {
            let share = ShareAdmin::new(client).describe(&group).await;
            match share {
                Ok(d) => {
                    println!("{}", serde_json::to_string_pretty(&share_json(&d))?);
                    Ok(())
                }
                Err(_) => {
                    let d = admin.describe_group(&group).await?;
                    let members: Vec<_> = d
                        .members
                        .iter()
                        .map(|m| json!({"member_id": m.member_id, "client_id": m.client_id,
                            "assignment": m.assignment.iter().map(|tp| format!("{}/{}", tp.topic, tp.partition)).collect::<Vec<_>>()}))
                        .collect();
                    let offsets: Vec<_> = d
                        .offsets
                        .iter()
                        .map(|o| json!({"topic": o.topic, "partition": o.partition, "committed": o.offset}))
                        .collect();
                    let out = json!({"group": group, "mode": "partitioned", "generation": d.generation,
                        "members": members, "offsets": offsets});
                    println!("{}", serde_json::to_string_pretty(&out)?);
                    Ok(())
                }
            }
        }
        GroupCommand::Unpin { group } => {
            let active = ShareAdmin::new(client).unpin(&group).await?;
            println!("{group}: active member now {}", if active.is_empty() { "(none)" } else { &active });
            Ok(())
        }
        GroupCommand::ResetOffsets { group, topic, to } => {
            let d = admin.describe_topic(&topic).await?;
            let spec = parse_target(&to)?;
            let mut offsets = Vec::new();
            for p in 0..d.topic.partitions {
                let offset = match spec {
                    Target::Offset(o) => o,
                    Target::Spec(s) => {
                        let got = admin.list_offsets(&[(topic.clone(), p, s)]).await?;
                        let o = got.first().ok_or_else(|| anyhow!("no offsets for {topic}/{p}"))?;
                        o.offset.unwrap_or(o.log_end_offset)
                    }
                };
                offsets.push(pb::CommittedOffset {
                    topic: topic.clone(),
                    partition: p,
                    offset,
                    metadata: String::new(),
                });
            }
            admin.commit_offsets(&group, offsets.clone()).await?;
            for o in offsets {
                println!("{group}\t{}/{}\t{}", o.topic, o.partition, o.offset);
            }
            Ok(())
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Offset(u64),
    Spec(OffsetSpec),
}

fn parse_target(to: &str) -> anyhow::Result<Target> {
    Ok(match to {
        "earliest" => Target::Spec(OffsetSpec::Earliest),
        "latest" => Target::Spec(OffsetSpec::Latest),
        t if t.ends_with("ms") && t[..t.len() - 2].parse::<i64>().is_ok() => {
            Target::Spec(OffsetSpec::Timestamp(t[..t.len() - 2].parse()?))
        }
        t if t.parse::<u64>().is_ok() => Target::Offset(t.parse()?),
        t => {
            let time = humantime::parse_rfc3339(t)
                .map_err(|e| anyhow!("--to {t:?}: not earliest, latest, an offset, NNNms or an RFC 3339 time ({e})"))?;
            let ms = time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
            Target::Spec(OffsetSpec::Timestamp(ms))
        }
    })
}

fn share_json(d: &pb::ShareDescribeResponse) -> serde_json::Value {
    let mode = pb::ShareMode::try_from(d.mode).map_or("unknown", mode_name);
    json!({
        "group": d.group, "mode": mode, "lock_timeout_ms": d.lock_timeout_ms, "window": d.window,
        "retries": d.retry.as_ref().and_then(|r| r.retries),
        "backoff_ms": d.retry.as_ref().map(|r| r.backoff_ms.clone()).unwrap_or_default(),
        "members": d.members.iter().map(|m| json!({"member_id": m.member_id, "client_id": m.client_id,
            "in_flight": m.in_flight, "active": m.active, "joined_ms": m.joined_ms})).collect::<Vec<_>>(),
        "partitions": d.partitions.iter().map(|p| json!({"topic": p.topic, "partition": p.partition,
            "start_offset": p.start_offset, "end_offset": p.end_offset, "waiting": p.waiting, "in_flight": p.in_flight,
            "failed": p.failed, "dead_lettered": p.dead_lettered, "lag": p.lag})).collect::<Vec<_>>(),
        "redeliveries": d.redeliveries, "lock_expiries": d.lock_expiries, "dead_lettered": d.dead_lettered,
        "settled": d.settled,
    })
}

fn mode_name(m: pb::ShareMode) -> &'static str {
    match m {
        pb::ShareMode::Broadcast => "broadcast",
        pb::ShareMode::Queue => "queue",
        pb::ShareMode::Serial => "serial",
        pb::ShareMode::Unspecified => "unknown",
    }
}
