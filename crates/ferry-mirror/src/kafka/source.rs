//! [`KafkaSource`]: a Kafka-API cluster reached through one egress route, as a [`SourceCluster`].
//!
//! - `probe` fetches metadata within the probe timeout and returns the cluster id librdkafka reports. Each probe
//!   uses a new client that knows only the route's bootstrap servers, so it tests the route itself. A route that
//!   leads to something that does not speak Kafka fails with an error saying so (librdkafka's own reason attached).
//! - Topic ids are `kafka:{name}` ([`super::kafka_topic_id`]): librdkafka does not expose Kafka's topic ids, so a
//!   Kafka topic deleted and re-created under the same name is not detected by its id.
//! - `epoch_end` is always `None`: Kafka keeps leader epochs, but librdkafka does not expose them per record.
//!   Divergence of a Kafka source is detected by log-end checks (the source log end below what was copied) and by
//!   librdkafka's own log-truncation detection in the consumer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_client::proto as pb;
use ferry_client::{ClientError, Code};
use rdkafka::consumer::Consumer;
use rdkafka::error::RDKafkaErrorCode;

use super::client::KafkaClients;
use super::error::{KafkaSetupError, map_error, status};
use super::props::{Side, blocking};
use crate::cluster::EpochAnswer;
use crate::cluster::{Result, SourceCluster};
use crate::tp::SourceTp;

/// Timeout of admin and offset calls (probes use their own).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kafka source route.
#[derive(Debug, Clone)]
pub struct KafkaSource {
    clients: Arc<KafkaClients>,
}

impl KafkaSource {
    /// A source over `bootstrap` (one route's brokers) with the `[source.kafka]` properties. Checks the
    /// properties; connects on first use.
    pub fn new(
        bootstrap: Vec<String>,
        properties: BTreeMap<String, String>,
        mirror: &str,
    ) -> Result<KafkaSource, KafkaSetupError> {
        let clients =
            KafkaClients::new(Side::Source, bootstrap, properties, format!("ferry-mirror.{mirror}"), CALL_TIMEOUT)?;
        Ok(KafkaSource { clients: Arc::new(clients) })
    }

    /// The bootstrap servers.
    pub fn bootstrap(&self) -> &[String] {
        self.clients.brokers()
    }
}

#[async_trait::async_trait]
impl SourceCluster for KafkaSource {
    async fn probe(&self, timeout: Duration) -> Result<String> {
        let c = self.clients.fresh_meta()?;
        let brokers = self.clients.brokers_text().to_owned();
        blocking("probe", move || {
            let started = std::time::Instant::now();
            if let Err(e) = c.fetch_metadata(None, timeout) {
                let code = super::error::code_of(&e);
                let mut err = map_error(&e, "metadata from", &format!("[{brokers}]"), &brokers, &c.context().cause());
                if err.is_transport() || err.is_retriable() {
                    let hint = match c.context().last_error_since(started).and_then(|l| l.code) {
                        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
                            "authentication failed: check the SASL/SSL properties in [source.kafka]"
                        }
                        _ if code == Some(RDKafkaErrorCode::OperationTimedOut) => {
                            "no Kafka answer within the probe timeout: is the route's address a Kafka endpoint, and is it reachable?"
                        }
                        _ => "is the route's address a reachable Kafka endpoint?",
                    };
                    err = match err {
                        ClientError::Status { code, message, broker, reason } => {
                            ClientError::Status { code, message: format!("{message}; {hint}"), broker, reason }
                        }
                        ClientError::Transport { broker, message } => {
                            ClientError::Transport { broker, message: format!("{message}; {hint}") }
                        }
                        other => other,
                    };
                }
                return Err(err);
            }
            let remaining = timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
            c.client().fetch_cluster_id(remaining).ok_or_else(|| {
                status(
                    Code::FailedPrecondition,
                    format!("the Kafka cluster at [{brokers}] reports no cluster id (Kafka before 0.10 is not supported)"),
                    &brokers,
                )
            })
        })
        .await
    }

    async fn list_topics(&self) -> Result<Vec<pb::TopicInfo>> {
        let topics = self.clients.topics().await?;
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let mut configs = self.clients.topic_configs(&names).await;
        Ok(topics
            .into_iter()
            .map(|t| pb::TopicInfo {
                topic_id: super::kafka_topic_id(&t.name),
                config: configs.remove(&t.name).flatten(),
                partitions: t.partitions,
                name: t.name,
                mirror: None,
                created_ms: 0,
                replication: "single".into(),
                risk_phase: false,
                ..Default::default()
            })
            .collect())
    }

    async fn log_offsets(&self, tp: &SourceTp) -> Result<(u64, u64)> {
        let (topic, partition) = (tp.topic(), tp.partition);
        self.clients.watermarks(topic, partition).await
    }

    async fn epoch_end(&self, _tp: &SourceTp, _epoch: u32) -> Result<EpochAnswer> {
        // librdkafka exposes no leader epochs: every batch the mirror builds carries epoch 0.
        Ok(EpochAnswer::Unknown)
    }

    async fn committed(&self, group: &str, partitions: &[SourceTp]) -> Result<Vec<pb::CommittedOffset>> {
        let partitions: Vec<(String, u32)> =
            partitions.iter().map(|tp| (tp.topic().to_owned(), tp.partition)).collect();
        let partitions = partitions.as_slice();
        self.clients.committed(group, partitions).await
    }

    async fn commit(&self, group: &str, offsets: Vec<pb::CommittedOffset>) -> Result<()> {
        self.clients.commit(group, offsets).await
    }

    async fn list_groups(&self) -> Result<Vec<String>> {
        Ok(self.clients.groups(None).await?.into_iter().map(|g| g.name).collect())
    }

    fn reconnect(&self) {
        self.clients.reset();
    }
}
