//! Delayed delivery from the command line: `ferryctl produce --delay 30s` / `--deliver-at RFC3339` (each stdin
//! line a record, sent in requests of up to 1000 records, each record's id printed on stdout), `ferryctl delay
//! cancel TOPIC ID` and `ferryctl delay describe TOPIC` (pending records per partition).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use clap::Subcommand;
use ferry_batch::Header;
use ferry_client::{Delayed, DeliverAt, ProducerRecord};
use tokio::io::AsyncBufReadExt;

use crate::common::{GlobalOpts, UsageError, explain};

/// Records per delayed produce request.
const CHUNK: usize = 1000;

/// `ferryctl delay`.
#[derive(Subcommand, Debug)]
pub enum DelayCommand {
    /// Cancel a pending delayed record by the id its produce printed; an error once it has fallen due.
    Cancel {
        /// Topic of the record.
        topic: String,
        /// The id (PARTITION-OFFSET) `ferryctl produce --delay` printed.
        id: String,
    },
    /// Pending delayed records of a topic per partition: count, bytes, earliest and latest due time.
    Describe {
        /// Topic name.
        topic: String,
    },
}

/// Runs `ferryctl delay`.
pub async fn run(cmd: DelayCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    let delayed = Delayed::new(global.client()?);
    match cmd {
        DelayCommand::Cancel { topic, id } => {
            let (partition, due) =
                delayed.cancel(&topic, &id).await.map_err(|e| explain(e, &topic, &global.brokers()))?;
            println!("cancelled {id}: it was due at {} on partition {partition}", show_ms(due));
        }
        DelayCommand::Describe { topic } => {
            let answer = delayed.describe_all(&topic).await.map_err(|e| explain(e, &topic, &global.brokers()))?;
            print!("{}", describe_text(&answer.partitions));
            warn_unanswered(&answer.unanswered_members);
        }
    }
    Ok(())
}

/// Warns on stderr that the counts leave out the members that did not answer.
pub fn warn_unanswered(members: &[u32]) {
    if !members.is_empty() {
        eprintln!(
            "warning: broker(s) {members:?} did not answer: the delayed records their delay-store partitions hold are \
             not counted"
        );
    }
}

/// The pending table `topic describe` and `delay describe` print.
pub fn describe_text(parts: &[ferry_client::proto::DelayedPartition]) -> String {
    let mut out = String::from("DELAYED  PENDING  BYTES  EARLIEST_DUE  LATEST_DUE\n");
    for p in parts {
        out.push_str(&format!(
            "{:<8} {:<8} {:<6} {} {}\n",
            p.partition,
            p.pending,
            p.pending_bytes,
            show_ms(p.earliest_due_ms),
            show_ms(p.latest_due_ms)
        ));
    }
    out
}

fn show_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

/// When `--delay` or `--deliver-at` ask for delivery.
pub fn deliver_at(delay: Option<&str>, at: Option<&str>) -> Result<Option<DeliverAt>, UsageError> {
    match (delay, at) {
        (None, None) => Ok(None),
        (Some(d), None) => {
            let d = humantime::parse_duration(d.trim())
                .map_err(|e| UsageError(format!("--delay {d:?} is not a duration like \"30s\" ({e})")))?;
            Ok(Some(DeliverAt::After(d)))
        }
        (None, Some(t)) => {
            let time: SystemTime = humantime::parse_rfc3339_weak(t.trim()).map_err(|e| {
                UsageError(format!("--deliver-at {t:?} is not an RFC 3339 time like 2030-01-01T12:00:00Z ({e})"))
            })?;
            Ok(Some(DeliverAt::at(time)))
        }
        (Some(_), Some(_)) => Err(UsageError("give --delay or --deliver-at, not both".into())),
    }
}

/// How `produce` splits a stdin line (number `line_no`, from 1) into key and value.
pub type SplitLine = fn(Bytes, u64, Option<&str>, Option<&str>) -> anyhow::Result<(Option<Bytes>, Bytes)>;

/// Where `ferryctl produce --delay` writes, from its options.
#[derive(Debug)]
pub struct Target<'a> {
    /// Topic.
    pub topic: &'a str,
    /// `--partition`.
    pub partition: Option<u32>,
    /// `--key`.
    pub key: Option<&'a str>,
    /// `--key-sep`.
    pub key_sep: Option<&'a str>,
}

/// `ferryctl produce --delay/--deliver-at`: stdin lines as delayed records (split by `split`); prints each id.
pub async fn produce(
    args: &Target<'_>,
    headers: &[Header],
    when: DeliverAt,
    split: SplitLine,
    global: &GlobalOpts,
) -> anyhow::Result<()> {
    let delayed = Delayed::new(global.client()?);
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let (mut buf, mut line_no, mut chunk, mut sent) = (Vec::new(), 0u64, Vec::new(), 0u64);
    loop {
        buf.clear();
        let eof = stdin.read_until(b'\n', &mut buf).await.context("cannot read stdin")? == 0;
        if !eof {
            line_no += 1;
            while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                buf.pop();
            }
            let (key, value) = split(Bytes::copy_from_slice(&buf), line_no, args.key, args.key_sep)?;
            let mut r = ProducerRecord::new(args.topic, value);
            r.key = key;
            r.partition = args.partition;
            r.headers = headers.to_vec();
            chunk.push(r);
        }
        if chunk.len() >= CHUNK || (eof && !chunk.is_empty()) {
            let receipt = delayed.send(&chunk, when).await.map_err(|e| explain(e, args.topic, &global.brokers()))?;
            match receipt.written {
                Some((first, last)) => eprintln!("due already: written at offsets {first}..={last}"),
                None => {
                    for id in &receipt.ids {
                        println!("{id}");
                    }
                }
            }
            sent += chunk.len() as u64;
            eprintln!("{} records to partition {} due at {}", chunk.len(), receipt.partition, show_ms(receipt.due_ms));
            chunk.clear();
        }
        if eof {
            break;
        }
    }
    eprintln!("{sent} delayed records sent");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_options_parse_or_say_what_is_wrong() {
        assert_eq!(deliver_at(None, None).unwrap(), None);
        assert_eq!(deliver_at(Some("30s"), None).unwrap(), Some(DeliverAt::After(Duration::from_secs(30))));
        assert_eq!(deliver_at(None, Some("2030-01-01T00:00:00Z")).unwrap(), Some(DeliverAt::Time(1_893_456_000_000)));
        assert!(deliver_at(Some("soon"), None).unwrap_err().0.contains("--delay"));
        assert!(deliver_at(None, Some("tomorrow")).unwrap_err().0.contains("RFC 3339"));
        assert!(deliver_at(Some("1s"), Some("2030-01-01T00:00:00Z")).unwrap_err().0.contains("not both"));
    }
}
