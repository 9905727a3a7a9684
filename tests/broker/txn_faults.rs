//! Transactional messages under a power loss and a full disk: every acknowledged prepare and outcome survives a
//! power cut (the internal topic is flushed on every write; the topic of this test too), and a full disk refuses a
//! prepare with a clear error, changes nothing, and works again once there is room.

use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_client::{Code, Transactions, TxnOutcome};
use ferry_testkit::BrokerProcess;

use crate::common::{assert_same_records, connect, read_topic};
use crate::txn::{committed, messages};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_outcomes_and_prepares_survive_a_power_loss() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let mut broker = BrokerProcess::builder()
        .sync_journal()
        .config("[storage]\nflush = \"sync\"\n[transactions]\ntransaction_timeout = \"60s\"\n")
        .start()
        .await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "shop");
    let (c, r, open) = (messages("orders", "c", 4), messages("orders", "r", 4), messages("orders", "open", 4));
    txns.prepare("c", c.clone()).await?;
    let done = txns.commit("c").await?;
    txns.prepare("r", r).await?;
    txns.rollback("r").await?;
    txns.prepare("open", open.clone()).await?;
    broker.power_loss().await?;
    broker.restart().await?;
    let want = committed(&c, &done);
    assert_same_records("after the power loss", &want, &read_topic(&client, "orders").await);
    let listed = client.txn_list(pb::TxnListRequest { all: true }).await?.transactions;
    let states: Vec<(&str, &str)> = listed.iter().map(|t| (t.txn_id.as_str(), t.state.as_str())).collect();
    assert_eq!(states, vec![("c", "committed"), ("open", "pending"), ("r", "rolled_back")]);
    assert!(txns.commit("c").await?.repeated);
    let late = txns.commit("open").await?;
    assert_eq!(late.outcome, TxnOutcome::Commit);
    let mut all = want;
    all.extend(committed(&open, &late));
    assert_same_records("after the late commit", &all, &read_topic(&client, "orders").await);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_prepare_on_a_full_disk_is_refused_and_changes_nothing() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let broker = BrokerProcess::builder()
        .disk_full_switch()
        .config("[transactions]\ntransaction_timeout = \"60s\"\n")
        .start()
        .await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("orders", 2, TopicConfig::default(), None).await?;
    let txns = Transactions::new(client.clone(), "shop");
    broker.set_disk_full(true)?;
    let err = txns.prepare("t", messages("orders", "t", 3)).await.expect_err("a prepare on a full disk");
    assert_eq!(err.code(), Some(Code::Internal), "{err}");
    assert!(err.to_string().contains("__ferry_transactions"), "the error names what failed: {err}");
    broker.set_disk_full(false)?;
    assert!(client.txn_list(pb::TxnListRequest { all: true }).await?.transactions.is_empty());
    let records = messages("orders", "t", 3);
    assert!(!txns.prepare("t", records.clone()).await?, "the refused prepare left nothing behind");
    let done = txns.commit("t").await?;
    assert_same_records("after the disk has room", &committed(&records, &done), &read_topic(&client, "orders").await);
    Ok(())
}
