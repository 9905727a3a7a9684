//! [`Problems`]: every problem found in a configuration, each naming its key.

use std::fmt;
use std::time::Duration;

/// Every problem found in a configuration, in the order found. Each entry reads `{key}: {what is wrong}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<String>);

impl Problems {
    /// An empty report.
    pub fn new() -> Problems {
        Problems(Vec::new())
    }

    /// Adds `{key}: {message}`.
    pub fn push(&mut self, key: impl fmt::Display, message: impl fmt::Display) {
        self.0.push(format!("{key}: {message}"));
    }

    /// Adds a problem whose text already names what it is about.
    pub fn push_text(&mut self, text: impl Into<String>) {
        self.0.push(text.into());
    }

    /// Adds every problem of `other`.
    pub fn extend(&mut self, other: impl IntoIterator<Item = String>) {
        self.0.extend(other);
    }

    /// Adds `{key}: "..." is below the minimum of ...` when `value` is below `min`.
    pub fn at_least(&mut self, key: impl fmt::Display, value: Duration, min: Duration) {
        if value < min {
            let (value, min) = (crate::de::format_duration(value), crate::de::format_duration(min));
            self.push(key, format!("{value:?} is below the minimum of {min}"));
        }
    }

    /// Whether a problem was already reported for `key` or anything inside it (`key.x`, `key[0]`), e.g. so that a
    /// list whose every entry was bad is not reported as missing too.
    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|p| {
            p.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('.') || rest.starts_with('['))
        })
    }

    /// Whether nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many problems there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `Ok(value)` when nothing is wrong, else the report.
    pub fn into_result<T>(self, value: T) -> Result<T, Problems> {
        if self.is_empty() { Ok(value) } else { Err(self) }
    }

    /// The report as one line (`a; b; c`), for daemons that print errors as one sentence.
    pub fn one_line(&self) -> String {
        self.0.join("; ")
    }
}

/// `N config problem(s):` and one indented line per problem.
impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} config problem(s):\n  - {}", self.0.len(), self.0.join("\n  - "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_lists_every_problem_with_its_key() {
        let mut p = Problems::new();
        assert_eq!(p.clone().into_result(7), Ok(7));
        p.at_least("a", Duration::from_millis(50), Duration::from_millis(50));
        p.push("sync.queue_bytes", "must be at least 64KiB");
        p.push_text("alarm channel \"ops\": no password");
        assert_eq!(p.len(), 2);
        assert!(p.has("sync.queue_bytes") && p.has("sync") && !p.has("sync.queue") && !p.has("alarm"));
        let mut below = Problems::new();
        below.at_least("source.health.timeout", Duration::from_millis(5), Duration::from_millis(10));
        assert_eq!(below.0, ["source.health.timeout: \"5ms\" is below the minimum of 10ms"]);
        assert_eq!(
            p.to_string(),
            "2 config problem(s):\n  - sync.queue_bytes: must be at least 64KiB\n  - alarm channel \"ops\": no password"
        );
        assert_eq!(p.one_line(), "sync.queue_bytes: must be at least 64KiB; alarm channel \"ops\": no password");
        assert_eq!(p.clone().into_result(()), Err(p));
    }
}
