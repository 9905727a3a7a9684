//! `ferryctl failover --mirror URL --topics PATTERN [--dry-run] [--max-rpo 5s] [--source-unreachable] --confirm`:
//! starts (or resumes) the mirror's failover job through its monitor, follows it step by step, and prints the
//! report. Interrupting the command leaves the job running in the mirror; running it again follows it, or resumes
//! it after the mirror was restarted.

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use ferry_mirror::failover::job::Job;
use ferry_mirror::failover::{Answer, Check};
use serde_json::json;

use crate::common::{GlobalOpts, parse_duration};
use crate::monitor::{MonitorClient, MonitorError};
use crate::output::Format;

/// `failover` options.
#[derive(Args)]
pub struct FailoverArgs {
    /// The mirror's monitor, host:port or URL (overrides --monitor).
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
    /// Source topics to fail over: a regular expression matched against the whole name.
    #[arg(long)]
    pub topics: String,
    /// Print the plan and the pre-checks; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Refuse when a partition's RPO is above this (e.g. 5s).
    #[arg(long, value_name = "DURATION")]
    pub max_rpo: Option<String>,
    /// The source cannot be reached: skip the fence and the drain, promote what the target holds, and report what
    /// may be lost.
    #[arg(long)]
    pub source_unreachable: bool,
    /// How long the drain may take before the job stops with a report of the partitions behind.
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<String>,
    /// Required (except with --dry-run): the failover fences the source and promotes the target.
    #[arg(long)]
    pub confirm: bool,
    /// How often to read the job's progress.
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    pub poll: Duration,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// `GET /api/v1/failover`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct StatusDoc {
    /// The job, if one was ever recorded.
    pub job: Option<Job>,
    /// Whether it runs in the mirror now.
    pub running: bool,
}

/// Runs `failover`.
pub async fn run(args: FailoverArgs, global: &GlobalOpts) -> anyhow::Result<()> {
    if !args.confirm && !args.dry_run {
        return Err(crate::common::UsageError(
            "a failover fences the source topics and promotes the target topics: pass --confirm (or --dry-run to \
             see the plan)"
                .into(),
        )
        .into());
    }
    let mut global = global.clone();
    if let Some(m) = &args.mirror {
        global.monitor = Some(m.clone());
    }
    let monitor = MonitorClient::new(&global)?;
    let body = json!({
        "topics": args.topics, "confirm": args.confirm, "dry_run": args.dry_run, "max_rpo": args.max_rpo,
        "source_unreachable": args.source_unreachable, "drain_timeout": args.drain_timeout,
    });
    // A mirror that is still starting (or cannot reach a side for a moment) answers `unavailable`: asked again,
    // within --timeout.
    let give_up = std::time::Instant::now() + global.timeout;
    let (text, answer) = loop {
        match monitor.post::<Answer>(&["api", "v1", "failover"], Some(body.clone())).await {
            Err(MonitorError::Api { code, reason, .. })
                if code == "unavailable" && std::time::Instant::now() < give_up =>
            {
                eprintln!("the mirror cannot start the failover yet ({reason}); asking again");
                tokio::time::sleep(args.poll).await;
            }
            other => break other.map_err(refused)?,
        }
    };
    if args.dry_run {
        match args.format {
            Format::Json => println!("{}", text.trim_end()),
            Format::Text => print!("{}", plan_text(&answer)),
        }
        let failed = answer.checks.iter().filter(|c| !c.ok).count();
        return if failed == 0 { Ok(()) } else { Err(anyhow!("{failed} pre-checks failed; nothing was changed")) };
    }
    if args.format == Format::Text {
        eprint!("{}", plan_text(&answer));
    }
    let mut last_step = String::new();
    loop {
        let (_, doc) = monitor.get::<StatusDoc>(&["api", "v1", "failover"], None).await?;
        let Some(job) = doc.job else {
            return Err(anyhow!("the mirror at {} recorded no failover job", monitor.addr()));
        };
        if job.step.name() != last_step {
            last_step = job.step.name().to_owned();
            eprintln!("failover {}: step {last_step}", job.id);
        }
        if job.finished_ms.is_some() {
            match args.format {
                Format::Json => println!("{}", serde_json::to_string(&job)?),
                Format::Text => print!("{}", report_text(&job)),
            }
            return Ok(());
        }
        if !doc.running {
            let why =
                job.error.as_deref().unwrap_or("the mirror is not running it (it was restarted, or lost the target)");
            return Err(anyhow!(
                "failover {} stopped after step {}: {why}\nrun the same command again to resume it",
                job.id,
                job.step.name()
            ));
        }
        if !job.waiting.is_empty() {
            eprintln!("  waiting for {} partitions, e.g. {}", job.waiting.len(), job.waiting[0]);
        }
        tokio::time::sleep(args.poll).await;
    }
}

fn refused(e: MonitorError) -> anyhow::Error {
    match e {
        MonitorError::Api { code, reason, .. } if code == "failover_refused" => anyhow!("failover refused: {reason}"),
        MonitorError::Api { code, reason, .. } if code == "unavailable" => {
            anyhow!("{reason}\nnothing was changed by this attempt; run the same command again")
        }
        e => e.into(),
    }
}

fn check_line(c: &Check) -> String {
    format!("  [{}] {}: {}\n", if c.ok { "ok" } else { "FAILED" }, c.name, c.detail)
}

/// The plan and the pre-checks.
pub fn plan_text(a: &Answer) -> String {
    let partitions: u32 = a.topics.iter().map(|t| t.partitions).sum();
    let mut out = format!(
        "failover {}{}: {} topics, {partitions} partitions, lag {} records\n",
        a.job_id,
        if a.resumed { " (resuming the recorded job)" } else { "" },
        a.topics.len(),
        a.lag
    );
    for t in a.topics.iter().take(20) {
        out.push_str(&format!("  {} -> {} ({} partitions)\n", t.source, t.target, t.partitions));
    }
    if a.topics.len() > 20 {
        out.push_str(&format!("  ... and {} more topics\n", a.topics.len() - 20));
    }
    for c in &a.checks {
        out.push_str(&check_line(c));
    }
    out
}

/// The report of a finished job: per topic the loss window, per partition the final offsets and RPO.
pub fn report_text(job: &Job) -> String {
    let lost: u64 = job.loss.iter().map(|l| l.records_lost).sum();
    let mut out = format!(
        "failover {} done: {} topics promoted as one cut at partition epoch {}; {}\n",
        job.id,
        job.topics.len(),
        job.epoch_floor,
        if job.source_unreachable {
            format!("source unreachable, {lost} records not on the target")
        } else {
            format!("source fenced at epoch {}, RPO 0", job.epoch)
        }
    );
    out.push_str("topic loss (records, window seconds):\n");
    for l in &job.loss {
        out.push_str(&format!("  {}  {}  {:.1}\n", l.topic, l.records_lost, l.window_seconds));
    }
    out.push_str("partition  source_end  target_end  records_lost  rpo_seconds\n");
    for p in &job.partitions {
        out.push_str(&format!(
            "  {}/{}  {}  {}  {}  {:.1}\n",
            p.topic, p.partition, p.source_end, p.target_end, p.records_lost, p.rpo_seconds
        ));
    }
    out
}
