//! `ferryctl txn ...`: transactional messages by hand, for scripts and drills (docs/transactions.md): prepare
//! (one message per stdin line), commit, rollback, and list the pending transactions.

use std::io::BufRead;

use anyhow::Context;
use clap::Subcommand;
use ferry_client::proto as pb;
use ferry_client::{ProducerRecord, Transactions, TxnOutcome, TxnResult};
use serde::Serialize;

use crate::common::GlobalOpts;
use crate::output::{Format, Table};

/// `txn` subcommands.
#[derive(Subcommand)]
pub enum TxnCommand {
    /// Prepare transaction ID: one half message per stdin line, to TOPIC; nothing is visible until commit.
    Prepare {
        /// Transaction id.
        id: String,
        /// Topic of its messages.
        topic: String,
        /// Producer group (whose live producers answer the check-back).
        #[arg(long, default_value = "ferryctl")]
        group: String,
        /// Partition of every message (else by key, else spread).
        #[arg(long)]
        partition: Option<u32>,
    },
    /// Commit transaction ID: its messages become visible, once each.
    Commit {
        /// Transaction id.
        id: String,
        /// Producer group.
        #[arg(long, default_value = "ferryctl")]
        group: String,
        /// Resolve as an operator (admin scope; audit-logged by the broker).
        #[arg(long)]
        operator: bool,
    },
    /// Roll back transaction ID: its messages are dropped.
    Rollback {
        /// Transaction id.
        id: String,
        /// Producer group.
        #[arg(long, default_value = "ferryctl")]
        group: String,
        /// Resolve as an operator (admin scope; audit-logged by the broker).
        #[arg(long)]
        operator: bool,
    },
    /// The pending transactions of the broker asked: age, answered checks and state.
    List {
        /// Also the resolved transactions the broker still remembers.
        #[arg(long)]
        all: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}

#[derive(Serialize)]
struct Listed<'a> {
    group: &'a str,
    txn_id: &'a str,
    state: &'a str,
    age_ms: u64,
    checks: u32,
    messages: u32,
    bytes: u64,
    waiting_for_producer: bool,
    decided_by: &'a str,
}

/// Runs a `txn` subcommand.
pub async fn run(cmd: TxnCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    let client = global.client()?;
    match cmd {
        TxnCommand::Prepare { id, topic, group, partition } => {
            let mut records = Vec::new();
            for line in std::io::stdin().lock().lines() {
                let line = line.context("reading stdin")?;
                records.push(ProducerRecord { partition, ..ProducerRecord::new(topic.clone(), line.into_bytes()) });
            }
            let repeated = Transactions::new(client, group).prepare(&id, records).await?;
            println!("{} {id}", if repeated { "already prepared" } else { "prepared" });
        }
        TxnCommand::Commit { id, group, operator } => {
            let r = Transactions::new(client, group).resolve(&id, TxnOutcome::Commit, operator).await?;
            print_result(&id, &r);
        }
        TxnCommand::Rollback { id, group, operator } => {
            let r = Transactions::new(client, group).resolve(&id, TxnOutcome::Rollback, operator).await?;
            print_result(&id, &r);
        }
        TxnCommand::List { all, format } => {
            let listed = client.txn_list(pb::TxnListRequest { all }).await?.transactions;
            let rows: Vec<Listed<'_>> = listed
                .iter()
                .map(|t| Listed {
                    group: &t.group,
                    txn_id: &t.txn_id,
                    state: &t.state,
                    age_ms: t.age_ms,
                    checks: t.checks,
                    messages: t.messages,
                    bytes: t.bytes,
                    waiting_for_producer: t.waiting_for_producer,
                    decided_by: &t.decided_by,
                })
                .collect();
            match format {
                Format::Json => println!("{}", serde_json::to_string(&rows)?),
                Format::Text => {
                    let mut table = Table::new(&["GROUP", "TXN", "STATE", "AGE", "CHECKS", "MESSAGES", "WAITING"]);
                    for r in &rows {
                        table.row(vec![
                            r.group.to_owned(),
                            r.txn_id.to_owned(),
                            r.state.to_owned(),
                            format!("{:.1}s", r.age_ms as f64 / 1000.0),
                            r.checks.to_string(),
                            r.messages.to_string(),
                            if r.waiting_for_producer { "yes".into() } else { "no".into() },
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
    }
    Ok(())
}

fn print_result(id: &str, r: &TxnResult) {
    let what = match r.outcome {
        TxnOutcome::Commit => "committed",
        TxnOutcome::Rollback => "rolled back",
    };
    let again = if r.repeated { " (already)" } else { "" };
    println!("{what}{again} {id} by {}", r.decided_by);
    for (topic, p, first, last) in &r.offsets {
        println!("{topic}/{p} {first}..={last}");
    }
}
