//! Fences (issue 29): a fenced topic is read-only at a fence epoch, produce refused naming the failover and the
//! epoch, reads going on.
//!
//! - On a single broker the fence is in the topic's file: it holds across a kill -9. Only an admin or the mirror
//!   scope fences, only an admin lifts a fence, and a fence only moves up.
//! - On a cluster the fence is in the topic's catalog record: a member that was down when it was written takes it
//!   from the catalog before it serves, so even when it comes back and leads it takes no write.

use ferry_client::{Admin, BrokerClient, ClientConfig, ClientError, Code, Producer, ProducerConfig};
use ferry_testkit::{BrokerProcess, ClusterSpec, deadline, wait_until};

use crate::common::{IO_BUDGET, assert_status};
use crate::faults::{client, client_of, cluster_with_topic, placement, produce, record, wait_placement};

const TOPIC: &str = "ledger";
const ADMIN_SECRET: &str = "admin-secret-7f3a1c92d04b6e58";
const MIRROR_SECRET: &str = "mirror-secret-0b9e4d27c61f3a85";
const APP_SECRET: &str = "app-secret-3c8d5e1a94f27b06";

fn as_token(broker: &BrokerProcess, secret: &str) -> anyhow::Result<Admin> {
    Ok(Admin::new(BrokerClient::new(ClientConfig::new([broker.addr().to_string()]).with_token(secret))?))
}

/// The refusal of a produce to fenced `TOPIC`: FAILED_PRECONDITION, reason `topic_fenced`, naming epoch and reason.
fn fenced<T: std::fmt::Debug>(result: Result<T, ClientError>, epoch: u64, reason: &str) {
    assert_status(result, Code::FailedPrecondition, &[&format!("is fenced at epoch {epoch} ({reason})"), "read-only"]);
}

