//! One target partition's producer: idempotent always (per-partition order, no duplicates from retries), and
//! transactional with `transactional.id = ferry-mirror.{mirror}.{topic}.{partition}` when the target supports
//! transactions. Then each append is one transaction, and a new writer of the same partition (this process after
//! a crash, or another mirror process that took the partition over) fences the old one: the old one's open
//! transaction is aborted and its later writes fail. Without transactions, two writers of one partition at the
//! same time can duplicate records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use ferry_batch::Record;
use ferry_client::{ClientError, Code};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::provenance::{Origin, headers_with_provenance};
use crate::kafka::client::KafkaClients;
use crate::kafka::error::{code_of, map_error, status};
use crate::kafka::props::{Ctx, blocking, client_config};

/// Whether the target supports transactions: not probed yet, yes, no.
pub(crate) const TXN_UNKNOWN: u8 = 0;
pub(crate) const TXN_YES: u8 = 1;
pub(crate) const TXN_NO: u8 = 2;

/// A partition's producer and what it knows of the partition.
pub(crate) struct Writer {
    producer: Arc<FutureProducer<Ctx>>,
    ctx: Ctx,
    transactional: bool,
    topic: String,
    partition: u32,
    brokers: String,
    timeout: Duration,
    /// One past the last source offset in the partition.
    pub(crate) log_end: u64,
}

fn fenced(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
    )
}

impl Writer {
    /// Creates the producer (and registers its transactional id, fencing any earlier writer). `log_end` is set by
    /// the caller from the partition's tail, read after this (so that a fenced writer's last transaction is
    /// already aborted).
    pub(crate) async fn open(
        clients: &KafkaClients,
        mirror: &str,
        topic: &str,
        partition: u32,
        transactions: &AtomicU8,
    ) -> Result<Writer, ClientError> {
        let brokers = clients.brokers_text().to_owned();
        let timeout = clients.timeout();
        loop {
            let txn = transactions.load(Ordering::Acquire) != TXN_NO;
            let mut owned = vec![
                ("client.id", clients.client_id().to_owned()),
                ("enable.idempotence", "true".to_owned()),
                ("acks", "all".to_owned()),
            ];
            if txn {
                owned.push(("transactional.id", format!("ferry-mirror.{mirror}.{topic}.{partition}")));
            }
            let defaults = [("linger.ms", "5"), ("transaction.timeout.ms", "60000")];
            let cfg = client_config(clients.side(), clients.brokers(), clients.properties(), &owned, &defaults)?;
            let label = format!("target producer {topic}/{partition} [{brokers}]");
            let ctx = Ctx::new(label);
            let producer: FutureProducer<Ctx> = cfg.create_with_context(ctx.clone()).map_err(|e| {
                ClientError::from(crate::kafka::KafkaSetupError::ClientCreation {
                    role: "producer".into(),
                    brokers: brokers.clone(),
                    message: e.to_string(),
                })
            })?;
            let producer = Arc::new(producer);
            let writer = Writer {
                producer: Arc::clone(&producer),
                ctx: ctx.clone(),
                transactional: txn,
                topic: topic.to_owned(),
                partition,
                brokers: brokers.clone(),
                timeout,
                log_end: 0,
            };
            if !txn {
                return Ok(writer);
            }
            let p = Arc::clone(&producer);
            let init = blocking("init transactions", move || Ok(p.init_transactions(timeout * 3))).await?;
            match init {
                Ok(()) => {
                    transactions.store(TXN_YES, Ordering::Release);
                    return Ok(writer);
                }
                Err(e) if KafkaClients::unsupported(&e) && transactions.load(Ordering::Acquire) == TXN_UNKNOWN => {
                    tracing::warn!(
                        brokers = %brokers,
                        error = %e,
                        "the Kafka target does not support transactions: writing with idempotent producers only, \
                         without zombie fencing (two mirror processes writing one partition at once can duplicate records)"
                    );
                    transactions.store(TXN_NO, Ordering::Release);
                    writer.close();
                }
                Err(e) => {
                    let cause = ctx.cause();
                    writer.close();
                    return Err(map_error(
                        &e,
                        "init transactions for",
                        &format!("{topic}/{partition}"),
                        &brokers,
                        &cause,
                    ));
                }
            }
        }
    }

