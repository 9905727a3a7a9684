//! Deserializers for the value types of Ferry's config files, with messages that say what is expected. Use them
//! with `#[serde(deserialize_with = "ferry_config::de::duration")]` and so on.
//!
//! - durations are strings like `"250ms"`, `"5s"`, `"10m"`, `"7days"` (humantime);
//! - sizes are strings like `"64KiB"`, `"8MiB"`, `"1GiB"`, or a plain number of bytes (bytesize).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// A duration: `"5s"`, `"250ms"`, `"10m"`.
pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor)
}

/// An optional duration (with `#[serde(default)]`): absent is `None`.
pub fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    d.deserialize_any(DurationVisitor).map(Some)
}

/// A size in bytes: `"64MiB"`, `"4KiB"`, or a plain number.
pub fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(SizeVisitor)
}

/// Parses a duration as the config files write it.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration like \"5s\", \"250ms\" or \"10m\" ({e})"))
}

/// Parses a size as the config files write it.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    bytesize::ByteSize::from_str(t)
        .map(|b| b.as_u64())
        .map_err(|e| format!("{text:?} is not a size like \"64MiB\" or \"4KiB\" ({e})"))
}

/// Formats a duration as the config files write it (`1m 30s`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration string like \"5s\", \"250ms\" or \"10m\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(E::custom(format!("{v} is not a duration string like \"5s\", \"250ms\" or \"10m\"")))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        Err(E::custom(format!("{v} is not a duration string like \"5s\", \"250ms\" or \"10m\"")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(E::custom(format!("{v} is not a duration string like \"5s\", \"250ms\" or \"10m\"")))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Duration, E> {
        Err(E::custom(format!("{v} is not a duration string like \"5s\", \"250ms\" or \"10m\"")))
    }
}

struct SizeVisitor;

impl Visitor<'_> for SizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a size like \"64MiB\" or a number of bytes")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_size(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("{v} is not a size (a number of bytes, 0 or more)")))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct T {
        #[serde(deserialize_with = "duration")]
        d: Duration,
        #[serde(deserialize_with = "size")]
        s: u64,
    }

    fn parse(text: &str) -> Result<T, String> {
        toml::from_str::<T>(text).map_err(|e| e.message().to_owned())
    }

    #[test]
    fn durations_and_sizes_parse_as_the_files_write_them() {
        let t = parse("d = \"1m 30s\"\ns = \"8MiB\"").unwrap();
        assert_eq!((t.d, t.s), (Duration::from_secs(90), 8 << 20));
        assert_eq!(parse("d = \"250ms\"\ns = 4096").unwrap().s, 4096);
        assert_eq!(parse("d = \"250ms\"\ns = \"4096\"").unwrap().s, 4096);
        assert_eq!(format_duration(Duration::from_millis(1500)), "1s 500ms");
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        let e = parse("d = \"soon\"\ns = 1").unwrap_err();
        assert!(e.starts_with("\"soon\" is not a duration like \"5s\", \"250ms\" or \"10m\" ("), "{e}");
        assert_eq!(parse("d = 5\ns = 1").unwrap_err(), "5 is not a duration string like \"5s\", \"250ms\" or \"10m\"");
        let e = parse("d = \"1s\"\ns = \"lots\"").unwrap_err();
        assert!(e.starts_with("\"lots\" is not a size like \"64MiB\" or \"4KiB\" ("), "{e}");
        assert_eq!(parse("d = \"1s\"\ns = -1").unwrap_err(), "-1 is not a size (a number of bytes, 0 or more)");
        assert_eq!(
            parse("d = \"1s\"\ns = true").unwrap_err(),
            "invalid type: boolean `true`, expected a size like \"64MiB\" or a number of bytes"
        );
    }
}
