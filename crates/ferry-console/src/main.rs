//! `ferry-console`: parses arguments, starts tracing, loads and validates the config, serves until SIGTERM/SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferry_console::ConsoleConfig;
use tokio_util::sync::CancellationToken;

/// The Ferry web console.
#[derive(Debug, Parser)]
#[command(name = "ferry-console", version)]
struct Args {
    /// Config file (TOML); conf/console.toml documents every key.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Write the bound address to this file once listening.
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
    let args = Args::parse();
    let Some(path) = args.config else {
        eprintln!("error: --config FILE is required (see conf/console.toml)");
        return ExitCode::from(2);
    };
    let config = match ConsoleConfig::load(&path) {
        Ok(c) => c,
        Err(problems) => {
            eprintln!("error: {}: {problems}", path.display());
            return ExitCode::from(2);
        }
    };
    if matches!(args.command, Some(Command::Validate)) {
        println!("{}: valid ({} cluster(s))", path.display(), config.clusters.len());
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread().enable_all().build() else {
        eprintln!("error: cannot start the async runtime");
        return ExitCode::from(1);
    };
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let (addr, task) = match ferry_console::start(config, shutdown.clone()).await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        };
        if let Some(f) = &args.addr_file {
            if let Err(e) = std::fs::write(f, addr.to_string()) {
                eprintln!("error: cannot write {}: {e}", f.display());
                return ExitCode::from(1);
            }
        }
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            stop.cancel();
        });
        shutdown.cancelled().await;
        let _ = tokio::time::timeout(ferry_console::SHUTDOWN_GRACE, task).await;
        ExitCode::SUCCESS
    })
}
