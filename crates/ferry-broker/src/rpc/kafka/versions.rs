//! The APIs the Kafka listener advertises, generated from the compatibility ledger `docs/kafka-compat.toml`
//! (compiled in). Its tests hold the ledger to its rules: Kafka's API names, floors never above Kafka 4.x's, and
//! every advertised API proved by named end-to-end tests that exist.

use std::collections::BTreeMap;

use kafka_protocol::messages::ApiKey;
use serde::Deserialize;

/// Every API `handlers::handle` (or, for SASL, the connection) answers: the ledger may advertise only these.
pub const HANDLED: &[ApiKey] = &[
    ApiKey::ApiVersions,
    ApiKey::Metadata,
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ListOffsets,
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
    ApiKey::CreateTopics,
    ApiKey::DeleteTopics,
    ApiKey::CreatePartitions,
    ApiKey::InitProducerId,
    ApiKey::ListGroups,
    ApiKey::DescribeGroups,
    ApiKey::DeleteGroups,
    ApiKey::DescribeConfigs,
    ApiKey::IncrementalAlterConfigs,
    ApiKey::SaslHandshake,
    ApiKey::SaslAuthenticate,
];

/// The ledger's text.
pub const LEDGER: &str = include_str!("../../../../../docs/kafka-compat.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    api: Vec<Entry>,
}

/// One advertised API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Kafka's name of the API (`ApiKey`'s variant name).
    pub name: String,
    /// Lowest version served.
    pub min: i16,
    /// Highest version served.
    pub max: i16,
    /// The end-to-end tests that prove it.
    pub tests: Vec<String>,
}

/// The advertised versions of each API key.
#[derive(Debug, Clone)]
pub struct Versions {
    by_key: BTreeMap<i16, (i16, i16)>,
    entries: Vec<Entry>,
}

impl Versions {
    /// Parses the ledger; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Versions, String> {
        let file: File = toml::from_str(text).map_err(|e| format!("docs/kafka-compat.toml: {e}"))?;
        let mut by_key = BTreeMap::new();
        for e in &file.api {
            let key = key_named(&e.name).ok_or_else(|| format!("{:?} is not a Kafka API", e.name))?;
            if e.min < 0 || e.min > e.max {
                return Err(format!("{}: versions {}..={} are not a range", e.name, e.min, e.max));
            }
            if !HANDLED.contains(&key) {
                return Err(format!("{} is listed, but no handler of the Kafka listener answers it", e.name));
            }
            if by_key.insert(key as i16, (e.min, e.max)).is_some() {
                return Err(format!("{} is listed twice", e.name));
            }
        }
        Ok(Versions { by_key, entries: file.api })
    }

    /// The compiled-in ledger.
    pub fn ledger() -> Result<Versions, String> {
        Versions::parse(LEDGER)
    }

    /// The versions served for `key`, when it is advertised.
    pub fn range(&self, key: i16) -> Option<(i16, i16)> {
        self.by_key.get(&key).copied()
    }

    /// Every advertised key with its versions, in key order.
    pub fn all(&self) -> impl Iterator<Item = (i16, i16, i16)> + '_ {
        self.by_key.iter().map(|(&k, &(min, max))| (k, min, max))
    }

    /// The ledger's entries.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

/// The API key Kafka names `name`.
pub fn key_named(name: &str) -> Option<ApiKey> {
    ApiKey::iter().find(|k| format!("{k:?}") == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_parses_and_names_only_kafka_apis() {
        let v = Versions::ledger().unwrap();
        assert!(v.range(ApiKey::ApiVersions as i16).is_some());
        assert!(v.range(ApiKey::EndTxn as i16).is_none(), "transactions are not advertised");
        assert!(v.range(ApiKey::OffsetForLeaderEpoch as i16).is_none());
    }

    #[test]
    fn no_floor_is_above_kafka_4s() {
        // The kafka-protocol crate's valid versions are Kafka 4.x's message schemas, after KIP-896's removals.
        let v = Versions::ledger().unwrap();
        for e in v.entries() {
            let key = key_named(&e.name).unwrap();
            let kafka = key.valid_versions();
            assert!(e.min <= kafka.min, "{}: floor {} is above Kafka 4.x's {}", e.name, e.min, kafka.min);
            assert!(
                e.max <= kafka.max,
                "{}: {} is above the newest version Kafka defines ({})",
                e.name,
                e.max,
                kafka.max
            );
        }
    }

    #[test]
    fn every_advertised_api_names_tests_that_exist() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/kafka_wire");
        let mut sources = String::new();
        for f in std::fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|x| x == "rs") {
                sources.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
        for e in Versions::ledger().unwrap().entries() {
            assert!(!e.tests.is_empty(), "{} is advertised without a test that proves it", e.name);
            for t in &e.tests {
                assert!(
                    sources.contains(&format!("async fn {t}(")) || sources.contains(&format!("fn {t}(")),
                    "{} names test {t}, which tests/kafka_wire/ does not have",
                    e.name
                );
            }
        }
    }

    #[test]
    fn a_bad_ledger_is_refused_with_a_reason() {
        let bad = "[[api]]\nname = \"Produc\"\nmin = 3\nmax = 9\ntests = []\n";
        assert!(Versions::parse(bad).unwrap_err().contains("not a Kafka API"));
        let unhandled = "[[api]]\nname = \"EndTxn\"\nmin = 0\nmax = 1\ntests = []\n";
        assert!(Versions::parse(unhandled).unwrap_err().contains("no handler"));
        let twice = "[[api]]\nname = \"Fetch\"\nmin = 4\nmax = 9\ntests = []\n[[api]]\nname = \"Fetch\"\nmin = 4\nmax = 9\ntests = []\n";
        assert!(Versions::parse(twice).unwrap_err().contains("twice"));
    }
}
