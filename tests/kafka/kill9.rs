//! kill -9 of the mirror in the middle of a kafka -> ferry and of a ferry -> kafka run: after a restart, the target
//! holds every source record exactly once (Ferry: the same offsets; Kafka: each source offset once in the
//! provenance headers, the killed process's open transaction fenced).

use crate::common::{
    Ferry, SideConf, mirror_toml, produce_ferry, read_ferry, start_mirror, wait_ferry_leo, wait_kafka_records,
};
use crate::kafka_support::{Tansu, consume, create_topic, digest, header, produce, strip_provenance};

/// Small appends, slowly: the kill lands mid-copy.
const RATE: &str = "max_records_per_sec = 200\nmax_request_bytes = \"64KiB\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_kafka_to_ferry_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    let k = Tansu::start("kafka-a").await;
    let dst = Ferry::start("dc-b").await?;
    create_topic(&k, "orders", 1).await;
    // Records of up to 3 KB: the consumer's batches (512 KiB) hold a few hundred, so the copy takes many appends.
    produce(&k, "orders", 0, 2000, 1, &["--size", "3000"]).await;
    let source = SideConf::new("kafka-a", "kafka", &k.bootstrap());
    let target = SideConf::new("dc-b", "ferry", &dst.addr());
    let mut mirror =
        start_mirror(&mirror_toml("kafka-a_to_dc-b", &source, &target, "identity", "^orders$", RATE)).await?;
    wait_ferry_leo(&dst, "orders", 0, 200).await?;
    mirror.kill9().await?;
    let copied = dst.leos("orders").await[0];
    assert!(copied < 2000, "the kill must land mid-copy ({copied} copied)");
    produce(&k, "orders", 0, 500, 2, &["--size", "3000"]).await;
    mirror.restart().await?;
    let truth = consume(&k, "orders", 0, 0).await;
    assert_eq!(truth.len(), 2500);
    wait_ferry_leo(&dst, "orders", 0, truth.last().unwrap().offset + 1).await?;
    let got = read_ferry(&dst, "orders", 0).await?;
    assert_eq!(digest(&got), digest(&truth));
    assert_eq!(got, truth);
    mirror.terminate(std::time::Duration::from_secs(20)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_ferry_to_kafka_resumes_from_provenance_without_duplicates() -> anyhow::Result<()> {
    let src = Ferry::start("dc-a").await?;
    let k = Tansu::start("kafka-b").await;
    src.create_topic("orders", 1).await?;
    produce_ferry(&src, "orders", 0, "a", 0, 2000).await?;
    let source = SideConf::new("dc-a", "ferry", &src.addr());
    let target = SideConf::new("kafka-b", "kafka", &k.bootstrap());
    let mut mirror =
        start_mirror(&mirror_toml("dc-a_to_kafka-b", &source, &target, "identity", "^orders$", RATE)).await?;
    wait_kafka_records(&k, "orders", 0, 200).await?;
    mirror.kill9().await?;
    let copied = consume(&k, "orders", 0, 0).await.len();
    assert!(copied < 2000, "the kill must land mid-copy ({copied} copied)");
    produce_ferry(&src, "orders", 0, "b", 2000, 2500).await?;
    mirror.restart().await?;
    let truth = read_ferry(&src, "orders", 0).await?;
    wait_kafka_records(&k, "orders", 0, truth.len()).await?;
    mirror.terminate(std::time::Duration::from_secs(20)).await?;
    let got = consume(&k, "orders", 0, 0).await;
    let offsets: Vec<u64> = got.iter().map(|r| header(r, "ferry.source.offset").unwrap().parse().unwrap()).collect();
    assert_eq!(offsets, (0..2500).collect::<Vec<u64>>(), "every source offset exactly once, in order");
    let stripped: Vec<_> = got.iter().map(strip_provenance).collect();
    assert_eq!(digest(&stripped), digest(&truth));
    assert_eq!(stripped, truth);
    Ok(())
}
