//! `ferryctl produce TOPIC`: one message per stdin line, or a synthetic load (`--count N --size B`).
//!
//! Lines are split on `\n`; the newline (and a `\r` before it) is not part of the value, and the bytes are sent
//! as they are (no UTF-8 requirement). Every message is acknowledged before the command exits; the summary goes
//! to stderr, and any failed record makes the exit code 1 with the broker's message.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use bytes::Bytes;
use clap::Args;
use ferry_batch::Header;
use ferry_client::{Admin, ClientError, DeliveryFuture, Producer, ProducerConfig, ProducerRecord};
use rand::Rng as _;
use rand::distr::Alphanumeric;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use crate::common::{GlobalOpts, UsageError, explain, parse_key_value};

/// `produce` options.
#[derive(Args, Debug)]
pub struct ProduceArgs {
    /// Topic to produce to.
    pub topic: String,
    /// Key of every message.
    #[arg(long, conflicts_with_all = ["key_sep", "count"])]
    pub key: Option<String>,
    /// Split each line at the first SEP into key and value.
    #[arg(long, value_name = "SEP", conflicts_with = "count")]
    pub key_sep: Option<String>,
    /// Header KEY=VALUE on every message; may repeat.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Partition to write to (default: by key, else round robin).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Synthetic load: number of messages (keys "key-{i}"), with --size.
    #[arg(long, requires = "size")]
    pub count: Option<u64>,
    /// Synthetic load: value size in bytes, with --count.
    #[arg(long, requires = "count")]
    pub size: Option<usize>,
    /// Deliver the records this long from now (e.g. 30s, 5m); each record's id is printed for `delay cancel`.
    #[arg(long, conflicts_with = "deliver_at")]
    pub delay: Option<String>,
    /// Deliver the records at this RFC 3339 time (e.g. 2030-01-01T12:00:00Z).
    #[arg(long, value_name = "RFC3339")]
    pub deliver_at: Option<String>,
    /// Retries a queue or serial group gives each record before dead-lettering it (the `ferry-retries` header).
    #[arg(long, value_name = "N")]
    pub retries: Option<u32>,
}

/// A pending acknowledgement and the value bytes of its record.
type Delivery = (DeliveryFuture, u64);

/// Message counts and acknowledged value bytes, for the summary.
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicU64,
    acked: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    stop: AtomicBool,
}

/// Runs `produce`.
pub async fn run(args: ProduceArgs, global: &GlobalOpts) -> anyhow::Result<()> {
    let mut headers = parse_headers(&args.headers)?;
    if let Some(n) = args.retries {
        headers.push(Header { key: "ferry-retries".into(), value: Some(Bytes::from(n.to_string())) });
    }
    if let Some(when) = crate::delay::deliver_at(args.delay.as_deref(), args.deliver_at.as_deref())? {
        if args.count.is_some() {
            return Err(UsageError("--delay and --deliver-at read records from stdin, not --count".into()).into());
        }
        let target = crate::delay::Target {
            topic: &args.topic,
            partition: args.partition,
            key: args.key.as_deref(),
            key_sep: args.key_sep.as_deref(),
        };
        return crate::delay::produce(&target, &headers, when, split_line, global).await;
    }
    let client = global.client()?;
    // Fail with a clear sentence before reading stdin when the topic does not exist.
    Admin::new(client.clone())
        .describe_topic(&args.topic)
        .await
        .map_err(|e| explain(e, &args.topic, &global.brokers()))?;
    let producer = Producer::new(client, ProducerConfig::default()).await?;
    let progress = Arc::new(Progress::default());
    let (tx, rx) = mpsc::channel::<Delivery>(65_536);
    let collector = tokio::spawn(collect(rx, progress.clone()));
    let started = Instant::now();
    let reported = match (args.count, args.size) {
        (Some(count), Some(size)) => {
            let reporter = Reporter::start(count, progress.clone());
            let result = synthetic(&args, &headers, count, size, &producer, &tx, &progress).await;
            (result, Some(reporter))
        }
        _ => (from_stdin(&args, &headers, &producer, &tx, &progress).await, None),
    };
    let (read_result, reporter) = reported;
    drop(tx);
    producer.close().await;
    let first_error = collector.await.context("the acknowledgement task failed")?;
    if let Some(reporter) = reporter {
        reporter.finish();
    }
    eprintln!("{}", summary(&progress, started.elapsed()));
    read_result?;
    if let Some(err) = first_error {
        let failed = progress.failed.load(Ordering::Relaxed);
        let sent = progress.sent.load(Ordering::Relaxed);
        return Err(anyhow!("{failed} of {sent} records failed; first failure: {err}"));
    }
    Ok(())
}

