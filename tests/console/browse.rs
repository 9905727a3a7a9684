//! Browse by offset, by time and newest first; the filter scan and its budget; search by key over a time range.

use std::collections::BTreeSet;

use ferry_client::admin::TopicConfig;
use ferry_client::{Producer, ProducerConfig, ProducerRecord, RecordMetadata};
use serde_json::Value;

use crate::common::{Env, done, found};

const BASE_MS: i64 = 1_700_000_000_000;

fn value(i: u64) -> String {
    if i % 7 == 3 { format!("v{i} needle") } else { format!("v{i}") }
}

/// Produces `n` records in groups of `per_batch`, each group acknowledged before the next (so the log holds
/// several batches); record i has key `k{i%10}`, value [`value`], header `trace: t{i}` and timestamp BASE + i s.
async fn produce(env: &Env, topic: &str, n: u64, per_batch: u64) -> anyhow::Result<Vec<RecordMetadata>> {
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    let mut acks = Vec::new();
    for start in (0..n).step_by(per_batch as usize) {
        let mut pending = Vec::new();
        for i in start..(start + per_batch).min(n) {
            let r = ProducerRecord::new(topic, value(i))
                .with_partition(0)
                .with_key(format!("k{}", i % 10))
                .with_header("trace", format!("t{i}"))
                .with_timestamp(BASE_MS + i as i64 * 1000);
            pending.push(producer.send(r).await?);
        }
        for p in pending {
            acks.push(p.await?);
        }
    }
    producer.close().await;
    Ok(acks)
}

