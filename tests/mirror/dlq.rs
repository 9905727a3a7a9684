//! The mirror and dead letters (docs/messaging.md, "Message models"): a group's `{group}.dlq` is an ordinary topic,
//! so the target holds it identically, disposition headers and offsets included; the groups' state in
//! `__ferry_queues` stays on the source.

use std::time::Duration;

use ferry_client::{Outcome, ProducerRecord, ShareConfig, ShareConsumer, ShareMode};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_copies_a_dead_letter_topic_identically_and_no_group_state() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic("orders", 2).await?;
    let producer = ferry_client::Producer::new(a.client.clone(), ferry_client::ProducerConfig::default()).await?;
    for i in 0..40u32 {
        let r = ProducerRecord::new("orders", format!("o{i}"))
            .with_partition(i % 2)
            .with_key(format!("k{i}"))
            .with_header("ferry-retries", "0")
            .with_header("n", i.to_string());
        producer.send(r).await?.await?;
    }
    producer.close().await;
    let mut config = ShareConfig::new("billing", &["orders"], ShareMode::Queue);
    config.from_earliest = true;
    let m = ShareConsumer::join(a.client.clone(), config).await?;
    let mut failed = 0;
    while failed < 40 {
        let got = m.poll(100, Duration::from_millis(300)).await?;
        let outcomes: Vec<_> = got
            .iter()
            .map(|r| {
                (
                    r,
                    if r.offset % 2 == 0 {
                        Outcome::retry("even")
                    } else {
                        Outcome::DeadLetter { reason: "odd".into() }
                    },
                )
            })
            .collect();
        m.ack(&outcomes).await?;
        failed += got.len();
    }
    m.leave().await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.exclude = Vec::new();
    let _mirror = conf.start().await?;
    wait_caught_up(&a, "billing.dlq", &b, "billing.dlq", io_deadline()).await?;
    assert_identical(&a, "billing.dlq", &b, "billing.dlq").await?;
    let copied = read_topic(&b, "billing.dlq").await?;
    let records: Vec<_> = copied.iter().flat_map(|p| p.records.iter()).collect();
    assert_eq!(records.len(), 40, "every dead letter, once");
    assert!(
        records.iter().all(|r| r.headers.iter().any(|h| h.0 == "ferry-dlq-error")
            && r.headers.iter().any(|h| h.0 == "ferry-dlq-offset")),
        "the disposition headers came along"
    );
    let mut names = b.topic_names().await?;
    names.sort();
    assert_eq!(names, vec!["billing.dlq".to_owned(), "orders".to_owned()], "no internal topic was copied");
    Ok(())
}
