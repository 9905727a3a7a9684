//! The three directions with a Kafka-API cluster, each compared record by record: kafka -> ferry keeps every
//! offset (append with offsets); ferry -> kafka and kafka -> kafka carry the source offset in provenance headers.

use crate::common::{
    Ferry, SideConf, mirror_toml, produce_ferry, read_ferry, start_mirror, wait_ferry_leo, wait_kafka_records,
};
use crate::kafka_support::{Tansu, consume, create_topic, digest, header, produce, strip_provenance};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_ferry_keeps_every_offset_key_value_header_and_timestamp() -> anyhow::Result<()> {
    let k = Tansu::start("kafka-a").await;
    let dst = Ferry::start("dc-b").await?;
    create_topic(&k, "orders", 2).await;
    produce(&k, "orders", 0, 400, 1, &[]).await;
    // Transactions, every third aborted: commit markers leave offsets without records.
    produce(&k, "orders", 1, 150, 2, &["--txn", "app-tx", "--abort-every", "3"]).await;
    let truth = [consume(&k, "orders", 0, 0).await, consume(&k, "orders", 1, 0).await];
    let source = SideConf::new("kafka-a", "kafka", &k.bootstrap());
    let target = SideConf::new("dc-b", "ferry", &dst.addr());
    let mut mirror =
        start_mirror(&mirror_toml("kafka-a_to_dc-b", &source, &target, "identity", "^orders$", "")).await?;
    for (p, t) in truth.iter().enumerate() {
        wait_ferry_leo(&dst, "orders", p as u32, t.last().unwrap().offset + 1).await?;
        let got = read_ferry(&dst, "orders", p as u32).await?;
        assert_eq!(got.len(), t.len(), "partition {p}: same count");
        assert_eq!(digest(&got), digest(t), "partition {p}: same digest");
        assert_eq!(&got, t, "partition {p}");
    }
    mirror.terminate(std::time::Duration::from_secs(20)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferry_to_kafka_writes_every_record_once_with_provenance() -> anyhow::Result<()> {
    let src = Ferry::start("dc-a").await?;
    let k = Tansu::start("kafka-b").await;
    src.create_topic("orders", 2).await?;
    for p in 0..2 {
        produce_ferry(&src, "orders", p, "a", 0, 300).await?;
    }
    let source = SideConf::new("dc-a", "ferry", &src.addr());
    let target = SideConf::new("kafka-b", "kafka", &k.bootstrap());
    let mut mirror =
        start_mirror(&mirror_toml("dc-a_to_kafka-b", &source, &target, "identity", "^orders$", "")).await?;
    for p in 0..2u32 {
        let truth = read_ferry(&src, "orders", p).await?;
        let got = wait_kafka_records(&k, "orders", p, truth.len()).await?;
        for r in &got {
            assert_eq!(header(r, "ferry.source.cluster"), Some("dc-a"));
            assert_eq!(header(r, "ferry.source.topic"), Some("orders"));
            assert_eq!(header(r, "ferry.source.partition"), Some(p.to_string().as_str()));
        }
        let stripped: Vec<_> = got.iter().map(strip_provenance).collect();
        assert_eq!(digest(&stripped), digest(&truth), "partition {p}");
        assert_eq!(stripped, truth, "partition {p}");
    }
    mirror.terminate(std::time::Duration::from_secs(20)).await?;
    // Nothing more was written after the mirror caught up and stopped.
    for p in 0..2u32 {
        assert_eq!(consume(&k, "orders", p, 0).await.len(), 300);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_mirrors_under_the_prefix_with_provenance() -> anyhow::Result<()> {
    let a = Tansu::start("kafka-a").await;
    let b = Tansu::start("kafka-b").await;
    create_topic(&a, "orders", 1).await;
    produce(&a, "orders", 0, 250, 3, &["--txn", "app-tx", "--abort-every", "4"]).await;
    let truth = consume(&a, "orders", 0, 0).await;
    let source = SideConf::new("kafka-a", "kafka", &a.bootstrap());
    let target = SideConf::new("kafka-b", "kafka", &b.bootstrap());
    let mut mirror =
        start_mirror(&mirror_toml("kafka-a_to_kafka-b", &source, &target, "prefix", "^orders$", "")).await?;
    let got = wait_kafka_records(&b, "kafka-a.orders", 0, truth.len()).await?;
    let stripped: Vec<_> = got.iter().map(strip_provenance).collect();
    assert_eq!(digest(&stripped), digest(&truth));
    assert_eq!(stripped, truth);
    mirror.terminate(std::time::Duration::from_secs(20)).await?;
    assert_eq!(consume(&b, "kafka-a.orders", 0, 0).await.len(), truth.len(), "no duplicates");
    Ok(())
}
