//! `ferryctl consume --mode broadcast|queue|serial`, `message show` and `dlq redrive`: the message models from the
//! command line (docs/messaging.md, "Message models").
//!
//! A broadcast, queue or serial consumer prints each record as a JSON line (with its delivery count) and settles it:
//! an ack, or with `--nack` a failure (a retry, then a dead letter once its retries are used), so scripts can drive
//! the lifecycle.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use ferry_client::proto as pb;
use ferry_client::{Outcome, ShareAdmin, ShareConfig, ShareConsumer, ShareMessage, ShareMode};
use serde_json::json;
use tokio::time::Instant;

use crate::common::{GlobalOpts, UsageError, parse_duration};

/// What `consume --mode broadcast|queue|serial` was asked.
#[derive(Debug, Clone)]
pub struct ConsumeOpts {
    /// The topic.
    pub topic: String,
    /// The group (required).
    pub group: Option<String>,
    /// `--mode` as given.
    pub mode: String,
    /// Start a new group at the earliest offset.
    pub from_beginning: bool,
    /// The lock timeout.
    pub ack_timeout: Option<Duration>,
    /// The group's retries.
    pub group_retries: Option<u32>,
    /// The group's backoff, as given.
    pub retry_backoff: Option<String>,
    /// The session timeout.
    pub session_timeout: Option<Duration>,
    /// Stop after this many records.
    pub max: Option<u64>,
    /// Stop after this long without a record.
    pub idle_timeout: Option<Duration>,
    /// Fail every record.
    pub nack: bool,
}

/// Runs a broadcast, queue or serial consumer for `consume`.
pub async fn consume(args: &ConsumeOpts, mode: ShareMode, global: &GlobalOpts) -> anyhow::Result<()> {
    let Some(group) = args.group.clone() else {
        return Err(UsageError(format!("--mode {} needs --group", args.mode)).into());
    };
    let mut config = ShareConfig::new(group, &[args.topic.as_str()], mode);
    config.from_earliest = args.from_beginning;
    config.lock_timeout = args.ack_timeout;
    config.retries = args.group_retries;
    config.backoff = match &args.retry_backoff {
        Some(text) => parse_backoff(text).map_err(|e| UsageError(format!("--retry-backoff {text:?}: {e}")))?,
        None => Vec::new(),
    };
    if let Some(s) = args.session_timeout {
        config.session_timeout = s;
    }
    config.client_id = "ferryctl".into();
    let consumer = ShareConsumer::join(global.client()?, config).await.context("could not join the group")?;
    let mut stdout = std::io::BufWriter::new(std::io::stdout());
    let mut printed = 0u64;
    let mut last = Instant::now();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let result: anyhow::Result<()> = async {
        loop {
            if args.max.is_some_and(|m| printed >= m) {
                return Ok(());
            }
            let mut wait = Duration::from_millis(500);
            if let Some(idle) = args.idle_timeout {
                let left = (last + idle).saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                wait = wait.min(left);
            }
            let room = args.max.map_or(500, |m| (m - printed).min(500)) as u32;
            let got = tokio::select! {
                biased;
                _ = &mut ctrl_c => return Ok(()),
                got = consumer.poll(room, wait) => got?,
            };
            if got.is_empty() {
                continue;
            }
            last = Instant::now();
            let mut outcomes = Vec::with_capacity(got.len());
            for m in &got {
                writeln!(stdout, "{}", message_json(m)).context("cannot write to stdout")?;
                printed += 1;
                let o = if args.nack { Outcome::retry("nacked by ferryctl consume --nack") } else { Outcome::Ack };
                outcomes.push((m, o));
            }
            stdout.flush().context("cannot write to stdout")?;
            consumer.ack(&outcomes).await?;
        }
    }
    .await;
    let left = consumer.leave().await;
    eprintln!("consumed {printed} records");
    result?;
    left.context("could not leave the group cleanly")
}

/// A delivered record as one JSON line.
pub fn message_json(m: &ShareMessage) -> String {
    let text = |b: &Option<bytes::Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
    json!({
        "topic": m.topic,
        "partition": m.partition,
        "offset": m.offset,
        "timestamp": m.timestamp,
        "key": text(&m.key),
        "value": text(&m.value),
        "headers": m.headers.iter().map(|(k, v)| json!({"key": k, "value": text(v)})).collect::<Vec<_>>(),
        "delivery_count": m.delivery_count,
    })
    .to_string()
}

/// `message` subcommands.
#[derive(Subcommand, Debug)]
pub enum MessageCommand {
    /// A record, its status in a group and its history there.
    Show {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Offset.
        offset: u64,
        /// The queue, serial or broadcast group.
        #[arg(long)]
        group: String,
    },
}

