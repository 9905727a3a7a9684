//! The check-back of transactional messages (docs/transactions.md), with short intervals: a transaction whose
//! producer died is resolved by another live producer of its group (COMMIT or ROLLBACK); without any producer it
//! waits and alarms, and resolves when one comes back; UNKNOWN answers expire it after max_checks; a producer's
//! COMMIT racing a check's ROLLBACK has one winner and the loser is told; and 1,000 transactions from 8 producers
//! end with the visible set equal to the committed set.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{CheckAnswer, Code, ProducerRecord, TransactionChecker, Transactions, TxnOutcome};
use ferry_testkit::{deadline, wait_until};
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::common::{IO_BUDGET, Rec, assert_same_records, assert_status, connect, digest, read_topic, start_broker};
use crate::txn::{committed, messages};

/// transaction_timeout and check_interval of these tests.
const INTERVAL: Duration = Duration::from_millis(300);
const MAX_CHECKS: u32 = 3;

fn config() -> String {
    format!(
        "[transactions]\ntransaction_timeout = \"{ms}ms\"\ncheck_interval = \"{ms}ms\"\nmax_checks = {MAX_CHECKS}\n",
        ms = INTERVAL.as_millis()
    )
}

/// A checker that answers from a table (the producer's "database"), UNKNOWN for what it does not know, and
/// counts the checks it was asked.
#[derive(Default)]
struct Table {
    answers: Mutex<HashMap<String, CheckAnswer>>,
    asked: Mutex<Vec<String>>,
}

impl TransactionChecker for Table {
    async fn check(&self, txn_id: &str, _messages: &[ProducerRecord]) -> CheckAnswer {
        self.asked.lock().expect("lock").push(txn_id.to_owned());
        self.answers.lock().expect("lock").get(txn_id).copied().unwrap_or(CheckAnswer::Unknown)
    }
}

async fn metric(broker: &ferry_testkit::BrokerProcess, name: &str) -> anyhow::Result<u64> {
    let text = crate::raft3::scrape(broker).await?;
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
    Ok(line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0))
}

