//! Command-line definition: the top-level parser and the subcommand enum with its dispatch.
//!
//! Imports point one way: this module knows every subcommand module, and none of them knows it. Each subcommand
//! module owns its argument types and its `run`; what they all share (global options, the usage error, value
//! parsers) lives in [`crate::common`]. Adding a subcommand means: its arguments and an
//! `async fn run(args, &GlobalOpts) -> anyhow::Result<()>` in a module, a variant in [`Command`] and its arm in
//! [`Command::run`].

use clap::{Parser, Subcommand};

use crate::common::GlobalOpts;
use crate::{cluster, consume, demo, dr, group, mirror, produce, share, topic, txn};

/// Ferry's operator CLI.
#[derive(Parser)]
#[command(
    name = "ferryctl",
    version,
    about = "Ferry's operator CLI: topics, produce and consume, mirror status and control, verify, demo",
    long_about = None
)]
pub struct Cli {
    /// Options every subcommand understands.
    #[command(flatten)]
    pub global: GlobalOpts,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Create, alter, delete, list, describe and promote topics.
    #[command(subcommand)]
    Topic(topic::TopicCommand),
    /// Produce one message per stdin line, or a synthetic load with --count and --size.
    Produce(produce::ProduceArgs),
    /// Print records of a topic; follows like `tail -f` unless --max or --idle-timeout is given.
    Consume(consume::ConsumeArgs),
    /// Watch and steer a running mirror through its monitor (--monitor), or verify a mirror's copy.
    Mirror(mirror::MirrorArgs),
    /// Run two brokers (dc-a, dc-b), the mirror between them and a keyed load, all in this process.
    Demo(demo::DemoArgs),
    /// A broker cluster's members and replicated partitions (leader, epoch, replicas, ISR, lag).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Fail over: fence the source topics, drain them to the target and promote it as one cut (a job in the mirror).
    Failover(dr::failover::FailoverArgs),
    /// Fail back: keep what the old primary wrote after the split, and make it a mirror of the new primary.
    Failback(dr::failback::FailbackArgs),
    /// Transactional messages by hand: prepare, commit, rollback, list.
    #[command(subcommand)]
    Txn(txn::TxnCommand),
    /// Delayed records: cancel one, or describe what is pending.
    #[command(subcommand)]
    Delay(crate::delay::DelayCommand),
    /// Consumer groups of every mode: list, describe (mode, members, backlog), unpin, reset offsets.
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// A record's status and history in a queue, serial or broadcast group.
    #[command(subcommand)]
    Message(share::MessageCommand),
    /// Dead letters: redrive a group's {group}.dlq.
    #[command(subcommand)]
    Dlq(share::DlqCommand),
}

impl Command {
    /// Runs the subcommand.
    pub async fn run(self, global: &GlobalOpts) -> anyhow::Result<()> {
        match self {
            Command::Topic(cmd) => topic::run(cmd, global).await,
            Command::Produce(args) => produce::run(args, global).await,
            Command::Consume(args) => consume::run(args, global).await,
            Command::Mirror(args) => mirror::run(args.command, args.format, global).await,
            Command::Demo(args) => demo::run(args, global).await,
            Command::Cluster(cmd) => cluster::run(cmd, global).await,
            Command::Failover(args) => dr::failover::run(args, global).await,
            Command::Failback(args) => dr::failback::run(args, global).await,
            Command::Txn(cmd) => txn::run(cmd, global).await,
            Command::Delay(cmd) => crate::delay::run(cmd, global).await,
            Command::Group(cmd) => group::run(cmd, global).await,
            Command::Message(cmd) => share::message(cmd, global).await,
            Command::Dlq(cmd) => share::dlq(cmd, global).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ferryctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_parse_anywhere_and_build_the_client_config() {
        let cli = parse(&[
            "topic",
            "list",
            "--broker",
            "a:1,b:2",
            "--token",
            "tkn",
            "--timeout",
            "3s",
            "--ca-file",
            "/ca.pem",
        ])
        .unwrap();
        let config = cli.global.client_config();
        assert_eq!(config.brokers, vec!["a:1".to_owned(), "b:2".to_owned()]);
        assert_eq!(config.token.as_deref(), Some("tkn"));
        assert_eq!(config.request_timeout, Duration::from_secs(3));
        assert_eq!(config.tls.unwrap().ca_file, Some(PathBuf::from("/ca.pem")));
    }

    #[test]
    fn defaults() {
        // The environment may carry FERRY_BROKER; only check what it cannot change.
        let cli = parse(&["topic", "list"]).unwrap();
        assert_eq!(cli.global.timeout, Duration::from_secs(20));
        assert!(cli.global.client_config().tls.is_none());
    }

    #[test]
    fn usage_errors_exit_with_2() {
        for args in [
            &["topic", "create", "t"][..],
            &["topic", "create", "t", "--partitions", "x"],
            &["topic", "create", "t", "--partitions", "0"],
            &["consume"],
            &["nonsense"],
            &["produce", "t", "--count", "5"],
            &["produce", "t", "--key", "k", "--key-sep", ":"],
            &["topic", "list", "--format", "yaml"],
        ] {
            let err = parse(args).err().unwrap_or_else(|| panic!("{args:?} parsed"));
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
    }
}
