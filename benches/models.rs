//! The message models against partitioned consumption, side by side on one release broker:
//!
//! ```text
//! cargo build --release -p ferry-broker
//! cargo bench --bench models
//! ```
//!
//! - queue: 8 queue members take and ack (one ack call per poll) every record of a backlog of 1 KiB records,
//!   on a topic of 1 partition and one of 8; the yardstick is a partitioned group of 8 members consuming the same
//!   backlog of a copy of the topic and committing per poll;
//! - broadcast: 3 broadcast members each receive the whole backlog, acking their positions per poll; the yardstick
//!   is one partitioned consumer reading it once;
//! - the ratios, in records per second (broadcast: records delivered, over all members).
//!
//! Numbers are printed, never asserted.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ferry::{
    BrokerClient, ClientConfig, Consumer, ConsumerConfig, OffsetReset, Outcome, ShareConfig, ShareConsumer, ShareMode,
};
use ferry_client::admin::{Admin, TopicConfig};

mod support;

const RECORD_BYTES: usize = 1024;
const RECORDS: usize = 40_000;
const MEMBERS: usize = 8;

fn main() -> ExitCode {
    support::block_on_main(run())
}

/// A partitioned group of `members` reading `topic` until `total` records arrived; records per second.
async fn partitioned(
    client: &BrokerClient,
    topic: &str,
    group: &str,
    members: usize,
    total: usize,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..members {
        let (client, topic, group, done) = (client.clone(), topic.to_owned(), group.to_owned(), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            let config = ConsumerConfig {
                group: Some(group.clone()),
                auto_offset_reset: OffsetReset::Earliest,
                max_wait: Duration::from_millis(100),
                ..ConsumerConfig::default()
            };
            let mut c = Consumer::new(client, config)?;
            c.subscribe(&group, vec![topic]).await?;
            while done.load(Ordering::Relaxed) < total {
                let got = c.poll(Duration::from_millis(100)).await?;
                if !got.is_empty() {
                    done.fetch_add(got.len(), Ordering::Relaxed);
                    c.commit().await?;
                }
            }
            c.close().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// `members` message-model members of `mode` until `total` records were settled (queue) or each member got them
/// all (broadcast, `total` per member); records per second over all members.
async fn modelled(
    client: &BrokerClient,
    topic: &str,
    group: &str,
    mode: ShareMode,
    members: usize,
    total: usize,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicUsize::new(0));
    let mut joined = Vec::new();
    for _ in 0..members {
        let mut config = ShareConfig::new(group, &[topic], mode);
        config.from_earliest = true;
        joined.push(Arc::new(ShareConsumer::join(client.clone(), config).await?));
    }
    let goal = if mode == ShareMode::Broadcast { total * members } else { total };
    let start = Instant::now();
    let mut tasks = Vec::new();
    for m in joined {
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let mut mine = 0;
            while done.load(Ordering::Relaxed) < goal && (mode != ShareMode::Broadcast || mine < total) {
                let got = m.poll(1_000, Duration::from_millis(100)).await?;
                if got.is_empty() {
                    continue;
                }
                let acks: Vec<_> = got.iter().map(|r| (r, Outcome::Ack)).collect();
                m.ack(&acks).await?;
                mine += got.len();
                done.fetch_add(got.len(), Ordering::Relaxed);
            }
            m.leave().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(goal as f64 / start.elapsed().as_secs_f64())
}

async fn run() -> anyhow::Result<()> {
    let broker = support::broker("bench-models").await?;
    let addr = broker.addr().to_string();
    let client = BrokerClient::new(ClientConfig::new([addr.clone()]))?;
    let admin = Admin::new(client.clone());
    for (topic, partitions) in [("q1", 1), ("p1", 1), ("q8", 8), ("p8", 8), ("b8", 8)] {
        admin.create_topic(topic, partitions, TopicConfig::default(), None).await?;
        support::produce_keyed(&addr, topic, RECORDS, RECORD_BYTES, partitions, Duration::from_millis(5)).await?;
    }
    let part1 = partitioned(&client, "p1", "pg1", MEMBERS, RECORDS).await?;
    let queue1 = modelled(&client, "q1", "qg1", ShareMode::Queue, MEMBERS, RECORDS).await?;
    let part8 = partitioned(&client, "p8", "pg8", MEMBERS, RECORDS).await?;
    let queue8 = modelled(&client, "q8", "qg8", ShareMode::Queue, MEMBERS, RECORDS).await?;
    let one = partitioned(&client, "b8", "solo", 1, RECORDS).await?;
    let broadcast = modelled(&client, "b8", "bg", ShareMode::Broadcast, 3, RECORDS).await?;
    println!("{RECORDS} records of {RECORD_BYTES} B, {MEMBERS} members");
    println!("partitioned group, 1 partition            {part1:>10.0} records/s");
    println!("queue group, 1 partition (settled)        {queue1:>10.0} records/s");
    println!("partitioned group, 8 partitions           {part8:>10.0} records/s");
    println!("queue group, 8 partitions (settled)       {queue8:>10.0} records/s");
    println!("one partitioned consumer, 8 partitions    {one:>10.0} records/s");
    println!("broadcast to 3 members (delivered, all)   {broadcast:>10.0} records/s");
    println!("RATIO queue / partitioned, 1 partition    {:>10.3}", queue1 / part1);
    println!("RATIO queue / partitioned, 8 partitions   {:>10.3}", queue8 / part8);
    println!("RATIO broadcast(3) / one consumer         {:>10.3}", broadcast / one);
    Ok(())
}
