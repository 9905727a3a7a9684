//! Rate limits that protect the DC link (`sync.max_bytes_per_sec`, `sync.max_records_per_sec`), with governor.
//!
//! Bytes are metered in KiB cells so that one quota covers links up to terabytes per second. The burst is a
//! quarter second of traffic (at least one cell), so over any window the rate stays within the limit plus that
//! burst; a request larger than the burst waits for several bursts in turn. From a full bucket, `n` cells of one
//! limiter pass after `(n - burst) / rate` seconds.
//!
//! The limiters run on tokio's clock and wait on tokio's timer ([`TokioClock`]), not on governor's default
//! wall-clock quanta and futures-timer: the mirror's other timers are tokio's, and `tokio::time::pause()` then
//! drives the limits in tests as exactly as everything else.

use std::num::NonZeroU32;
use std::time::Instant;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

/// governor's view of tokio's clock: `tokio::time::Instant::now()`, which `tokio::time::pause()` controls.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    type Instant = Instant;

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Instant>>;

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
    Some((RateLimiter::direct_with_clock(Quota::per_second(rate).allow_burst(burst), TokioClock), burst.get()))
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

/// Takes `n` cells in chunks of at most the burst. This is governor's own `until_n_ready` loop (check, then sleep
/// until the earliest moment the cells fit), with tokio's timer in place of futures-timer.
async fn take(l: &Limiter, burst: u32, mut n: u64) {
    while n > 0 {
        let chunk = n.min(u64::from(burst)) as u32;
        n -= u64::from(chunk);
        let Some(cells) = NonZeroU32::new(chunk) else { continue };
        // A chunk never exceeds the burst, so the check cannot fail with insufficient capacity.
        while let Ok(Err(not_until)) = l.check_n(cells) {
            tokio::time::sleep(not_until.wait_time_from(TokioClock.now())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// 1,000 cells a second: one cell per millisecond, a burst of 250, so every wait is a whole number of
    /// milliseconds and virtual time is exact.
    const RATE: u64 = 1_000;
    const BURST: u64 = RATE / 4;
    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn unlimited_passes_at_once() {
        let r = RateLimits::new(0, 0);
        assert!(r.bytes.is_none() && r.records.is_none(), "0 turns both limits off");
        let start = Instant::now();
        for _ in 0..1_000 {
            r.acquire(u64::MAX / 2, u64::MAX / 2).await;
        }
        // Any wait would have advanced the paused clock.
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_burst_passes_at_once_then_each_record_waits_its_share() {
        let r = RateLimits::new(0, RATE);
        assert_eq!(r.records.as_ref().map(|(_, b)| u64::from(*b)), Some(BURST));
        let start = Instant::now();
        r.acquire(0, BURST).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "a full bucket lets the burst through");
        r.acquire(0, 1).await;
        assert_eq!(start.elapsed(), MS, "then one record per 1/rate");
        r.acquire(0, 10).await;
        assert_eq!(start.elapsed(), 11 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_larger_than_the_burst_is_chunked_and_waits_exactly_for_its_cells() {
        let r = RateLimits::new(0, RATE);
        let start = Instant::now();
        // 16 bursts in one request: governor alone refuses more than the burst (insufficient capacity); chunked,
        // it passes when the last cell is due, (n - burst) / rate after a full bucket.
        r.acquire(0, 16 * BURST).await;
        assert_eq!(start.elapsed(), 15 * BURST as u32 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_are_metered_in_whole_kib() {
        // 1,000 KiB/s: 1,000 cells of 1 KiB a second.
        let r = RateLimits::new(RATE * 1024, 0);
        assert_eq!(r.bytes.as_ref().map(|(_, b)| u64::from(*b)), Some(BURST));
        assert!(r.records.is_none());
        let start = Instant::now();
        // Each byte-sized request takes a whole cell: the burst is 250 of them.
        for _ in 0..BURST {
            r.acquire(1, 1_000_000).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "records are not limited");
        r.acquire(1, 0).await;
        assert_eq!(start.elapsed(), MS, "the 251st request of one byte waits for a cell");
        // 4,000 KiB, 16 bursts: chunked, and 4 s at 1,000 KiB/s.
        r.acquire(4_000 * 1024, 0).await;
        assert_eq!(start.elapsed(), MS + 4_000 * MS);
        // 1 KiB + 1 byte is two cells.
        r.acquire(1025, 0).await;
        assert_eq!(start.elapsed(), 4_003 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_both_limits() {
        // Bytes: 1,000 KiB/s; records: 100/s (burst 25).
        let r = RateLimits::new(RATE * 1024, 100);
        let start = Instant::now();
        r.acquire(BURST * 1024, 25).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // 100 KiB more is 100 ms of bytes, during which 10 records' worth refills; 20 records need 100 ms more.
        r.acquire(100 * 1024, 20).await;
        assert_eq!(start.elapsed(), 200 * MS);
        // Meanwhile 100 KiB of bytes refilled: 50 KiB pass at once; 5 more records wait 50 ms.
        r.acquire(50 * 1024, 0).await;
        r.acquire(0, 5).await;
        assert_eq!(start.elapsed(), 250 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_share_one_limit() {
        let r = Arc::new(RateLimits::new(0, RATE));
        let start = Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let r = Arc::clone(&r);
                tokio::spawn(async move {
                    r.acquire(0, 2 * BURST).await;
                    start.elapsed()
                })
            })
            .collect();
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.expect("no panic"));
        }
        // 2,000 records through one 1,000/s limit with a burst of 250: the last passes at 1.75 s, not earlier.
        let last = done.iter().max().copied().unwrap_or_default();
        assert_eq!(last, 1_750 * MS, "{done:?}");
    }
}
