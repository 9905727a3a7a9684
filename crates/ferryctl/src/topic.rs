//! `ferryctl topic ...`: create, alter, delete, list, describe and promote topics.
//!
//! `--config k=v` keys are exactly the TopicConfig fields; an unknown key or a bad value is a usage error (exit 2)
//! naming it. Broker errors that operators hit often (a missing or existing topic) are restated as one sentence
//! naming the topic and the broker.

use clap::{Args, Subcommand};
use ferry_client::Admin;
use ferry_client::admin::{PartitionInfo, TopicConfig, TopicInfo};

use crate::common::{GlobalOpts, UsageError, explain, parse_key_value};
use crate::output::{Format, Table, TopicJson};

/// The config keys `--config` accepts.
pub const CONFIG_KEYS: [&str; 8] = [
    "flush",
    "flush_interval_ms",
    "flush_bytes",
    "retention_bytes",
    "retention_ms",
    "segment_bytes",
    "segment_ms",
    "max_delay_ms",
];

/// `topic` subcommands.
#[derive(Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        /// Topic name.
        name: String,
        /// Number of partitions.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        partitions: u32,
        /// Topic config KEY=VALUE (flush, flush_interval_ms, flush_bytes, retention_bytes, retention_ms,
        /// segment_bytes, segment_ms, max_delay_ms); may repeat.
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
        /// How the partitions are kept: single (one copy on the broker asked), double_write (two replicas on two
        /// of a cluster's brokers, a write acknowledged by both) or raft3 (three replicas, a write acknowledged
        /// by every in-sync replica); docs/cluster.md.
        #[arg(long, value_parser = ["single", "double_write", "raft3"], default_value = "single")]
        replication: String,
        /// double_write only: writes go on with one replica while a lost one is replaced (the risk phase).
        #[arg(long)]
        risk_phase: bool,
    },
    /// Grow a topic's partitions and/or change its config.
    Alter(AlterArgs),
    /// Delete a topic.
    Delete {
        /// Topic name.
        name: String,
    },
    /// List topics.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Describe a topic and its partitions.
    Describe {
        /// Topic name.
        name: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Make a mirror topic writable (the failover step); with --all-from, every mirror topic of a cluster. With
    /// --monitor, first print per partition how many source records the mirror had not copied yet.
    Promote(crate::promote::PromoteArgs),
}

/// `topic alter`.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("change").required(true).multiple(true).args(["partitions", "config"]))]
pub struct AlterArgs {
    /// Topic name.
    name: String,
    /// New partition count (can only grow).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    partitions: Option<u32>,
    /// Config KEY=VALUE to change; may repeat.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
}

/// Runs a `topic` subcommand.
pub async fn run(cmd: TopicCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    let admin = Admin::new(global.client()?);
    let on = global.brokers();
    match cmd {
        TopicCommand::Create { name, partitions, config, replication, risk_phase } => {
            if risk_phase && replication != "double_write" {
                return Err(UsageError("--risk-phase goes with --replication double_write".into()).into());
            }
            let config = parse_config(&config)?;
            let topic = if replication == "single" {
                admin.create_topic(&name, partitions, config, None).await
            } else {
                admin.create_topic_kept(&name, partitions, Some(config), None, &replication, risk_phase).await
            };
            let topic = topic.map_err(|e| explain(e, &name, &on))?;
            let kept = match (replication.as_str(), risk_phase) {
                ("single", _) => String::new(),
                (_, true) => format!(", replication {replication} with the risk phase"),
                _ => format!(", replication {replication}"),
            };
            println!(
                "created topic {:?} with {} partitions{kept} (id {})",
                topic.name, topic.partitions, topic.topic_id
            );
        }
        TopicCommand::Alter(args) => {
            if let Some(partitions) = args.partitions {
                let topic =
                    admin.alter_partitions(&args.name, partitions).await.map_err(|e| explain(e, &args.name, &on))?;
                println!("topic {:?} has {} partitions", topic.name, topic.partitions);
            }
            if !args.config.is_empty() {
                let config = parse_config(&args.config)?;
                admin.alter_topic_config(&args.name, config).await.map_err(|e| explain(e, &args.name, &on))?;
                println!("topic {:?} config changed", args.name);
            }
        }
        TopicCommand::Delete { name } => {
            admin.delete_topic(&name).await.map_err(|e| explain(e, &name, &on))?;
            println!("deleted topic {name:?}");
        }
        TopicCommand::List { format } => {
            let mut topics = admin.list_topics().await?;
            topics.sort_by(|a, b| a.name.cmp(&b.name));
            match format {
                Format::Json => {
                    let list: Vec<TopicJson> = topics.iter().map(|t| TopicJson::new(t, None)).collect();
                    println!("{}", serde_json::to_string(&list)?);
                }
                Format::Text => print!("{}", list_table(&topics)),
            }
        }
        TopicCommand::Describe { name, format } => {
            let d = admin.describe_topic(&name).await.map_err(|e| explain(e, &name, &on))?;
            match format {
                Format::Json => println!("{}", serde_json::to_string(&TopicJson::new(&d.topic, Some(&d.partitions)))?),
                Format::Text => {
                    print!("{}", describe_text(&d.topic, &d.partitions));
                    // Delayed records pending per partition, when the brokers have any for this topic.
                    if let Ok(pending) = ferry_client::Delayed::new(admin.client().clone()).describe_all(&name).await {
                        if !pending.partitions.is_empty() {
                            print!("{}", crate::delay::describe_text(&pending.partitions));
                        }
                        crate::delay::warn_unanswered(&pending.unanswered_members);
                    }
                }
            }
        }
        TopicCommand::Promote(args) => crate::promote::run(args, &admin, global).await?,
    }
    Ok(())
}

