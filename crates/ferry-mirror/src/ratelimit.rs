//! Rate limits that protect the DC link (`sync.max_bytes_per_sec`, `sync.max_records_per_sec`), with governor.
//!
//! Bytes are metered in KiB cells so that one quota covers links up to terabytes per second. The burst is a
//! quarter second of traffic (at least one cell), so over any window the rate stays within the limit plus that
//! burst; a request larger than the burst waits for several bursts in turn.

use std::num::NonZeroU32;

use governor::clock::DefaultClock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

type Limiter = RateLimiter<NotKeyed, InMemoryState, DefaultClock, NoOpMiddleware>;

/// The byte and record limiters (either may be off).
pub struct RateLimits {
    bytes: Option<(Limiter, u32)>,
    records: Option<(Limiter, u32)>,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("bytes", &self.bytes.is_some())
            .field("records", &self.records.is_some())
            .finish()
    }
}

fn limiter(per_sec: u64) -> Option<(Limiter, u32)> {
    let rate = NonZeroU32::new(u32::try_from(per_sec).unwrap_or(u32::MAX))?;
    let burst = NonZeroU32::new((rate.get() / 4).max(1)).unwrap_or(NonZeroU32::MIN);
    Some((RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)), burst.get()))
}

impl RateLimits {
    /// Limits of `bytes_per_sec` and `records_per_sec`; 0 turns a limit off.
    pub fn new(bytes_per_sec: u64, records_per_sec: u64) -> RateLimits {
        RateLimits { bytes: limiter(bytes_per_sec.div_ceil(1024)), records: limiter(records_per_sec) }
    }

    /// Waits until `bytes` and `records` may pass.
    pub async fn acquire(&self, bytes: u64, records: u64) {
        if let Some((l, burst)) = &self.bytes {
            take(l, *burst, bytes.div_ceil(1024)).await;
        }
        if let Some((l, burst)) = &self.records {
            take(l, *burst, records).await;
        }
    }
}

async fn take(l: &Limiter, burst: u32, mut n: u64) {
    while n > 0 {
        let chunk = n.min(u64::from(burst)) as u32;
        if let Some(c) = NonZeroU32::new(chunk) {
            // A chunk never exceeds the burst, so this cannot fail with insufficient capacity.
            let _ = l.until_n_ready(c).await;
        }
        n -= u64::from(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unlimited_passes_at_once() {
        let r = RateLimits::new(0, 0);
        r.acquire(u64::MAX / 2, u64::MAX / 2).await;
    }

    #[tokio::test]
    async fn bytes_are_metered_in_kib_and_large_requests_are_chunked() {
        let r = RateLimits::new(4 * 1024 * 1024, 0);
        // 1 MiB at 4 MiB/s with a 1 MiB burst passes without error.
        r.acquire(1024 * 1024, 10).await;
        assert!(r.bytes.as_ref().is_some_and(|(_, b)| *b == 1024));
    }
}
