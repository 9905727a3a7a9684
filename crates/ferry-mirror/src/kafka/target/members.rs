//! Scale-out membership on a Kafka target: a real Kafka consumer-group member (group `ferry-mirror.{mirror}`)
//! subscribed to the target topics that never fetches: every partition it is assigned is paused at once, and the
//! assignment is what the mirror process mirrors. A background thread polls it (that drives heartbeats and
//! rebalances). The generation reported is counted locally: it grows with every rebalance this member sees.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferry_client::ClientError;
use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;

use crate::cluster::Membership;
use crate::kafka::client::KafkaClients;
use crate::kafka::error::map_error;
use crate::kafka::props::Ctx;

#[derive(Debug, Default)]
struct State {
    generation: u64,
    assignment: Vec<(String, u32)>,
}

/// Consumer context that pauses whatever it is assigned and records the assignment.
struct MemberCtx {
    ctx: Ctx,
    state: Arc<Mutex<State>>,
}

impl ClientContext for MemberCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.ctx.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.ctx.error(error, reason);
    }

    fn stats(&self, _statistics: rdkafka::Statistics) {}
}

impl ConsumerContext for MemberCtx {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut state = self.state.lock();
        match rebalance {
            Rebalance::Assign(tpl) => {
                // Never fetch: the member exists only for the assignment.
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(error = %e, "cannot pause the scale-out member's partitions");
                }
                state.generation += 1;
                let mut assignment: Vec<(String, u32)> =
                    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition() as u32)).collect();
                assignment.sort();
                state.assignment = assignment;
            }
            Rebalance::Revoke(_) => {
                state.generation += 1;
                state.assignment.clear();
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "scale-out group rebalance error"),
        }
    }
}

/// This process's membership in the scale-out group.
pub(crate) struct Member {
    pub(crate) group: String,
    pub(crate) member_id: String,
    topics: Vec<String>,
    consumer: Arc<BaseConsumer<MemberCtx>>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    /// Joins `group` subscribed to `topics`.
    pub(crate) fn join(
        clients: &KafkaClients,
        group: &str,
        member_id: &str,
        topics: Vec<String>,
        session: Duration,
    ) -> Result<Member, ClientError> {
        let session_ms = session.as_millis().max(1000);
        let owned = [
            ("group.id", group.to_owned()),
            ("session.timeout.ms", session_ms.to_string()),
            ("heartbeat.interval.ms", (session_ms / 3).max(100).to_string()),
            ("partition.assignment.strategy", "roundrobin".to_owned()),
            ("auto.offset.reset", "latest".to_owned()),
            ("enable.auto.offset.store", "false".to_owned()),
        ];
        let cfg = clients.consumer_config(&owned)?;
        let state = Arc::new(Mutex::new(State::default()));
        let ctx = MemberCtx { ctx: Ctx::new(format!("target scale-out member of {group}")), state: Arc::clone(&state) };
        let consumer: BaseConsumer<MemberCtx> = cfg.create_with_context(ctx).map_err(|e| {
            ClientError::from(crate::kafka::KafkaSetupError::ClientCreation {
                role: "scale-out member".into(),
                brokers: clients.brokers_text().to_owned(),
                message: e.to_string(),
            })
        })?;
        let consumer = Arc::new(consumer);
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(|e| map_error(&e, "subscribe of scale-out member to", group, clients.brokers_text(), ""))?;
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (consumer, stop) = (Arc::clone(&consumer), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("ferry-kafka-member".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        // Paused partitions deliver nothing; anything that slipped in before the pause is dropped.
                        let _ = consumer.poll(Duration::from_millis(100));
                    }
                })
                .map_err(|e| ClientError::Usage(format!("cannot start the scale-out member thread: {e}")))?
        };
        let member_id = if member_id.is_empty() {
            format!("{}-{}", clients.client_id(), uuid::Uuid::new_v4())
        } else {
            member_id.to_owned()
        };
        Ok(Member { group: group.to_owned(), member_id, topics, consumer, state, stop, poller: Some(poller) })
    }

    /// Whether this member subscribes to exactly `topics`.
    pub(crate) fn subscribes(&self, topics: &[String]) -> bool {
        self.topics == topics
    }

    /// Waits (blocking) until the group assigned a generation newer than `after`, up to `within`.
    pub(crate) fn wait_generation(&self, after: u64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.state.lock().generation <= after && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The current membership; `None` once the group expelled this member.
    pub(crate) fn current(&self) -> Option<Membership> {
        if self.consumer.assignment_lost() {
            return None;
        }
        let state = self.state.lock();
        Some(Membership {
            member_id: self.member_id.clone(),
            generation: state.generation,
            assignment: state.assignment.clone(),
            members: 0,
        })
    }

    /// The generation seen so far.
    pub(crate) fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// Leaves the group (blocking: the consumer closes).
    pub(crate) fn leave(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
        self.consumer.unsubscribe();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
