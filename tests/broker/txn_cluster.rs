//! Transactional messages on a raft3 cluster: the transactions of a producer group live in a raft3 partition of
//! `__ferry_transactions`, owned by its leader. Killing that leader between prepare and commit loses nothing: the
//! commit completes on the new leader, with exactly one copy; appends to partitions led by other members go
//! through their leaders; and a producer's check stream opened at another member reaches the owner, and follows
//! the ownership when a paused owner loses it.

use std::sync::Arc;

use ferry_client::admin::Admin;
use ferry_client::proto as pb;
use ferry_client::{CheckAnswer, Code, ProducerRecord, TransactionChecker, Transactions, TxnOutcome};
use ferry_testkit::{deadline, wait_for, wait_until};
use tokio_util::sync::CancellationToken;

use crate::common::{IO_BUDGET, assert_same_records, assert_status, read_topic};
use crate::raft3::{Cluster, LEASE_TTL};
use crate::txn::{committed, messages};

const GROUP: &str = "shop";

/// A producer whose local transactions all committed.
struct CommitAll;

impl TransactionChecker for CommitAll {
    async fn check(&self, _txn_id: &str, _messages: &[ProducerRecord]) -> CheckAnswer {
        CheckAnswer::Commit
    }
}

const INTERNAL: &str = "__ferry_transactions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_on_raft3_survives_the_owner_killed_between_prepare_and_commit() -> anyhow::Result<()> {
    let mut cluster =
        Cluster::start_with("\n[transactions]\ntransaction_timeout = \"500ms\"\ncheck_interval = \"500ms\"\n").await?;
    let client = cluster.client();
    Admin::new(client.clone()).create_replicated_topic("orders", 3, "raft3").await?;
    let within = deadline(&[LEASE_TTL, IO_BUDGET]);
    let k = ferry_client::proto::partition_for_key(GROUP.as_bytes(), 8);
    let owner = async |cluster: &Cluster, asked: u32| -> anyhow::Result<u32> {
        let meta = cluster.client_of(asked).metadata_for(vec![INTERNAL.to_owned()]).await?;
        Ok(meta.partitions.iter().find(|p| p.partition == k).map_or(0, |p| p.leader_id))
    };
    let first = wait_for("the owner of the group's transactions", within, async || {
        owner(&cluster, 1).await.map(|id| (id != 0).then_some(id))
    })
    .await?;
    let txns = Transactions::new(client.clone(), GROUP);
    // A first transaction over all three partitions, each led by its own member: the owner appends to the ones
    // other members lead through them.
    let leaders = wait_for("a leader for each partition of orders", within, async || {
        let placed = cluster.client_of(first).metadata_for(vec!["orders".to_owned()]).await?;
        let leaders: Vec<u32> = placed.partitions.iter().map(|p| p.leader_id).collect();
        Ok::<_, anyhow::Error>((leaders.len() == 3 && !leaders.contains(&0)).then_some(leaders))
    })
    .await?;
    assert!(leaders.iter().any(|l| *l != first), "orders leaders {leaders:?}, owner {first}");
    let spread: Vec<ProducerRecord> =
        (0..6).map(|i| crate::txn::message("orders", "spread", i).with_partition((i % 3) as u32)).collect();
    wait_until("the prepare to be taken", within, async || txns.prepare("spread", spread.clone()).await.is_ok())
        .await?;
    let spread_done = txns.commit("spread").await?;
    assert_eq!(spread_done.offsets.len(), 3);
    let mut want = committed(&spread, &spread_done);
    assert_same_records("the spread commit", &want, &read_topic(&client, "orders").await);

    let records = messages("orders", "t", 6);
    txns.prepare("t", records.clone()).await?;
    assert_same_records("half messages are invisible", &want, &read_topic(&client, "orders").await);

    cluster.broker(first).kill9().await?;
    let alive = if first == 1 { 2 } else { 1 };
    let second = wait_for("a new owner", within, async || {
        owner(&cluster, alive).await.map(|id| (id != 0 && id != first).then_some(id))
    })
    .await?;
    assert_ne!(second, first);

    let result =
        wait_for("the commit on the new owner", within, async || Ok::<_, anyhow::Error>(txns.commit("t").await.ok()))
            .await?;
    assert_eq!((result.outcome, result.offsets.len()), (TxnOutcome::Commit, 2));
    want.extend(committed(&records, &result));
    assert_same_records("after the failover", &want, &read_topic(&client, "orders").await);
    assert!(txns.commit("t").await?.repeated);
    // The check-back stream follows the owner: a producer connected to another member only is redirected there,
    // and its answer resolves a transaction it never committed.
    let elsewhere = [1, 2, 3].into_iter().find(|id| *id != second && *id != first).expect("a third member");
    let checker = Arc::new(CommitAll);
    let stop = CancellationToken::new();
    let task = Transactions::new(cluster.client_of(elsewhere), GROUP).start_checker(checker, stop.clone());
    let late = messages("orders", "late", 2);
    txns.prepare("late", late.clone()).await?;
    wait_until("the check-back to commit late", within, async || {
        let listed = cluster.client_of(second).txn_list(pb::TxnListRequest { all: true }).await?.transactions;
        Ok::<bool, anyhow::Error>(
            listed.iter().any(|t| t.txn_id == "late" && t.state == "committed" && t.decided_by == "check"),
        )
    })
    .await?;
    assert_status(txns.rollback("late").await, Code::FailedPrecondition, &["already committed (decided by check)"]);
    let late_done = txns.commit("late").await?;
    want.extend(committed(&late, &late_done));
    assert_same_records("after the check-back", &want, &read_topic(&client, "orders").await);
    // The killed owner comes back as a follower: still one copy.
    cluster.broker(first).restart().await?;
    assert_same_records("after the old owner's return", &want, &read_topic(&client, "orders").await);

    // The owner is paused until it loses the partition, then goes on: it closes the check streams it holds (naming
    // the new owner), and the producer's stream follows to the new owner, which gets its answers.
    cluster.broker(second).suspend(within).await?;
    let third = wait_for("an owner other than the paused one", within, async || {
        owner(&cluster, elsewhere).await.map(|id| (id != 0 && id != second).then_some(id))
    })
    .await?;
    cluster.broker(second).resume()?;
    let after = messages("orders", "after", 2);
    wait_until("the prepare on the third owner", within, async || txns.prepare("after", after.clone()).await.is_ok())
        .await?;
    // Committed, not only decided: the check-back's appends can fail once while leaders settle after the pause
    // (the transaction is then `committing`, and a check round makes them again). A commit asked meanwhile would
    // make them itself, and rightly not answer as a repeat.
    wait_until("the check-back on the third owner", within, async || {
        let listed = cluster.client_of(third).txn_list(pb::TxnListRequest { all: true }).await?.transactions;
        Ok::<bool, anyhow::Error>(
            listed.iter().any(|t| t.txn_id == "after" && t.state == "committed" && t.decided_by == "check"),
        )
    })
    .await?;
    let after_done = txns.commit("after").await?;
    assert!(after_done.repeated);
    want.extend(committed(&after, &after_done));
    assert_same_records("after the pause", &want, &read_topic(&client, "orders").await);
    stop.cancel();
    task.await?;
    Ok(())
}
