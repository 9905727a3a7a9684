//! Transactional messages on a single broker (docs/transactions.md): nothing is visible before commit, the exact
//! messages appear in order once after it, nothing after a rollback; repeats answer the first result, conflicting
//! outcomes get a definite error; and a kill -9 at every step of a commit leaves exactly one copy.

use std::time::Duration;

use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{BrokerClient, Code, ProducerRecord, Transactions, TxnOutcome, TxnResult};
use ferry_testkit::{BrokerProcess, deadline, wait_until};

use crate::common::{IO_BUDGET, Rec, assert_same_records, assert_status, connect, headers, read_topic, start_broker};

pub const TS0: i64 = 1_700_000_000_000;

/// Message `i` of transaction `tag`: partitions alternate, each with a key, a header and a timestamp.
pub fn message(topic: &str, tag: &str, i: usize) -> ProducerRecord {
    ProducerRecord::new(topic, format!("{tag}-{i}"))
        .with_partition((i % 2) as u32)
        .with_key(format!("k{i}"))
        .with_header("n", i.to_string())
        .with_timestamp(TS0 + i as i64)
}

pub fn messages(topic: &str, tag: &str, n: usize) -> Vec<ProducerRecord> {
    (0..n).map(|i| message(topic, tag, i)).collect()
}

/// The records a commit of `records` wrote, given its offsets: each partition's messages in prepared order from
/// the partition's first offset.
pub fn committed(records: &[ProducerRecord], result: &TxnResult) -> Vec<Rec> {
    let mut out = Vec::new();
    for (_, partition, base, last) in &result.offsets {
        let mine: Vec<&ProducerRecord> = records.iter().filter(|r| r.partition == Some(*partition)).collect();
        assert_eq!(mine.len() as u64, last - base + 1, "partition {partition}: offsets {base}..={last}");
        for (j, r) in mine.into_iter().enumerate() {
            out.push(Rec {
                partition: *partition,
                offset: base + j as u64,
                key: r.key.clone(),
                value: r.value.clone(),
                headers: headers(&r.headers),
                timestamp: r.timestamp.expect("timestamps are set"),
            });
        }
    }
    out
}

