//! `ferryctl`: Ferry's operator CLI. Parses the command line, starts tracing on stderr, runs the subcommand, and
//! turns the outcome into an exit code: 0 ok, 1 runtime failure, 2 bad usage. Errors are printed as one line,
//! `error: ...`, never as a Debug dump.

mod cli;
mod cluster;
mod common;
mod consume;
mod delay;
mod demo;
mod dr;
mod group;
mod mirror;
mod monitor;
mod output;
mod produce;
mod promote;
mod share;
mod topic;
mod txn;
mod verify;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::common::UsageError;

fn main() -> ExitCode {
    // clap prints its own usage errors and exits with 2.
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(cli.command.run(&cli.global));
    // Background tasks (heartbeats, senders) must not keep the process alive after the command is done.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            if e.downcast_ref::<UsageError>().is_some() { ExitCode::from(2) } else { ExitCode::from(1) }
        }
    }
}

/// The error and its causes as one line, skipping causes the message already contains.
fn one_line(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}
