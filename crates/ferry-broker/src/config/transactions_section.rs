//! `[transactions]`: the check-back clock of transactional messages and the bounds on what producers may keep
//! pending (docs/transactions.md).

use std::time::Duration;

use bytesize::ByteSize;
use ferry_config::{Problems, de};
use serde::Deserialize;

/// `[transactions]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransactionsSection {
    /// How long a prepared transaction may stay without an outcome before the broker checks it back.
    #[serde(deserialize_with = "de::duration")]
    pub transaction_timeout: Duration,
    /// Time between two checks of one transaction.
    #[serde(deserialize_with = "de::duration")]
    pub check_interval: Duration,
    /// Answered checks after which a transaction still unknown is rolled back (expired).
    pub max_checks: u32,
    /// Most pending (prepared, unresolved) transactions per internal partition; past it a prepare is refused.
    pub max_pending: usize,
    /// Most bytes of half messages pending per internal partition; past it a prepare is refused.
    pub max_pending_bytes: ByteSize,
    /// Most messages in one transaction.
    pub max_messages: usize,
    /// How long a finished transaction is remembered, so that a repeated request answers its first result.
    #[serde(deserialize_with = "de::duration")]
    pub resolved_retention: Duration,
    /// Most finished transactions remembered per partition of the internal topic (the oldest are forgotten first).
    pub max_resolved: usize,
}

impl Default for TransactionsSection {
    fn default() -> Self {
        TransactionsSection {
            transaction_timeout: Duration::from_secs(6),
            check_interval: Duration::from_secs(30),
            max_checks: 15,
            max_pending: 10_000,
            max_pending_bytes: ByteSize::mib(256),
            max_messages: 1000,
            resolved_retention: Duration::from_secs(3600),
            max_resolved: 100_000,
        }
    }
}

impl TransactionsSection {
    /// Every problem of `[transactions]`; `retention` is the internal topic's retention (`None`: kept until the
    /// feature drops it), which must outlast a transaction's whole check-back.
    pub(super) fn validate(&self, retention: Option<Duration>, p: &mut Problems) {
        if self.transaction_timeout < Duration::from_millis(100) {
            p.push("transactions.transaction_timeout", "is below 100ms");
        }
        if self.check_interval < Duration::from_millis(100) {
            p.push("transactions.check_interval", "is below 100ms");
        }
        if !(1..=1000).contains(&self.max_checks) {
            p.push("transactions.max_checks", format!("{} is outside 1..1000", self.max_checks));
        }
        if !(1..=1_000_000).contains(&self.max_pending) {
            p.push("transactions.max_pending", format!("{} is outside 1..1000000", self.max_pending));
        }
        if self.max_pending_bytes.as_u64() < 1 << 20 {
            p.push("transactions.max_pending_bytes", format!("{} is below 1 MiB", self.max_pending_bytes));
        }
        if !(1..=100_000).contains(&self.max_messages) {
            p.push("transactions.max_messages", format!("{} is outside 1..100000", self.max_messages));
        }
        if !(1..=10_000_000).contains(&self.max_resolved) {
            p.push("transactions.max_resolved", format!("{} is outside 1..10000000", self.max_resolved));
        }
        if let Some(retention) = retention
            && retention < self.lifetime()
        {
            p.push(
                "transactions",
                format!(
                    "the internal topic's retention ({retention:?}) is shorter than transaction_timeout + \
                     check_interval x max_checks ({:?})",
                    self.lifetime()
                ),
            );
        }
    }

    /// The longest a transaction stays unresolved while producers answer: the timeout, then every check.
    pub fn lifetime(&self) -> Duration {
        self.transaction_timeout + self.check_interval * self.max_checks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_retention_shorter_than_a_whole_check_back_is_refused() {
        let s = TransactionsSection::default();
        assert_eq!(s.lifetime(), Duration::from_secs(6 + 30 * 15));
        let mut p = Problems::new();
        s.validate(Some(Duration::from_secs(400)), &mut p);
        assert_eq!(p.0.len(), 1, "{:?}", p.0);
        assert!(p.0[0].starts_with("transactions: the internal topic's retention"), "{:?}", p.0);
        let mut p = Problems::new();
        s.validate(Some(s.lifetime()), &mut p);
        s.validate(None, &mut p);
        assert!(p.0.is_empty(), "{:?}", p.0);
    }
}