/// Parses `--header` values.
pub fn parse_headers(raw: &[String]) -> Result<Vec<Header>, UsageError> {
    raw.iter()
        .map(|h| {
            let (key, value) = parse_key_value(h, "--header")?;
            Ok(Header { key, value: Some(Bytes::from(value)) })
        })
        .collect()
}

/// Splits a stdin line into key and value per the options. `line_no` counts from 1.
pub fn split_line(
    line: Bytes,
    line_no: u64,
    key: Option<&str>,
    key_sep: Option<&str>,
) -> anyhow::Result<(Option<Bytes>, Bytes)> {
    if let Some(sep) = key_sep {
        let sep = sep.as_bytes();
        let at = memchr_slice(&line, sep)
            .ok_or_else(|| anyhow!("line {line_no} has no key separator {:?}", String::from_utf8_lossy(sep)))?;
        return Ok((Some(line.slice(..at)), line.slice(at + sep.len()..)));
    }
    Ok((key.map(|k| Bytes::copy_from_slice(k.as_bytes())), line))
}

fn memchr_slice(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Removes the line terminator: `\n`, and a `\r` before it.
pub fn strip_newline(line: &mut Vec<u8>) {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
}

async fn from_stdin(
    args: &ProduceArgs,
    headers: &[Header],
    producer: &Producer,
    tx: &mpsc::Sender<Delivery>,
    progress: &Progress,
) -> anyhow::Result<()> {
    if args.key_sep.as_deref() == Some("") {
        return Err(UsageError("--key-sep must not be empty".into()).into());
    }
    let mut stdin = tokio::io::BufReader::with_capacity(1 << 20, tokio::io::stdin());
    let mut line_no = 0u64;
    let mut buf = Vec::new();
    while !progress.stop.load(Ordering::Relaxed) {
        buf.clear();
        if stdin.read_until(b'\n', &mut buf).await.context("cannot read stdin")? == 0 {
            break;
        }
        line_no += 1;
        strip_newline(&mut buf);
        let (key, value) =
            split_line(Bytes::copy_from_slice(&buf), line_no, args.key.as_deref(), args.key_sep.as_deref())?;
        send(producer, tx, progress, &args.topic, args.partition, key, value, headers).await?;
    }
    Ok(())
}

async fn synthetic(
    args: &ProduceArgs,
    headers: &[Header],
    count: u64,
    size: usize,
    producer: &Producer,
    tx: &mpsc::Sender<Delivery>,
    progress: &Progress,
) -> anyhow::Result<()> {
    // One random block; each value is a window into it, so values differ without a random draw per message.
    const SPREAD: usize = 4096;
    let block: Bytes = rand::rng().sample_iter(Alphanumeric).take(size + SPREAD).collect::<Vec<u8>>().into();
    for i in 0..count {
        if progress.stop.load(Ordering::Relaxed) {
            break;
        }
        let start = (i as usize).wrapping_mul(7919) % SPREAD;
        let value = block.slice(start..start + size);
        let key = Bytes::from(format!("key-{i}"));
        send(producer, tx, progress, &args.topic, args.partition, Some(key), value, headers).await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn send(
    producer: &Producer,
    tx: &mpsc::Sender<Delivery>,
    progress: &Progress,
    topic: &str,
    partition: Option<u32>,
    key: Option<Bytes>,
    value: Bytes,
    headers: &[Header],
) -> anyhow::Result<()> {
    let bytes = value.len() as u64;
    let record = ProducerRecord {
        topic: topic.to_owned(),
        partition,
        key,
        value: Some(value),
        headers: headers.to_vec(),
        timestamp: None,
        when: None,
    };
    let delivery = producer.send(record).await?;
    progress.sent.fetch_add(1, Ordering::Relaxed);
    tx.send((delivery, bytes)).await.map_err(|_| anyhow!("the acknowledgement task stopped"))?;
    Ok(())
}

/// Awaits every delivery in send order; returns the first failure. Stops the reader on the first failure.
async fn collect(mut rx: mpsc::Receiver<Delivery>, progress: Arc<Progress>) -> Option<ClientError> {
    let mut first = None;
    while let Some((delivery, bytes)) = rx.recv().await {
        match delivery.await {
            Ok(_) => {
                progress.acked.fetch_add(1, Ordering::Relaxed);
                progress.bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(e) => {
                progress.failed.fetch_add(1, Ordering::Relaxed);
                progress.stop.store(true, Ordering::Relaxed);
                first.get_or_insert(e);
            }
        }
    }
    first
}

/// The final line: records, MB, records/s and MB/s (MB = 10^6 bytes of values).
fn summary(progress: &Progress, elapsed: Duration) -> String {
    let acked = progress.acked.load(Ordering::Relaxed);
    format_summary(acked, progress.bytes.load(Ordering::Relaxed) as f64, elapsed)
}

/// Formats the summary line.
pub fn format_summary(records: u64, bytes: f64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mb = bytes / 1e6;
    format!(
        "{records} records, {mb:.2} MB in {:.2}s: {:.0} records/s, {:.2} MB/s",
        elapsed.as_secs_f64(),
        records as f64 / secs,
        mb / secs
    )
}

/// Progress on stderr: a bar on a terminal, a plain line every 5 s otherwise.
struct Reporter {
    task: tokio::task::JoinHandle<()>,
    bar: Option<indicatif::ProgressBar>,
}

impl Reporter {
    fn start(total: u64, progress: Arc<Progress>) -> Self {
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40.cyan/blue} {pos}/{len} records acknowledged, {per_sec}, eta {eta}",
            ) {
                bar.set_style(style);
            }
            let b = bar.clone();
            let task = tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    b.set_position(progress.acked.load(Ordering::Relaxed));
                }
            });
            Reporter { task, bar: Some(bar) }
        } else {
            let task = tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    eprintln!("progress: {}/{total} records acknowledged", progress.acked.load(Ordering::Relaxed));
                }
            });
            Reporter { task, bar: None }
        }
    }

    fn finish(self) {
        self.task.abort();
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newline_and_carriage_return_are_stripped() {
        for (raw, expected) in
            [(&b"abc\n"[..], &b"abc"[..]), (b"abc\r\n", b"abc"), (b"abc", b"abc"), (b"\n", b""), (b"a\rb\n", b"a\rb")]
        {
            let mut line = raw.to_vec();
            strip_newline(&mut line);
            assert_eq!(line, expected);
        }
    }

    #[test]
    fn key_sep_splits_at_the_first_separator() {
        let (k, v) = split_line(Bytes::from_static(b"user-1::a::b"), 1, None, Some("::")).unwrap();
        assert_eq!((k.as_deref(), &v[..]), (Some(&b"user-1"[..]), &b"a::b"[..]));
        let (k, v) = split_line(Bytes::from_static(b":v"), 1, None, Some(":")).unwrap();
        assert_eq!((k.as_deref(), &v[..]), (Some(&b""[..]), &b"v"[..]));
        let err = split_line(Bytes::from_static(b"no separator"), 7, None, Some("|")).unwrap_err();
        assert_eq!(err.to_string(), "line 7 has no key separator \"|\"");
    }

    #[test]
    fn fixed_key_or_none() {
        let (k, v) = split_line(Bytes::from_static(b"v"), 1, Some("K"), None).unwrap();
        assert_eq!((k.as_deref(), &v[..]), (Some(&b"K"[..]), &b"v"[..]));
        let (k, _) = split_line(Bytes::from_static(b"v"), 1, None, None).unwrap();
        assert!(k.is_none());
    }

    #[test]
    fn headers_parse_in_order_and_may_repeat() {
        let h = parse_headers(&["a=1".into(), "a=2".into(), "b=x=y".into()]).unwrap();
        let pairs: Vec<(&str, &[u8])> = h.iter().map(|h| (h.key.as_str(), h.value.as_deref().unwrap())).collect();
        assert_eq!(pairs, vec![("a", &b"1"[..]), ("a", b"2"), ("b", b"x=y")]);
        assert!(parse_headers(&["novalue".into()]).is_err());
    }

    #[test]
    fn summary_reports_rates() {
        assert_eq!(
            format_summary(1000, 2_000_000.0, Duration::from_secs(2)),
            "1000 records, 2.00 MB in 2.00s: 500 records/s, 1.00 MB/s"
        );
    }
}
