//! Transactional messages against plain idempotent produce, side by side on one release broker:
//!
//! ```text
//! cargo build --release -p ferry-broker
//! cargo bench --bench txn
//! ```
//!
//! - plain: an idempotent producer sends 1 KiB records as fast as it is acknowledged (the yardstick);
//! - transactional, 1 and 10 messages of 1 KiB per transaction: `prepare` then `commit`, with 64 transactions in
//!   flight over 8 producer groups (one partition of `__ferry_transactions` each, so that the owners' partition
//!   locks do not serialise them all);
//! - the ratios `txn / plain` in records per second.
//!
//! The broker flushes topics asynchronously (its default); the internal topic is flushed on every write, as the
//! transactions' durability needs. Numbers are printed, never asserted.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry::{BrokerClient, ClientConfig, ProducerRecord, Transactions};
use ferry_client::admin::{Admin, TopicConfig};

mod support;

const RECORD_BYTES: usize = 1024;
const PARTITIONS: u32 = 8;
const PLAIN_RECORDS: usize = 100_000;
const IN_FLIGHT: usize = 64;
const GROUPS: usize = 8;

fn main() -> ExitCode {
    support::block_on_main(run())
}

/// Group names that hash to distinct partitions of the 8 of `__ferry_transactions`.
fn groups() -> Vec<String> {
    let mut taken = Vec::new();
    let mut out = Vec::new();
    for i in 0.. {
        let name = format!("bench-{i}");
        let k = ferry_client::proto::partition_for_key(name.as_bytes(), 8);
        if !taken.contains(&k) {
            taken.push(k);
            out.push(name);
        }
        if out.len() == GROUPS {
            break;
        }
    }
    out
}

/// Runs `txns` transactions of `per` messages each; returns records per second.
async fn transactional(client: &BrokerClient, topic: &str, txns: usize, per: usize, tag: &str) -> anyhow::Result<f64> {
    let value = Bytes::from(vec![b't'; RECORD_BYTES]);
    let groups = groups();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..IN_FLIGHT {
        let t = Transactions::new(client.clone(), groups[w % GROUPS].clone());
        let (topic, value, tag) = (topic.to_owned(), value.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < txns {
                let id = format!("{tag}-{i}");
                let records = (0..per)
                    .map(|j| {
                        ProducerRecord::new(topic.clone(), value.clone()).with_partition(((i + j) as u32) % PARTITIONS)
                    })
                    .collect();
                t.prepare(&id, records).await?;
                t.commit(&id).await?;
                i += IN_FLIGHT;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((txns * per) as f64 / start.elapsed().as_secs_f64())
}

async fn run() -> anyhow::Result<()> {
    let broker = support::broker("bench-txn").await?;
    let addr = broker.addr().to_string();
    let client = BrokerClient::new(ClientConfig::new([addr.clone()]))?;
    let admin = Admin::new(client.clone());
    for topic in ["plain", "txn1", "txn10"] {
        admin.create_topic(topic, PARTITIONS, TopicConfig::default(), None).await?;
    }
    let elapsed =
        support::produce_keyed(&addr, "plain", PLAIN_RECORDS, RECORD_BYTES, PARTITIONS, Duration::from_millis(5))
            .await?;
    let plain = PLAIN_RECORDS as f64 / elapsed.as_secs_f64();
    let one = transactional(&client, "txn1", 5_000, 1, "one").await?;
    let ten = transactional(&client, "txn10", 2_000, 10, "ten").await?;
    println!("plain idempotent produce, 1 KiB            {plain:>10.0} records/s");
    println!("transactional, 1 message per transaction   {one:>10.0} records/s  ({one:.0} transactions/s)");
    println!("transactional, 10 messages per transaction {ten:>10.0} records/s  ({:.0} transactions/s)", ten / 10.0);
    println!("RATIO txn(1) / plain idempotent produce    {:>10.3}", one / plain);
    println!("RATIO txn(10) / plain idempotent produce   {:>10.3}", ten / plain);
    Ok(())
}
