//! A raft3 cluster whose members require mutual TLS and tokens: each member dials its peers over TLS with its own
//! certificate and presents `cluster.token_file`, which the peers grant the replica scope alone. Followers get in
//! sync, acknowledged records survive a killed leader, and the token the members present to each other can do
//! nothing but replicate.

use ferry_client::{Admin, BrokerClient, ClientConfig, Code, Producer, ProducerConfig, TlsOptions};
use ferry_testkit::{BrokerProcess, EtcdProcess, deadline, wait_until};

use crate::common::{Rec, assert_same_records, assert_status, read_partition};
use crate::raft3::{LEASE_TTL, TOPIC, record};
use crate::tls::Pki;

const PEER_SECRET: &str = "peer-secret-0123456789abcdef";
const ADMIN_SECRET: &str = "admin-secret-0123456789abcdef";

/// Member `id`'s config: mutual TLS on its listener, the two tokens it accepts, and its links to the others.
fn member(etcd: &EtcdProcess, id: u32, pki: &Pki, dir: &std::path::Path) -> anyhow::Result<String> {
    let (cert, key) = pki.issue(&format!("broker-{id}"), &["localhost", "127.0.0.1"])?;
    let (peer, admin) = (dir.join("peer.token"), dir.join("admin.token"));
    std::fs::write(&peer, PEER_SECRET)?;
    std::fs::write(&admin, ADMIN_SECRET)?;
    Ok(format!(
        "[cluster]\netcd = [\"{etcd}\"]\nbroker_id = {id}\nlease_ttl = \"2s\"\nreplica_lag_max = \"2s\"\n\
         ack_timeout = \"8s\"\ntoken_file = {peer:?}\ntls_ca_file = {ca:?}\n\n\
         [broker.tls]\ncert_file = {cert:?}\nkey_file = {key:?}\nclient_ca_file = {ca:?}\n\n\
         [storage]\nflush = \"sync\"\n\n\
         [[auth.tokens]]\nname = \"peers\"\ntoken_file = {peer:?}\nscopes = [\"replica\"]\n\n\
         [[auth.tokens]]\nname = \"ops\"\ntoken_file = {admin:?}\nscopes = [\"admin\", \"produce\", \"consume\"]\n\
         topics = [\".*\"]\ngroups = [\".*\"]\n",
        etcd = etcd.url(),
        ca = pki.ca_file(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_require_mutual_tls_and_tokens_replicate_to_each_other() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let pki = Pki::new()?;
    let secrets = tempfile::tempdir()?;
    let etcd = EtcdProcess::start().await?;
    let mut brokers = Vec::new();
    for id in 1..=3 {
        let config = member(&etcd, id, &pki, secrets.path())?;
        brokers.push(BrokerProcess::builder().cluster_id("dc-a").config(config).start().await?);
    }
    let (client_cert, client_key) = pki.issue("ops", &["ops"])?;
    let tls = TlsOptions {
        ca_file: Some(pki.ca_file()),
        cert_file: Some(client_cert),
        key_file: Some(client_key),
        domain: Some("localhost".into()),
    };
    let addrs: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
    let client_with = |secret: &str, ids: &[usize]| {
        let mut config = ClientConfig::new(ids.iter().map(|i| addrs[*i - 1].clone()));
        config.tls = Some(tls.clone());
        BrokerClient::new(config.with_token(secret)).expect("loopback addresses")
    };
    let client = client_with(ADMIN_SECRET, &[1, 2, 3]);
    Admin::new(client.clone()).create_replicated_topic(TOPIC, 1, "raft3").await?;
    let in_sync = async |client: &BrokerClient, not: u32| -> anyhow::Result<Option<u32>> {
        let meta = client.metadata_for(vec![TOPIC.to_owned()]).await?;
        Ok(meta
            .partitions
            .first()
            .filter(|p| p.leader_id != 0 && p.leader_id != not && p.isr.len() >= 2)
            .map(|p| p.leader_id))
    };
    // Three in sync: every follower fetched from its leader through TLS and the peers' token.
    wait_until("three replicas in sync over TLS", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        let meta = client.metadata_for(vec![TOPIC.to_owned()]).await?;
        anyhow::Ok(meta.partitions.first().is_some_and(|p| p.leader_id != 0 && p.isr.len() == 3))
    })
    .await?;
    let leader = in_sync(&client, 0).await?.expect("a leader");

    let config =
        ProducerConfig { delivery_timeout: deadline(&[LEASE_TTL, LEASE_TTL, LEASE_TTL]), ..Default::default() };
    let producer = Producer::new(client.clone(), config).await?;
    let mut acked = Vec::new();
    for i in 0..50 {
        let ack = producer.send(record(i)).await?.await?;
        acked.push(Rec::acked(&ack, record(i)));
    }
    brokers[leader as usize - 1].kill9().await?;
    let live: Vec<usize> = (1..=3).filter(|i| *i != leader as usize).collect();
    let survivors = client_with(ADMIN_SECRET, &live);
    wait_until("a new leader among the survivors", deadline(&[LEASE_TTL, LEASE_TTL, LEASE_TTL]), async || {
        in_sync(&survivors, leader).await.map(|l| l.is_some())
    })
    .await?;
    let new_leader = in_sync(&survivors, leader).await?.expect("a new leader");
    for i in 50..80 {
        let ack = producer.send(record(i)).await?.await?;
        acked.push(Rec::acked(&ack, record(i)));
    }
    producer.close().await;
    let got = read_partition(&client_with(ADMIN_SECRET, &[new_leader as usize]), TOPIC, 0).await;
    assert_same_records("after the leader was killed", &acked, &got);

    // The members' token replicates, and nothing else.
    let peer_token = Admin::new(client_with(PEER_SECRET, &live));
    assert_status(peer_token.list_topics().await, Code::PermissionDenied, &["token \"peers\"", "call ListTopics"]);
    Ok(())
}
