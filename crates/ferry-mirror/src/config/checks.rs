//! Value checks and deserializers several sections share: names, addresses, IP and socket addresses, regex
//! lists, librdkafka property tables.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ferry_config::Problems;
use regex::Regex;
use serde::Deserialize;
use serde::de::{self, Deserializer};

/// A name (mirror, cluster alias, route, channel): 1-100 characters of `A-Z a-z 0-9 . _ -`.
pub(super) fn name(p: &mut Problems, key: &str, name: &str) {
    if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        p.push(key, format!("{name:?} must be 1-100 characters of A-Z a-z 0-9 . _ -"));
    }
}

/// A non-empty list of `host:port` addresses.
pub(super) fn addresses(p: &mut Problems, key: &str, list: &[String]) {
    if list.is_empty() {
        p.push(key, "needs at least one \"host:port\" address");
    }
    for (i, a) in list.iter().enumerate() {
        let ok =
            a.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok {
            p.push(format!("{key}[{i}]"), format!("{a:?} is not a \"host:port\" address"));
        }
    }
}

/// A value parsed from a string with [`FromStr`]; `what` completes "is not ...".
fn parsed<'de, D: Deserializer<'de>, T: FromStr>(d: D, what: &str) -> Result<T, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(|_| de::Error::custom(format!("{text:?} is not {what}")))
}

/// An optional IP address (`bind`).
pub(super) fn ip_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    parsed(d, "an IP address").map(Some)
}

/// An `ip:port` socket address (`monitor.listen`).
pub(super) fn socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    parsed(d, "an \"ip:port\" address")
}

/// A list of regexes; a bad one is reported at its index.
pub(super) fn regexes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Regex>, D::Error> {
    struct Pattern(Regex);
    impl<'de> Deserialize<'de> for Pattern {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Pattern, D::Error> {
            let text = String::deserialize(d)?;
            Regex::new(&text).map(Pattern).map_err(|e| de::Error::custom(format!("bad regex {text:?}: {e}")))
        }
    }
    Ok(Vec::<Pattern>::deserialize(d)?.into_iter().map(|p| p.0).collect())
}

/// librdkafka properties (`[source.kafka]`, `[target.kafka]`): keys as librdkafka names them, quoted
/// (`"session.timeout.ms" = "6000"`) or as dotted keys (which TOML nests), values strings, numbers or booleans.
pub(super) fn kafka_props<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let table = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    let mut out = BTreeMap::new();
    flatten(&table, "", &mut out).map_err(de::Error::custom)?;
    Ok(out)
}

fn flatten(
    t: &BTreeMap<String, serde_json::Value>,
    prefix: &str,
    out: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    use serde_json::Value;
    for (k, v) in t {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            Value::String(s) => {
                out.insert(key, s.clone());
            }
            Value::Number(n) => {
                out.insert(key, n.to_string());
            }
            Value::Bool(b) => {
                out.insert(key, b.to_string());
            }
            // Unquoted dotted keys parse as nested tables; accept them as the same property.
            Value::Object(inner) => {
                let inner: BTreeMap<String, Value> = inner.clone().into_iter().collect();
                flatten(&inner, &key, out)?;
            }
            other => return Err(format!("{key:?}: {other} is not a string, number or boolean")),
        }
    }
    Ok(())
}
