//! Kafka clients' compressed batches (gzip, snappy, lz4, zstd) are decompressed, within the broker's bound, and
//! stored exactly; they are served back uncompressed and read exactly.

use ferry_client::admin::TopicConfig;
use serde_json::json;

use crate::support::{Rec, Wire, assert_same, expected_range, run_client, run_client_with};

#[tokio::test]
async fn compressed_batches_of_every_kafka_codec_are_stored_exactly() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        w.admin.create_topic(codec, 2, TopicConfig::default(), None).await?;
        let config = json!({"compression.type": codec, "linger.ms": 50});
        let acked =
            run_client_with("confluent", &w.kafka, &["produce", codec, "2", codec, "0", "300"], &config).await?;
        assert_eq!(acked, vec![json!({"acked": 300, "unflushed": 0})], "{codec}");
        let mut stored = Vec::new();
        for p in 0..2 {
            stored.extend(w.read_grpc(codec, p).await?.iter().map(|r| Rec::of_ferry(p, r)));
        }
        stored.sort();
        assert_same(&format!("{codec} batches read through gRPC"), &stored, &expected_range(codec, 2, 0, 300));
        let read = run_client("confluent", &w.kafka, &["consume", codec, codec, "300"]).await?;
        let mut read: Vec<Rec> = read.iter().filter_map(|l| l.get("rec")).map(Rec::of).collect();
        read.sort();
        assert_same(&format!("{codec} batches read through Kafka"), &read, &expected_range(codec, 2, 0, 300));
    }
    Ok(())
}
