//! `FERRY_BROKER__SECTION__KEY` environment variables override the config file, and the command-line flags
//! override both (conf/broker.toml, docs/broker.md): the precedence defaults < file < environment < flags.

use ferry_client::Code;
use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;
use ferry_testkit::BrokerProcess;

use crate::common::{assert_status, connect, leos, plain_batch};

const TS0: i64 = 1_700_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_overrides_the_file_and_flags_override_the_environment() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let file = "[broker]\nmax_batch_bytes = \"1MiB\"\n[storage]\nflush = \"async\"\nretention = \"0s\"\n";
    let broker = BrokerProcess::builder()
        .cluster_id("from-the-flag")
        .config(file)
        .env("FERRY_BROKER__BROKER__MAX_BATCH_BYTES", "64KiB")
        .env("FERRY_BROKER__STORAGE__FLUSH", "sync")
        .env("FERRY_BROKER__STORAGE__RETENTION", "2h")
        // The flag --cluster-id (which the testkit passes) wins over this.
        .env("FERRY_BROKER__BROKER__CLUSTER_ID", "from-the-env")
        .start()
        .await?;
    let (client, admin) = connect(&broker);

    let meta = admin.metadata().await?;
    assert_eq!(meta.max_batch_bytes, 64 * 1024, "the environment's max_batch_bytes, not the file's 1 MiB");
    assert_eq!(meta.cluster_id, "from-the-flag", "the flag wins over the environment");

    // Topic defaults come from the environment too: a new topic's effective config shows them.
    let topic = admin.create_topic("env", 1, TopicConfig::default(), None).await?;
    let config = topic.config.clone().unwrap_or_default();
    assert_eq!(config.flush.as_deref(), Some("sync"), "{config:?}");
    assert_eq!(config.retention_ms, Some(2 * 3600 * 1000), "{config:?}");
    let described = admin.describe_topic("env").await?;
    assert_eq!(described.topic.config, topic.config, "describe reports the same effective config");

    // The limit is enforced: 70 KiB passes the file's limit but not the environment's.
    let produce = |batches| pb::ProduceRequest { topic: "env".into(), partition: Some(0), key: None, batches };
    let big = "v".repeat(70 * 1024);
    assert_status(
        client.produce(produce(plain_batch(&[big.as_str()], TS0))).await,
        Code::ResourceExhausted,
        &["exceeds max_batch_bytes (65536)"],
    );
    assert_eq!(leos(&admin, "env").await, vec![0], "the refused batch wrote nothing");
    let small = "v".repeat(60 * 1024);
    client.produce(produce(plain_batch(&[small.as_str()], TS0))).await?;
    assert_eq!(leos(&admin, "env").await, vec![1]);
    Ok(())
}
