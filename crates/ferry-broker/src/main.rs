//! `ferry-broker`: the broker daemon. Parses arguments, starts tracing, loads and validates the config, installs
//! the signal handlers and calls [`ferry_broker::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ferry_broker::{BrokerConfig, Overrides, RunOptions, ServerError};
use futures::StreamExt;
use signal_hook::consts::{SIGINT, SIGTERM};
use tokio_util::sync::CancellationToken;

/// The Ferry broker. With no arguments it serves 127.0.0.1:7411 with ./data.
#[derive(Debug, Parser)]
#[command(name = "ferry-broker", version)]
struct Args {
    /// Config file (TOML); see conf/broker.toml for every key.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen address, overriding broker.listen.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Data directory, overriding broker.data_dir.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Cluster id, overriding broker.cluster_id.
    #[arg(long, value_name = "ID")]
    cluster_id: Option<String>,
    /// Write the bound listen address to this file once serving (for supervisors and tests).
    #[arg(long, value_name = "FILE")]
    addr_file: Option<PathBuf>,
    /// etcd client URLs of the cluster's master, comma-separated, overriding cluster.etcd (joins a cluster).
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',')]
    etcd: Option<Vec<String>>,
    /// This broker's id in the cluster, overriding cluster.broker_id.
    #[arg(long, value_name = "N")]
    broker_id: Option<u32>,
}

// Huge blocks reserved lazily: a hostile length prefix in a Kafka request cannot abort the process.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOC: ferry_config::allocator::LazyHuge = ferry_config::allocator::LazyHuge;

fn main() -> ExitCode {
    ferry_config::allocator::tune();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none())
        .init();
    let overrides = Overrides {
        listen: args.listen,
        data_dir: args.data_dir,
        cluster_id: args.cluster_id,
        etcd: args.etcd,
        broker_id: args.broker_id,
    };
    let config = match BrokerConfig::load(args.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = match signal_hook_tokio::Signals::new([SIGTERM, SIGINT]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot install signal handlers: {e}");
                return ExitCode::from(1);
            }
        };
        let handle = signals.handle();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut signals = signals;
            if let Some(sig) = signals.next().await {
                tracing::info!(signal = sig, "shutting down");
                stop.cancel();
            }
        });
        // Tests only: a journal of what was made durable, so that a test can cut the power under this process, and
        // a switch that makes the disk full.
        let journal = std::env::var_os(ferry_storage::fs::SYNC_JOURNAL_VAR).map(std::path::PathBuf::from);
        let full = std::env::var_os(ferry_storage::fs::DISK_FULL_FLAG_VAR).map(std::path::PathBuf::from);
        let fs = if journal.is_some() || full.is_some() {
            match ferry_storage::fs::JournalFs::with(journal.as_deref(), full) {
                Ok(j) => Some(std::sync::Arc::new(j) as ferry_storage::fs::FsRef),
                Err(e) => {
                    eprintln!("error: cannot open the sync journal: {e}");
                    return ExitCode::from(1);
                }
            }
        } else {
            None
        };
        let options = RunOptions { addr_file: args.addr_file, fs };
        let result = ferry_broker::run(config, options, shutdown, |_| {}).await;
        handle.close();
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                // A token or TLS file that cannot be used is a bad config, like one that does not parse.
                let bad_config = matches!(e, ServerError::Config(_) | ServerError::Tls(_));
                ExitCode::from(if bad_config { 2 } else { 1 })
            }
        }
    })
}
