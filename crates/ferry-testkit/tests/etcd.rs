//! The kit's etcd: a real server on loopback that the cluster tests use as their master. These tests prove the
//! harness and the client the tests inspect it with: a put-if-absent transaction succeeds once and the first value
//! stays; a key under a lease lives as long as the lease; a SIGSTOPped server answers again after
//! SIGCONT.

use std::time::Duration;

use ferry_testkit::etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use ferry_testkit::{EtcdProcess, Signal};

/// Puts `key` = `value` if the key does not exist; returns whether the transaction took that branch.
async fn put_if_absent(
    client: &mut ferry_testkit::etcd_client::Client,
    key: &str,
    value: &str,
) -> anyhow::Result<bool> {
    let absent = Compare::version(key, CompareOp::Equal, 0);
    Ok(client.txn(Txn::new().when([absent]).and_then([TxnOp::put(key, value, None)])).await?.succeeded())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_if_absent_transaction_wins_once_and_a_leased_key_lives_with_its_lease() -> anyhow::Result<()> {
    let etcd = EtcdProcess::start().await?;
    let mut client = etcd.client().await?;

    assert!(put_if_absent(&mut client, "/ferry/cluster_id", "dc-a").await?);
    assert!(!put_if_absent(&mut client, "/ferry/cluster_id", "dc-b").await?, "a second create won");
    let stored = client.get("/ferry/cluster_id", None).await?;
    assert_eq!(stored.kvs().iter().map(|kv| kv.value().to_vec()).collect::<Vec<_>>(), [b"dc-a".to_vec()]);

    let lease = client.lease_grant(60, None).await?.id();
    client.put("/ferry/brokers/1", "127.0.0.1:7411", Some(PutOptions::new().with_lease(lease))).await?;
    let held = client.get("/ferry/brokers/1", None).await?;
    assert_eq!(
        held.kvs().iter().map(|kv| (kv.value_str().unwrap().to_owned(), kv.lease())).collect::<Vec<_>>(),
        [("127.0.0.1:7411".to_owned(), lease)]
    );
    client.lease_revoke(lease).await?;
    assert_eq!(client.get("/ferry/brokers/1", None).await?.kvs().len(), 0, "the key outlived its lease");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_etcd_answers_again_after_sigcont_with_its_data() -> anyhow::Result<()> {
    let mut etcd = EtcdProcess::start().await?;
    let mut client = etcd.client().await?;
    client.put("k", "v1", None).await?;
    etcd.send_signal(Signal::STOP)?;
    let timeout = ferry_testkit::etcd_client::ConnectOptions::new().with_timeout(Duration::from_millis(500));
    let mut bounded = ferry_testkit::etcd_client::Client::connect([etcd.url()], Some(timeout)).await?;
    assert!(bounded.get("k", None).await.is_err(), "a stopped etcd answered");
    etcd.send_signal(Signal::CONT)?;
    let got = client.get("k", None).await?;
    assert_eq!(got.kvs().iter().map(|kv| kv.value().to_vec()).collect::<Vec<_>>(), [b"v1".to_vec()]);
    Ok(())
}