async fn send_one(client: BrokerClient, i: usize) -> Result<ferry_client::RecordMetadata, ClientError> {
    let p = Producer::new(client, ProducerConfig::default()).await?;
    let out = p.send(record(TOPIC, 0, i)).await?.await;
    p.close().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_holds_across_a_restart_and_only_admins_lift_it() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let secrets = tempfile::tempdir()?;
    let mut config = String::new();
    for (name, secret, scopes) in [
        ("ops", ADMIN_SECRET, r#"["admin", "consume", "produce"]"#),
        ("dc-mirror", MIRROR_SECRET, r#"["mirror"]"#),
        ("app", APP_SECRET, r#"["produce"]"#),
    ] {
        let file = secrets.path().join(format!("{name}.token"));
        std::fs::write(&file, format!("{secret}\n"))?;
        config.push_str(&format!(
            "[[auth.tokens]]\nname = \"{name}\"\ntoken_file = {:?}\nscopes = {scopes}\ntopics = [\".*\"]\n\n",
            file.display().to_string()
        ));
    }
    let mut broker = BrokerProcess::builder().config(config).start().await?;
    let admin = as_token(&broker, ADMIN_SECRET)?;
    admin.create_topic(TOPIC, 1, Default::default(), None).await?;
    let addr = broker.addr().to_string();
    let ops = || BrokerClient::new(ClientConfig::new([addr.clone()]).with_token(ADMIN_SECRET));
    send_one(ops()?, 0).await?;

    // The produce scope may not fence; the mirror scope may; a repeat is harmless; a lower epoch is refused.
    let topics = [TOPIC.to_owned()];
    let app = as_token(&broker, APP_SECRET)?;
    assert_status(app.fence_topics(&topics, 5, "drill").await, Code::PermissionDenied, &["call FenceTopics"]);
    let mirror = as_token(&broker, MIRROR_SECRET)?;
    for _ in 0..2 {
        let out = mirror.fence_topics(&topics, 5, "failover f-1").await?;
        let fence = out[0].result.as_ref().map_err(|e| anyhow::anyhow!("{e:?}"))?.fence.clone();
        assert_eq!(fence.map(|f| (f.epoch, f.reason)), Some((5, "failover f-1".to_owned())));
    }
    let lower = mirror.fence_topics(&topics, 4, "stale").await?;
    let (reason, message) = lower[0].result.as_ref().expect_err("a lower epoch is refused");
    assert_eq!(reason, "invalid_argument");
    assert!(message.contains("fenced at epoch 5 (failover f-1), above the asked epoch 4"), "{message}");
    fenced(send_one(ops()?, 1).await, 5, "failover f-1");

    // Reads go on, and the fence is in the topic's file: a kill -9 and a restart keep it.
    let end = admin.list_offset(TOPIC, 0, ferry_client::OffsetSpec::Latest).await?;
    assert_eq!((end.log_end_offset, end.fence_epoch, end.stored_end_offset), (1, Some(5), 1));
    broker.kill9().await?;
    broker.restart().await?;
    fenced(send_one(ops()?, 1).await, 5, "failover f-1");

    // Only an admin lifts it; then the topic takes writes at the next offset.
    assert_status(mirror.unfence_topics(&topics).await, Code::PermissionDenied, &["call FenceTopics"]);
    let out = admin.unfence_topics(&topics).await?;
    assert!(out[0].result.as_ref().is_ok_and(|t| t.fence.is_none()), "{out:?}");
    assert_eq!(send_one(ops()?, 1).await?.offset, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_when_the_fence_was_written_refuses_writes_when_it_comes_back_and_leads() -> anyhow::Result<()> {
    let mut cluster = cluster_with_topic(ClusterSpec::default(), TOPIC, 1, "raft3").await?;
    let ttl = cluster.spec().lease_ttl;
    let p = Producer::new(client(&cluster), ProducerConfig::default()).await?;
    let acked = produce(&p, TOPIC, 0, 0..20).await?;
    p.close().await;
    let zombie = placement(&cluster, 1, TOPIC, 0).await?.leader_id;
    let others: Vec<u32> = (1..=3).filter(|i| *i != zombie).collect();
    cluster.broker(zombie).kill9().await?;

    // The fence is written while the leader is down.
    let admin = Admin::new(client_of(&cluster, others[0]));
    let out = admin.fence_topics(&[TOPIC.to_owned()], 9, "failover f-9").await?;
    assert!(out[0].result.is_ok(), "{out:?}");

    // It comes back and gets in sync; then the two others crash, and it is elected.
    cluster.broker(zombie).restart().await?;
    wait_placement(&cluster, others[0], TOPIC, 0, deadline(&[ttl, ttl, IO_BUDGET]), |pl| pl.isr.len() == 3).await?;
    for id in &others {
        cluster.broker(*id).kill9().await?;
    }
    wait_placement(&cluster, zombie, TOPIC, 0, deadline(&[ttl, ttl, IO_BUDGET]), |pl| pl.leader_id == zombie).await?;
    fenced(send_one(client_of(&cluster, zombie), 20).await, 9, "failover f-9");
    let held = crate::common::read_partition(&client_of(&cluster, zombie), TOPIC, 0).await;
    assert_eq!(held, acked, "reads go on at the fenced leader, and it holds exactly what was acknowledged");

    // The others come back; lifted (by an admin), the topic takes the next write at the next offset once its leader
    // took the record.
    for id in &others {
        cluster.broker(*id).restart().await?;
    }
    wait_placement(&cluster, zombie, TOPIC, 0, deadline(&[ttl, ttl, IO_BUDGET]), |pl| pl.isr.len() == 3).await?;
    let admin = Admin::new(client(&cluster));
    admin.unfence_topics(&[TOPIC.to_owned()]).await?;
    let leader = Admin::new(client_of(&cluster, zombie));
    wait_until("the leader took the lifted fence", deadline(&[ttl, IO_BUDGET]), async || -> anyhow::Result<bool> {
        Ok(leader.list_offset(TOPIC, 0, ferry_client::OffsetSpec::Latest).await?.fence_epoch.is_none())
    })
    .await?;
    let meta = send_one(client(&cluster), 20).await?;
    assert_eq!(meta.offset, 20);
    Ok(())
}