/// `dlq` subcommands.
#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// Send a group's dead letters back (to their origin topics, or --to), as a job on the group's owner.
    Redrive(RedriveArgs),
}

/// `dlq redrive` options.
#[derive(Args, Debug)]
pub struct RedriveArgs {
    /// The group whose dead letters ({group}.dlq) to redrive.
    pub group: String,
    /// Send every record to this topic instead of its origin.
    #[arg(long)]
    pub to: Option<String>,
    /// Records per second (0: unlimited).
    #[arg(long, default_value_t = 0)]
    pub rate: u32,
    /// Count what would go where, writing nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not wait for the job: print its state and return.
    #[arg(long)]
    pub no_wait: bool,
}

/// Runs `message`.
pub async fn message(cmd: MessageCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    let MessageCommand::Show { topic, partition, offset, group } = cmd;
    let admin = ShareAdmin::new(global.client()?);
    let status = admin.status(&group, &topic, partition, offset).await?;
    let client = global.client()?;
    let record = read_one(&client, &topic, partition, offset).await?;
    let history: Vec<_> = status
        .history
        .iter()
        .map(|t| {
            json!({"at_ms": t.at_ms, "member": t.member_id, "event": t.event, "delivery_count": t.delivery_count,
                   "error": t.error, "detail": t.detail})
        })
        .collect();
    let out = json!({
        "topic": topic, "partition": partition, "offset": offset, "record": record,
        "group": group, "status": status.status, "delivery_count": status.delivery_count,
        "held_by": status.member_id, "history": history,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

async fn read_one(
    client: &ferry_client::BrokerClient,
    topic: &str,
    partition: u32,
    offset: u64,
) -> anyhow::Result<serde_json::Value> {
    let mut raw = client.for_partition(topic, partition).raw().await?;
    let req = pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: topic.into(),
            partition,
            offset,
            max_bytes: 1 << 20,
            leader_epoch: None,
        }],
        max_wait_ms: 0,
        max_bytes: 1 << 20,
    };
    let data = raw.fetch(req).await.map_err(|s| anyhow!("reading {topic}/{partition}/{offset}: {}", s.message()))?;
    let data = data.into_inner().partitions.into_iter().next().unwrap_or_default();
    for (_, batch) in ferry_client::batch::split_verified(&data.batches)? {
        for r in ferry_client::batch::decode_records(&batch)? {
            if r.offset == offset {
                let text = |b: &Option<bytes::Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
                return Ok(json!({"timestamp": r.timestamp, "key": text(&r.key), "value": text(&r.value),
                    "headers": r.headers.iter().map(|h| json!({"key": h.key, "value": text(&h.value)})).collect::<Vec<_>>()}));
            }
        }
    }
    Ok(serde_json::Value::Null)
}

/// Runs `dlq`.
pub async fn dlq(cmd: DlqCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    let DlqCommand::Redrive(args) = cmd;
    let admin = ShareAdmin::new(global.client()?);
    let req = pb::RedriveRequest {
        group: args.group.clone(),
        to: args.to.clone().unwrap_or_default(),
        rate: args.rate,
        dry_run: args.dry_run,
        status_only: false,
    };
    let mut job = admin.redrive(req.clone()).await?;
    eprintln!(
        "redrive job {} of {}.dlq [{}, {}) {}",
        job.job_id, args.group, job.from_offset, job.end_offset, job.state
    );
    let mut last_print = Instant::now();
    while !args.no_wait && job.state == "RUNNING" {
        tokio::time::sleep(Duration::from_millis(200)).await;
        job = admin.redrive(pb::RedriveRequest { status_only: true, ..req.clone() }).await?;
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!("  {} of {} copied", job.copied, job.end_offset.saturating_sub(job.from_offset));
            last_print = Instant::now();
        }
    }
    let receipt = json!({
        "job_id": job.job_id, "state": job.state, "group": args.group, "dry_run": job.dry_run,
        "from_offset": job.from_offset, "end_offset": job.end_offset, "next_offset": job.next_offset,
        "copied": job.copied, "per_topic": job.per_topic, "error": job.error,
        "started_ms": job.started_ms, "finished_ms": job.finished_ms,
    });
    println!("{}", serde_json::to_string_pretty(&receipt)?);
    if job.state == "FAILED" {
        return Err(anyhow!("the redrive failed: {}", job.error));
    }
    Ok(())
}

/// Parses a comma-separated list of durations (a retry backoff).
pub fn parse_backoff(text: &str) -> Result<Vec<Duration>, String> {
    text.split(',').filter(|s| !s.trim().is_empty()).map(|s| parse_duration(s.trim())).collect()
}
