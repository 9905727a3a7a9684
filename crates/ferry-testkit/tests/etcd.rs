//! The kit's etcd: a real server on loopback that the cluster tests use as their master. These tests prove the
//! harness and the client the tests inspect it with: a create-if-absent transaction succeeds once and then reports
//! the value that won; a key under a lease lives as long as the lease; a SIGSTOPped server answers again after
//! SIGCONT.

use std::time::Duration;

use ferry_testkit::etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use ferry_testkit::{EtcdProcess, Signal};

/// Creates `key` = `value` unless the key exists; returns whether it was created and the value stored after.
async fn create_if_absent(
    client: &mut ferry_testkit::etcd_client::Client,
    key: &str,
    value: &str,
) -> anyhow::Result<(bool, String)> {
    let txn = Txn::new()
        .when([Compare::version(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, value, None)])
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await?;
    if response.succeeded() {
        return Ok((true, value.to_owned()));
    }
    let stored = response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value_str().map(str::to_owned)),
            _ => None,
        })
        .transpose()?
        .unwrap_or_default();
    Ok((false, stored))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_if_absent_transaction_wins_once_and_a_leased_key_lives_with_its_lease() -> anyhow::Result<()> {
    let etcd = EtcdProcess::start().await?;
    let mut client = etcd.client().await?;

    assert_eq!(create_if_absent(&mut client, "/ferry/cluster_id", "dc-a").await?, (true, "dc-a".to_owned()));
    assert_eq!(create_if_absent(&mut client, "/ferry/cluster_id", "dc-b").await?, (false, "dc-a".to_owned()));

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
