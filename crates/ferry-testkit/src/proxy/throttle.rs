//! The proxy's bandwidth limit for one direction: a `governor` token bucket of bytes, swappable at runtime,
//! shared by every connection of the proxy.
//!
//! The bucket's burst is a twentieth of a second of traffic (at most 64 KiB), so a transfer of N bytes at R
//! bytes/s takes at least N/R - 50 ms even when the bucket starts full. Waiting uses tokio's timer, whose
//! millisecond granularity caps a throttled direction at roughly 64 MB/s; the throttle is meant for slow links.
//! governor stores the refill period in whole nanoseconds, so very high rates round up (300 MB/s acts as
//! ~333 MB/s); test rates of a few MB/s are exact to 0.1%.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::clock::Clock as _;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::lock;

/// Largest burst a bucket allows, in bytes.
const MAX_BURST: u32 = 64 * 1024;

/// One direction's limiter; `None` inside means unlimited.
#[derive(Default)]
pub(crate) struct Throttle {
    limiter: Mutex<Option<(Arc<DefaultDirectRateLimiter>, NonZeroU32)>>,
    rate: Mutex<Option<u64>>,
}

impl Throttle {
    /// Sets the rate in bytes per second (`None`: unlimited). A rate of 0 is taken as 1 byte/s; rates above
    /// `u32::MAX` are clamped to it. Transfers waiting under the old rate finish their current piece under it.
    pub(crate) fn set(&self, bytes_per_sec: Option<u64>) {
        let limiter = bytes_per_sec.map(|rate| {
            let rate = u32::try_from(rate.max(1)).unwrap_or(u32::MAX);
            let burst = (rate / 20).clamp(1, MAX_BURST);
            let rate = NonZeroU32::new(rate).unwrap_or(NonZeroU32::MIN);
            let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
            (Arc::new(RateLimiter::direct(Quota::per_second(rate).allow_burst(burst))), burst)
        });
        *lock(&self.limiter) = limiter;
        *lock(&self.rate) = bytes_per_sec;
    }

    /// The configured rate.
    pub(crate) fn rate(&self) -> Option<u64> {
        *lock(&self.rate)
    }

    /// Waits until `bytes` may pass.
    pub(crate) async fn take(&self, bytes: usize) {
        let mut left = u32::try_from(bytes).unwrap_or(u32::MAX);
        while left > 0 {
            // Re-read per piece so a rate change applies within one burst.
            let Some((limiter, burst)) = lock(&self.limiter).clone() else { return };
            let piece = left.min(burst.get());
            let n = NonZeroU32::new(piece).unwrap_or(NonZeroU32::MIN);
            loop {
                match limiter.check_n(n) {
                    Ok(Ok(())) => break,
                    Ok(Err(not_until)) => {
                        tokio::time::sleep(not_until.wait_time_from(limiter.clock().now())).await;
                    }
                    // piece <= burst by construction; treat the impossible case as "let it through".
                    Err(_insufficient) => break,
                }
            }
            left -= piece;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unlimited_by_default_and_after_clearing() {
        let t = Throttle::default();
        assert_eq!(t.rate(), None);
        t.take(10 << 20).await;
        t.set(Some(1000));
        assert_eq!(t.rate(), Some(1000));
        t.set(None);
        t.take(10 << 20).await;
    }

    #[tokio::test]
    async fn limits_the_rate() {
        let t = Throttle::default();
        t.set(Some(100_000));
        let start = std::time::Instant::now();
        for _ in 0..20 {
            t.take(10_000).await;
        }
        // 200 kB at 100 kB/s: at least 2 s minus the 5 kB burst.
        assert!(start.elapsed() >= std::time::Duration::from_millis(1900), "{:?}", start.elapsed());
    }
}
