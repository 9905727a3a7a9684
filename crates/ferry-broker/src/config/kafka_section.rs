//! `[kafka]`: the Kafka wire-protocol listener (docs/kafka.md, "The Kafka listener"). Off unless `listen` is set.

use std::net::SocketAddr;
use std::time::Duration;

use bytesize::ByteSize;
use ferry_config::{Problems, de};
use serde::Deserialize;

use super::TlsSection;

/// `[kafka]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSection {
    /// Address the Kafka listener binds. Unset: no Kafka listener.
    pub listen: Option<SocketAddr>,
    /// `host:port` Kafka clients are told to connect to (Metadata, FindCoordinator). Default: the bound address.
    pub advertised_address: Option<String>,
    /// Whether a Metadata request may create a topic it names (when the client allows it too).
    pub auto_create_topics: bool,
    /// Partitions of an auto-created topic, and of CreateTopics asking for the default (-1).
    pub default_partitions: u32,
    /// Largest request frame accepted; a larger size prefix closes the connection before anything is read.
    pub max_request_bytes: ByteSize,
    /// Most Kafka connections open at once; one past it is closed at accept.
    pub max_connections: usize,
    /// Require SASL/PLAIN before any request but ApiVersions and the SASL ones: the password is one of the
    /// broker's tokens, and the token's scopes apply to every request. Required on a broker with tokens.
    pub sasl: bool,
    /// How long a connection may take to authenticate (TLS and SASL) before it is closed.
    #[serde(deserialize_with = "de::duration")]
    pub auth_timeout: Duration,
    /// TLS for the Kafka listener (rustls). Unset: plaintext.
    pub tls: Option<TlsSection>,
}

impl Default for KafkaSection {
    fn default() -> Self {
        KafkaSection {
            listen: None,
            advertised_address: None,
            auto_create_topics: false,
            default_partitions: 1,
            max_request_bytes: ByteSize::mib(8),
            max_connections: 1024,
            sasl: false,
            auth_timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

impl KafkaSection {
    /// Whether the Kafka listener runs.
    pub fn enabled(&self) -> bool {
        self.listen.is_some()
    }

    /// Every problem of `[kafka]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        if !(1..=10_000).contains(&self.default_partitions) {
            p.push("kafka.default_partitions", format!("{} is outside 1..10000", self.default_partitions));
        }
        let max = self.max_request_bytes.as_u64();
        if !(1024..=1 << 30).contains(&max) {
            p.push("kafka.max_request_bytes", format!("{} is outside 1KiB..1GiB", self.max_request_bytes));
        }
        if self.max_connections == 0 {
            p.push("kafka.max_connections", "must be above 0");
        }
        if self.auth_timeout.is_zero() {
            p.push("kafka.auth_timeout", "must be above 0");
        }
        if self.tls.as_ref().is_some_and(|t| t.client_ca_file.is_some()) {
            p.push("kafka.tls.client_ca_file", "client certificates are not supported on the Kafka listener");
        }
        if let Some(a) = &self.advertised_address
            && a.rsplit_once(':').is_none_or(|(h, port)| h.is_empty() || port.parse::<u16>().is_err())
        {
            p.push("kafka.advertised_address", format!("{a:?} is not host:port"));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::BrokerConfig;

    #[test]
    fn bad_kafka_settings_are_named() {
        let bad = "[kafka]\nlisten = \"127.0.0.1:9092\"\ndefault_partitions = 0\nmax_request_bytes = \"10B\"\n\
                   max_connections = 0\nadvertised_address = \"nohost\"\n";
        let err = BrokerConfig::from_toml(bad, false).unwrap_err().to_string();
        for key in
            ["kafka.default_partitions", "kafka.max_request_bytes", "kafka.max_connections", "kafka.advertised_address"]
        {
            assert!(err.contains(key), "{key} in {err}");
        }
        let on_cluster =
            "[kafka]\nlisten = \"127.0.0.1:9092\"\n[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nbroker_id = 1\n";
        let member = BrokerConfig::from_toml(on_cluster, false).unwrap();
        assert!(member.kafka.enabled() && member.cluster.enabled());
        let client_certs = "[kafka]\nlisten = \"127.0.0.1:9092\"\nauth_timeout = \"0s\"\n\
                            [kafka.tls]\ncert_file = \"c\"\nkey_file = \"k\"\nclient_ca_file = \"ca\"\n";
        let err = BrokerConfig::from_toml(client_certs, false).unwrap_err().to_string();
        assert!(err.contains("kafka.auth_timeout") && err.contains("kafka.tls.client_ca_file"), "{err}");
        let ok =
            BrokerConfig::from_toml("[kafka]\nlisten = \"127.0.0.1:0\"\nauto_create_topics = true\n", false).unwrap();
        assert!(ok.kafka.enabled() && ok.kafka.auto_create_topics);
    }
}