/// Parses `--config` pairs into a TopicConfig.
pub fn parse_config(pairs: &[String]) -> Result<TopicConfig, UsageError> {
    let mut config = TopicConfig::default();
    let mut seen = Vec::new();
    for pair in pairs {
        let (key, value) = parse_key_value(pair, "--config")?;
        if seen.contains(&key) {
            return Err(UsageError(format!("config key {key:?} is given twice")));
        }
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| UsageError(format!("config key {key:?} needs a whole non-negative number, not {value:?}")))
        };
        match key.as_str() {
            "flush" => {
                if value != "sync" && value != "async" {
                    return Err(UsageError(format!("config key \"flush\" is \"sync\" or \"async\", not {value:?}")));
                }
                config.flush = Some(value.clone());
            }
            "flush_interval_ms" => config.flush_interval_ms = Some(number()?),
            "flush_bytes" => config.flush_bytes = Some(number()?),
            "retention_bytes" => config.retention_bytes = Some(number()?),
            "retention_ms" => config.retention_ms = Some(number()?),
            "segment_bytes" => config.segment_bytes = Some(number()?),
            "segment_ms" => config.segment_ms = Some(number()?),
            "max_delay_ms" => config.max_delay_ms = Some(number()?),
            _ => {
                return Err(UsageError(format!(
                    "unknown topic config key {key:?} (known keys: {})",
                    CONFIG_KEYS.join(", ")
                )));
            }
        }
        seen.push(key);
    }
    Ok(config)
}

fn config_text(config: Option<&TopicConfig>) -> String {
    let Some(c) = config else { return "-".into() };
    let mut parts = Vec::new();
    if let Some(v) = &c.flush {
        parts.push(format!("flush={v}"));
    }
    let numbers = [
        ("flush_interval_ms", c.flush_interval_ms),
        ("flush_bytes", c.flush_bytes),
        ("retention_bytes", c.retention_bytes),
        ("retention_ms", c.retention_ms),
        ("segment_bytes", c.segment_bytes),
        ("segment_ms", c.segment_ms),
        ("max_delay_ms", c.max_delay_ms),
    ];
    parts.extend(numbers.iter().filter_map(|(k, v)| v.map(|v| format!("{k}={v}"))));
    if parts.is_empty() { "-".into() } else { parts.join(" ") }
}

fn mirror_text(topic: &TopicInfo) -> String {
    match &topic.mirror {
        None => "-".into(),
        Some(m) => format!(
            "{} (cluster id {}), topic {} (id {})",
            m.source_cluster, m.source_cluster_id, m.source_topic, m.source_topic_id
        ),
    }
}

