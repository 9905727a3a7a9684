//! `ferryctl consume TOPIC`: print records as text or JSON lines.
//!
//! Without `--group` it reads every partition (or `--partition P`) from the end, or from the beginning with
//! `--from-beginning`. With `--group` it joins the group (or, with `--partition`, starts at the group's committed
//! offset) and commits what it printed when it stops. It stops after `--max N` records, after `--idle-timeout`
//! without a record, on Ctrl-C, or when stdout closes; otherwise it follows like `tail -f`.
//!
//! Exactly the printed records count as consumed: when a poll returns more than `--max` allows, the consumer
//! seeks back to the first unprinted record of each partition before committing.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use ferry_client::{Admin, Consumer, ConsumerConfig, ConsumerRecord, OffsetReset, StartAt};
use tokio::time::Instant;

use crate::common::{GlobalOpts, explain, parse_duration};
use crate::output::{Format, record_json_line, record_text};

/// `consume` options.
#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// Topic to read.
    pub topic: String,
    /// Consumer group: join it (or use its committed offsets with --partition) and commit on exit.
    #[arg(long)]
    pub group: Option<String>,
    /// Start at the earliest offset (where no committed offset applies).
    #[arg(long)]
    pub from_beginning: bool,
    /// Stop after N records.
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// Stop when no record arrived for this long (e.g. 5s, or plain seconds).
    #[arg(long, value_name = "S", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Read only this partition.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Text format: print key<TAB>value.
    #[arg(long)]
    pub print_key: bool,
    /// The group's model: partitioned (Kafka-style, the default), broadcast, queue or serial (these print JSON
    /// lines with each record's delivery count and settle every record).
    #[arg(long, default_value = "partitioned", value_parser = ["partitioned", "broadcast", "queue", "serial"])]
    pub mode: String,
    /// Queue, serial: fail every record received (retries, then dead letters), to drive the lifecycle from scripts.
    #[arg(long)]
    pub nack: bool,
    /// Queue, serial: how long a delivered record stays locked to this member (e.g. 30s).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub ack_timeout: Option<Duration>,
    /// Queue, serial: the group's retry backoff steps when this join creates it (e.g. 1s,5s,30s).
    #[arg(long, value_name = "D,D,...")]
    pub retry_backoff: Option<String>,
    /// Queue, serial: the group's retries for records that name none, when this join creates it.
    #[arg(long = "retries", value_name = "N")]
    pub group_retries: Option<u32>,
    /// The member's session timeout (e.g. 10s).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub session_timeout: Option<Duration>,
}

/// Why the loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    Max,
    Idle,
    Interrupted,
    StdoutClosed,
}

/// Runs `consume`.
pub async fn run(args: ConsumeArgs, global: &GlobalOpts) -> anyhow::Result<()> {
    if let Some(mode) = ferry_client::ShareMode::parse(&args.mode) {
        let opts = crate::share::ConsumeOpts {
            topic: args.topic.clone(),
            group: args.group.clone(),
            mode: args.mode.clone(),
            from_beginning: args.from_beginning,
            ack_timeout: args.ack_timeout,
            group_retries: args.group_retries,
            retry_backoff: args.retry_backoff.clone(),
            session_timeout: args.session_timeout,
            max: args.max,
            idle_timeout: args.idle_timeout,
            nack: args.nack,
        };
        return crate::share::consume(&opts, mode, global).await;
    }
    let client = global.client()?;
    let description = Admin::new(client.clone())
        .describe_topic(&args.topic)
        .await
        .map_err(|e| explain(e, &args.topic, &global.brokers()))?;
    let partitions = description.topic.partitions;
    if let Some(p) = args.partition
        && p >= partitions
    {
        return Err(anyhow!("topic {:?} has {partitions} partitions; partition {p} does not exist", args.topic));
    }
    let reset = if args.from_beginning { OffsetReset::Earliest } else { OffsetReset::Latest };
    let config = ConsumerConfig {
        group: args.group.clone(),
        auto_offset_reset: reset,
        max_wait: Duration::from_millis(500),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(client, config)?;
    match (&args.group, args.partition) {
        (Some(group), None) => consumer.subscribe(group, vec![args.topic.clone()]).await?,
        (group, only) => {
            let start = if group.is_some() { StartAt::Committed } else { reset.into() };
            let chosen: Vec<u32> = only.map_or_else(|| (0..partitions).collect(), |p| vec![p]);
            consumer.assign(chosen.into_iter().map(|p| (args.topic.clone(), p, start)).collect())?;
        }
    }
    let mut printed = 0u64;
    let outcome = consume_loop(&args, &mut consumer, &mut printed).await;
    let committed = if args.group.is_some() { consumer.commit().await } else { Ok(()) };
    let closed = consumer.close().await;
    eprintln!("consumed {printed} records");
    let stop = outcome?;
    committed.context("could not commit the consumed offsets")?;
    closed.context("could not leave the group cleanly")?;
    tracing::debug!(?stop, "consume stopped");
    Ok(())
}

async fn consume_loop(args: &ConsumeArgs, consumer: &mut Consumer, printed: &mut u64) -> anyhow::Result<Stop> {
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout());
    let mut line = Vec::new();
    let mut last_record = Instant::now();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        if args.max.is_some_and(|max| *printed >= max) {
            return Ok(Stop::Max);
        }
        let mut wait = Duration::from_millis(500);
        if let Some(idle) = args.idle_timeout {
            let left = (last_record + idle).saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Stop::Idle);
            }
            wait = wait.min(left);
        }
        let records = tokio::select! {
            biased;
            _ = &mut ctrl_c => return Ok(Stop::Interrupted),
            polled = consumer.poll(wait) => polled?,
        };
        if records.is_empty() {
            continue;
        }
        last_record = Instant::now();
        let allowed = args.max.map_or(records.len(), |max| usize::try_from(max - *printed).unwrap_or(usize::MAX));
        let (print, rest) = records.split_at(allowed.min(records.len()));
        for record in print {
            line.clear();
            match args.format {
                Format::Json => line.extend_from_slice(record_json_line(record).as_bytes()),
                Format::Text => record_text(record, args.print_key, &mut line),
            }
            line.push(b'\n');
            if let Err(e) = stdout.write_all(&line) {
                return stdout_closed(e, consumer, print, Some(record));
            }
            *printed += 1;
        }
        if let Err(e) = stdout.flush() {
            return stdout_closed(e, consumer, &[], None);
        }
        rewind(consumer, rest)?;
    }
}

/// A closed stdout (`| head`) ends the loop cleanly; records not written are not counted as consumed.
fn stdout_closed(
    e: std::io::Error,
    consumer: &mut Consumer,
    batch: &[ConsumerRecord],
    failed_at: Option<&ConsumerRecord>,
) -> anyhow::Result<Stop> {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        return Err(anyhow!("cannot write to stdout: {e}"));
    }
    if let Some(i) = failed_at.and_then(|f| batch.iter().position(|r| std::ptr::eq(r, f))) {
        rewind(consumer, &batch[i..])?;
    }
    Ok(Stop::StdoutClosed)
}

/// Seeks each partition back to its first record in `unprinted`.
fn rewind(consumer: &mut Consumer, unprinted: &[ConsumerRecord]) -> anyhow::Result<()> {
    let mut done: Vec<(&str, u32)> = Vec::new();
    for r in unprinted {
        if !done.contains(&(r.topic.as_str(), r.partition)) {
            consumer.seek(&r.topic, r.partition, r.offset)?;
            done.push((r.topic.as_str(), r.partition));
        }
    }
    Ok(())
}
