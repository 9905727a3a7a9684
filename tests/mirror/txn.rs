//! The mirror and transactional messages (docs/transactions.md): committed transactions are ordinary records, so
//! the target holds them identically, offsets included; half messages and the transaction state stay on the source
//! (even with a route that includes every topic name, `__ferry_` ones are never copied).

use ferry_client::proto as pb;
use ferry_client::{ProducerRecord, Transactions};
use ferry_testkit::wait_until;

use crate::common::*;

fn txn_records(tag: &str, n: u32) -> Vec<ProducerRecord> {
    (0..n)
        .map(|i| {
            ProducerRecord::new("orders", format!("{tag}-{i}"))
                .with_partition(i % 2)
                .with_key(format!("k{i}"))
                .with_header("txn", tag.to_owned())
                .with_timestamp(1_700_000_000_000 + i64::from(i))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_copies_committed_transactions_identically_and_no_transaction_state() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic("orders", 2).await?;
    let txns = Transactions::new(a.client.clone(), "shop");
    txns.prepare("committed", txn_records("committed", 6)).await?;
    txns.commit("committed").await?;
    txns.prepare("rolled", txn_records("rolled", 4)).await?;
    txns.rollback("rolled").await?;
    txns.prepare("open", txn_records("open", 4)).await?;
    produce(&a, "orders", "plain", 10, 64).await?;

    let mut conf = MirrorConf::new(&a, &b);
    conf.exclude = Vec::new();
    let _mirror = conf.start().await?;
    wait_caught_up(&a, "orders", &b, "orders", io_deadline()).await?;
    assert_identical(&a, "orders", &b, "orders").await?;
    // Only the committed messages (and the plain ones) were on the source to copy.
    let values: Vec<String> = read_topic(&b, "orders")
        .await?
        .iter()
        .flat_map(|p| {
            p.records.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        })
        .collect();
    assert_eq!(values.iter().filter(|v| v.starts_with("committed-")).count(), 6, "{values:?}");
    assert!(!values.iter().any(|v| v.starts_with("rolled-") || v.starts_with("open-")), "{values:?}");
    // The target knows no transaction: the state stayed on the source.
    assert_eq!(b.topic_names().await?, vec!["orders".to_owned()]);
    assert!(b.client.txn_list(pb::TxnListRequest { all: true }).await?.transactions.is_empty());

    // Committed later, it reaches the target like any write.
    txns.commit("open").await?;
    let want = a.leos("orders").await?;
    wait_until("the late commit on the target", io_deadline(), async || {
        b.leos("orders").await.is_ok_and(|l| l == want)
    })
    .await?;
    assert_identical(&a, "orders", &b, "orders").await?;
    Ok(())
}
