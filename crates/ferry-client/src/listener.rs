//! Push consumption (the seed's MQListener): a handler `async fn(ShareMessage) -> Outcome` run over a
//! [`ShareConsumer`] of any mode.
//!
//! - **Credits, not pools.** At most `max_in_flight` records are held at once (fetched and not yet settled); a poll
//!   never asks for more than the credit left, so a slow handler holds back the fetching, not a queue.
//! - **Order per key.** Records of one key run one after another in offset order; different keys (and records
//!   without a key) run in parallel, at most `max_per_partition` at once per partition.
//! - **No zombie acks.** A handler past `handler_timeout`, or one that panics, counts as a retry; a clean
//!   [`Listener::stop`] waits for the handlers in flight and settles them before leaving.
//! - `max_rate` bounds handler starts per second.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::share::{Outcome, ShareConsumer, ShareMessage};

/// How a listener runs its handler.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Most records held at once (fetched, not settled).
    pub max_in_flight: usize,
    /// Most handlers running at once per partition.
    pub max_per_partition: usize,
    /// Most handler starts per second; `None`: unbounded.
    pub max_rate: Option<f64>,
    /// A handler running longer counts as a retry.
    pub handler_timeout: Duration,
    /// How long one poll waits for records.
    pub poll_wait: Duration,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            max_in_flight: 64,
            max_per_partition: 16,
            max_rate: None,
            handler_timeout: Duration::from_secs(25),
            poll_wait: Duration::from_millis(500),
        }
    }
}

/// A running listener.
#[derive(Debug)]
pub struct Listener {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<()>>,
}

/// Where a record waits: its partition and key (records without a key each run alone).
type Lane = (String, u32, Option<Bytes>);

impl Listener {
    /// Starts running `handler` over `consumer`'s records.
    pub fn start<H, F>(consumer: Arc<ShareConsumer>, config: ListenerConfig, handler: H) -> Listener
    where
        H: Fn(ShareMessage) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(consumer, config, Arc::new(handler), stop.clone()));
        Listener { stop, task }
    }

    /// Stops fetching, waits for the handlers in flight, settles them, and leaves the group.
    pub async fn stop(self) -> Result<()> {
        self.stop.cancel();
        self.task.await.unwrap_or(Ok(()))
    }
}

async fn run<H, F>(
    consumer: Arc<ShareConsumer>,
    config: ListenerConfig,
    handler: Arc<H>,
    stop: CancellationToken,
) -> Result<()>
where
    H: Fn(ShareMessage) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    let max = config.max_in_flight.max(1);
    let mut held = 0usize;
    let mut waiting: HashMap<Lane, VecDeque<ShareMessage>> = HashMap::new();
    let mut busy: HashMap<Lane, bool> = HashMap::new();
    let mut running_per_partition: HashMap<(String, u32), usize> = HashMap::new();
    let mut running: JoinSet<(Lane, ShareMessage, Outcome)> = JoinSet::new();
    let mut last_start = tokio::time::Instant::now() - Duration::from_secs(1);
    let spacing = config.max_rate.filter(|r| *r > 0.0).map(|r| Duration::from_secs_f64(1.0 / r));
    let mut seq = 0u64;
    // Polls run in a task of their own: a poll is never dropped half-way (the records it took would stay locked to
    // this member until their locks ended).
    let (ask, mut asks) = tokio::sync::mpsc::channel::<u32>(1);
    let (give, mut answers) = tokio::sync::mpsc::channel(1);
    let poller = {
        let consumer = Arc::clone(&consumer);
        let wait = config.poll_wait;
        tokio::spawn(async move {
            while let Some(credit) = asks.recv().await {
                if give.send(consumer.poll(credit, wait).await).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut polling = false;
    loop {
        // Start what may start: the head of every idle lane, within the per-partition bound and the rate.
        let lanes: Vec<Lane> = waiting
            .iter()
            .filter(|(l, q)| !q.is_empty() && !busy.get(*l).copied().unwrap_or(false))
            .map(|(l, _)| l.clone())
            .collect();
        for lane in lanes {
            let pk = (lane.0.clone(), lane.1);
            if running_per_partition.get(&pk).copied().unwrap_or(0) >= config.max_per_partition.max(1) {
                continue;
            }
            if let Some(gap) = spacing {
                let next = last_start + gap;
                if tokio::time::Instant::now() < next {
                    tokio::time::sleep_until(next).await;
                }
                last_start = tokio::time::Instant::now();
            }
            let Some(msg) = waiting.get_mut(&lane).and_then(VecDeque::pop_front) else { continue };
            busy.insert(lane.clone(), true);
            *running_per_partition.entry(pk).or_default() += 1;
            let h = Arc::clone(&handler);
            let timeout = config.handler_timeout;
            running.spawn(async move {
                let copy = msg.clone();
                let outcome = match tokio::spawn(async move { tokio::time::timeout(timeout, h(copy)).await }).await {
                    Ok(Ok(o)) => o,
                    Ok(Err(_)) => Outcome::retry(format!("the handler ran past its {timeout:?} deadline")),
                    Err(e) => Outcome::retry(format!("the handler failed: {e}")),
                };
                (lane, msg, outcome)
            });
        }
        waiting.retain(|_, q| !q.is_empty());
        let credit = max.saturating_sub(held);
        if credit > 0 && !polling && !stop.is_cancelled() && ask.send(credit as u32).await.is_ok() {
            polling = true;
        }
        if stop.is_cancelled() && running.is_empty() && !polling {
            poller.abort();
            // Records fetched but never started go back at once.
            let rest: Vec<ShareMessage> = waiting.drain().flat_map(|(_, q)| q).collect();
            let back: Vec<(&ShareMessage, Outcome)> = rest.iter().map(|m| (m, Outcome::Release)).collect();
            consumer.ack(&back).await?;
            return consumer.leave().await;
        }
        tokio::select! {
            done = running.join_next(), if !running.is_empty() => {
                if let Some(Ok((lane, msg, outcome))) = done {
                    busy.insert(lane.clone(), false);
                    if let Some(n) = running_per_partition.get_mut(&(lane.0.clone(), lane.1)) {
                        *n -= 1;
                    }
                    held -= 1;
                    consumer.ack(&[(&msg, outcome)]).await?;
                }
            }
            polled = answers.recv(), if polling => {
                polling = false;
                let Some(polled) = polled else { return consumer.leave().await };
                for msg in polled? {
                    held += 1;
                    let lane = match &msg.key {
                        Some(k) => (msg.topic.clone(), msg.partition, Some(k.clone())),
                        None => {
                            seq += 1;
                            (msg.topic.clone(), msg.partition, Some(Bytes::from(format!("\0nokey{seq}"))))
                        }
                    };
                    waiting.entry(lane).or_default().push_back(msg);
                }
            }
            _ = stop.cancelled(), if !stop.is_cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)), if !polling && running.is_empty() => {}
        }
    }
}
