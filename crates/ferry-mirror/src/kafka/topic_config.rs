//! Topic configs between Ferry and Kafka. Only retention and segment settings have the same meaning on both; Ferry's
//! flush policy has no Kafka equivalent (Kafka's `flush.ms` / `flush.messages` are per-broker fsync knobs) and is
//! not carried. "Unlimited" is 0 on Ferry and -1 on Kafka.

use ferry_client::proto as pb;

fn unlimited_from_kafka(v: &str) -> Option<u64> {
    let n: i64 = v.trim().parse().ok()?;
    Some(if n < 0 { 0 } else { n as u64 })
}

fn positive(v: &str) -> Option<u64> {
    v.trim().parse::<u64>().ok().filter(|&n| n > 0)
}

/// The shortest `segment_ms` a Ferry broker accepts (its `MIN_SEGMENT_MS`). Kafka allows down to 1 ms; a source
/// topic with less is mirrored at the minimum rather than refused.
const FERRY_MIN_SEGMENT_MS: u64 = 1000;

/// A Ferry topic config from Kafka `(name, value)` pairs; `None` when none of the carried keys is present (the
/// cluster does not describe configs).
pub(crate) fn from_kafka<'a>(entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Option<pb::TopicConfig> {
    let mut c = pb::TopicConfig::default();
    let mut any = false;
    for (name, value) in entries {
        let Some(value) = value else { continue };
        let slot = match name {
            "retention.ms" => (&mut c.retention_ms, unlimited_from_kafka(value)),
            "retention.bytes" => (&mut c.retention_bytes, unlimited_from_kafka(value)),
            "segment.bytes" => (&mut c.segment_bytes, positive(value)),
            "segment.ms" => (&mut c.segment_ms, positive(value).map(|ms| ms.max(FERRY_MIN_SEGMENT_MS))),
            _ => continue,
        };
        if let (field, Some(v)) = slot {
            *field = Some(v);
            any = true;
        }
    }
    any.then_some(c)
}

/// Kafka `(name, value)` pairs for the fields of a Ferry topic config that are set.
pub(crate) fn to_kafka(c: &pb::TopicConfig) -> Vec<(&'static str, String)> {
    let unlimited = |v: u64| if v == 0 { "-1".to_owned() } else { v.to_string() };
    let mut out = Vec::new();
    if let Some(v) = c.retention_ms {
        out.push(("retention.ms", unlimited(v)));
    }
    if let Some(v) = c.retention_bytes {
        out.push(("retention.bytes", unlimited(v)));
    }
    if let Some(v) = c.segment_bytes.filter(|&v| v > 0) {
        out.push(("segment.bytes", v.to_string()));
    }
    if let Some(v) = c.segment_ms.filter(|&v| v > 0) {
        out.push(("segment.ms", v.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_and_sizes_round_trip() {
        let c = from_kafka([
            ("retention.ms", Some("-1")),
            ("retention.bytes", Some("1073741824")),
            ("segment.bytes", Some("104857600")),
            ("cleanup.policy", Some("delete")),
            ("segment.ms", None),
        ])
        .unwrap();
        assert_eq!(c.retention_ms, Some(0));
        assert_eq!(c.retention_bytes, Some(1 << 30));
        assert_eq!(c.segment_bytes, Some(100 << 20));
        assert_eq!(c.segment_ms, None);
        assert_eq!(c.flush, None);
        let back = to_kafka(&c);
        assert_eq!(
            back,
            vec![
                ("retention.ms", "-1".to_owned()),
                ("retention.bytes", "1073741824".to_owned()),
                ("segment.bytes", "104857600".to_owned())
            ]
        );
    }

    #[test]
    fn a_segment_age_below_ferrys_minimum_is_raised_to_it() {
        assert_eq!(from_kafka([("segment.ms", Some("10"))]).unwrap().segment_ms, Some(1000));
        assert_eq!(from_kafka([("segment.ms", Some("604800000"))]).unwrap().segment_ms, Some(604_800_000));
    }

    #[test]
    fn nothing_described_is_no_config() {
        assert_eq!(from_kafka([("cleanup.policy", Some("compact"))]), None);
        assert_eq!(from_kafka(std::iter::empty()), None);
    }
}