fn offsets(page: &Value) -> Vec<u64> {
    page["records"].as_array().unwrap().iter().map(|r| r["offset"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browse_by_offset_time_and_newest_gives_exact_records_and_filters_find_exactly_their_matches()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("orders", 1, TopicConfig::default(), None).await?;
    let acks = produce(&env, "orders", 200, 40).await?;
    assert_eq!(acks.iter().map(|a| a.offset).collect::<Vec<_>>(), (0..200).collect::<Vec<_>>());
    let base = "/api/v1/clusters/dc1/topics/orders/partitions/0/records";

    // By offset: exactly 50..60 with their keys, values, headers and timestamps.
    let page = env.read(&format!("{base}?offset=50&limit=10")).await?;
    assert_eq!(offsets(&page), (50..60).collect::<Vec<_>>());
    for r in page["records"].as_array().unwrap() {
        let i = r["offset"].as_u64().unwrap();
        assert_eq!(r["key"], format!("k{}", i % 10));
        assert_eq!(r["value"], value(i));
        assert_eq!(r["timestamp"], BASE_MS + i as i64 * 1000);
        assert_eq!(r["headers"], serde_json::json!([{"key": "trace", "value": format!("t{i}")}]));
    }
    assert_eq!((page["log_start_offset"].as_u64(), page["log_end_offset"].as_u64()), (Some(0), Some(200)));
    // By time: the first record at or after BASE + 120.5 s is offset 121.
    let page = env.read(&format!("{base}?timestamp={}&limit=5", BASE_MS + 120_500)).await?;
    assert_eq!(offsets(&page), (121..126).collect::<Vec<_>>());
    // Newest first.
    let page = env.read(&format!("{base}?newest=true&limit=3")).await?;
    assert_eq!(offsets(&page), vec![199, 198, 197]);
    // Hex shows the bytes.
    let page = env.read(&format!("{base}?offset=1&limit=1&format=hex")).await?;
    assert_eq!(page["records"][0]["value"], "7631");

    // A value substring over the whole partition: exactly the matching records, then `end`.
    let scan = "/api/v1/clusters/dc1/topics/orders/scan";
    let lines = env.scan(&format!("{scan}?value=needle&limit=500")).await?;
    let want: Vec<(u64, u64, String, String)> =
        (0..200).filter(|i| i % 7 == 3).map(|i| (0, i, format!("k{}", i % 10), value(i))).collect();
    assert_eq!(found(&lines), want);
    assert_eq!(done(&lines)["stop"], "end");
    assert_eq!(done(&lines)["scanned_records"], 200);
    assert!(lines.iter().any(|l| l["type"] == "progress"), "progress lines stream");
    // A regex on the value, and a header's value by regex.
    let lines = env.scan(&format!("{scan}?value=%5Ev1%5B0-9%5D%24&regex=true")).await?;
    assert_eq!(
        found(&lines).iter().map(|f| f.1).collect::<Vec<_>>(),
        (10..20).filter(|i| i % 7 != 3).collect::<Vec<_>>()
    );
    let lines = env.scan(&format!("{scan}?header=trace%3D%5Et7%5Cd%24&regex=true")).await?;
    assert_eq!(found(&lines).iter().map(|f| f.1).collect::<Vec<_>>(), (70..80).collect::<Vec<_>>());
    // The limit stops it at the third match.
    let lines = env.scan(&format!("{scan}?value=needle&limit=3")).await?;
    assert_eq!(found(&lines).iter().map(|f| f.1).collect::<Vec<_>>(), vec![3, 10, 17]);
    assert_eq!(done(&lines)["stop"], "limit");

    // A one-byte budget reads one batch and stops there: the matches before its resume point, and no others.
    let lines = env.scan(&format!("{scan}?value=needle&budget_bytes=1")).await?;
    let d = done(&lines);
    assert_eq!(d["stop"], "budget", "{d}");
    let resume = d["resume"][0]["next_offset"].as_u64().unwrap();
    assert!(resume > 0 && resume < 200, "{d}");
    let want: Vec<u64> = (0..resume).filter(|i| i % 7 == 3).collect();
    assert_eq!(found(&lines).iter().map(|f| f.1).collect::<Vec<_>>(), want);
    assert_eq!(d["scanned_records"].as_u64(), Some(resume));

    // Bad input is a 400 naming the field.
    let (status, e) = env.get(&format!("{scan}?value=(&regex=true"), Some(crate::common::OPS)).await?;
    assert_eq!((status, e["code"].as_str()), (400, Some("bad_request")));
    assert!(e["reason"].as_str().unwrap().starts_with("value:"), "{e}");
    let (status, _) = env.get(&format!("{base}?offset=1&limit=100000"), Some(crate::common::OPS)).await?;
    assert_eq!(status, 400);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_by_key_over_a_time_range_finds_exactly_that_keys_records_in_every_partition() -> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("events", 3, TopicConfig::default(), None).await?;
    let producer = Producer::new(env.client.clone(), ProducerConfig::default()).await?;
    let mut sent = Vec::new();
    for i in 0..60u64 {
        // Keys user-0..4 land on partitions by the client's key hash; user-2 also goes to each partition by hand.
        let mut r = ProducerRecord::new("events", format!("e{i}"))
            .with_key(format!("user-{}", i % 5))
            .with_timestamp(BASE_MS + i as i64 * 1000);
        if i % 5 == 2 {
            r = r.with_partition((i % 3) as u32);
        }
        sent.push((i, producer.send(r).await?));
    }
    let mut want = BTreeSet::new();
    for (i, ack) in sent {
        let ack = ack.await?;
        if i % 5 == 2 && (10..40).contains(&i) {
            want.insert((u64::from(ack.partition), ack.offset, "user-2".to_owned(), format!("e{i}")));
        }
    }
    producer.close().await;
    assert_eq!(want.iter().map(|w| w.0).collect::<BTreeSet<_>>().len(), 3, "the key is in every partition");
    let lines = env
        .scan(&format!(
            "/api/v1/clusters/dc1/topics/events/scan?key=user-2&key_exact=true&from_time={}&until_time={}",
            BASE_MS + 10_000,
            BASE_MS + 40_000
        ))
        .await?;
    assert_eq!(found(&lines).into_iter().collect::<BTreeSet<_>>(), want);
    assert_eq!(done(&lines)["stop"], "end");
    Ok(())
}
