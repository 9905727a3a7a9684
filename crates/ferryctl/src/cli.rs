//! Command-line definition: global options, the subcommand enums and their dispatch, and the usage-error type that
//! makes `main` exit with 2.
//!
//! The `topic`, `produce` and `consume` argument types live in their modules; the `mirror` and `demo` ones live
//! here, and each command's code is in its own module (mirror.rs, verify/, demo.rs). Adding a subcommand means: its
//! arguments, an `async fn run(args, &GlobalOpts) -> anyhow::Result<()>` in a module, a variant in [`Command`]
//! and its arm in [`Command::run`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ferry_client::{BrokerClient, ClientConfig, ClientError, TlsOptions};

use crate::output::Format;
use crate::{consume, demo, mirror, produce, topic};

/// Where the mirror monitor is when `--monitor` and `FERRY_MONITOR` are not given.
pub const DEFAULT_MONITOR: &str = "127.0.0.1:9300";

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

/// Options shared by every subcommand. Not `Debug`: it holds the token.
#[derive(Args, Clone)]
pub struct GlobalOpts {
    /// Broker address host:port (a comma-separated list fails over in order).
    #[arg(long, global = true, env = "FERRY_BROKER", default_value = "127.0.0.1:7411", value_delimiter = ',')]
    pub broker: Vec<String>,
    /// Mirror monitor address host:port or URL (for mirror commands) [default: 127.0.0.1:9300].
    #[arg(long, global = true, env = "FERRY_MONITOR")]
    pub monitor: Option<String>,
    /// Bearer token for the broker or monitor.
    #[arg(long, global = true, env = "FERRY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Request timeout, e.g. 20s, 500ms, or plain seconds.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "20s")]
    pub timeout: Duration,
    /// CA certificate (PEM) for TLS to the broker; turns TLS on.
    #[arg(long, global = true, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, global = true, value_name = "FILE")]
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of --cert-file.
    #[arg(long, global = true, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Name to verify the broker certificate against (default: the host of --broker).
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

impl GlobalOpts {
    /// The client configuration these options describe.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.broker.iter().map(|b| b.trim().to_owned()));
        config.request_timeout = self.timeout;
        config.token = self.token.clone();
        if self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some() {
            config.tls = Some(TlsOptions {
                ca_file: self.ca_file.clone(),
                cert_file: self.cert_file.clone(),
                key_file: self.key_file.clone(),
                domain: self.tls_domain.clone(),
            });
        }
        config
    }

    /// A broker client; bad options are usage errors (exit 2).
    pub fn client(&self) -> anyhow::Result<BrokerClient> {
        BrokerClient::new(self.client_config()).map_err(|e| match e {
            ClientError::Config { .. } => UsageError(e.to_string()).into(),
            other => other.into(),
        })
    }

    /// The broker addresses, for messages.
    pub fn brokers(&self) -> String {
        self.broker.join(",")
    }

    /// The monitor address: `--monitor`, `FERRY_MONITOR`, or [`DEFAULT_MONITOR`].
    pub fn monitor_addr(&self) -> &str {
        self.monitor.as_deref().unwrap_or(DEFAULT_MONITOR)
    }

    /// A client for the same TLS and token options but other broker addresses (`mirror verify`).
    pub fn client_for(&self, brokers: &[String]) -> anyhow::Result<BrokerClient> {
        let mut opts = self.clone();
        opts.broker = brokers.to_vec();
        opts.client()
    }
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
    Mirror(MirrorArgs),
    /// Run two brokers (dc-a, dc-b), the mirror between them and a keyed load, all in this process.
    Demo(DemoArgs),
}

/// `mirror` options.
#[derive(Args)]
pub struct MirrorArgs {
    /// Output format (json passes the monitor's JSON through, for scripts).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// What to do.
    #[command(subcommand)]
    pub command: MirrorCommand,
}

/// `mirror` subcommands.
#[derive(Subcommand)]
pub enum MirrorCommand {
    /// Mirror identity, active route, partition states, lag, rates and totals.
    Status,
    /// Per-partition offsets, lag and state.
    Partitions {
        /// Only this source topic.
        #[arg(long)]
        topic: Option<String>,
        /// Redraw every second until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// Source routes (egress), or switch and unpin them.
    Egress {
        /// Switch or unpin; without one, list the routes.
        #[command(subcommand)]
        action: Option<EgressAction>,
    },
    /// Pause a mirrored source topic (its partitions stop appending and keep their positions).
    Pause {
        /// Source topic.
        topic: String,
    },
    /// Resume a paused (or halted) source topic.
    Resume {
        /// Source topic.
        topic: String,
    },
    /// Compare every mirror topic on the target with its source, batch by batch; exit 1 on any difference.
    Verify(VerifyArgs),
}

/// `mirror egress` subcommands.
#[derive(Subcommand)]
pub enum EgressAction {
    /// Switch the source route by hand; it stays pinned until `mirror egress unpin`.
    Switch {
        /// Route name.
        route: String,
        /// Switch even when the route is unhealthy.
        #[arg(long)]
        force: bool,
    },
    /// Remove the pin of a manual switch, so automatic failover applies again.
    Unpin,
}

/// `mirror verify` options.
#[derive(Args)]
pub struct VerifyArgs {
    /// Source cluster broker address(es), comma separated.
    #[arg(long, required = true, value_delimiter = ',')]
    pub source: Vec<String>,
    /// Target cluster broker address(es), comma separated.
    #[arg(long, required = true, value_delimiter = ',')]
    pub target: Vec<String>,
    /// Only this mirror topic (its target or its source name).
    #[arg(long)]
    pub topic: Option<String>,
}

/// `demo` options.
#[derive(Args)]
pub struct DemoArgs {
    /// Stop by itself after this long (e.g. 30s or plain seconds); default: run until Ctrl-C.
    #[arg(long, value_name = "SECONDS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Records per second of the sample load.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rate: u32,
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
        }
    }
}

/// A mistake in how ferryctl was called, found after parsing (an unknown `--config` key, a bad `k=v`).
/// `main` prints it and exits with 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Parses `20s`, `500ms`, `1m` or plain (possibly fractional) seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{text:?} is not a duration"));
    }
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e}); try 20s or 500ms"))
}

/// Splits `key=value` at the first `=`; `what` names the option in the error.
pub fn parse_key_value(text: &str, what: &str) -> Result<(String, String), UsageError> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(UsageError(format!("{what} {text:?} is not key=value"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn key_values() {
        assert_eq!(parse_key_value("a=b=c", "--header").unwrap(), ("a".into(), "b=c".into()));
        assert_eq!(parse_key_value("a=", "--header").unwrap(), ("a".into(), String::new()));
        assert!(parse_key_value("=b", "--header").is_err());
        assert_eq!(parse_key_value("ab", "--header").unwrap_err().0, "--header \"ab\" is not key=value");
    }
}
