//! Waiting for conditions with a deadline, the only way tests synchronise with processes: poll a check every
//! [`POLL_INTERVAL`] until it holds or the deadline passes, never a bare sleep.
//!
//! Deadlines come from the configured intervals of the thing awaited with a 3x margin ([`deadline`]), because
//! the test machine is small and noisy; a deadline is a bound on a hang, never the thing asserted.

use std::time::Duration;

use tokio::time::Instant;

/// How often [`wait_until`] and [`wait_for`] call their check.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// The smallest deadline [`deadline`] returns: process start-up and a first connection alone can take seconds
/// on a loaded 2-core machine.
pub const MIN_DEADLINE: Duration = Duration::from_secs(5);

/// The deadline for waiting on something driven by the given configured intervals: 3x their sum, at least
/// [`MIN_DEADLINE`]. Example: a lag alarm needs a failure threshold of 3 checks at 1 s plus a 10 s switch delay,
/// so `deadline(&[Duration::from_secs(3), Duration::from_secs(10)])` is 39 s.
pub fn deadline(intervals: &[Duration]) -> Duration {
    let sum: Duration = intervals.iter().sum();
    sum.saturating_mul(3).max(MIN_DEADLINE)
}

/// The result of one check of [`wait_until`]: `bool`, or `Result<bool, E>` where an error counts as "not yet"
/// (e.g. connection refused while a server starts) and the last one is reported on timeout.
pub trait Check {
    /// `Ok(true)` when the condition holds.
    fn into_check(self) -> anyhow::Result<bool>;
}

impl Check for bool {
    fn into_check(self) -> anyhow::Result<bool> {
        Ok(self)
    }
}

impl<E: Into<anyhow::Error>> Check for Result<bool, E> {
    fn into_check(self) -> anyhow::Result<bool> {
        self.map_err(Into::into)
    }
}

/// The result of one check of [`wait_for`]: `Option<T>`, or `Result<Option<T>, E>` where an error counts as
/// "not yet" and the last one is reported on timeout.
pub trait Found<T> {
    /// `Ok(Some(value))` when the awaited value is there.
    fn into_found(self) -> anyhow::Result<Option<T>>;
}

impl<T> Found<T> for Option<T> {
    fn into_found(self) -> anyhow::Result<Option<T>> {
        Ok(self)
    }
}

impl<T, E: Into<anyhow::Error>> Found<T> for Result<Option<T>, E> {
    fn into_found(self) -> anyhow::Result<Option<T>> {
        self.map_err(Into::into)
    }
}

/// Calls `check` every [`POLL_INTERVAL`] until it returns `true` (or `Ok(true)`), for at most `deadline`.
/// A check still running at the deadline is abandoned. On timeout the error reads
/// `timed out after 15s waiting for {what}` plus the last error the check returned, if any.
///
/// `check` is an async closure, e.g. `async || proxy.stats().connections_accepted >= 2` or
/// `|| async { client.describe("orders").await.map(|d| d.leo == 100) }`.
pub async fn wait_until<F, O>(what: &str, deadline: Duration, mut check: F) -> anyhow::Result<()>
where
    F: AsyncFnMut() -> O,
    O: Check,
{
    wait_for(what, deadline, async || match check().await.into_check() {
        Ok(true) => Ok(Some(())),
        Ok(false) => Ok(None),
        Err(e) => Err(e),
    })
    .await
}

/// Calls `check` every [`POLL_INTERVAL`] until it returns `Some(value)` (or `Ok(Some(value))`) and returns
/// the value, for at most `deadline`. Errors on timeout as [`wait_until`] does.
pub async fn wait_for<T, F, O>(what: &str, deadline: Duration, mut check: F) -> anyhow::Result<T>
where
    F: AsyncFnMut() -> O,
    O: Found<T>,
{
    let until = Instant::now() + deadline;
    let mut last_error: Option<anyhow::Error> = None;
    loop {
        match tokio::time::timeout_at(until, check()).await {
            Ok(outcome) => match outcome.into_found() {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => {}
                Err(e) => last_error = Some(e),
            },
            Err(_elapsed) => return Err(timeout_error(what, deadline, last_error, true)),
        }
        if Instant::now() + POLL_INTERVAL > until {
            return Err(timeout_error(what, deadline, last_error, false));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn timeout_error(what: &str, deadline: Duration, last_error: Option<anyhow::Error>, hung: bool) -> anyhow::Error {
    let mut msg = format!("timed out after {deadline:?} waiting for {what}");
    if hung {
        msg.push_str(" (the last check was still running)");
    }
    if let Some(e) = last_error {
        msg.push_str(&format!("; last error: {e:#}"));
    }
    anyhow::anyhow!(msg)
}

/// Holds a fault (or the calm between two) in place for `span`. This is the one wait that is not on a condition:
/// in a fault schedule (nemesis, soak) the span itself is what is exercised, a cluster or pipeline under the fault
/// for that long, drawn from the test's seed, so there is nothing to wait for instead.
pub async fn hold_fault(span: Duration) {
    tokio::time::sleep(span).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_three_times_the_intervals_with_a_floor() {
        assert_eq!(deadline(&[Duration::from_secs(3), Duration::from_secs(10)]), Duration::from_secs(39));
        assert_eq!(deadline(&[Duration::from_millis(100)]), MIN_DEADLINE);
        assert_eq!(deadline(&[]), MIN_DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_returns_once_the_condition_holds() {
        let mut calls = 0;
        wait_until("third call", Duration::from_secs(5), async || {
            calls += 1;
            calls == 3
        })
        .await
        .unwrap();
        assert_eq!(calls, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_times_out_naming_what_and_the_last_error() {
        let err = wait_until("the moon", Duration::from_secs(1), async || {
            Err::<bool, _>(anyhow::anyhow!("connection refused"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(err, "timed out after 1s waiting for the moon; last error: connection refused");
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_abandons_a_hung_check_at_the_deadline() {
        let err = wait_until("a hung check", Duration::from_secs(2), async || {
            std::future::pending::<()>().await;
            true
        })
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(err, "timed out after 2s waiting for a hung check (the last check was still running)");
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_returns_the_value() {
        let mut n = 0u32;
        let v = wait_for("n to reach 4", Duration::from_secs(5), async || {
            n += 1;
            (n >= 4).then_some(n * 10)
        })
        .await
        .unwrap();
        assert_eq!(v, 40);
        let v: u32 =
            wait_for("a fallible value", Duration::from_secs(5), || async { Ok::<_, std::io::Error>(Some(7)) })
                .await
                .unwrap();
        assert_eq!(v, 7);
    }
}