fn within() -> Duration {
    deadline(&[INTERVAL * (MAX_CHECKS + 1), IO_BUDGET])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_check_back_reaches_another_live_producer_which_commits_or_rolls_back() -> anyhow::Result<()> {
    let broker = start_broker(&config()).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    // The producer that prepares dies (it never resolves); another of its group answers the checks.
    let dead = Transactions::new(client.clone(), "shop");
    let (to_commit, to_roll) = (messages("orders", "c", 4), messages("orders", "r", 4));
    dead.prepare("commit-me", to_commit.clone()).await?;
    dead.prepare("roll-me", to_roll).await?;
    drop(dead);
    let checker = Arc::new(Table::default());
    checker
        .answers
        .lock()
        .expect("lock")
        .extend([("commit-me".to_owned(), CheckAnswer::Commit), ("roll-me".into(), CheckAnswer::Rollback)]);
    let stop = CancellationToken::new();
    let live = Transactions::new(client.clone(), "shop");
    let task = live.start_checker(Arc::clone(&checker), stop.clone());
    crate::txn::settled(&client, within()).await?;
    // The outcome is the check's, recorded once; the messages appear once.
    let c = live.commit("commit-me").await?;
    assert_eq!((c.outcome, c.repeated, c.decided_by.as_str()), (TxnOutcome::Commit, true, "check"));
    assert_same_records("committed by the check", &committed(&to_commit, &c), &read_topic(&client, "orders").await);
    assert_status(live.commit("roll-me").await, Code::FailedPrecondition, &["already rolled back", "check"]);
    assert_eq!(metric(&broker, "ferry_broker_txn_committed_total").await?, 1);
    assert_eq!(metric(&broker, "ferry_broker_txn_rolled_back_total").await?, 1);
    // Resolved transactions are not checked again: while a later one is checked and resolved, only it is asked.
    let asked = checker.asked.lock().expect("lock").clone();
    checker.answers.lock().expect("lock").insert("later".into(), CheckAnswer::Rollback);
    live.prepare("later", messages("orders", "l", 1)).await?;
    crate::txn::settled(&client, within()).await?;
    let mut now = checker.asked.lock().expect("lock").clone();
    assert_eq!(now.pop().as_deref(), Some("later"));
    now.retain(|id| id != "later");
    assert_eq!(now, asked, "a resolved transaction was checked again");
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_without_a_producer_waits_and_alarms_then_resolves_when_one_returns() -> anyhow::Result<()> {
    let broker = start_broker(&config()).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "lonely");
    let records = messages("orders", "w", 3);
    txns.prepare("w", records.clone()).await?;
    // Due, nobody to ask: it waits, listed as such, counted, and never discarded.
    wait_until("the transaction to wait for a producer", within(), async || {
        Ok::<bool, anyhow::Error>(metric(&broker, "ferry_broker_txn_waiting").await? == 1)
    })
    .await?;
    assert_eq!(metric(&broker, "ferry_broker_txn_waits_total").await?, 1);
    assert!(broker.logs().contains("txn_waiting_for_producer"));
    let listed = client.txn_list(pb::TxnListRequest { all: false }).await?.transactions;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].waiting_for_producer && listed[0].checks == 0 && listed[0].state == "pending", "{listed:?}");
    // While another group's transaction goes through all its checks and expires, this one stays pending with
    // no check counted: its clock is paused.
    let busy = Transactions::new(client.clone(), "busy");
    let stop_busy = CancellationToken::new();
    let busy_task = busy.start_checker(Arc::new(Table::default()), stop_busy.clone());
    busy.prepare("b", messages("orders", "b", 1)).await?;
    wait_until("the busy group's transaction to expire", within(), async || {
        Ok::<bool, anyhow::Error>(metric(&broker, "ferry_broker_txn_expired_total").await? == 1)
    })
    .await?;
    stop_busy.cancel();
    busy_task.await?;
    let listed = client.txn_list(pb::TxnListRequest { all: false }).await?.transactions;
    let got: Vec<(&str, u32, bool)> =
        listed.iter().map(|t| (t.txn_id.as_str(), t.checks, t.waiting_for_producer)).collect();
    assert_eq!(got, vec![("w", 0, true)]);
    assert!(read_topic(&client, "orders").await.is_empty());
    // A producer comes back and answers COMMIT.
    let checker = Arc::new(Table::default());
    checker.answers.lock().expect("lock").insert("w".into(), CheckAnswer::Commit);
    let stop = CancellationToken::new();
    let task = txns.start_checker(checker, stop.clone());
    crate::txn::settled(&client, within()).await?;
    let c = txns.commit("w").await?;
    assert_same_records("resolved on return", &committed(&records, &c), &read_topic(&client, "orders").await);
    assert_eq!(metric(&broker, "ferry_broker_txn_waiting").await?, 0);
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_unknown_answers_expire_it_after_max_checks() -> anyhow::Result<()> {
    let broker = start_broker(&config()).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "unsure");
    txns.prepare("u", messages("orders", "u", 2)).await?;
    let checker = Arc::new(Table::default());
    let stop = CancellationToken::new();
    let task = txns.start_checker(Arc::clone(&checker), stop.clone());
    crate::txn::settled(&client, within()).await?;
    // Every check asked about it (a check unanswered within an interval is asked again, uncounted).
    let asked = checker.asked.lock().expect("lock").clone();
    assert!(asked.len() >= MAX_CHECKS as usize && asked.iter().all(|id| id == "u"), "{asked:?}");
    let listed = client.txn_list(pb::TxnListRequest { all: true }).await?.transactions;
    let t = &listed[0];
    assert_eq!((t.state.as_str(), t.checks, t.decided_by.as_str()), ("rolled_back", MAX_CHECKS, "expired"));
    assert_eq!(metric(&broker, "ferry_broker_txn_expired_total").await?, 1);
    assert!(broker.logs().contains("txn_expired"));
    assert_status(txns.commit("u").await, Code::FailedPrecondition, &["already rolled back", "expired"]);
    assert!(read_topic(&client, "orders").await.is_empty());
    stop.cancel();
    task.await?;
    Ok(())
}

/// A checker that answers ROLLBACK, holding its answers about "early" until the test lets them go.
struct Held {
    asked: tokio::sync::mpsc::UnboundedSender<String>,
    release: tokio::sync::Semaphore,
}