    /// Whether writes are transactional.
    pub(crate) fn transactional(&self) -> bool {
        self.transactional
    }

    fn error(&self, e: &KafkaError, op: &str) -> ClientError {
        let subject = format!("{}/{}", self.topic, self.partition);
        // A fenced producer fails everything queued (purged) with its fatal error as the cause.
        let fatal = self.producer.client().fatal_error().map(|(code, _)| code);
        if fenced(code_of(e)) || fenced(fatal) {
            return status(
                Code::FailedPrecondition,
                format!(
                    "another writer took over Kafka target partition {subject} (this producer was fenced): another \
                     mirror process with the same mirror.name now writes it; {e}"
                ),
                &self.brokers,
            );
        }
        map_error(e, op, &subject, &self.brokers, &self.ctx.cause())
    }

    /// Writes `records` (source offsets growing) in order, with their provenance; returns each record's (source
    /// offset, target offset). All or nothing when transactional.
    pub(crate) async fn write(
        &self,
        records: &[Record],
        origin: &Origin,
        topic_id: &str,
    ) -> Result<Vec<(u64, u64)>, ClientError> {
        if self.transactional {
            self.producer.begin_transaction().map_err(|e| self.error(&e, "begin transaction on"))?;
        }
        match self.produce(records, origin, topic_id).await {
            Ok(pairs) => {
                if self.transactional {
                    let p = Arc::clone(&self.producer);
                    let timeout = self.timeout * 3;
                    let r = blocking("commit transaction", move || Ok(p.commit_transaction(timeout))).await?;
                    if let Err(e) = r {
                        self.abort().await;
                        return Err(self.error(&e, "commit transaction on"));
                    }
                }
                Ok(pairs)
            }
            Err(e) => {
                if self.transactional {
                    self.abort().await;
                }
                Err(e)
            }
        }
    }

    async fn produce(
        &self,
        records: &[Record],
        origin: &Origin,
        topic_id: &str,
    ) -> Result<Vec<(u64, u64)>, ClientError> {
        let mut pending = Vec::with_capacity(records.len());
        for r in records {
            let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic)
                .partition(self.partition as i32)
                .headers(headers_with_provenance(&r.headers, origin, r.offset, topic_id));
            if let Some(k) = &r.key {
                rec = rec.key(&k[..]);
            }
            if let Some(v) = &r.value {
                rec = rec.payload(&v[..]);
            }
            if r.timestamp >= 0 {
                rec = rec.timestamp(r.timestamp);
            }
            loop {
                match self.producer.send_result(rec) {
                    Ok(delivery) => {
                        pending.push((r.offset, delivery));
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        rec = back;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Err((e, _)) => return Err(self.error(&e, "produce to")),
                }
            }
        }
        let mut pairs = Vec::with_capacity(pending.len());
        for (src, delivery) in pending {
            match delivery.await {
                Ok(Ok(d)) => pairs.push((src, d.offset.max(0) as u64)),
                Ok(Err((e, _))) => return Err(self.error(&e, "produce to")),
                Err(_) => {
                    return Err(status(
                        Code::Unavailable,
                        format!("the producer of {}/{} stopped before delivery", self.topic, self.partition),
                        &self.brokers,
                    ));
                }
            }
        }
        Ok(pairs)
    }

    async fn abort(&self) {
        let p = Arc::clone(&self.producer);
        let timeout = self.timeout;
        let _ = blocking("abort transaction", move || Ok(p.abort_transaction(timeout))).await;
    }

    /// Drops the producer off the async runtime (closing it waits for its threads).
    pub(crate) fn close(self) {
        let producer = self.producer;
        tokio::task::spawn_blocking(move || {
            producer.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
            drop(producer);
        });
    }
}
