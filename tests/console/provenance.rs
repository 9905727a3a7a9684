//! The trace's `produced` and `transaction`: a plain record (no producer id), one from an idempotent producer,
//! two from a committed transaction, and a rolled-back transaction whose message never reaches the partition.

use ferry_client::admin::TopicConfig;
use ferry_client::{Producer, ProducerConfig, ProducerRecord, Transactions};
use serde_json::{Value, json};

use crate::common::Env;

fn trace_path(offset: u64) -> String {
    format!("/api/v1/clusters/dc1/topics/ledger/partitions/0/records/{offset}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_names_the_batch_epoch_leader_and_the_committed_transaction_of_a_record() -> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("ledger", 1, TopicConfig::default(), None).await?;
    // 0: a plain produce through the console (no producer id); 1: an idempotent producer's record.
    let w = env
        .act(
            "/api/v1/clusters/dc1/produce",
            json!({"topic": "ledger", "partition": 0, "value": "plain", "confirm": true}),
        )
        .await?;
    assert_eq!(w["written"]["offset"], 0);
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    let ack = producer.send(ProducerRecord::new("ledger", "idempotent").with_partition(0)).await?.await?;
    producer.close().await;
    assert_eq!(ack.offset, 1);
    // 2..=3: transaction t-commit of group ledger-tx, committed by its producer; t-abort is rolled back.
    let txns = Transactions::new(env.client.clone(), "ledger-tx");
    let msg = |v: &str| ProducerRecord::new("ledger", v.to_owned()).with_partition(0);
    txns.prepare("t-commit", vec![msg("tx-1"), msg("tx-2")]).await?;
    txns.prepare("t-abort", vec![msg("aborted-1")]).await?;
    let committed = txns.commit("t-commit").await?;
    assert_eq!(committed.offsets, vec![("ledger".to_owned(), 0, 2, 3)]);
    assert!(txns.rollback("t-abort").await?.offsets.is_empty());

    // The partition holds exactly the plain, idempotent and committed records; nothing of the rolled-back one.
    let page = env.read("/api/v1/clusters/dc1/topics/ledger/partitions/0/records?offset=0").await?;
    let values: Vec<&str> = page["records"].as_array().unwrap().iter().map(|r| r["value"].as_str().unwrap()).collect();
    assert_eq!(values, vec!["plain", "idempotent", "tx-1", "tx-2"]);

    // The transactions API gives both outcomes and the producer id each one's appends carry.
    let list = env.read("/api/v1/clusters/dc1/transactions").await?;
    let by_id = |id: &str| -> Value {
        list["transactions"].as_array().unwrap().iter().find(|t| t["txn_id"] == id).cloned().unwrap_or(Value::Null)
    };
    let (commit, abort) = (by_id("t-commit"), by_id("t-abort"));
    assert_eq!((commit["state"].as_str(), commit["decided_by"].as_str()), (Some("committed"), Some("producer")));
    assert_eq!((abort["state"].as_str(), abort["decided_by"].as_str()), (Some("rolled_back"), Some("producer")));
    assert_eq!(commit["offsets"], json!([{"topic": "ledger", "partition": 0, "base_offset": 2, "last_offset": 3}]));
    assert_eq!(abort["offsets"], json!([]));
    let commit_pid = commit["producer_id"].as_i64().unwrap();
    let abort_pid = abort["producer_id"].as_i64().unwrap();
    assert!(commit_pid >= 0 && abort_pid >= 0 && commit_pid != abort_pid);

    let leader = env.broker.addr().to_string();
    let mut pids = Vec::new();
    for offset in 0..4u64 {
        let t = env.read(&trace_path(offset)).await?;
        let p = &t["produced"];
        assert_eq!(t["record"]["offset"], offset);
        // A fresh single broker: every batch in epoch 0, written to the one broker, which leads it now.
        assert_eq!(
            (&p["partition_epoch"], &p["partition_epoch_now"], p["leader"].as_str(), &p["leader_basis"]),
            (&json!(0), &json!(0), Some(leader.as_str()), &json!("single_broker")),
            "{t}"
        );
        assert_eq!(p["leader_now"].as_str(), Some(leader.as_str()));
        pids.push(p["producer_id"].as_i64().unwrap());
        let want_txn = if offset >= 2 {
            json!({"group": "ledger-tx", "txn_id": "t-commit", "state": "committed", "decided_by": "producer",
                   "producer_id": commit_pid,
                   "offsets": [{"topic": "ledger", "partition": 0, "base_offset": 2, "last_offset": 3}]})
        } else {
            Value::Null
        };
        assert_eq!(t["transaction"], want_txn, "offset {offset}");
        let batch = if offset >= 2 {
            (2, 0, 0)
        } else if offset == 1 {
            (1, 0, 0)
        } else {
            (0, -1, -1)
        };
        assert_eq!(
            (p["batch_base_offset"].as_u64(), p["producer_epoch"].as_i64(), p["base_sequence"].as_i64()),
            (Some(batch.0), Some(batch.1), Some(batch.2)),
            "offset {offset}: {p}"
        );
    }
    assert_eq!((pids[0], pids[2], pids[3]), (-1, commit_pid, commit_pid));
    assert!(pids[1] >= 0 && pids[1] != commit_pid && pids[1] != abort_pid, "{pids:?}");
    assert!(!pids.contains(&abort_pid), "no stored batch carries the rolled-back transaction's producer id");
    Ok(())
}