fn list_table(topics: &[TopicInfo]) -> String {
    let mut table = Table::new(&["NAME", "PARTITIONS", "MIRROR_OF", "TOPIC_ID"]);
    for t in topics {
        let mirror = t.mirror.as_ref().map_or("-".to_owned(), |m| format!("{}/{}", m.source_cluster, m.source_topic));
        table.row(vec![t.name.clone(), t.partitions.to_string(), mirror, t.topic_id.clone()]);
    }
    table.render()
}

fn describe_text(topic: &TopicInfo, partitions: &[PartitionInfo]) -> String {
    let mut out = String::new();
    out.push_str(&format!("Topic:       {}\n", topic.name));
    out.push_str(&format!("Topic id:    {}\n", topic.topic_id));
    out.push_str(&format!("Partitions:  {}\n", topic.partitions));
    out.push_str(&format!("Config:      {}\n", config_text(topic.config.as_ref())));
    out.push_str(&format!("Mirror of:   {}\n", mirror_text(topic)));
    if let Some(f) = &topic.fence {
        out.push_str(&format!("Fenced:      at epoch {} ({}): read-only\n", f.epoch, f.reason));
    }
    out.push('\n');
    let mut table = Table::new(&["PARTITION", "LOG_START", "LOG_END", "EPOCH", "SIZE_BYTES", "SEGMENTS", "GAPS"]);
    for p in partitions {
        let gaps = if p.gaps.is_empty() {
            "-".to_owned()
        } else {
            p.gaps.iter().map(|g| format!("[{},{})", g.start, g.end)).collect::<Vec<_>>().join(" ")
        };
        table.row(vec![
            p.partition.to_string(),
            p.log_start_offset.to_string(),
            p.log_end_offset.to_string(),
            p.epoch.to_string(),
            p.size_bytes.to_string(),
            p.segments.to_string(),
            gaps,
        ]);
    }
    out.push_str(&table.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn every_config_key_parses() {
        let config = parse_config(&strings(&[
            "flush=sync",
            "flush_interval_ms=1000",
            "flush_bytes=4096",
            "retention_bytes=0",
            "retention_ms=86400000",
            "segment_bytes=1048576",
            "segment_ms=3600000",
            "max_delay_ms=60000",
        ]))
        .unwrap();
        assert_eq!(
            config,
            TopicConfig {
                flush: Some("sync".into()),
                flush_interval_ms: Some(1000),
                flush_bytes: Some(4096),
                retention_bytes: Some(0),
                retention_ms: Some(86_400_000),
                segment_bytes: Some(1_048_576),
                segment_ms: Some(3_600_000),
                max_delay_ms: Some(60_000),
            }
        );
    }

    #[test]
    fn bad_config_names_the_key() {
        let err = parse_config(&strings(&["retention=5"])).unwrap_err();
        assert!(err.0.starts_with("unknown topic config key \"retention\""), "{}", err.0);
        let err = parse_config(&strings(&["flush=maybe"])).unwrap_err();
        assert!(err.0.contains("\"maybe\""), "{}", err.0);
        let err = parse_config(&strings(&["segment_ms=-1"])).unwrap_err();
        assert!(err.0.contains("segment_ms") && err.0.contains("\"-1\""), "{}", err.0);
        let err = parse_config(&strings(&["flush_bytes"])).unwrap_err();
        assert!(err.0.contains("not key=value"), "{}", err.0);
        let err = parse_config(&strings(&["flush=sync", "flush=async"])).unwrap_err();
        assert!(err.0.contains("twice"), "{}", err.0);
    }

    #[test]
    fn describe_text_is_an_aligned_table() {
        let topic = TopicInfo { name: "t".into(), topic_id: "id".into(), partitions: 2, ..Default::default() };
        let parts = [
            PartitionInfo { partition: 0, log_end_offset: 1200, size_bytes: 77, segments: 1, ..Default::default() },
            PartitionInfo { partition: 1, ..Default::default() },
        ];
        let text = describe_text(&topic, &parts);
        assert!(
            text.starts_with("Topic:       t\nTopic id:    id\nPartitions:  2\nConfig:      -\nMirror of:   -\n\n")
        );
        assert!(text.ends_with(
            "PARTITION  LOG_START  LOG_END  EPOCH  SIZE_BYTES  SEGMENTS  GAPS\n\
             0          0          1200     0      77          1         -\n\
             1          0          0        0      0           0         -\n"
        ));
    }
}