async fn list(client: &BrokerClient, all: bool) -> Vec<pb::TxnInfo> {
    client.txn_list(pb::TxnListRequest { all }).await.expect("list transactions").transactions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_commit_and_rollback_are_exact_once_and_conflicts_name_the_outcome() -> anyhow::Result<()> {
    let broker = start_broker("[transactions]\nmax_messages = 20\ntransaction_timeout = \"60s\"\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "shop");

    // Prepared: stored, listed as pending, invisible.
    let first = messages("orders", "t1", 5);
    assert!(!txns.prepare("t1", first.clone()).await?);
    assert!(read_topic(&client, "orders").await.is_empty(), "half messages are visible");
    let pending = list(&client, false).await;
    assert_eq!(pending.len(), 1);
    assert_eq!((pending[0].txn_id.as_str(), pending[0].state.as_str(), pending[0].messages), ("t1", "pending", 5));
    // The same prepare again is harmless; other messages under the same id are refused.
    assert!(txns.prepare("t1", first.clone()).await?);
    let other = messages("orders", "other", 5);
    assert_status(txns.prepare("t1", other).await, Code::FailedPrecondition, &["t1", "other messages"]);

    // Commit: the exact messages, in order, once; a repeat answers the same offsets.
    let result = txns.commit("t1").await?;
    assert_eq!((result.outcome, result.repeated, result.decided_by.as_str()), (TxnOutcome::Commit, false, "producer"));
    let want = committed(&first, &result);
    assert_same_records("after commit", &want, &read_topic(&client, "orders").await);
    let again = txns.commit("t1").await?;
    assert_eq!((again.repeated, &again.offsets), (true, &result.offsets));
    assert_status(txns.rollback("t1").await, Code::FailedPrecondition, &["t1", "already committed", "producer"]);
    assert!(txns.prepare("t1", first.clone()).await?, "a repeated prepare after the commit is harmless");
    assert_same_records("after the repeats", &want, &read_topic(&client, "orders").await);

    // Rollback: nothing appears; a repeat is harmless; a commit after it is refused naming the rollback.
    assert!(!txns.prepare("t2", messages("orders", "t2", 4)).await?);
    let rolled = txns.rollback("t2").await?;
    assert_eq!((rolled.outcome, rolled.offsets.len()), (TxnOutcome::Rollback, 0));
    assert!(txns.rollback("t2").await?.repeated);
    assert_status(txns.commit("t2").await, Code::FailedPrecondition, &["t2", "already rolled back"]);
    assert_same_records("after the rollback", &want, &read_topic(&client, "orders").await);

    // Unknown ids, limits and internal topics are clear errors.
    assert_status(txns.commit("never").await, Code::NotFound, &["never", "no such transaction"]);
    let too_many = messages("orders", "big", 21);
    assert_status(txns.prepare("t3", too_many).await, Code::ResourceExhausted, &["transactions.max_messages"]);
    let internal = vec![ProducerRecord::new("__ferry_transactions", "x")];
    assert_status(txns.prepare("t4", internal).await, Code::InvalidArgument, &["internal"]);
    assert_status(txns.prepare("t5", messages("nope", "x", 1)).await, Code::NotFound, &["nope"]);
    let states: Vec<(String, String)> = list(&client, true).await.into_iter().map(|t| (t.txn_id, t.state)).collect();
    assert_eq!(states, vec![("t1".into(), "committed".into()), ("t2".into(), "rolled_back".into())]);
    Ok(())
}

/// Starts a broker whose commits crash at `FERRY_TEST_TXN_CRASH`'s point while its flag file exists.
async fn crashing_broker() -> anyhow::Result<(BrokerProcess, std::path::PathBuf, tempfile::TempDir)> {
    ferry_testkit::init_tracing();
    let dir = tempfile::tempdir()?;
    let flag = dir.path().join("crash");
    let broker = BrokerProcess::builder()
        .config("[transactions]\ntransaction_timeout = \"60s\"\n")
        .env("FERRY_TEST_TXN_CRASH", format!("none:{}", flag.display()))
        .start()
        .await?;
    Ok((broker, flag, dir))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_kill_9_at_every_step_of_a_commit_leaves_exactly_one_copy() -> anyhow::Result<()> {
    let mut want = Vec::new();
    for point in ["after_decision", "mid_appends", "after_appends"] {
        ferry_testkit::init_tracing();
        let dir = tempfile::tempdir()?;
        let flag = dir.path().join("crash");
        let mut broker = BrokerProcess::builder()
            .config("[transactions]\ntransaction_timeout = \"60s\"\n")
            .env("FERRY_TEST_TXN_CRASH", format!("{point}:{}", flag.display()))
            .start()
            .await?;
        let (client, admin) = connect(&broker);
        admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
        let txns = Transactions::new(client.clone(), "shop");
        let records = messages("orders", point, 6);
        txns.prepare("t", records.clone()).await?;
        std::fs::write(&flag, point)?;
        // The broker crashes inside the commit: the call fails, the process is gone.
        let crashed = tokio::spawn({
            let txns = txns.clone();
            async move { txns.commit("t").await }
        });
        wait_until(&format!("the broker to crash {point}"), deadline(&[IO_BUDGET]), async || !broker.is_running())
            .await?;
        broker.restart().await?;
        let _ = crashed.await?;
        // After the restart the commit is finished exactly once, whoever finishes it (the broker's own round, or
        // this repeat).
        let result = txns.commit("t").await?;
        assert_eq!(result.outcome, TxnOutcome::Commit, "{point}");
        want = committed(&records, &result);
        let got = read_topic(&client, "orders").await;
        assert_same_records(point, &want, &got);
        assert_eq!(got.len(), 6, "{point}: exactly one copy");
        assert!(broker.logs().contains("crashing on purpose"), "{point}: the crash point was not reached");
    }
    assert_eq!(want.len(), 6);

    // kill -9 after prepare and after commit: the prepared transaction commits once after the restart, the
    // committed one stays once, and a rolled-back one never appears.
    let (mut broker, _flag, _dir) = crashing_broker().await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "shop");
    let (a, b, c) = (messages("orders", "a", 4), messages("orders", "b", 4), messages("orders", "c", 4));
    txns.prepare("a", a.clone()).await?;
    txns.prepare("b", b.clone()).await?;
    txns.prepare("c", c.clone()).await?;
    let done_b = txns.commit("b").await?;
    txns.rollback("c").await?;
    broker.kill9().await?;
    broker.restart().await?;
    assert_same_records("after restart", &committed(&b, &done_b), &read_topic(&client, "orders").await);
    let done_a = txns.commit("a").await?;
    assert!(txns.commit("b").await?.repeated);
    assert_status(txns.commit("c").await, Code::FailedPrecondition, &["already rolled back"]);
    let mut both = committed(&b, &done_b);
    both.extend(committed(&a, &done_a));
    broker.kill9().await?;
    broker.restart().await?;
    assert_same_records("after the second restart", &both, &read_topic(&client, "orders").await);
    Ok(())
}

/// Waits until the broker has no pending transaction.
pub async fn settled(client: &BrokerClient, within: Duration) -> anyhow::Result<()> {
    wait_until("every transaction to be resolved", within, async || {
        Ok::<bool, anyhow::Error>(client.txn_list(pb::TxnListRequest { all: false }).await?.transactions.is_empty())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_state_is_compacted_forgetting_the_oldest_finished_past_max_resolved() -> anyhow::Result<()> {
    const N: usize = 400;
    let mut broker = start_broker("[transactions]\ntransaction_timeout = \"60s\"\nmax_resolved = 5\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "many");
    let mut want = Vec::new();
    for i in 0..N {
        let records = messages("orders", &format!("m{i}"), 2);
        txns.prepare(&format!("m{i}"), records.clone()).await?;
        want.extend(committed(&records, &txns.commit(&format!("m{i}")).await?));
    }
    // A pending one survives every compaction.
    txns.prepare("open", messages("orders", "open", 1)).await?;
    // 3 records per transaction: past 1000 records the log is rewritten, keeping the 5 newest finished ones.
    wait_until("a compaction", deadline(&[IO_BUDGET]), async || list(&client, true).await.len() < N).await?;
    let before: Vec<(String, String)> = list(&client, true).await.into_iter().map(|t| (t.txn_id, t.state)).collect();
    assert!(before.contains(&("open".into(), "pending".into())), "{before:?}");
    assert!(before.contains(&(format!("m{}", N - 1), "committed".into())), "{before:?}");
    assert_status(txns.commit("m0").await, Code::NotFound, &["m0", "no such transaction"]);
    assert_same_records("after compaction", &want, &read_topic(&client, "orders").await);
    // The compacted log rebuilds the same state.
    broker.kill9().await?;
    broker.restart().await?;
    let after: Vec<(String, String)> = list(&client, true).await.into_iter().map(|t| (t.txn_id, t.state)).collect();
    assert_eq!(after, before);
    assert!(txns.commit(&format!("m{}", N - 1)).await?.repeated);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_in_transaction_commits_after_local_success_and_rolls_back_after_failure() -> anyhow::Result<()> {
    let broker = start_broker("[transactions]\ntransaction_timeout = \"60s\"\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "shop");
    // The local work sees its transaction prepared and nothing visible yet.
    let ok = messages("orders", "ok", 3);
    let (seen, result) = txns
        .send_in_transaction(ok.clone(), |id| {
            let client = client.clone();
            async move {
                let visible = read_topic(&client, "orders").await.len();
                let listed = list(&client, false).await;
                Ok::<_, String>((
                    visible,
                    listed.iter().map(|t| (t.txn_id.clone(), t.state.clone())).collect::<Vec<_>>(),
                    id,
                ))
            }
        })
        .await?;
    let (visible, listed, id) = seen;
    assert_eq!((visible, listed), (0, vec![(id.clone(), "pending".to_owned())]));
    assert_eq!((result.outcome, result.decided_by.as_str()), (TxnOutcome::Commit, "producer"));
    let want = committed(&ok, &result);
    assert_same_records("after the local success", &want, &read_topic(&client, "orders").await);
    // A failed local transaction rolls the messages back and returns its error.
    let failed =
        txns.send_in_transaction(messages("orders", "bad", 2), |_id| async { Err::<(), _>("the insert failed") }).await;
    assert!(matches!(failed, Err(ferry_client::TxnError::Local("the insert failed"))), "{failed:?}");
    let states: Vec<(String, String)> =
        list(&client, true).await.into_iter().filter(|t| t.txn_id != id).map(|t| (t.state, t.decided_by)).collect();
    assert_eq!(states, vec![("rolled_back".to_owned(), "producer".to_owned())]);
    assert_same_records("after the local failure", &want, &read_topic(&client, "orders").await);
    Ok(())
}