impl TransactionChecker for Held {
    async fn check(&self, txn_id: &str, _messages: &[ProducerRecord]) -> CheckAnswer {
        let _ = self.asked.send(txn_id.to_owned());
        if txn_id == "early" {
            self.release.acquire().await.expect("open").forget();
        }
        CheckAnswer::Rollback
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_producer_commit_racing_a_check_rollback_has_one_winner_and_the_loser_is_told() -> anyhow::Result<()> {
    let broker = start_broker(&config()).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "racers");
    let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let checker = Arc::new(Held { asked: asked_tx, release: tokio::sync::Semaphore::new(0) });
    let stop = CancellationToken::new();
    let task = txns.start_checker(Arc::clone(&checker), stop.clone());

    // The check's ROLLBACK lands first: the producer's COMMIT is refused naming it.
    let late = messages("orders", "late", 2);
    txns.prepare("late", late).await?;
    crate::txn::settled(&client, within()).await?;
    assert_eq!(asked.try_recv().ok().as_deref(), Some("late"));
    assert_status(txns.commit("late").await, Code::FailedPrecondition, &["late", "already rolled back", "check"]);

    // The producer's COMMIT lands while a check is in flight: the check's ROLLBACK is moot.
    let early = messages("orders", "early", 2);
    txns.prepare("early", early.clone()).await?;
    wait_until("a check of early", within(), async || {
        while let Ok(id) = asked.try_recv() {
            if id == "early" {
                return true;
            }
        }
        false
    })
    .await?;
    let c = txns.commit("early").await?;
    assert_eq!((c.outcome, c.decided_by.as_str()), (TxnOutcome::Commit, "producer"));
    checker.release.add_permits(100);
    wait_until("the held check of early to be answered", within(), async || {
        Ok::<bool, anyhow::Error>(metric(&broker, "ferry_broker_txn_checks_answered_total").await? >= 2)
    })
    .await?;
    let listed = client.txn_list(pb::TxnListRequest { all: true }).await?.transactions;
    let states: Vec<(&str, &str, &str)> =
        listed.iter().map(|t| (t.txn_id.as_str(), t.state.as_str(), t.decided_by.as_str())).collect();
    assert_eq!(states, vec![("early", "committed", "producer"), ("late", "rolled_back", "check")]);
    assert_same_records("only early", &committed(&early, &c), &read_topic(&client, "orders").await);
    stop.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_thousand_transactions_from_8_producers_show_exactly_the_committed_set() -> anyhow::Result<()> {
    const PRODUCERS: usize = 8;
    const PER: usize = 125;
    let seed = ferry_testkit::test_seed("transaction outcomes")?;
    let broker = start_broker(&config()).await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("ledger", 4, TopicConfig::default(), None).await?;
    // The group's "database": what each local transaction did, answered by a live producer on check-back.
    let checker = Arc::new(Table::default());
    let stop = CancellationToken::new();
    let watcher = Transactions::new(client.clone(), "ledger-writers").start_checker(Arc::clone(&checker), stop.clone());
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let (client, checker) = (client.clone(), Arc::clone(&checker));
        tasks.push(tokio::spawn(async move {
            let txns = Transactions::new(client, "ledger-writers");
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed + p as u64);
            let mut committed_values = Vec::new();
            for i in 0..PER {
                let id = format!("p{p}-{i}");
                let n = rand::Rng::random_range(&mut rng, 1..=3usize);
                let records: Vec<ProducerRecord> = (0..n)
                    .map(|j| ProducerRecord::new("ledger", format!("{id}/{j}")).with_key(id.clone()).with_timestamp(1))
                    .collect();
                txns.prepare(&id, records).await.expect("prepare");
                match rand::Rng::random_range(&mut rng, 0..3u8) {
                    0 => {
                        checker.answers.lock().expect("lock").insert(id.clone(), CheckAnswer::Commit);
                        txns.commit(&id).await.expect("commit");
                        committed_values.extend((0..n).map(|j| format!("{id}/{j}")));
                    }
                    1 => {
                        checker.answers.lock().expect("lock").insert(id.clone(), CheckAnswer::Rollback);
                        txns.rollback(&id).await.expect("rollback");
                    }
                    // Left to the check-back: the "database" says what happened.
                    _ => {
                        let commit = rand::Rng::random_bool(&mut rng, 0.5);
                        let answer = if commit { CheckAnswer::Commit } else { CheckAnswer::Rollback };
                        checker.answers.lock().expect("lock").insert(id.clone(), answer);
                        if commit {
                            committed_values.extend((0..n).map(|j| format!("{id}/{j}")));
                        }
                    }
                }
            }
            committed_values
        }));
    }
    let mut want_values = HashSet::new();
    for t in tasks {
        want_values.extend(t.await?);
    }
    crate::txn::settled(&client, within()).await?;
    let got = read_topic(&client, "ledger").await;
    let got_values: Vec<String> = got.iter().map(|r| r.value_str().to_owned()).collect();
    assert_eq!(got_values.len(), got_values.iter().collect::<HashSet<_>>().len(), "a message appears twice");
    let mut want_sorted: Vec<String> = want_values.into_iter().collect();
    let mut got_sorted = got_values.clone();
    want_sorted.sort();
    got_sorted.sort();
    let as_recs = |v: &[String]| -> Vec<Rec> {
        v.iter()
            .enumerate()
            .map(|(i, s)| Rec {
                partition: 0,
                offset: i as u64,
                key: None,
                value: Some(s.clone().into()),
                headers: vec![],
                timestamp: 0,
            })
            .collect()
    };
    assert_eq!(digest(&as_recs(&got_sorted)), digest(&as_recs(&want_sorted)), "visible set != committed set");
    let listed = client.txn_list(pb::TxnListRequest { all: true }).await?.transactions;
    assert_eq!(listed.len(), PRODUCERS * PER);
    stop.cancel();
    watcher.await?;
    Ok(())
}
