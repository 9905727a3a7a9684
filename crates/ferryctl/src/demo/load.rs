//! The demo's sample load: orders keyed by customer (`customer-N`), a small JSON value and a `content-type` header,
//! produced at a steady rate through the idempotent [`Producer`] until stopped.
//!
//! Pacing follows the clock (records due = rate x elapsed), sending at most a tenth of a second's worth per 10 ms
//! tick, so a slow machine lowers the rate instead of bursting. Every delivery is awaited in send order by a
//! collector task; [`Load::stop`] returns only when every record was acknowledged or failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use bytes::Bytes;
use ferry_client::{BrokerClient, ClientError, DeliveryFuture, Producer, ProducerConfig, ProducerRecord};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running load.
pub struct Load {
    stop: CancellationToken,
    sender: JoinHandle<anyhow::Result<()>>,
    collector: JoinHandle<(u64, Option<ClientError>)>,
    acked: Arc<AtomicU64>,
}

impl Load {
    /// Starts producing `rate` records per second to `topic`.
    pub async fn start(client: BrokerClient, topic: &str, rate: u32) -> anyhow::Result<Load> {
        let producer = Producer::new(client, ProducerConfig::default()).await.context("cannot start the producer")?;
        let stop = CancellationToken::new();
        let acked = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<DeliveryFuture>(65_536);
        let collector = tokio::spawn(collect(rx, Arc::clone(&acked)));
        let sender = tokio::spawn(produce(producer, topic.to_owned(), u64::from(rate), tx, stop.clone()));
        Ok(Load { stop, sender, collector, acked })
    }

    /// Records acknowledged so far.
    pub fn acknowledged(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Stops sending, waits for every acknowledgement, and returns how many records were acknowledged.
    pub async fn stop(self) -> anyhow::Result<u64> {
        self.stop.cancel();
        let sent = self.sender.await.context("the load task failed")?;
        let (acked, failure) = self.collector.await.context("the acknowledgement task failed")?;
        sent?;
        match failure {
            Some(e) => Err(anyhow!("the sample load failed after {acked} acknowledged records: {e}")),
            None => Ok(acked),
        }
    }
}

async fn produce(
    producer: Producer,
    topic: String,
    rate: u64,
    tx: mpsc::Sender<DeliveryFuture>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break Ok(()),
            _ = tick.tick() => {}
        }
        let due = (rate as f64 * started.elapsed().as_secs_f64()) as u64;
        let burst = due.saturating_sub(sent).min(rate.div_ceil(10).max(1));
        let mut failed = None;
        for _ in 0..burst {
            match producer.send(order(&topic, sent)).await {
                Ok(delivery) => {
                    if tx.send(delivery).await.is_err() {
                        failed = Some(anyhow!("the acknowledgement task stopped"));
                        break;
                    }
                    sent += 1;
                }
                Err(e) => {
                    failed = Some(anyhow!("cannot send to {topic}: {e}"));
                    break;
                }
            }
        }
        if let Some(e) = failed {
            break Err(e);
        }
    };
    drop(tx);
    producer.close().await;
    result
}

async fn collect(mut rx: mpsc::Receiver<DeliveryFuture>, acked: Arc<AtomicU64>) -> (u64, Option<ClientError>) {
    let mut first = None;
    while let Some(delivery) = rx.recv().await {
        match delivery.await {
            Ok(_) => {
                acked.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    (acked.load(Ordering::Relaxed), first)
}

/// Order number `i`: keyed by one of 1,000 customers, so each customer's orders stay in order in one partition.
pub fn order(topic: &str, i: u64) -> ProducerRecord {
    let customer = i.wrapping_mul(2_654_435_761) % 1000;
    let items = 1 + i % 5;
    let amount_cents = 500 + i.wrapping_mul(7919) % 20_000;
    let value = format!(
        "{{\"order_id\":{i},\"customer\":\"customer-{customer}\",\"items\":{items},\"amount_cents\":{amount_cents},\
         \"currency\":\"EUR\"}}"
    );
    ProducerRecord::new(topic, Bytes::from(value))
        .with_key(Bytes::from(format!("customer-{customer}")))
        .with_header("content-type", Bytes::from_static(b"application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_keyed_json_with_a_header() {
        let r = order("orders", 7);
        let key = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
        assert!(key.starts_with("customer-"), "{key}");
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["order_id"], 7);
        assert_eq!(v["customer"], key.as_str());
        assert_eq!(v["currency"], "EUR");
        assert_eq!(r.headers.len(), 1);
        assert_eq!(r.headers[0].key, "content-type");
        assert_eq!(r.topic, "orders");
    }
}
