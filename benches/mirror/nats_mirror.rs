//! The NATS JetStream mirror the Ferry mirror is measured against (phase 8 of the mirror bench).

use ferry_testkit::{deadline, wait_until};

use super::*;
use crate::support::nats::NatsServer;

/// Phase 8: a hub nats-server (JetStream domain `hub`) holding `records` 1 KiB messages in a file-storage stream,
/// and a leaf nats-server (domain `leaf`) linked to it by a leafnode connection, on which a file-storage stream
/// mirrors the hub's across the domain. Timed like [`mirror_backlog`]: from the mirror stream's creation until it
/// holds every message, steady rate over 10%..90%. `cpu` is the hub's and the leaf's CPU seconds together (the
/// copy runs inside the two servers).
pub(super) async fn nats_mirror(program: &std::path::Path, records: u64) -> Result<MirrorRun> {
    use async_nats::jetstream::{self, stream};
    // A generous store limit on both (the default is a share of the free disk); the streams have no byte limit.
    let leafnode_port = ferry_testkit::reserve_port()?;
    let hub = NatsServer::start_with_config(
        program,
        &format!(
            "server_name: hub\njetstream {{\n  domain: hub\n  max_file_store: 4GB\n}}\n\
             leafnodes {{\n  listen: \"127.0.0.1:{leafnode_port}\"\n}}\n"
        ),
    )
    .await?;
    let leaf = NatsServer::start_with_config(
        program,
        &format!(
            "server_name: leaf\njetstream {{\n  domain: leaf\n  max_file_store: 4GB\n}}\n\
             leafnodes {{\n  remotes: [ {{ url: \"nats-leaf://127.0.0.1:{leafnode_port}\" }} ]\n}}\n"
        ),
    )
    .await?;

    // The backlog: the same count of 1 KiB records as phase 1, dealt over 8 subjects of one stream. Not timed.
    let mut hub_js = jetstream::new(async_nats::connect(&hub.url).await?);
    hub_js.set_timeout(Duration::from_secs(30));
    let subjects: Vec<String> = (0..PARTITIONS).map(|p| format!("lan.p{p}")).collect();
    let mut source = hub_js
        .create_stream(stream::Config {
            name: "LAN".into(),
            subjects: vec!["lan.>".into()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let payload = Bytes::from(vec![b'x'; RECORD]);
    let published = nats::publish_acked(&hub_js, &subjects, records as usize, &payload).await?;
    let held = source.info().await?.state.messages;
    if held != records {
        bail!("the hub stream holds {held} of {records} messages:\n{}", hub.logs());
    }
    println!(
        "nats jetstream backlog: {records} records published to the hub in {:.2} s ({:.0} records/s; not timed)",
        published.as_secs_f64(),
        records as f64 / published.as_secs_f64()
    );

    // The leaf must see the hub's stream through the leafnode link (as `$JS.hub.API`) before the mirror is
    // created. The client turns the mirror's `domain` into that API prefix (`external`); nats-server 2.9 ignores
    // a bare `domain`.
    let leaf_client = async_nats::connect(&leaf.url).await?;
    wait_until("the leaf to see the hub's stream in domain hub", deadline(&[Duration::from_secs(5)]), async || {
        jetstream::with_domain(leaf_client.clone(), "hub").get_stream("LAN").await.map(|_| true)
    })
    .await
    .with_context(|| format!("leaf log:\n{}", leaf.logs()))?;
    let mut leaf_js = jetstream::new(leaf_client);
    leaf_js.set_timeout(Duration::from_secs(30));

    let cpu0 = cpu_seconds(hub.pid()) + cpu_seconds(leaf.pid());
    let mut mirror = leaf_js
        .create_stream(stream::Config {
            name: "LAN_MIRROR".into(),
            storage: stream::StorageType::File,
            mirror: Some(stream::Source { name: "LAN".into(), domain: Some("hub".into()), ..Default::default() }),
            ..Default::default()
        })
        .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut clock = Steady::start(records);
    loop {
        if clock.observe(mirror.info().await?.state.messages) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the nats mirror did not finish:\nleaf log:\n{}", leaf.logs());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (steady, total) = clock.finish();
    Ok(MirrorRun {
        seconds: steady,
        total_seconds: total,
        cpu: cpu_seconds(hub.pid()) + cpu_seconds(leaf.pid()) - cpu0,
        rss_peak_mib: rss_peak_mib(leaf.pid()),
        target_cpu: None,
    })
}
