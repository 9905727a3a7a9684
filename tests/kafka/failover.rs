//! Bootstrap failover between two routes to one Kafka cluster: two fault proxies in front of the same tansu. The
//! primary is cut; the Egress switches to the backup, the consumer is rebuilt on the backup's bootstrap servers
//! and resumes from the cache offsets: nothing lost, nothing duplicated. (Kafka clients follow the cluster's
//! advertised listeners after bootstrap, here tansu's own address.)

use std::time::Duration;

use ferry_testkit::Proxy;

use crate::common::{
    Ferry, SideConf, events, io_deadline, mirror_toml, monitor_get, read_ferry, start_mirror, wait_ferry_leo,
};
use crate::kafka_support::{Tansu, consume, create_topic, digest, produce};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_the_primary_route_switches_to_the_backup_bootstrap_without_loss() -> anyhow::Result<()> {
    let k = Tansu::start("kafka-a").await;
    let dst = Ferry::start("dc-b").await?;
    let primary = Proxy::start(k.bootstrap().parse()?).await?;
    let backup = Proxy::start(k.bootstrap().parse()?).await?;
    create_topic(&k, "orders", 1).await;
    produce(&k, "orders", 0, 300, 1, &[]).await;
    let mut source = SideConf::new("kafka-a", "kafka", &primary.addr().to_string());
    source.routes.push(("backup".into(), vec![backup.addr().to_string()]));
    let target = SideConf::new("dc-b", "ferry", &dst.addr());
    let mut mirror =
        start_mirror(&mirror_toml("kafka-a_to_dc-b", &source, &target, "identity", "^orders$", "")).await?;
    wait_ferry_leo(&dst, "orders", 0, 300).await?;
    assert_eq!(monitor_get(&mirror, "/api/v1/egress").await?["active"], "primary");

    primary.cut();
    ferry_testkit::wait_until("the mirror to switch to the backup route", io_deadline(), async || {
        Ok::<_, anyhow::Error>(monitor_get(&mirror, "/api/v1/egress").await?["active"] == "backup")
    })
    .await?;
    let switched = events(&mirror, "source_net_be_switched").await?;
    assert!(!switched.is_empty());
    produce(&k, "orders", 0, 200, 2, &[]).await;
    let truth = consume(&k, "orders", 0, 0).await;
    wait_ferry_leo(&dst, "orders", 0, truth.last().unwrap().offset + 1).await?;
    let got = read_ferry(&dst, "orders", 0).await?;
    assert_eq!(digest(&got), digest(&truth));
    assert_eq!(got, truth);
    assert!(backup.stats().connections_accepted > 0, "the backup's bootstrap servers were used");
    mirror.terminate(Duration::from_secs(20)).await?;
    Ok(())
}
