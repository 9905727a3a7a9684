//! `ferry-mirror`: the mirror daemon, one per datacenter pair. Parses arguments, starts tracing, loads and
//! validates the config, installs signal handlers (SIGTERM/SIGINT stop gracefully, SIGHUP reloads the topic, group
//! and alarm rules) and calls [`ferry_mirror::run`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use ferry_mirror::{MirrorConfig, RunOptions};
use futures::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio_util::sync::CancellationToken;

/// The Ferry MirrorMaker.
#[derive(Debug, Parser)]
#[command(name = "ferry-mirror", version)]
struct Args {
    /// Config file (TOML); see conf/mirror.toml for every key.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Write the monitor's bound address to this file once it listens.
    #[arg(long, value_name = "FILE")]
    addr_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the config, list every problem, and exit (0 valid, 2 invalid).
    Validate,
}

fn main() -> ExitCode {
    ferry_config::allocator::tune();
    let args = Args::parse();
    let Some(path) = args.config.clone() else {
        eprintln!("error: --config FILE is required (see conf/mirror.toml)");
        return ExitCode::from(2);
    };
    if matches!(args.command, Some(Command::Validate)) {
        return match MirrorConfig::load(&path) {
            Ok(c) => {
                println!("{}: valid (mirror {}: {} -> {})", path.display(), c.name, c.source.cluster, c.target.cluster);
                ExitCode::SUCCESS
            }
            Err(problems) => {
                eprintln!("{}: {problems}", path.display());
                ExitCode::from(2)
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none())
        .init();
    let config = match MirrorConfig::load(&path) {
        Ok(c) => c,
        Err(problems) => {
            eprintln!("error: {}: {problems}", path.display());
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
        let signals = match signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot install signal handlers: {e}");
                return ExitCode::from(1);
            }
        };
        let handle = signals.handle();
        let (reload_tx, reload_rx) = tokio::sync::watch::channel(Arc::new(config.clone()));
        let stop = shutdown.clone();
        let reload_path = path.clone();
        tokio::spawn(async move {
            let mut signals = signals;
            while let Some(sig) = signals.next().await {
                if sig == SIGHUP {
                    match MirrorConfig::load(&reload_path) {
                        Ok(new) => {
                            tracing::info!(file = %reload_path.display(), "SIGHUP: reloading topic, group and alarm rules");
                            let _ = reload_tx.send(Arc::new(new));
                        }
                        Err(problems) => tracing::error!("SIGHUP: the new config is invalid, keeping the old one: {problems}"),
                    }
                } else {
                    tracing::info!(signal = sig, "stopping: draining and committing offsets");
                    stop.cancel();
                }
            }
        });
        let options = RunOptions { addr_file: args.addr_file, reload: Some(reload_rx), on_started: None };
        let result = ferry_mirror::run(config, options, shutdown).await;
        handle.close();
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        }
    })
}
